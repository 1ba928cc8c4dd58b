package proxyswitch

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/proxyswitch/proxyswitch/internal/cookierule"
)

// A session's cookie jar (session.go): the storage and matching rules of
// RFC 6265 section 5.3 and 5.4 (internal/cookierule, shared with package
// storage's cookies), applied in Go, on cookies kept in Redis in
// the hash {prefix:pool}:sjar:<session ID>, one field per cookie
// "<domain>;<path>;<name>" -> "<created µs>|<cookie as JSON>", with the
// session record's TTL. A Domain attribute must name the host or a parent
// of it that is not a public suffix (golang.org/x/net/publicsuffix, as
// net/http/cookiejar: "co.uk" and "com" are refused, except from the host
// of that name itself, where the cookie becomes host-only). Unlike a
// browser, a cookie without an expiry lives as long as the session.

const (
	// maxSessionCookies bounds a session's jar; beyond it the oldest
	// cookies go first.
	maxSessionCookies = 100
	// maxSessionCookieBytes bounds one cookie (name, value, domain and
	// path); a larger one is dropped, as browsers do.
	maxSessionCookieBytes = 4096
)

// jarCookie is one cookie of a session's jar.
type jarCookie struct {
	Name     string `json:"n"`
	Value    string `json:"v"`
	Quoted   bool   `json:"q,omitempty"`
	Domain   string `json:"d"`
	Path     string `json:"p"`
	HostOnly bool   `json:"h,omitempty"`
	Secure   bool   `json:"s,omitempty"`
	Expires  int64  `json:"e,omitempty"` // unix ms; 0: lives as long as the session
	Created  int64  `json:"c"`           // unix µs, for the order of equal paths and eviction
}

func (c *jarCookie) field() string { return c.Domain + ";" + c.Path + ";" + c.Name }

// newJarCookie applies the storage rules to a cookie set by a response to
// u: ok is false when the cookie is refused, del when it deletes the stored
// one (expired, Max-Age <= 0).
func newJarCookie(c *http.Cookie, u *url.URL, now time.Time) (e jarCookie, del, ok bool) {
	host, canon := cookierule.CanonicalHost(u.Hostname())
	if c.Name == "" || host == "" || !canon {
		return e, false, false
	}
	e = jarCookie{Name: c.Name, Value: c.Value, Quoted: c.Quoted, Secure: c.Secure, Created: now.UnixMicro()}
	var allowed bool
	if e.Domain, e.HostOnly, allowed = cookierule.Domain(host, c.Domain); !allowed {
		return e, false, false // a domain the host cannot set cookies for
	}
	e.Path = cookierule.Path(c.Path, u.Path)
	if len(e.Name)+len(e.Value)+len(e.Domain)+len(e.Path) > maxSessionCookieBytes {
		return e, false, false
	}
	at, del := cookierule.Expiry(c, now)
	if del {
		return e, true, true
	}
	if !at.IsZero() {
		e.Expires = at.UnixMilli()
	}
	return e, false, true
}

// matches reports whether c goes with a request to u (host: u's, as
// cookierule.CanonicalHost has it).
func (c *jarCookie) matches(u *url.URL, host string, now int64) bool {
	if c.Expires != 0 && c.Expires <= now {
		return false
	}
	if !cookierule.SecureOK(c.Secure, u.Scheme) || !cookierule.DomainMatch(host, c.Domain, c.HostOnly) {
		return false
	}
	return cookierule.PathMatch(u.Path, c.Path) // decoded, as the default path is (and as net/http/cookiejar matches)
}

// cookiesFor returns the cookies of a jar (its stored values) to send to u,
// longest path first, then oldest first. Values that do not parse are
// skipped.
func cookiesFor(values []string, u *url.URL, now time.Time) []*http.Cookie {
	host, canon := cookierule.CanonicalHost(u.Hostname())
	if !canon {
		return nil
	}
	ms := now.UnixMilli()
	var hits []jarCookie
	for _, v := range values {
		_, raw, ok := strings.Cut(v, "|")
		var c jarCookie
		if !ok || json.Unmarshal([]byte(raw), &c) != nil || c.Name == "" {
			continue
		}
		if c.matches(u, host, ms) {
			hits = append(hits, c)
		}
	}
	slices.SortStableFunc(hits, func(a, b jarCookie) int {
		if n := cmp.Compare(len(b.Path), len(a.Path)); n != 0 {
			return n
		}
		return cmp.Compare(a.Created, b.Created)
	})
	out := make([]*http.Cookie, len(hits))
	for i, c := range hits {
		out[i] = &http.Cookie{Name: c.Name, Value: c.Value, Quoted: c.Quoted}
	}
	return out
}

// cookieHeader is the Cookie header of a request of a session: the
// session's cookies, then the request's own (those it carried before the
// collector's jar added to it) whose names the session does not have.
func cookieHeader(own string, session []*http.Cookie) string {
	names := make(map[string]bool, len(session))
	parts := make([]string, 0, len(session))
	for _, c := range session {
		names[c.Name] = true
		parts = append(parts, c.String())
	}
	for _, p := range strings.Split(own, ";") {
		p = strings.TrimSpace(p)
		name, _, _ := strings.Cut(p, "=")
		if p != "" && !names[strings.TrimSpace(name)] {
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, "; ")
}

// storeCookies stores the Set-Cookie lines of a response to u.url in the
// jar of session u.id. A session retired meanwhile takes nothing.
func (p *redisPool) storeCookies(ctx context.Context, u *sessionUse, lines []string, now time.Time) error {
	changes := map[string]string{} // field -> stored value, "" to delete
	var order []string
	for i, line := range lines {
		c, err := http.ParseSetCookie(line)
		if err != nil {
			continue
		}
		// Cookies of one response count as set one after the other.
		e, del, ok := newJarCookie(c, u.url, now.Add(time.Duration(i)*time.Microsecond))
		if !ok {
			continue
		}
		f := e.field()
		if _, seen := changes[f]; !seen {
			order = append(order, f)
		}
		changes[f] = ""
		if !del {
			b, _ := json.Marshal(e)
			changes[f] = strconv.FormatInt(e.Created, 10) + "|" + string(b)
		}
	}
	if len(order) == 0 {
		return nil
	}
	var set, del []any
	for _, f := range order {
		if v := changes[f]; v != "" {
			set = append(set, f, v)
		} else {
			del = append(del, f)
		}
	}
	args := append(append([]any{u.id, maxSessionCookies, len(set) / 2}, set...), del...)
	res, err := roundTrip(ctx, p.cfg.redisTimeout, func(ctx context.Context) (any, error) {
		return sessionCookiesScript.Run(ctx, p.rdb, []string{p.keys.session(u.task), p.keys.sessionJar(u.id)}, args...).Result()
	}, nil)
	if err != nil {
		return fmt.Errorf("proxyswitch: storing the cookies of task %q's session: %w", u.task, redisErr("session cookies", err))
	}
	if r, ok := res.([]any); ok {
		what := "unexpected reply"
		if len(r) == 2 {
			what, _ = r[1].(string)
		}
		return fmt.Errorf("%w: session of task %q in pool %q (key %s): %s (EndSession deletes it)", ErrCorrupt, u.task, p.name, p.keys.session(u.task), clip(what))
	}
	return nil
}
