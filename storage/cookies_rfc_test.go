package storage

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	collystorage "github.com/gocolly/colly/v2/storage"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/publicsuffix"
)

// cookieStep is one step of a cookie table test: Set-Cookie lines set by a
// response to url, or (no lines) a read of the cookies for url.
type cookieStep struct {
	url   string
	lines []string
	want  *string // for a read: the expected "n=v; n=v", besides the oracle's
	// wantColly, if set, replaces want through a collector.
	wantColly *string
}

func wantCookies(s string) *string { return &s }

// cookieNames is the cookies as "n=v; n=v", in order.
func cookieNames(cs []*http.Cookie) string {
	parts := make([]string, len(cs))
	for i, c := range cs {
		parts[i] = c.Name + "=" + c.Value
	}
	return strings.Join(parts, "; ")
}

// The storage's cookies, through Colly's own jar wrapper (a collector's
// SetCookies and Cookies), are those net/http/cookiejar with the public
// suffix list (what Colly's default storage wraps) gives: domain cookies
// across subdomains, host-only cookies on their host, path-match and the
// default path, Secure, expiry and deletion, refused domains (another
// domain, a public suffix, an IP's part), overwrites, and the order
// (longest path first, then the earliest created; an overwrite keeps its
// place).
func TestCookiesMatchCookiejar(t *testing.T) {
	past := time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat)
	future := time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)
	steps := []cookieStep{
		// Domain and host-only cookies.
		{url: "https://www.shop.test/login", lines: []string{
			"sid=1; Domain=shop.test; Path=/", "host=1; Path=/", "dot=1; Domain=.shop.test; Path=/", "upper=1; Domain=SHOP.Test; Path=/"}},
		{url: "https://www.shop.test/", want: wantCookies("sid=1; host=1; dot=1; upper=1")},
		{url: "https://api.shop.test/", want: wantCookies("sid=1; dot=1; upper=1")},
		{url: "https://m.shop.test/x/y", want: wantCookies("sid=1; dot=1; upper=1")},
		{url: "https://shop.test/", want: wantCookies("sid=1; dot=1; upper=1")},
		{url: "https://a.b.shop.test/", want: wantCookies("sid=1; dot=1; upper=1")},
		{url: "https://www.shop.test:8443/", want: wantCookies("sid=1; host=1; dot=1; upper=1")}, // ports do not matter
		{url: "https://WWW.Shop.Test/", want: wantCookies("sid=1; host=1; dot=1; upper=1")},
		{url: "https://shop.test.evil/", want: wantCookies("")},
		{url: "https://notshop.test/", want: wantCookies("")},
		// The host itself as Domain: a domain cookie, sent to its subdomains.
		{url: "https://www.shop.test/", lines: []string{"self=1; Domain=www.shop.test; Path=/"}},
		{url: "https://m.www.shop.test/", want: wantCookies("sid=1; dot=1; upper=1; self=1")},
		// Refused domains: another site, a public suffix, malformed ones.
		{url: "https://www.shop.test/", lines: []string{
			"o=1; Domain=other.test; Path=/", "sib=1; Domain=api.shop.test; Path=/", "tld=1; Domain=test; Path=/",
			"tdot=1; Domain=shop.test.; Path=/", "ddot=1; Domain=..shop.test; Path=/", "dot0=1; Domain=.; Path=/"}},
		{url: "https://other.test/", want: wantCookies("")},
		{url: "https://api.shop.test/", want: wantCookies("sid=1; dot=1; upper=1")},
		{url: "https://www.shop.co.uk/", lines: []string{"a=1; Domain=co.uk", "b=1; Domain=shop.co.uk", "c=1; Domain=uk", "d=1; Domain=.co.uk"}},
		{url: "https://m.shop.co.uk/", want: wantCookies("b=1")},
		{url: "https://other.co.uk/", want: wantCookies("")},
		{url: "https://www.shop.com/", lines: []string{"x=1; Domain=com", "y=1; Domain=shop.com"}},
		{url: "https://evil.com/", want: wantCookies("")},
		{url: "https://shop.com/", want: wantCookies("y=1")},
		// A public suffix as a host: its Domain cookie is host-only.
		{url: "https://github.io/", lines: []string{"f=1; Domain=github.io"}},
		{url: "https://alice.github.io/", lines: []string{"g=1; Domain=github.io", "h=1; Domain=alice.github.io"}},
		{url: "https://github.io/", want: wantCookies("f=1")},
		{url: "https://alice.github.io/", want: wantCookies("h=1")},
		{url: "https://x.alice.github.io/", want: wantCookies("h=1")},
		{url: "https://bob.github.io/", want: wantCookies("")},
		// IP hosts: only the IP itself as Domain, and host-only.
		{url: "http://127.0.0.1:8080/", lines: []string{"a=1", "b=1; Domain=127.0.0.1", "c=1; Domain=0.0.1", "d=1; Domain=.127.0.0.1"}},
		{url: "http://127.0.0.1:9090/x", want: wantCookies("a=1; b=1"), wantColly: wantCookies("a=1; b=1; c=1; d=1")},
		{url: "http://127.0.0.2/", want: wantCookies("")},
		{url: "http://localhost/", lines: []string{"l=1", "m=1; Domain=localhost"}},
		{url: "http://localhost:1/", want: wantCookies("l=1; m=1")},
		// Paths: /a matches /a and /a/b, not /ab; the default path.
		{url: "http://paths.test/a/set", lines: []string{"def=1", "ab=1; Path=/ab", "asub=1; Path=/a/b", "root=1; Path=/", "slash=1; Path=/a/", "rel=1; Path=a/b"}},
		{url: "http://paths.test/a", want: wantCookies("def=1; rel=1; root=1")},
		{url: "http://paths.test/a/", want: wantCookies("slash=1; def=1; rel=1; root=1")},
		{url: "http://paths.test/ab", want: wantCookies("ab=1; root=1")},
		{url: "http://paths.test/a/b", want: wantCookies("asub=1; slash=1; def=1; rel=1; root=1")},
		{url: "http://paths.test/a/b/c", want: wantCookies("asub=1; slash=1; def=1; rel=1; root=1")},
		{url: "http://paths.test/a/bc", want: wantCookies("slash=1; def=1; rel=1; root=1")},
		{url: "http://paths.test/abc", want: wantCookies("root=1")},
		{url: "http://paths.test", want: wantCookies("root=1")},
		{url: "http://paths.test/x/y/z", lines: []string{"deep=1"}}, // default path /x/y
		{url: "http://paths.test/x/y", want: wantCookies("deep=1; root=1")},
		{url: "http://paths.test/x", want: wantCookies("root=1")},
		{url: "http://paths.test/caf%C3%A9/menu", lines: []string{"cafe=1"}}, // default path /café (decoded)
		{url: "http://paths.test/caf%C3%A9/dessert", want: wantCookies("cafe=1; root=1")},
		{url: "http://paths.test/caf/", want: wantCookies("root=1")},
		// Secure: https only.
		{url: "https://sec.test/", lines: []string{"s=1; Secure; Path=/", "p=1; Path=/"}},
		{url: "http://sec.test/", want: wantCookies("p=1")},
		{url: "https://sec.test/", want: wantCookies("s=1; p=1")},
		{url: "http://sec.test/", lines: []string{"s2=1; Secure; Path=/"}}, // set over http: net/http/cookiejar keeps it
		{url: "https://sec.test/", want: wantCookies("s=1; p=1; s2=1")},
		// Expiry: Max-Age and Expires; Max-Age=0 or a past Expires deletes.
		{url: "http://exp.test/", lines: []string{
			"ma=1; Max-Age=3600; Path=/", "ex=1; Expires=" + future + "; Path=/", "old=1; Expires=" + past + "; Path=/",
			"neg=1; Max-Age=-1; Path=/", "gone=1; Path=/", "gone2=1; Path=/", "dom=1; Domain=exp.test; Path=/"}},
		{url: "http://exp.test/", want: wantCookies("ma=1; ex=1; gone=1; gone2=1; dom=1")},
		{url: "http://exp.test/", lines: []string{"gone=x; Max-Age=0; Path=/", "gone2=x; Expires=" + past + "; Path=/", "dom=; Domain=.exp.test; Path=/; Max-Age=0"}},
		{url: "http://exp.test/", want: wantCookies("ma=1; ex=1")},
		{url: "http://exp.test/", lines: []string{"ma=; Path=/x; Max-Age=0"}}, // another path: no match, nothing deleted
		{url: "http://exp.test/", want: wantCookies("ma=1; ex=1")},
		// Overwrites of one (domain, path, name) keep the first creation.
		{url: "http://ow.test/", lines: []string{"ow=1; Path=/"}},
		{url: "http://ow.test/", lines: []string{"later=1; Path=/"}},
		{url: "http://ow.test/", lines: []string{"ow=2; Path=/"}},
		{url: "http://ow.test/", want: wantCookies("ow=2; later=1")},
		{url: "http://ow.test/", lines: []string{"ow=3; Path=/", "ow=4; Path=/"}}, // the last of one response wins
		{url: "http://ow.test/", want: wantCookies("ow=4; later=1")},
		// A host-only and a domain cookie of one domain, path and name are
		// one cookie: the later replaces the earlier.
		{url: "http://www.ow.test/", lines: []string{"same=host; Path=/"}},
		{url: "http://www.ow.test/", lines: []string{"same=dom; Domain=www.ow.test; Path=/"}},
		{url: "http://m.www.ow.test/", want: wantCookies("same=dom")},
		{url: "http://www.ow.test/", lines: []string{"same=host2; Path=/"}},
		{url: "http://m.www.ow.test/", want: wantCookies("")},
		{url: "http://www.ow.test/", want: wantCookies("same=host2")},
		// Same name, different domains and paths: apart.
		{url: "http://www.two.test/p/q", lines: []string{"n=host; Path=/", "n=dom; Domain=two.test; Path=/", "n=path; Path=/p"}},
		{url: "http://www.two.test/p/q", want: wantCookies("n=path; n=host; n=dom")},
		{url: "http://api.two.test/p/q", want: wantCookies("n=dom")},
	}

	// Through a collector (Colly's jar wrapper), the oracle gets the
	// cookies as the wrapper's serialization passes them to a storage
	// (it drops a Domain it deems invalid, "0.0.1": the cookie becomes
	// host-only, with Colly's own storage too); called directly, the
	// storage gets the Set-Cookie lines as they are.
	for _, viaColly := range []bool{true, false} {
		t.Run(map[bool]string{true: "collector", false: "direct"}[viaColly], func(t *testing.T) {
			st := newStorage(t, shared.Client(t))
			c := colly.NewCollector()
			require.NoError(t, c.SetStorage(st))
			oracle, err := cookiejar.New(&cookiejar.Options{PublicSuffixList: publicsuffix.List})
			require.NoError(t, err)
			for i, s := range steps {
				u, err := url.Parse(s.url)
				require.NoError(t, err)
				if len(s.lines) > 0 {
					var cs []*http.Cookie
					for _, l := range s.lines {
						ck, err := http.ParseSetCookie(l)
						require.NoError(t, err, l)
						cs = append(cs, ck)
					}
					if viaColly {
						require.NoError(t, c.SetCookies(s.url, cs))
						oracle.SetCookies(u, collystorage.UnstringifyCookies(collystorage.StringifyCookies(cs)))
					} else {
						st.SetCookies(u, strings.Join(s.lines, "\n"))
						oracle.SetCookies(u, cs)
					}
					continue
				}
				exp := cookieNames(oracle.Cookies(u))
				var got string
				if viaColly {
					got = cookieNames(c.Cookies(s.url))
				} else {
					got = cookieNames(collystorage.UnstringifyCookies(st.Cookies(u)))
				}
				require.Equal(t, exp, got, "step %d: %s (oracle: net/http/cookiejar)", i, s.url)
				if s.want != nil && (!viaColly || s.wantColly == nil) {
					require.Equal(t, *s.want, got, "step %d: %s", i, s.url)
				}
				if viaColly && s.wantColly != nil {
					require.Equal(t, *s.wantColly, got, "step %d: %s", i, s.url)
				}
			}
		})
	}
}

// loopbackTransport sends every request, whatever its host name, to addr:
// one test server answers for www.shop.test, api.shop.test and others.
func loopbackTransport(addr string) *http.Transport {
	d := &net.Dialer{Timeout: 5 * time.Second}
	return &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return d.DialContext(ctx, network, addr)
	}}
}

// A login cookie set by www.shop.test for the domain (Domain=shop.test)
// is sent by another collector, on another Redis client, to api.shop.test
// and m.shop.test, as Colly's own storage sends it; a host-only cookie and
// one of Path=/admin stay where they belong; no cookie goes to another site.
func TestCookiesDomainLoginThroughCollector(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/login" {
			w.Header().Add("Set-Cookie", "session=s3cr3t; Domain=shop.test; Path=/; HttpOnly")
			w.Header().Add("Set-Cookie", "wwwonly=1; Path=/")
			w.Header().Add("Set-Cookie", "adm=1; Path=/admin")
			w.Header().Add("Set-Cookie", "bad=1; Domain=other.test; Path=/")
		}
		fmt.Fprintf(w, "%s|%s", r.Host, r.Header.Get("Cookie"))
	}))
	t.Cleanup(srv.Close)
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	at := func(host, path string) string { return fmt.Sprintf("http://%s:%d%s", host, port, path) }
	visits := []string{
		at("api.shop.test", "/me"), at("m.shop.test", "/"), at("www.shop.test", "/"),
		at("www.shop.test", "/admin/users"), at("api.shop.test", "/admin"), at("other.test", "/"),
	}
	run := func(login, rest *colly.Collector) []string {
		var got []string
		require.NoError(t, login.Visit(at("www.shop.test", "/login")))
		rest.OnResponse(func(r *colly.Response) { got = append(got, string(r.Body)) })
		for _, v := range visits {
			require.NoError(t, rest.Visit(v))
		}
		return got
	}
	newCollector := func(st *Storage) *colly.Collector {
		c := colly.NewCollector(colly.AllowURLRevisit())
		c.WithTransport(loopbackTransport(srv.Listener.Addr().String()))
		if st != nil {
			require.NoError(t, c.SetStorage(st))
		}
		return c
	}
	want := []string{
		fmt.Sprintf("api.shop.test:%d|session=s3cr3t", port),
		fmt.Sprintf("m.shop.test:%d|session=s3cr3t", port),
		fmt.Sprintf("www.shop.test:%d|session=s3cr3t; wwwonly=1", port),
		fmt.Sprintf("www.shop.test:%d|adm=1; session=s3cr3t; wwwonly=1", port),
		fmt.Sprintf("api.shop.test:%d|session=s3cr3t", port),
		fmt.Sprintf("other.test:%d|", port),
	}
	one := newCollector(nil) // Colly's own storage: one collector
	require.Equal(t, want, run(one, one), "Colly's own storage")

	a := newStorage(t, shared.Client(t))
	b := twin(t, a, shared.Client(t))
	require.Equal(t, want, run(newCollector(a), newCollector(b)))
}

// Storages on separate clients, through Colly's jar wrapper (read, merge,
// write back), set domain cookies and host-only cookies for hosts of one
// domain at once: nothing is lost, and each host sees its own host-only
// cookies and every domain cookie.
func TestCookiesConcurrentDomainWritersLoseNothing(t *testing.T) {
	const writers, each = 4, 25
	s := newStorage(t, shared.Client(t))
	var wg sync.WaitGroup
	for w := range writers {
		st := s
		if w%2 == 1 {
			st = twin(t, s, shared.Client(t))
		}
		c := colly.NewCollector()
		require.NoError(t, c.SetStorage(st))
		host := fmt.Sprintf("http://h%d.shop.test/", w)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				cs := []*http.Cookie{
					{Name: fmt.Sprintf("d%d_%d", w, i), Value: "v", Path: "/", Domain: "shop.test"},
					{Name: fmt.Sprintf("h%d_%d", w, i), Value: "v", Path: "/"},
				}
				if err := c.SetCookies(host, cs); err != nil {
					t.Error(err)
				}
				_ = c.Cookies(host)
			}
		}()
	}
	wg.Wait()
	count := func(u, prefix string) int {
		pu, _ := url.Parse(u)
		n := 0
		for _, l := range strings.Split(s.Cookies(pu), "\n") {
			if strings.HasPrefix(l, prefix) {
				n++
			}
		}
		return n
	}
	require.Equal(t, writers*each, count("http://x.shop.test/", "d"), "domain cookies")
	require.Zero(t, count("http://x.shop.test/", "h"), "host-only cookies went to another host")
	for w := range writers {
		require.Equal(t, each, count(fmt.Sprintf("http://h%d.shop.test/", w), fmt.Sprintf("h%d_", w)), "host-only cookies of h%d", w)
	}
}

// A domain cookie read on one host and written back by Colly's wrapper on
// that host does not undo a newer value another process set from another
// host of the domain.
func TestCookiesDomainWriteBackDoesNotRevert(t *testing.T) {
	a := newStorage(t, shared.Client(t))
	b := twin(t, a, shared.Client(t))
	www, _ := url.Parse("http://www.shop.test/")
	api, _ := url.Parse("http://api.shop.test/v1/x")
	b.SetCookies(www, "sid=old; Domain=shop.test; Path=/")
	read := a.Cookies(api)
	require.Equal(t, "sid=old; Path=/; Domain=shop.test", read)
	b.SetCookies(www, "sid=new; Domain=shop.test; Path=/")
	a.SetCookies(api, "y=1\n"+read) // the wrapper's merged list: the response's y, then what it read
	require.Equal(t, "y=1; Path=/v1\nsid=new; Path=/; Domain=shop.test", a.Cookies(api))
	require.Equal(t, "sid=new; Path=/; Domain=shop.test", a.Cookies(www))
}

// The cookies an earlier version kept per host (and port) are moved into
// the domain's jar when the host is read, by the rules (a Domain the host
// may not set is dropped), without overwriting what the jar got since; a
// write for the host moves them first, so an old value never overwrites a
// newer one. The old hash and its registry entry go.
func TestCookiesEarlierVersionMoved(t *testing.T) {
	rdb := shared.Client(t)
	s := newStorage(t, rdb)
	old := s.keys.legacyCookies("www.shop.test:8080")
	require.NoError(t, rdb.HSet(bg, old,
		"sid;/;shop.test", "sid=1; Path=/; Domain=shop.test",
		"own;/;", "own=old; Path=/",
		"bad;/;other.test", "bad=1; Path=/; Domain=other.test",
		"deep;/x;", "deep=1; Path=/x",
		"lit;;", "lit=1",
		"ma;/;", "ma=1; Path=/; Max-Age=3600",
		"junk", "\x00;;=",
	).Err())
	require.NoError(t, rdb.SAdd(bg, s.keys.cookieHosts(), "www.shop.test:8080").Err())
	www, _ := url.Parse("http://www.shop.test:8080/x/y")
	api, _ := url.Parse("http://api.shop.test/x/y")

	// Written since the upgrade, by another host's URL: newer, it stays.
	own, _ := url.Parse("http://www.shop.test/")
	s.SetCookies(own, "own=new; Path=/")
	require.Equal(t, "own=new; Path=/", s.Cookies(own), "the port-less host has no old hash")
	require.Equal(t, "", s.Cookies(api), "not moved before its host is read")

	got := s.Cookies(www)
	require.Regexp(t, `^deep=1; Path=/x\nown=new; Path=/\n`, got)
	for _, c := range []string{"sid=1; Path=/; Domain=shop.test", "lit=1; Path=/", "ma=1; Path=/; Expires="} {
		require.Contains(t, got, c)
	}
	require.NotContains(t, got, "bad=")
	require.Equal(t, "sid=1; Path=/; Domain=shop.test", s.Cookies(api))
	n, err := rdb.Exists(bg, old).Result()
	require.NoError(t, err)
	require.Zero(t, n, "old hash left")
	hosts, err := rdb.SMembers(bg, s.keys.cookieHosts()).Result()
	require.NoError(t, err)
	require.Empty(t, hosts)

	// A write first moves the old cookies, then overwrites them.
	old = s.keys.legacyCookies("m.other.test")
	require.NoError(t, rdb.HSet(bg, old, "x;/;", "x=old; Path=/", "z;/;", "z=1; Path=/").Err())
	m, _ := url.Parse("http://m.other.test/")
	s.SetCookies(m, "x=new; Path=/")
	require.Equal(t, "x=new; Path=/\nz=1; Path=/", s.Cookies(m))
	n, err = rdb.Exists(bg, old).Result()
	require.NoError(t, err)
	require.Zero(t, n, "old hash left")
}

// A host-only line just read for one host of a domain ("a=1; Path=/" of
// api) does not pass for the same line set for another host (www): the
// memo of lines read is per host.
func TestCookiesMemoPerHost(t *testing.T) {
	s := newStorage(t, shared.Client(t))
	api, _ := url.Parse("http://api.shop.test/")
	www, _ := url.Parse("http://www.shop.test/")
	s.SetCookies(api, "a=1; Path=/")
	require.Equal(t, "a=1; Path=/", s.Cookies(api))
	s.SetCookies(www, "a=1; Path=/")
	require.Equal(t, "a=1; Path=/", s.Cookies(www))
	require.Equal(t, "a=1; Path=/", s.Cookies(api))
}

// An IDN host is its punycode form, as net/http/cookiejar has it
// (canonicalHost): a Domain attribute in punycode is the host's domain, and
// either spelling of a host gets the same cookies (reviewer's bug 9).
func TestCookiesIDNHostMatchesCookiejar(t *testing.T) {
	s := newStorage(t, shared.Client(t))
	j, err := cookiejar.New(&cookiejar.Options{PublicSuffixList: publicsuffix.List})
	require.NoError(t, err)
	set, _ := url.Parse("http://www.bücher.de/")
	lines := "a=1; Domain=xn--bcher-kva.de; Path=/\nb=1; Path=/\nc=1; Domain=bücher.de; Path=/"
	j.SetCookies(set, collystorage.UnstringifyCookies(lines))
	s.SetCookies(set, lines)
	for _, raw := range []string{"http://www.bücher.de/", "http://www.xn--bcher-kva.de/", "http://shop.xn--bcher-kva.de/", "http://shop.bücher.de/"} {
		u, _ := url.Parse(raw)
		var want, got []string
		for _, c := range j.Cookies(u) {
			want = append(want, c.Name+"="+c.Value)
		}
		for _, c := range collystorage.UnstringifyCookies(s.Cookies(u)) {
			got = append(got, c.Name+"="+c.Value)
		}
		require.Equal(t, want, got, raw)
	}
}
