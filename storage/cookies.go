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
// Colly's cookie jar wrapper merges before it writes: it reads the host's
// cookies (Cookies), adds the response's new ones and hands the whole list
// back (SetCookies). Written back blindly, a cookie in that list would undo
// a newer value another process stored in between. So SetCookies skips
// every cookie that this process itself just read from Redis (the last 10s
// of reads, per host) and writes only what is new.

// cookieMemoTTL is how long a cookie read from Redis counts as "ours to skip"
// when it comes back through SetCookies.
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
	for _, r := range raw {
		line, _ := r.(string)
		c := parseCookie(line)
		switch {
		case c == nil:
			continue
		case expired(c, now):
			stale = append(stale, cookieField(c), line)
		default:
			lines = append(lines, c.String())
		}
	}
	slices.Sort(lines)
	s.cookies.remember(host, lines, now)
	if len(stale) > 0 {
		s.writeCookies(host, nil, stale)
	}
	return strings.Join(lines, "\n")
}

// SetCookies implements Colly's storage.Storage: it stores the cookies
// (Set-Cookie lines, as Colly's jar wrapper writes them) for u.Host. Each
// cookie is written on its own; cookies the list does not name are kept,
// cookies this process just read are not written back (see above), and a
// cookie that is expired or has Max-Age=0 is deleted. Failures are logged.
func (s *Storage) SetCookies(u *url.URL, cookies string) {
	host, ok := cookieHost(u)
	if !ok {
		return
	}
	now := time.Now()
	seen := s.cookies.recent(host, now)
	var set, del []any
	for _, c := range collystorage.UnstringifyCookies(cookies) {
		if c.Name == "" {
			continue
		}
		line := c.String()
		if _, ok := seen[line]; ok {
			continue
		}
		if expired(c, now) {
			del = append(del, cookieField(c), "")
			continue
		}
		set = append(set, cookieField(c), line)
	}
	if len(set) > 0 || len(del) > 0 {
		s.writeCookies(host, set, del)
	}
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

func cookieField(c *http.Cookie) string { return c.Name + ";" + c.Path + ";" + c.Domain }

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

// cookieMemo remembers, per host, the cookie lines this process read from
// Redis in the last cookieMemoTTL.
type cookieMemo struct {
	mu    sync.Mutex
	hosts map[string]map[string]time.Time
}

func (m *cookieMemo) init() { m.hosts = make(map[string]map[string]time.Time) }

func (m *cookieMemo) remember(host string, lines []string, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.hosts) > 4096 {
		clear(m.hosts)
	}
	h := m.hosts[host]
	if h == nil {
		h = make(map[string]time.Time, len(lines))
		m.hosts[host] = h
	}
	for l, at := range h {
		if now.Sub(at) > cookieMemoTTL {
			delete(h, l)
		}
	}
	for _, l := range lines {
		h[l] = now
	}
}

// recent returns a copy of the lines read for host within the TTL.
func (m *cookieMemo) recent(host string, now time.Time) map[string]struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]struct{}, len(m.hosts[host]))
	for l, at := range m.hosts[host] {
		if now.Sub(at) <= cookieMemoTTL {
			out[l] = struct{}{}
		}
	}
	return out
}
