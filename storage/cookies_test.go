package storage

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/stretchr/testify/require"
)

// A cookie one collector receives is sent by another collector on another
// client (another server, in production).
func TestCookiesSharedAcrossCollectors(t *testing.T) {
	site := newCountingSite(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/login" {
			http.SetCookie(w, &http.Cookie{Name: "session", Value: "s3cr3t", Path: "/"})
		}
		fmt.Fprintf(w, "cookies: %s", r.Header.Get("Cookie"))
	})
	s := newStorage(t, shared.Client(t))
	a, b := colly.NewCollector(colly.AllowURLRevisit()), colly.NewCollector(colly.AllowURLRevisit())
	require.NoError(t, a.SetStorage(s))
	require.NoError(t, b.SetStorage(twin(t, s, shared.Client(t))))
	require.NoError(t, a.Visit(site.URL+"/login"))
	var body string
	b.OnResponse(func(r *colly.Response) { body = string(r.Body) })
	require.NoError(t, b.Visit(site.URL+"/page"))
	require.Equal(t, "cookies: session=s3cr3t", body)
}

// Collectors on several clients set different cookies of one host at the
// same time, through Colly's own jar wrapper (read, merge, write back the
// whole list): no cookie is lost.
func TestCookiesConcurrentWritersLoseNothing(t *testing.T) {
	const writers, each = 6, 25
	s := newStorage(t, shared.Client(t))
	u := "http://shop.example/"
	var wg sync.WaitGroup
	for w := range writers {
		st := s
		if w > 0 {
			st = twin(t, s, shared.Client(t))
		}
		c := colly.NewCollector()
		require.NoError(t, c.SetStorage(st))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				ck := &http.Cookie{Name: fmt.Sprintf("w%d_%d", w, i), Value: "v", Path: "/"}
				if err := c.SetCookies(u, []*http.Cookie{ck}); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	pu, _ := url.Parse(u)
	got := s.Cookies(pu)
	require.Equal(t, writers*each, strings.Count(got, "\n")+1, got)
}

// Colly's jar wrapper writes back the cookies it read; a value another
// process stored in between must survive that.
func TestCookiesWriteBackDoesNotRevert(t *testing.T) {
	a := newStorage(t, shared.Client(t))
	b := twin(t, a, shared.Client(t))
	u, _ := url.Parse("http://shop.example/")
	b.SetCookies(u, "x=old; Path=/")
	read := a.Cookies(u) // a reads x=old
	require.Equal(t, "x=old; Path=/", read)
	b.SetCookies(u, "x=new; Path=/")      // b updates x
	a.SetCookies(u, "y=1; Path=/\n"+read) // a writes back the merged list
	require.Equal(t, "x=new; Path=/\ny=1; Path=/", a.Cookies(u))
}

// Max-Age=0 (or an Expires in the past) deletes a cookie; expired cookies
// are pruned on read; path and domain keep same-named cookies apart.
// (Before the cookies followed RFC 6265, a read at /x returned a=2 of
// /sub too: the URL is now one under /sub.)
func TestCookiesDeleteAndExpire(t *testing.T) {
	rdb := shared.Client(t)
	s := newStorage(t, rdb)
	u, _ := url.Parse("http://Shop.Example:8080/sub/x")
	s.SetCookies(u, "a=1; Path=/\na=2; Path=/sub\nb=1; Path=/")
	require.Equal(t, "a=2; Path=/sub\na=1; Path=/\nb=1; Path=/", s.Cookies(u))
	s.SetCookies(u, "a=; Path=/; Max-Age=0")
	require.Equal(t, "a=2; Path=/sub\nb=1; Path=/", s.Cookies(u))

	pastAt := time.Now().Add(-time.Hour)
	past := pastAt.UTC().Format(http.TimeFormat)
	require.NoError(t, rdb.HSet(bg, s.keys.cookieJar("shop.example"), "shop.example;/;c",
		fmt.Sprintf("1|h|%d|c=1; Path=/; Expires=%s", pastAt.UnixMilli(), past)).Err())
	require.Equal(t, "a=2; Path=/sub\nb=1; Path=/", s.Cookies(u))
	n, err := rdb.HLen(bg, s.keys.cookieJar("shop.example")).Result()
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "expired cookie not pruned")

	s.SetCookies(u, "a=; Path=/sub; Max-Age=0\nb=; Path=/; Max-Age=0")
	require.Empty(t, s.Cookies(u))
	domains, err := rdb.SMembers(bg, s.keys.cookieDomains()).Result()
	require.NoError(t, err)
	require.Empty(t, domains, "registry keeps a domain without cookies")
}

// A cookie jar over its limits (written by something else) is trimmed
// on read, not reported as corrupt; a response with more cookies than a
// jar holds keeps the latest (the dropped ones logged); a foreign kind of
// value is reported (logged, since Colly's cookie methods return no
// error) and yields no cookies; bad input is ignored without a panic.
func TestCookiesBadValues(t *testing.T) {
	rdb := shared.Client(t)
	var log bytes.Buffer
	s := newStorage(t, rdb, WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
	u, _ := url.Parse("http://big.example/")
	key := s.keys.cookieJar("big.example")
	require.NoError(t, rdb.HSet(bg, key, "big.example;/;a", strings.Repeat("x", maxCookieBytes+1)).Err())
	s.SetCookies(u, "b=1; Path=/")
	require.Equal(t, "b=1; Path=/", s.Cookies(u))
	require.NotContains(t, log.String(), "corrupt")
	n, err := rdb.HLen(bg, key).Result()
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the oversized foreign entry is removed")

	log.Reset()
	require.NoError(t, rdb.Del(bg, key).Err())
	// (net/http parses at most 3000 cookies of one text, maxCookies: the
	// byte limit is the one a response can pass.)
	var lines []string
	big := strings.Repeat("v", maxCookieValue-100)
	fit := maxCookieBytes / (maxCookieValue - 100 + 16 + cookieCreatedLen)
	for i := range fit + 3 {
		lines = append(lines, fmt.Sprintf("c%d=%s", i, big))
	}
	s.SetCookies(u, strings.Join(lines, "\n"))
	require.Contains(t, log.String(), "the earliest not stored")
	require.NotContains(t, log.String(), "vvvv", "a cookie value logged")
	got := s.Cookies(u)
	require.False(t, strings.HasPrefix(got, "c0="), "the earliest cookie was stored")
	require.Contains(t, got, fmt.Sprintf("\nc%d=", fit+2), "the latest cookie was not stored")
	require.GreaterOrEqual(t, strings.Count(got, "\n")+1, fit)

	log.Reset()
	require.NoError(t, rdb.Set(bg, key, "not a hash", 0).Err())
	require.Empty(t, s.Cookies(u))
	require.Contains(t, log.String(), "corrupt value in redis")
	require.Contains(t, log.String(), key+": holds the wrong kind of value", "the key a WRONGTYPE met is named")

	s.SetCookies(nil, "a=1")
	require.Empty(t, s.Cookies(nil))
	require.Empty(t, s.Cookies(&url.URL{Path: "/no-host"}))
	s.SetCookies(u, "\n\n;;;=\x00")
}
