package storage

import (
	"cmp"
	"context"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	collystorage "github.com/gocolly/colly/v2/storage"
	"github.com/proxyswitch/proxyswitch/internal/cookierule"
)

// Cookies are kept as net/http/cookiejar (the jar of Colly's own storage)
// keeps them, with the rules of RFC 6265 sections 5.3 and 5.4 that the root
// package's session jar applies too (internal/cookierule):
//
//   - A response from a host may set a cookie for the host itself
//     (host-only: no Domain attribute, or one naming a host that is a public
//     suffix) or for a domain: the host or a parent of it that is not a
//     public suffix (golang.org/x/net/publicsuffix). A Domain attribute
//     naming anything else ("other.com", "com", "co.uk", a part of an IP) is
//     refused: the cookie is not stored.
//   - A cookie without a Path attribute (or with one not starting with "/")
//     takes the request's default path, the directory of its path.
//   - Max-Age and Expires set the expiry; Max-Age <= 0 or an Expires in the
//     past deletes the stored cookie of that domain, path and name.
//   - Cookies(u) returns the cookies that go with a request to u: those of
//     u's host or of a domain u's host is in (not host-only ones of another
//     host), whose path is u's path or a parent of it ("/a" goes to "/a/b",
//     not to "/ab"), not expired, Secure ones only over https; longest path
//     first, then the earliest created. Ports do not matter; a host is
//     taken in its canonical form (cookierule.CanonicalHost: lower case,
//     no trailing dot, IDN labels in punycode), so "www.bücher.de" and
//     "www.xn--bcher-kva.de" are one host.
//
// Storage: one Redis hash per registrable domain (the host's public suffix
// plus one label, "shop.co.uk" for "www.shop.co.uk"; the host itself for an
// IP, "localhost" or a public suffix), as net/http/cookiejar keys its
// entries: every cookie that may go to a host is in its domain's hash, so
// Cookies is one read and the matching is done here. A field names a cookie
// as the jar identifies it, "<domain>;<path>;<name>" (a host-only cookie
// and a domain cookie of the same domain, path and name are one cookie:
// the later replaces the earlier; the path is the one the line carries,
// see linePath); its value is "<created µs>|<flags>|<expires
// ms>|<Set-Cookie line>": the creation time (Redis's clock; an overwrite
// keeps the first), flags h (host-only) or d (a domain cookie), followed
// by m for an entry moved from an earlier version's hash (below), the
// exact expiry in unix ms (0: a session cookie; the one expiry checks
// use), and the cookie as Cookies returns it (Path always, Domain for a
// domain cookie, Expires for one that expires, Max-Age turned into
// Expires, rounded down to the second, Secure, HttpOnly, SameSite). A write
// replaces single fields in one script, so writers in several processes
// never lose each other's cookies.
//
// Limits (storage/doc.go): a jar holds at most maxCookies cookies and
// maxCookieBytes of values, a value at most maxCookieValue bytes. A write
// that would pass a jar's limits makes room as a browser does (removing
// expired cookies first, then the oldest by creation time, never one the
// write itself sets) in the same script, before it writes anything; it is
// never refused for a full jar. Only a cookie larger than maxCookieValue,
// or the earliest cookies of one response that alone holds more than a
// jar does, are not stored (logged). A read that finds a jar over the
// limits (written by something else) removes entries until it is within
// them and returns the rest.
//
// Colly's cookie jar wrapper merges before it writes: it reads the cookies
// for the URL (Cookies), adds the response's new ones and hands the whole
// list back (SetCookies). Written back blindly, a cookie in that list would
// undo a newer value another process stored in between. So the Storage
// remembers, per host, the lines its last read for the host returned
// (cookieMemo), and SetCookies for that host skips a cookie whose line is
// exactly one of them when this process wrote nothing to its field since:
// the wrapper's write-back of what it just read. (A line read names its
// path, and its domain unless it is the host's own, so a write-back that is
// not skipped lands on the same field, never on another host's; its value
// may differ in the expiry, which the line has to the second only.) Every
// write of this process forgets the field's lines, and every read replaces
// the host's lines, so a cookie the site sets again (after deleting or
// changing it) is always written.
//
// Known limitation: the memo is a heuristic, not a guarantee. A write-back
// is skipped only when the host's last read returned its line, so it still
// undoes a change made between the wrapper's read and its write (Colly's
// wrapper does them back to back, so the window is that short) in two
// cases: (1) two collectors on one Storage: A's wrapper reads sid=old, B's
// wrapper reads and deletes (or changes) sid, which forgets the field's
// lines, and A's write-back stores sid=old again; (2) another process
// changes sid and another goroutine of this process (an outgoing
// request's jar read, not under the wrapper's lock) reads the host in
// between, replacing the memo with sid=new: A's write-back of sid=old is
// then no longer recognised and overwrites sid=new. No bookkeeping of
// reads and writes at this API can close both without breaking what
// Colly's own storage does: a cookie the site deletes (or changes) and
// then sets again to the same line is stored again
// (TestCookieSetAgainWithinMemo, TestCookieMemoForgetsOnWrite). The
// calls the Storage sees are the same in both stories (a read returning
// line L, a deletion of L's field, a SetCookies naming L, with or without a
// read finding the field absent, or changed, in between); only which goroutine made
// each read tells them apart (the wrapper's write follows its own read),
// and Colly's Storage interface carries no such link. Keeping every line
// read (not replaced by each read) and writing a recognised line only if
// its field was not deleted since (a tombstone) would fix both cases and
// lose such a re-set within the memo's TTL instead.
//
// Data of earlier versions: they kept one hash per host and port ({ns}:c:<host>,
// fields "<name>;<path>;<domain>" -> Set-Cookie line, registry
// {ns}:cookiehosts). A read for a URL of such a host moves its cookies into
// the domain's hash (cookies_migrate.lua), applying the rules above as if
// the host had set them (those it may not set are dropped; a Max-Age
// counts from the migration), and deletes the old fields; a write for it
// migrates first. A cookie moves only if its old field still holds the
// line read (else the next read moves what it holds now: an earlier
// version still running may rewrite it), so a move that lands late never
// brings back a cookie moved and deleted meanwhile. A moved entry is
// flagged (m): a later move may replace it, never an entry written since
// the upgrade. (A cookie an earlier version deletes after its move is not
// deleted in the jar: the old hash no longer says anything of it.) Old
// hashes of hosts never read again stay until Clear, which deletes both
// kinds.

// cookieMemoTTL bounds how long a cookie read from Redis counts as "ours to
// skip" when it comes back through SetCookies; Colly's wrapper writes back
// at once.
const cookieMemoTTL = 10 * time.Second

// cookieTarget is where the cookies of a URL live.
type cookieTarget struct {
	host   string // canonical (cookierule.CanonicalHost): lower-cased, punycode, without port or trailing dot
	domain string // the registrable domain: its jar's key
	legacy string // u.Host lower-cased: the key of an earlier version's hash
}

// targetOf returns the cookie target of u, false for a URL that has no
// cookies: no http(s) URL, no host, or a host that is too long or holds
// blanks or control characters.
func targetOf(u *url.URL) (cookieTarget, bool) {
	if u == nil || (u.Scheme != "http" && u.Scheme != "https") {
		return cookieTarget{}, false
	}
	legacy := strings.ToLower(u.Host)
	if legacy == "" || len(legacy) > maxHostLen || strings.ContainsAny(legacy, " \t") || strings.ContainsFunc(legacy, isControl) {
		return cookieTarget{}, false
	}
	host, ok := cookierule.CanonicalHost(u.Hostname())
	if !ok || host == "" {
		return cookieTarget{}, false
	}
	return cookieTarget{host: host, domain: cookierule.JarKey(host), legacy: legacy}, true
}

// Cookies implements Colly's storage.Storage: the cookies that go with a
// request to u (see above), one Set-Cookie line each. Colly's method has no
// error result, so a failure (Redis down, a key of another kind) is
// logged and no cookies are returned. Expired cookies of the domain are
// removed from Redis on the way, unless another process has replaced them
// meanwhile.
func (s *Storage) Cookies(u *url.URL) string {
	t, ok := targetOf(u)
	if !ok {
		return ""
	}
	stored, ok := s.readCookies(t)
	if !ok {
		return ""
	}
	now := time.Now()
	var hits []storedCookie
	var stale []any
	for _, c := range stored {
		if c.expired(now) {
			stale = append(stale, c.field, c.value)
			continue
		}
		if c.matches(u, t.host) {
			hits = append(hits, c)
		}
	}
	slices.SortFunc(hits, func(a, b storedCookie) int {
		if n := cmp.Compare(len(b.path), len(a.path)); n != 0 {
			return n
		}
		if n := cmp.Compare(a.created, b.created); n != 0 {
			return n
		}
		return strings.Compare(a.field, b.field)
	})
	read := make(map[string]string, len(hits))
	lines := make([]string, len(hits))
	for i, c := range hits {
		lines[i] = c.line
		read[c.line] = c.field
	}
	s.cookies.remember(t.domain, t.host, read, now)
	if len(stale) > 0 {
		s.writeCookies(t, nil, stale)
	}
	return strings.Join(lines, "\n")
}

// readCookies reads the domain's jar, migrating the host's cookies of an
// earlier version first if there are any; false after a failure (logged).
func (s *Storage) readCookies(t cookieTarget) ([]storedCookie, bool) {
	for try := 0; ; try++ {
		res, err := s.run(context.Background(), "cookies", cookiesGetScript,
			[]string{s.keys.cookieJar(t.domain), s.keys.legacyCookies(t.legacy), s.keys.cookieHosts()},
			maxCookies, maxCookieBytes, legacyMaxCookies, legacyMaxCookieBytes, t.legacy)
		if err != nil {
			s.cfg.logger.Warn("proxyswitch: reading cookies", "namespace", s.cfg.namespace, "domain", t.domain, "err", err)
			return nil, false
		}
		all, _ := res.([]any)
		var jar, legacy []any
		if len(all) == 4 {
			jar, _ = all[0].([]any)
			legacy, _ = all[1].([]any)
			if n, _ := all[2].(int64); n > 0 {
				s.cfg.logger.Warn("proxyswitch: cookie jar over its limits (not written by this package): entries removed",
					"namespace", s.cfg.namespace, "domain", t.domain, "removed", n, "max_cookies", maxCookies, "max_bytes", maxCookieBytes)
			}
			if n, _ := all[3].(int64); n > 0 {
				s.cfg.logger.Warn("proxyswitch: cookies of an earlier version over its limits: dropped",
					"namespace", s.cfg.namespace, "host", t.legacy, "dropped", n)
			}
		}
		// After a migration the jar is read again (an earlier version
		// still running may write the old hash again: twice at most).
		if len(legacy) == 0 || try == 2 || !s.migrateCookies(t, legacy) {
			return parseStored(jar), true
		}
	}
}

// SetCookies implements Colly's storage.Storage: it stores the cookies
// (Set-Cookie lines, as Colly's jar wrapper writes them) set by a response
// to u, by the rules above. Each cookie is written on its own; cookies the
// list does not name are kept, a cookie the host may not set is ignored, a
// cookie just as this process's last read found it is not written back
// (see above), a cookie that is expired or has Max-Age <= 0 is deleted,
// and of two cookies of one domain, path and name the later wins. Failures
// are logged.
func (s *Storage) SetCookies(u *url.URL, cookies string) {
	t, ok := targetOf(u)
	if !ok {
		return
	}
	now := time.Now()
	lines := make(map[string]string) // field -> value to set, "" to delete
	var fields []string              // in order of first appearance
	for _, c := range collystorage.UnstringifyCookies(cookies) {
		field, value, del, ok := newStoredCookie(c, t.host, u.Path, now, false)
		if !ok {
			continue
		}
		if len(value) > maxCookieValue {
			s.cfg.logger.Warn("proxyswitch: cookie too large, not stored", "namespace", s.cfg.namespace,
				"domain", t.domain, "cookie", field, "bytes", len(value), "max_bytes", maxCookieValue)
			continue
		}
		if !del && s.cookies.justRead(t.domain, t.host, lineOf(value), now) {
			continue
		}
		if _, ok := lines[field]; !ok {
			fields = append(fields, field)
		}
		lines[field] = value // the last cookie of a field wins, as in a jar
		if del {
			lines[field] = ""
		}
	}
	if len(fields) == 0 {
		return
	}
	var set, del []any
	for _, f := range fields {
		if v := lines[f]; v != "" {
			set = append(set, f, v)
		} else {
			del = append(del, f, "")
		}
	}
	set = s.capCookies(t, set)
	s.cookies.forget(t.domain, fields)
	s.writeCookies(t, set, del)
}

// capCookies keeps, of the field/value pairs one call sets, the last ones
// (the latest set) that fit a jar on their own (maxCookies, maxCookieBytes):
// a jar makes room for a call by removing older cookies, not the call's.
// The dropped ones are logged.
func (s *Storage) capCookies(t cookieTarget, set []any) []any {
	n, total, from := 0, 0, len(set)
	for from >= 2 {
		v, _ := set[from-1].(string)
		if n+1 > maxCookies || total+len(v)+cookieCreatedLen > maxCookieBytes {
			break
		}
		n, total, from = n+1, total+len(v)+cookieCreatedLen, from-2
	}
	if from > 0 {
		s.cfg.logger.Warn("proxyswitch: more cookies in one response than a cookie jar holds: the earliest not stored",
			"namespace", s.cfg.namespace, "domain", t.domain, "dropped", from/2, "max_cookies", maxCookies, "max_bytes", maxCookieBytes)
	}
	return set[from:]
}

// cookieCreatedLen bounds the creation time and separator a script puts in
// front of a value ("<created µs>|").
const cookieCreatedLen = 21

// writeCookies sets field/value pairs (values "<flags>|<expires ms>|<line>") and
// deletes field/expected pairs (expected "" deletes whatever is there) of
// one domain's jar, in one script; the host's cookies of an earlier
// version, if any, are migrated first.
func (s *Storage) writeCookies(t cookieTarget, set, del []any) {
	args := make([]any, 0, 4+len(set)+len(del))
	args = append(args, t.domain, maxCookies, maxCookieBytes, len(set)/2)
	args = append(append(args, set...), del...)
	keys := []string{s.keys.cookieJar(t.domain), s.keys.cookieDomains(), s.keys.legacyCookies(t.legacy)}
	for range 3 {
		res, err := s.run(context.Background(), "set cookies", cookiesSetScript, keys, args...)
		if err != nil {
			s.cfg.logger.Warn("proxyswitch: storing cookies", "namespace", s.cfg.namespace, "domain", t.domain,
				"set", len(set)/2, "deleted", len(del)/2, "err", err)
			return
		}
		if r, _ := res.([]any); len(r) == 2 {
			if n, _ := r[1].(int64); n > 0 {
				s.cfg.logger.Info("proxyswitch: cookie jar full: oldest cookies removed to make room",
					"namespace", s.cfg.namespace, "domain", t.domain, "removed", n)
			}
			return
		}
		// The host has cookies of an earlier version: they go first.
		if _, ok := s.readCookies(t); !ok {
			break
		}
	}
	s.cfg.logger.Warn("proxyswitch: cookies not stored: the host's cookies of an earlier version could not be moved first",
		"namespace", s.cfg.namespace, "domain", t.domain, "host", t.legacy, "set", len(set)/2, "deleted", len(del)/2)
}

// migrateCookies moves the host's cookies of an earlier version (legacy:
// field, line, ... of its hash as read) into its domain's jar; false after
// a failure (logged). An entry whose legacy field no longer holds the line
// read is left for the next read (cookies_migrate.lua).
func (s *Storage) migrateCookies(t cookieTarget, legacy []any) bool {
	now := time.Now()
	args := make([]any, 0, 4+2*len(legacy))
	args = append(args, t.domain, t.legacy, maxCookies, maxCookieBytes)
	left := 0 // cookies not moved
	for i := 0; i+1 < len(legacy); i += 2 {
		lf, _ := legacy[i].(string)
		line, _ := legacy[i+1].(string)
		field, value := "", ""
		if c := parseCookie(line); c != nil {
			// The field "<name>;<path>;<domain>" has the path the cookie was
			// stored under (its default path resolved); an older version kept
			// the literal attribute, maybe empty: "/" then.
			if _, rest, ok := strings.Cut(lf, ";"); ok {
				if p, _, _ := strings.Cut(rest, ";"); strings.HasPrefix(p, "/") {
					c.Path = p
				}
			}
			if f, v, del, ok := newStoredCookie(c, t.host, "/", now, true); ok && !del && len(v) <= maxCookieValue {
				field, value = f, v
			}
		}
		if field == "" {
			left++
		}
		args = append(args, lf, line, field, value)
	}
	_, err := s.run(context.Background(), "migrate cookies", cookiesMigrateScript,
		[]string{s.keys.cookieJar(t.domain), s.keys.cookieDomains(), s.keys.legacyCookies(t.legacy), s.keys.cookieHosts()}, args...)
	if err != nil {
		s.cfg.logger.Warn("proxyswitch: moving cookies of an earlier version", "namespace", s.cfg.namespace, "host", t.legacy, "err", err)
		return false
	}
	if left > 0 {
		s.cfg.logger.Info("proxyswitch: cookies of an earlier version not moved: unreadable, expired, too large, or for a domain the host may not set",
			"namespace", s.cfg.namespace, "host", t.legacy, "dropped", left)
	}
	return true
}

// newStoredCookie applies the storage rules to a cookie set by a response
// from host (canonical, without port) for a request path reqPath: the
// field and value ("<flags>|<expires ms>|<line>") to store, del when it
// deletes the stored one, ok false when the cookie is refused. The field's
// path is the one the line carries (linePath). migrated flags a cookie
// moved from an earlier version's hash (m).
func newStoredCookie(c *http.Cookie, host, reqPath string, now time.Time, migrated bool) (field, value string, del, ok bool) {
	if c.Name == "" || malformedDomain(c.Domain, host) {
		return "", "", false, false
	}
	domain, hostOnly, ok := cookierule.Domain(host, c.Domain)
	if !ok {
		return "", "", false, false
	}
	path := linePath(cookierule.Path(c.Path, reqPath))
	field = domain + ";" + path + ";" + c.Name
	expires, del := cookierule.Expiry(c, now)
	if del {
		return field, "", true, true
	}
	n := &http.Cookie{
		Name: c.Name, Value: c.Value, Quoted: c.Quoted, Path: path, Expires: expires,
		Secure: c.Secure, HttpOnly: c.HttpOnly, SameSite: c.SameSite,
	}
	flag := "h"
	if !hostOnly {
		n.Domain, flag = domain, "d"
	}
	if migrated {
		flag += "m"
	}
	var ms int64
	if !expires.IsZero() {
		ms = max(expires.UnixMilli(), 1)
	}
	return field, flag + "|" + strconv.FormatInt(ms, 10) + "|" + n.String(), false, true
}

// linePath is a cookie path as a Set-Cookie line can carry it: bytes a
// line may not hold (a request's decoded default path may have them:
// "/café") percent-encoded, where net/http would drop them (and log). The
// field and the line both carry it, so a line written back lands on its
// own field. Byte by byte, it keeps prefixes and '/': a request path
// matches (cookierule.PathMatch) as linePath(u.Path) against it. (Unlike
// net/http/cookiejar, a Path attribute that is literally "/caf%C3%A9" then
// also goes to "/café".)
func linePath(p string) string {
	ok := true
	for i := 0; i < len(p) && ok; i++ {
		ok = 0x20 <= p[i] && p[i] < 0x7f && p[i] != ';'
	}
	if ok {
		return p
	}
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		if c := p[i]; 0x20 <= c && c < 0x7f && c != ';' {
			b.WriteByte(c)
		} else {
			b.WriteString("%" + strings.ToUpper(strconv.FormatUint(uint64(c)|0x100, 16)[1:]))
		}
	}
	return b.String()
}

// malformedDomain reports a Domain attribute net/http/cookiejar refuses
// before its domain rules (which cookierule.Domain applies): "." alone or
// with a second leading dot, a trailing dot, a non-ASCII name, or a leading
// dot before an IP host.
func malformedDomain(attr, host string) bool {
	if attr == "" {
		return false
	}
	if strings.HasPrefix(attr, ".") && cookierule.IsIP(host) {
		return true
	}
	d := strings.TrimPrefix(attr, ".")
	if d == "" || d[0] == '.' || d[len(d)-1] == '.' {
		return true
	}
	for i := 0; i < len(d); i++ {
		if d[i] >= 0x80 {
			return true
		}
	}
	return false
}

// lineOf is the Set-Cookie line of a value newStoredCookie returns
// ("<flags>|<expires ms>|<line>").
func lineOf(v string) string {
	_, rest, _ := strings.Cut(v, "|")
	_, line, _ := strings.Cut(rest, "|")
	return line
}

// storedCookie is one cookie of a domain's jar as read.
type storedCookie struct {
	field, value string // as in Redis
	line         string // the Set-Cookie line
	domain, path string
	hostOnly     bool
	secure       bool
	expires      int64 // ms; 0: a session cookie
	created      int64 // µs
}

// parseStored parses a jar's field, value, ... pairs; entries this package
// did not write are skipped.
func parseStored(kv []any) []storedCookie {
	out := make([]storedCookie, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		field, _ := kv[i].(string)
		value, _ := kv[i+1].(string)
		domain, rest, ok1 := strings.Cut(field, ";")
		path, name, ok2 := strings.Cut(rest, ";")
		parts := strings.SplitN(value, "|", 4)
		if !ok1 || !ok2 || len(parts) != 4 || domain == "" || !strings.HasPrefix(path, "/") {
			continue
		}
		created, err1 := strconv.ParseInt(parts[0], 10, 64)
		expires, err2 := strconv.ParseInt(parts[2], 10, 64)
		kind := strings.TrimSuffix(parts[1], "m")
		if err1 != nil || err2 != nil || expires < 0 || (kind != "h" && kind != "d") {
			continue
		}
		line := parts[3]
		c := parseCookie(line)
		if c == nil || c.Name != name {
			continue
		}
		out = append(out, storedCookie{
			field: field, value: value, line: line, domain: domain, path: path,
			hostOnly: kind == "h", secure: c.Secure, expires: expires, created: created,
		})
	}
	return out
}

func (c *storedCookie) expired(now time.Time) bool {
	return c.expires != 0 && c.expires <= now.UnixMilli()
}

// matches reports whether c goes with a request to u (host: u's, as
// targetOf has it). c's path is as its line carries it (linePath), so the
// request's path is compared in that form too.
func (c *storedCookie) matches(u *url.URL, host string) bool {
	return cookierule.SecureOK(c.secure, u.Scheme) && cookierule.DomainMatch(host, c.domain, c.hostOnly) &&
		cookierule.PathMatch(linePath(u.Path), c.path)
}

func parseCookie(line string) *http.Cookie {
	c, err := http.ParseSetCookie(line)
	if err != nil {
		return nil
	}
	return c
}

// cookieMemo remembers, per domain jar and host, the cookie lines this
// process's last read for the host returned, and their fields (see above).
// Per host: a host-only line ("a=1; Path=/") names no host, so a line read
// for one host must not pass for the same line set by another.
type cookieMemo struct {
	mu      sync.Mutex
	domains map[string]map[string]*hostMemo // domain -> host -> its last read
	n       int                             // hosts remembered
}

type hostMemo struct {
	at    time.Time         // when the host was read
	lines map[string]string // line read -> its field, until this process writes the field
}

func (m *cookieMemo) init() { m.domains = make(map[string]map[string]*hostMemo) }

// remember records a read for host of its domain's jar: lines are the
// lines returned and their fields, and replace whatever an earlier read
// for the host found.
func (m *cookieMemo) remember(domain, host string, lines map[string]string, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.n > 4096 {
		for d, hosts := range m.domains {
			for h, e := range hosts {
				if now.Sub(e.at) > cookieMemoTTL {
					delete(hosts, h)
					m.n--
				}
			}
			if len(hosts) == 0 {
				delete(m.domains, d)
			}
		}
		if m.n > 4096 {
			clear(m.domains)
			m.n = 0
		}
	}
	hosts := m.domains[domain]
	if hosts == nil {
		hosts = make(map[string]*hostMemo)
		m.domains[domain] = hosts
	}
	if hosts[host] == nil {
		m.n++
	}
	hosts[host] = &hostMemo{at: now, lines: lines}
}

// justRead reports whether the last read for host (within the TTL) returned
// line, of a field this process wrote no line to since.
func (m *cookieMemo) justRead(domain, host, line string, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.domains[domain][host]
	if e == nil || now.Sub(e.at) > cookieMemoTTL {
		return false
	}
	_, ok := e.lines[line]
	return ok
}

// forget drops the lines read of a domain's fields, for every host: this
// process writes them.
func (m *cookieMemo) forget(domain string, fields []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	hosts := m.domains[domain]
	if len(hosts) == 0 {
		return
	}
	set := make(map[string]bool, len(fields))
	for _, f := range fields {
		set[f] = true
	}
	for _, e := range hosts {
		for line, f := range e.lines {
			if set[f] {
				delete(e.lines, line)
			}
		}
	}
}
