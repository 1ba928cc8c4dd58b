package storage

import (
	"context"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	collystorage "github.com/gocolly/colly/v2/storage"
)

// Cookies are kept per host (u.Host, lower-cased, as Colly's own storages
// do) in one Redis hash, one field per cookie "<name>;<path>;<domain>". A
// write replaces single fields in one script, so writers in several
// processes never lose each other's cookies.
//
// The field names a cookie as net/http/cookiejar (the jar of Colly's own
// storage) identifies it: a cookie set without a Path attribute (or with
// one not starting with "/") takes the request's default path (RFC 6265:
// the directory of the request path, "/" for "/x"), and its line is stored
// with that Path; the domain is the Domain attribute lower-cased without
// its leading dot, and "" for a host-only cookie or one whose Domain names
// the request's host itself. So "sid=new" set by /renew replaces
// "sid=old; Path=/", and "sid=; Max-Age=0" set by /logout deletes it.
//
// Colly's cookie jar wrapper merges before it writes: it reads the host's
// cookies (Cookies), adds the response's new ones and hands the whole list
// back (SetCookies). Written back blindly, a cookie in that list would undo
// a newer value another process stored in between. So the Storage
// remembers, per host and field, the line its last read of the host found
// (cookieMemo), and SetCookies skips a cookie whose line is exactly that one
// when this process wrote nothing to the field since: the wrapper's write-back
// of what it just read. Every write of this process forgets the field's
// line, and every read replaces the host's lines, so a cookie the site sets
// again (after deleting or changing it) is always written.

// cookieMemoTTL bounds how long a cookie read from Redis counts as "ours to
// skip" when it comes back through SetCookies; Colly's wrapper writes back
// at once.
const cookieMemoTTL = 10 * time.Second

// Cookies implements Colly's storage.Storage: the cookies stored for
// u.Host, one Set-Cookie line each. Colly's method has no error result, so
// a failure (Redis down, an oversized or foreign hash) is logged and no
// cookies are returned. Expired cookies are removed from Redis on the way,
// unless another process has replaced them meanwhile.
func (s *Storage) Cookies(u *url.URL) string {
	host, ok := cookieHost(u)
	if !ok {
		return ""
	}
	res, err := s.run(context.Background(), "cookies", cookiesGetScript,
		[]string{s.keys.cookies(host)}, maxCookies, maxCookieBytes)
	if err != nil {
		s.cfg.logger.Warn("proxyswitch: reading cookies", "namespace", s.cfg.namespace, "host", host, "err", err)
		return ""
	}
	raw, _ := res.([]any)
	now := time.Now()
	var lines []string
	var stale []any
	read := make(map[string]string, len(raw)/2)
	for i := 0; i+1 < len(raw); i += 2 {
		field, _ := raw[i].(string)
		line, _ := raw[i+1].(string)
		c := parseCookie(line)
		switch {
		case c == nil:
			continue
		case expired(c, now):
			stale = append(stale, field, line)
		default:
			l := c.String()
			lines = append(lines, l)
			read[field] = l
		}
	}
	slices.Sort(lines)
	s.cookies.remember(host, read, now)
	if len(stale) > 0 {
		s.writeCookies(host, nil, stale)
	}
	return strings.Join(lines, "\n")
}

// SetCookies implements Colly's storage.Storage: it stores the cookies
// (Set-Cookie lines, as Colly's jar wrapper writes them) for u.Host. Each
// cookie is written on its own; cookies the list does not name are kept, a
// cookie just as this process's last read found it is not written back
// (see above), a cookie that is expired or has Max-Age=0 is deleted, and of
// two cookies of one name, path and domain the later wins. Failures are
// logged.
func (s *Storage) SetCookies(u *url.URL, cookies string) {
	host, ok := cookieHost(u)
	if !ok {
		return
	}
	now := time.Now()
	hostname := strings.ToLower(u.Hostname())
	lines := make(map[string]string) // field -> line to set, "" to delete
	var fields []string              // in order of first appearance
	put := func(field, line string) {
		if _, ok := lines[field]; !ok {
			fields = append(fields, field)
		}
		lines[field] = line // the last cookie of a field wins, as in a jar
	}
	for _, c := range collystorage.UnstringifyCookies(cookies) {
		if c.Name == "" {
			continue
		}
		attr := c.Path
		if !strings.HasPrefix(c.Path, "/") {
			c.Path = defaultCookiePath(u.Path)
		}
		field := c.Name + ";" + c.Path + ";" + cookieDomain(c.Domain, hostname)
		line := c.String()
		if s.cookies.justRead(host, field, line, now) {
			continue
		}
		if attr != c.Path {
			// An earlier version stored the cookie under its literal
			// Path attribute: that copy goes, or both would be sent.
			put(c.Name+";"+attr+";"+c.Domain, "")
		}
		if expired(c, now) {
			line = ""
		}
		put(field, line)
	}
	if len(fields) == 0 {
		return
	}
	var set, del []any
	for _, f := range fields {
		if l := lines[f]; l != "" {
			set = append(set, f, l)
		} else {
			del = append(del, f, "")
		}
	}
	s.cookies.forget(host, fields)
	s.writeCookies(host, set, del)
}

// writeCookies sets field/line pairs and deletes field/expected pairs
// (expected "" deletes whatever is there) of one host, in one script.
func (s *Storage) writeCookies(host string, set, del []any) {
	args := make([]any, 0, 3+len(set)+len(del))
	args = append(args, host, maxCookies, len(set)/2)
	args = append(append(args, set...), del...)
	_, err := s.run(context.Background(), "set cookies", cookiesSetScript,
		[]string{s.keys.cookies(host), s.keys.cookieHosts()}, args...)
	if err != nil {
		s.cfg.logger.Warn("proxyswitch: storing cookies", "namespace", s.cfg.namespace, "host", host, "err", err)
	}
}

func cookieHost(u *url.URL) (string, bool) {
	if u == nil {
		return "", false
	}
	h := strings.ToLower(u.Host)
	if h == "" || len(h) > maxHostLen || strings.ContainsAny(h, " \t") || strings.ContainsFunc(h, isControl) {
		return "", false
	}
	return h, true
}

// cookieDomain is the domain part of a cookie's field: the Domain attribute
// lower-cased without its leading dot, "" if that is the request's host
// (hostname, lower-cased) or the cookie has none (net/http/cookiejar keys
// both by the host).
func cookieDomain(domain, hostname string) string {
	d := strings.ToLower(strings.TrimPrefix(domain, "."))
	if d == hostname {
		return ""
	}
	return d
}

// defaultCookiePath is RFC 6265's default-path of a request path, as
// net/http/cookiejar computes it.
func defaultCookiePath(p string) string {
	i := strings.LastIndex(p, "/")
	if !strings.HasPrefix(p, "/") || i <= 0 {
		return "/"
	}
	return p[:i]
}

func parseCookie(line string) *http.Cookie {
	c, err := http.ParseSetCookie(line)
	if err != nil {
		return nil
	}
	return c
}

func expired(c *http.Cookie, now time.Time) bool {
	return c.MaxAge < 0 || (!c.Expires.IsZero() && c.Expires.Before(now))
}

// cookieMemo remembers, per host and field, the cookie line this process's
// last read of the host found there (see above).
type cookieMemo struct {
	mu    sync.Mutex
	hosts map[string]*hostMemo
}

type hostMemo struct {
	at    time.Time         // when the host was read
	lines map[string]string // field -> line read, until this process writes the field
}

func (m *cookieMemo) init() { m.hosts = make(map[string]*hostMemo) }

// remember records a read of host: lines are its fields and lines, and
// replace whatever an earlier read found.
func (m *cookieMemo) remember(host string, lines map[string]string, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.hosts) > 4096 {
		for h, e := range m.hosts {
			if now.Sub(e.at) > cookieMemoTTL {
				delete(m.hosts, h)
			}
		}
		if len(m.hosts) > 4096 {
			clear(m.hosts)
		}
	}
	m.hosts[host] = &hostMemo{at: now, lines: lines}
}

// justRead reports whether line is what the last read of host (within the
// TTL) found in field, and this process wrote the field no line since.
func (m *cookieMemo) justRead(host, field, line string, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.hosts[host]
	if e == nil || now.Sub(e.at) > cookieMemoTTL {
		return false
	}
	l, ok := e.lines[field]
	return ok && l == line
}

// forget drops the lines read of host's fields: this process writes them.
func (m *cookieMemo) forget(host string, fields []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.hosts[host]; e != nil {
		for _, f := range fields {
			delete(e.lines, f)
		}
	}
}
