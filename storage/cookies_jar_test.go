package storage

import (
	"fmt"
	"net/http"
	"net/url"
	"testing"

	"github.com/gocolly/colly/v2"
	"github.com/stretchr/testify/require"
)

// cookieSite answers every path with the Cookie header it received, and
// sets the cookies sets[path] names (raw Set-Cookie lines).
func cookieSite(t *testing.T, sets map[string][]string) *countingSite {
	return newCountingSite(t, func(w http.ResponseWriter, r *http.Request) {
		for _, line := range sets[r.URL.Path] {
			w.Header().Add("Set-Cookie", line)
		}
		fmt.Fprint(w, r.Header.Get("Cookie"))
	})
}

// visitAll visits the paths in order on one collector with AllowURLRevisit,
// on s (or, if s is nil, on Colly's own in-memory storage: net/http's
// cookiejar), and returns the Cookie header each request sent.
func visitAll(t *testing.T, s *Storage, site *countingSite, paths ...string) []string {
	t.Helper()
	c := colly.NewCollector(colly.AllowURLRevisit())
	if s != nil {
		require.NoError(t, c.SetStorage(s))
	}
	sent := make([]string, 0, len(paths))
	c.OnResponse(func(r *colly.Response) { sent = append(sent, string(r.Body)) })
	for _, p := range paths {
		require.NoError(t, c.Visit(site.URL+p))
	}
	require.Len(t, sent, len(paths))
	return sent
}

// A cookie the site sets again soon after this process read it (and
// deleted or overwrote it meanwhile) is stored again, as Colly's own
// storage does: the memo of cookies just read must not swallow it.
func TestCookieSetAgainWithinMemo(t *testing.T) {
	site := cookieSite(t, map[string][]string{
		"/accept": {"consent=yes; Path=/"},
		"/revoke": {"consent=; Path=/; Max-Age=0"},
		"/en":     {"lang=en"},
		"/de":     {"lang=de"},
	})
	consent := []string{"/accept", "/check", "/revoke", "/check", "/accept", "/check"}
	want := []string{"", "consent=yes", "consent=yes", "", "", "consent=yes"}
	require.Equal(t, want, visitAll(t, nil, site, consent...), "Colly's own storage")
	require.Equal(t, want, visitAll(t, newStorage(t, shared.Client(t)), site, consent...))

	lang := []string{"/en", "/de", "/en", "/check"}
	want = []string{"", "lang=en", "lang=de", "lang=en"}
	require.Equal(t, want, visitAll(t, nil, site, lang...), "Colly's own storage")
	require.Equal(t, want, visitAll(t, newStorage(t, shared.Client(t)), site, lang...))
}

// Direct calls, without Colly's jar: a cookie deleted or overwritten by
// this process and then set again to the value it had when last read is
// stored, while a write-back of exactly what was just read is still
// skipped (TestCookiesWriteBackDoesNotRevert).
func TestCookieMemoForgetsOnWrite(t *testing.T) {
	s := newStorage(t, shared.Client(t))
	u, _ := url.Parse("http://memo.example/")
	s.SetCookies(u, "a=1; Path=/")
	require.Equal(t, "a=1; Path=/", s.Cookies(u))
	s.SetCookies(u, "a=; Path=/; Max-Age=0")
	s.SetCookies(u, "a=1; Path=/")
	require.Equal(t, "a=1; Path=/", s.Cookies(u), "re-set after a delete")
	s.SetCookies(u, "a=2; Path=/")
	s.SetCookies(u, "a=1; Path=/")
	require.Equal(t, "a=1; Path=/", s.Cookies(u), "re-set after an overwrite")
}

// A cookie without a Path attribute takes the request's default path (RFC
// 6265, as net/http/cookiejar does), so it replaces a cookie of that name
// set with that path, and a logout without Path deletes it. A Domain
// attribute naming the host itself keys the cookie as a host-only one.
func TestCookieDefaultPath(t *testing.T) {
	site := cookieSite(t, map[string][]string{
		"/login":      {"sid=old; Path=/"},
		"/renew":      {"sid=new"},
		"/logout":     {"sid=; Max-Age=0"},
		"/a/b/set":    {"x=1"},
		"/a/b/reset":  {"x=2; Path=/a/b"},
		"/a/b/delete": {"x=; Max-Age=0"},
	})
	paths := []string{"/login", "/renew", "/check", "/logout", "/check",
		"/a/b/set", "/a/b/check", "/a/b/reset", "/a/b/check", "/a/b/delete", "/a/b/check"}
	want := []string{"", "sid=old", "sid=new", "sid=new", "",
		"", "x=1", "x=1", "x=2", "x=2", ""}
	require.Equal(t, want, visitAll(t, nil, site, paths...), "Colly's own storage")
	require.Equal(t, want, visitAll(t, newStorage(t, shared.Client(t)), site, paths...))

	rdb := shared.Client(t)
	s := newStorage(t, rdb)
	u, _ := url.Parse("http://Shop.Example:8080/x")
	s.SetCookies(u, "d=1")
	s.SetCookies(u, "d=2; Domain=.shop.example")
	require.Equal(t, "d=2; Path=/; Domain=shop.example", s.Cookies(u))
	s.SetCookies(u, "d=; Domain=shop.example; Max-Age=0")
	require.Empty(t, s.Cookies(u))

	// The last cookie of a field in one list wins, as in a jar.
	s.SetCookies(u, "e=1; Path=/\ne=; Path=/; Max-Age=0\nf=1\nf=2")
	require.Equal(t, "f=2; Path=/", s.Cookies(u))

	// A cookie an earlier version stored (in its hash per host and port)
	// under its literal, empty Path is moved into the domain's jar with
	// Path=/ when the host is read, and replaced by the same cookie set
	// again without Path.
	key := s.keys.legacyCookies("shop.example:8080")
	require.NoError(t, rdb.HSet(bg, key, "sid;;", "sid=old").Err())
	require.Equal(t, "f=2; Path=/\nsid=old; Path=/", s.Cookies(u))
	n, err := rdb.Exists(bg, key).Result()
	require.NoError(t, err)
	require.Zero(t, n, "the hash of the earlier version stays")
	s.SetCookies(u, "sid=new")
	require.Equal(t, "f=2; Path=/\nsid=new; Path=/", s.Cookies(u))
}

// Known limitation (storage/cookies.go's header, reviewer's bugs 1 and 2):
// a write-back of what a wrapper read undoes a deletion or change made
// between its read and its write when the memo no longer recognises the
// line. Kept as reproducers, skipped.
func TestCookieWriteBackAfterSameProcessDelete(t *testing.T) {
	t.Skip("known limitation: storage/cookies.go, Colly's cookie jar wrapper")
	s := newStorage(t, shared.Client(t))
	u, _ := url.Parse("http://www.shop.test/")
	s.SetCookies(u, "sid=old; Path=/")
	readA := s.Cookies(u) // collector A's wrapper: read before merge
	_ = s.Cookies(u)      // collector B's wrapper: read before merge
	s.SetCookies(u, "sid=; Max-Age=0")
	require.Equal(t, "", s.Cookies(u), "B logged out")
	s.SetCookies(u, "y=1\n"+readA) // A's wrapper: response's y, then what it read
	require.Equal(t, "y=1; Path=/", s.Cookies(u), "deleted sid resurrected by A's write-back")
}

func TestCookieWriteBackAfterReadInBetween(t *testing.T) {
	t.Skip("known limitation: storage/cookies.go, Colly's cookie jar wrapper")
	a := newStorage(t, shared.Client(t))
	b := twin(t, a, shared.Client(t))
	u, _ := url.Parse("http://www.shop.test/login")
	other, _ := url.Parse("http://www.shop.test/page")
	a.SetCookies(u, "sid=old; Path=/")
	readA := a.Cookies(u)
	b.SetCookies(u, "sid=new; Path=/")
	_ = a.Cookies(other) // another goroutine of A: a request's jar read
	a.SetCookies(u, "y=1; Path=/\n"+readA)
	require.Contains(t, a.Cookies(u), "sid=new", "stale write-back overwrote a newer value")
}
