package proxyswitch

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// marketBed starts a fake marketplace (m; nil: the default one), n proxies
// and a Switch whose pool holds them.
func marketBed(t *testing.T, m *testbed.Marketplace, useTLS bool, n int, opts ...Option) (*testbed.Site, []*testbed.Proxy, *Switch) {
	t.Helper()
	if m == nil {
		m = testbed.NewMarketplace(nil)
	}
	var site *testbed.Site
	if useTLS {
		site = testbed.NewTLSSite(t, "market", m)
		opts = append([]Option{WithBaseTransport(&http.Transport{TLSClientConfig: site.TLSConfig()})}, opts...)
	} else {
		site = testbed.NewSite(t, "market", m)
	}
	proxies := testbed.NewProxies(t, n)
	s := newSwitch(t, shared.Client(t), opts...)
	urls := make([]string, n)
	for i, p := range proxies {
		urls[i] = p.URL()
	}
	_, err := s.Add(context.Background(), urls...)
	require.NoError(t, err)
	return site, proxies, s
}

// pageCollector is a synchronous collector attached to s that records what
// reaches the user's callbacks: product pages, other pages, errors.
type pageCollector struct {
	*colly.Collector
	mu       sync.Mutex
	products int
	others   []string // bodies of responses without a product
	errs     []error
}

func newPageCollector(t *testing.T, s *Switch, opts ...colly.CollectorOption) *pageCollector {
	t.Helper()
	pc := &pageCollector{Collector: colly.NewCollector(append([]colly.CollectorOption{colly.AllowURLRevisit()}, opts...)...)}
	s.Attach(pc.Collector)
	pc.OnResponse(func(r *colly.Response) {
		pc.mu.Lock()
		defer pc.mu.Unlock()
		if bytes.Contains(r.Body, []byte(`<div class="product"`)) {
			pc.products++
		} else {
			pc.others = append(pc.others, string(r.Body))
		}
	})
	pc.OnError(func(_ *colly.Response, err error) {
		pc.mu.Lock()
		defer pc.mu.Unlock()
		pc.errs = append(pc.errs, err)
	})
	return pc
}

func blockedReason(t *testing.T, err error) string {
	t.Helper()
	var be *BlockedError
	require.True(t, errors.As(err, &be), "want a *BlockedError, got %v", err)
	return be.Verdict.Reason
}

// TestDetectsSiteBans drives a real Colly collector against the fake
// marketplace: each kind of ban is detected with its reason, never reaches
// OnResponse, and a real 404 is not a ban.
func TestDetectsSiteBans(t *testing.T) {
	ctx := context.Background()

	t.Run("429 with Retry-After, then 403", func(t *testing.T) {
		m := testbed.NewMarketplace(nil)
		m.RateLimit, m.RateWindow, m.RetryAfter, m.BlockAfter = 2, time.Minute, 2*time.Second, 1
		site, _, s := marketBed(t, m, false, 1, WithRetries(0), WithMaxWait(0),
			WithQuarantine(100*time.Millisecond, 10*time.Second))
		c := newPageCollector(t, s)
		require.NoError(t, c.Visit(site.URL()+"/p/1"))
		require.NoError(t, c.Visit(site.URL()+"/p/2"))
		err := c.Visit(site.URL() + "/p/3")
		banned := time.Now()
		require.ErrorIs(t, err, ErrBanned)
		assert.Equal(t, "http_429", blockedReason(t, err))

		// Retry-After (2s) is the least quarantine, though the option says 100ms.
		time.Sleep(500 * time.Millisecond)
		err = c.Visit(site.URL() + "/p/4")
		require.ErrorIs(t, err, ErrNoProxy, "the only proxy is still quarantined")
		time.Sleep(time.Until(banned.Add(2100 * time.Millisecond)))
		err = c.Visit(site.URL() + "/p/5")
		require.ErrorIs(t, err, ErrBanned)
		assert.Equal(t, "http_403", blockedReason(t, err))

		assert.Equal(t, 2, c.products, "only the two real pages reached OnResponse")
		assert.Empty(t, c.others)
		host := site.Host()
		assert.Equal(t, map[BanKey]int64{{host, "http_429"}: 1, {host, "http_403"}: 1}, s.BanCounts())
	})

	t.Run("captcha redirect for two requests from one IP", func(t *testing.T) {
		m := testbed.NewMarketplace(&testbed.ShopHandler{Delay: 400 * time.Millisecond, PageSize: 2048})
		m.CaptchaOnConcurrent = true
		site, proxies, s := marketBed(t, m, false, 1, WithRetries(0))
		c := newPageCollector(t, s)
		// Someone else (a scraper outside the pool) uses the same IP at once.
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			u, _ := url.Parse(proxies[0].URL())
			resp, err := (&http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(u)}}).Get(site.URL() + "/p/1")
			if assert.NoError(t, err) {
				resp.Body.Close()
			}
		}()
		require.Eventually(t, func() bool { return site.Recorder().InFlight() == 1 }, time.Second, 5*time.Millisecond)
		err := c.Visit(site.URL() + "/p/2")
		wg.Wait()
		require.ErrorIs(t, err, ErrBanned)
		assert.Equal(t, ReasonChallenge, blockedReason(t, err))
		assert.Equal(t, 1, m.Count(testbed.DecidedCaptcha))
		assert.Zero(t, m.Count(testbed.DecidedCaptchaPage), "the redirect was the ban: the captcha page was never requested")
		assert.Zero(t, c.products)
		assert.Empty(t, c.others, "the captcha page never reached OnResponse")
	})

	t.Run("captcha redirect: the page again through another proxy", func(t *testing.T) {
		m := testbed.NewMarketplace(nil)
		site, proxies, s := marketBed(t, m, false, 2, WithRetries(1))
		m.Burn(proxies[0].SourceIP().String(), testbed.Challenge)
		// Hold the good proxy so that the request starts on the burnt one,
		// and free it once that one is banned.
		l1, err := s.Lease(ctx, site.Host())
		require.NoError(t, err)
		l2, err := s.Lease(ctx, site.Host())
		require.NoError(t, err)
		good, bad := l1, l2
		if l1.Proxy().URL().String() == proxies[0].URL() {
			good, bad = l2, l1
		}
		require.NoError(t, bad.Release(ctx))
		go func() {
			assert.Eventually(t, func() bool { return s.BanCounts()[BanKey{site.Host(), ReasonChallenge}] == 1 },
				5*time.Second, 5*time.Millisecond)
			_ = good.Release(ctx)
		}()
		var final string
		c := newPageCollector(t, s)
		c.OnResponse(func(r *colly.Response) { final = r.Request.URL.String() })
		require.NoError(t, c.Visit(site.URL()+"/p/9"))
		assert.Equal(t, 1, c.products)
		assert.Equal(t, site.URL()+"/p/9", final, "the user sees the page it asked for")
		ips := site.Recorder().IPs()
		assert.Equal(t, 1, ips[proxies[0].SourceIP().String()], "the redirect through the burnt proxy, not the captcha page")
		assert.Equal(t, 1, ips[proxies[1].SourceIP().String()], "the page through the good one")
		assert.Zero(t, m.Count(testbed.DecidedCaptchaPage))
	})

	t.Run("placeholder without the product selector", func(t *testing.T) {
		m := testbed.NewMarketplace(nil)
		site, proxies, s := marketBed(t, m, false, 1, WithRetries(0),
			WithExpect(testbed.NewSite(t, "other", nil).Host(), "", "div.nothing-there"), // another site's rule does not apply
			WithExpect("", `^/p/\d+`, "div.product", "p.description"))
		m.Burn(proxies[0].SourceIP().String(), testbed.Placeholder)
		c := newPageCollector(t, s)
		err := c.Visit(site.URL() + "/p/1")
		require.ErrorIs(t, err, ErrBanned)
		assert.Equal(t, ReasonSelector, blockedReason(t, err))
		assert.Empty(t, c.others, "the placeholder never reached OnResponse")
		assert.Equal(t, 1, m.Count(testbed.DecidedPlaceholder))
	})

	t.Run("truncated page: a size drop", func(t *testing.T) {
		m := testbed.NewMarketplace(nil)
		site, proxies, s := marketBed(t, m, false, 2, WithRetries(1), WithExpect("", `^/p/`, "div.product"))
		c := newPageCollector(t, s)
		for i := range baselineMinimum + 4 { // learn the usual size
			require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), i+1)))
		}
		m.Burn(proxies[0].SourceIP().String(), testbed.Truncate)
		for i := range 4 {
			require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), 100+i)))
		}
		assert.Equal(t, baselineMinimum+8, c.products, "every page arrived whole")
		assert.Empty(t, c.others)
		assert.Equal(t, map[BanKey]int64{{site.Host(), ReasonSizeDrop}: 1}, s.BanCounts(),
			"the truncated page still has its product tag: only its size gives it away")
		assert.Equal(t, 1, m.Count(testbed.DecidedTruncated), "and the proxy was not used again")
	})

	t.Run("a ban never reaches OnResponse, even with ParseHTTPErrorResponse", func(t *testing.T) {
		m := testbed.NewMarketplace(nil)
		site, proxies, s := marketBed(t, m, false, 1, WithRetries(0))
		m.Burn(proxies[0].SourceIP().String(), testbed.Forbid)
		c := newPageCollector(t, s, colly.ParseHTTPErrorResponse())
		var hookErr error
		c.OnError(func(_ *colly.Response, err error) { hookErr = err })
		err := c.Visit(site.URL() + "/p/1")
		require.ErrorIs(t, err, ErrBanned)
		assert.ErrorIs(t, hookErr, ErrBanned, "OnError sees it")
		assert.Zero(t, c.products)
		assert.Empty(t, c.others, "the 403 page was not parsed")
	})

	t.Run("a real 404 is not a ban", func(t *testing.T) {
		site, _, s := marketBed(t, nil, false, 1, WithRetries(3))
		c := newPageCollector(t, s)
		for range 3 {
			err := c.Visit(site.URL() + "/nothing-here")
			require.Error(t, err)
			assert.NotErrorIs(t, err, ErrBanned)
			assert.Equal(t, "Not Found", err.Error(), "Colly's own status error")
		}
		assert.Empty(t, s.BanCounts())
		assert.Equal(t, 3, site.Recorder().Count(), "no retries")
		st, err := s.Stats(ctx, site.Host())
		require.NoError(t, err)
		assert.Equal(t, 1, st.FreeSlots, "the proxy is free, not quarantined")
	})
}

// TestDetectsProxyFailures: with one failing and one good proxy, two pages
// both arrive, and the failing proxy is caught once, with its reason.
func TestDetectsProxyFailures(t *testing.T) {
	for _, tc := range []struct {
		mode   testbed.ProxyMode
		tls    bool
		reason string
		drop   bool // the proxy drops the connection once the request is in
	}{
		{testbed.ProxyHang, false, ReasonProxyError, true},
		{testbed.ProxyHang, true, ReasonProxyError, true},
		{testbed.Proxy407, false, ReasonProxyAuth, false},
		{testbed.Proxy407, true, ReasonProxyAuth, false},
		{testbed.Proxy502, false, ReasonProxyGateway, false},
		{testbed.Proxy502, true, ReasonProxyTunnel, false},
		{testbed.ProxyDead, false, ReasonProxyConnect, false},
		{testbed.ProxyDead, true, ReasonProxyConnect, false},
		{testbed.ProxyHang, false, ReasonProxyTimeout, false},
		{testbed.ProxyHang, true, ReasonProxyTimeout, false},
	} {
		t.Run(fmt.Sprintf("%s tls=%v drop=%v", tc.mode, tc.tls, tc.drop), func(t *testing.T) {
			t.Parallel()
			timeout := 400 * time.Millisecond
			if tc.drop {
				timeout = 10 * time.Second // the drop, not the timeout, ends the attempt
			}
			site, proxies, s := marketBed(t, nil, tc.tls, 2, WithRetries(1), WithAttemptTimeout(timeout))
			proxies[0].SetMode(tc.mode)
			if tc.drop {
				go func() {
					for proxies[0].Requests() == 0 {
						time.Sleep(2 * time.Millisecond)
					}
					proxies[0].SetMode(testbed.ProxyDead)
				}()
			}
			c := newPageCollector(t, s)
			for i := range 2 {
				require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), i+1)))
			}
			assert.Equal(t, 2, c.products)
			assert.Equal(t, map[BanKey]int64{{site.Host(), tc.reason}: 1}, s.BanCounts())
			assert.Equal(t, 2, site.Recorder().Count())
			assert.Zero(t, site.Recorder().DirectHits())
		})
	}
}

// TestClassify covers the built-in checks and the classifier chain on
// exchanges made up in memory.
func TestClassify(t *testing.T) {
	s := newSwitch(t, shared.Client(t),
		WithBanStatus("lenient.example", 429),
		WithExpect("shop.example", `^/item/`, "div.item"),
		WithClassifier(func(x *Exchange) Verdict {
			switch {
			case bytes.Contains(x.Body, []byte("Доступ ограничен")):
				return Verdict{Kind: Ban, Reason: "access_limited"}
			case x.URL.Path == "/ok-anyway":
				return Verdict{Kind: OK}
			case x.URL.Path == "/bad-reason":
				return Verdict{Kind: Ban, Reason: "Has Spaces and a password=hunter2"}
			}
			return Verdict{Kind: Pass}
		}))
	r := s.cfg.rules
	mk := func(rawURL string, code int, body string, hdr ...string) *Exchange {
		u, _ := url.Parse(rawURL)
		h := http.Header{"Content-Type": {"text/html; charset=utf-8"}}
		for i := 0; i+1 < len(hdr); i += 2 {
			h.Set(hdr[i], hdr[i+1])
		}
		return &Exchange{Site: u.Host, URL: u, OriginURL: u, StatusCode: code, Header: h, Body: []byte(body),
			Request: &http.Request{Method: http.MethodGet, URL: u}}
	}
	redirected := func(x *Exchange, from string) *Exchange { x.OriginURL, _ = url.Parse(from); return x }
	verdict := func(x *Exchange) Verdict {
		v, err := r.classify(x)
		require.NoError(t, err)
		return v
	}
	for name, tc := range map[string]struct {
		x    *Exchange
		want Verdict
	}{
		"200":                   {mk("http://a.example/p/1", 200, "<p>hi</p>"), Verdict{Kind: OK}},
		"403":                   {mk("http://a.example/p/1", 403, ""), Verdict{Kind: Ban, Reason: "http_403"}},
		"503 retry-after":       {mk("http://a.example/p/1", 503, "", "Retry-After", "120"), Verdict{Kind: Ban, Reason: "http_503", RetryAfter: 2 * time.Minute}},
		"429":                   {mk("http://a.example/p/1", 429, ""), Verdict{Kind: Ban, Reason: "http_429"}},
		"site rule: 403 is not": {mk("http://lenient.example/p/1", 403, ""), Verdict{Kind: Neutral}},
		"site rule: 429 is":     {mk("http://lenient.example/p/1", 429, ""), Verdict{Kind: Ban, Reason: "http_429"}},
		"404":                   {mk("http://a.example/p/1", 404, "not found"), Verdict{Kind: Neutral}},
		"500":                   {mk("http://a.example/p/1", 500, ""), Verdict{Kind: Neutral}},
		"407":                   {mk("http://a.example/p/1", 407, ""), Verdict{Kind: ProxyFailure, Reason: ReasonProxyAuth}},
		"502 via http proxy":    {mk("http://a.example/p/1", 502, ""), Verdict{Kind: ProxyFailure, Reason: ReasonProxyGateway}},
		"502 in a tunnel":       {mk("https://a.example/p/1", 502, ""), Verdict{Kind: Neutral}},
		"redirect hop":          {mk("http://a.example/p/1", 302, "", "Location", "/p/2"), Verdict{Kind: Pass}},
		"redirect to captcha":   {mk("http://a.example/p/1", 302, "", "Location", "/captcha"), Verdict{Kind: Ban, Reason: ReasonChallenge}},
		"relative to the hop":   {mk("http://a.example/p/1", 303, "", "Location", "../showcaptcha?retpath=x"), Verdict{Kind: Ban, Reason: ReasonChallenge}},
		"captcha on another host": {mk("http://a.example/p/1", 307, "", "Location", "https://captcha.example/check?from=a"),
			Verdict{Kind: Ban, Reason: ReasonChallenge}},
		"redirect to login": {redirected(mk("http://a.example/p/2", 301, "", "Location", "http://a.example/login?next=/p/2"), "http://a.example/p/1"),
			Verdict{Kind: Ban, Reason: ReasonChallenge}},
		"redirect to a 'loginhistory' page": {mk("http://a.example/p/1", 302, "", "Location", "/loginhistory"), Verdict{Kind: Pass}},
		"redirect back to the login asked for": {redirected(mk("http://a.example/login/", 308, "", "Location", "/login"), "http://a.example/login"),
			Verdict{Kind: Pass}},
		"3xx without a Location": {mk("http://a.example/captcha-info", 302, ""), Verdict{Kind: Neutral}},
		"landed on captcha": {redirected(mk("http://a.example/showcaptcha?retpath=x", 200, "<form>"), "http://a.example/p/1"),
			Verdict{Kind: Ban, Reason: ReasonChallenge}},
		"captcha with a 403": {redirected(mk("http://a.example/captcha", 403, ""), "http://a.example/p/1"),
			Verdict{Kind: Ban, Reason: ReasonChallenge}},
		"landed on login": {redirected(mk("http://a.example/login?next=/p/1", 200, "<form>"), "http://a.example/p/1"),
			Verdict{Kind: Ban, Reason: ReasonChallenge}},
		"asked for the login page": {mk("http://a.example/login", 200, "<form>"), Verdict{Kind: OK}},
		"redirect to a real page": {redirected(mk("http://a.example/p/2", 200, "<p>"), "http://a.example/p/1"),
			Verdict{Kind: OK}},
		"a 'loginhistory' page is no login": {redirected(mk("http://a.example/loginhistory", 200, "<p>"), "http://a.example/p/1"),
			Verdict{Kind: OK}},
		"expected item present":    {mk("http://shop.example/item/1", 200, `<div class="item">x</div>`), Verdict{Kind: OK}},
		"expected item missing":    {mk("http://shop.example/item/1", 200, `<div class="stub">x</div>`), Verdict{Kind: Ban, Reason: ReasonSelector}},
		"empty 200":                {mk("http://shop.example/item/1", 200, ""), Verdict{Kind: Ban, Reason: ReasonSelector}},
		"binary garbage":           {mk("http://shop.example/item/1", 200, "\x00\xff\xfe<<<div class=item"), Verdict{Kind: Ban, Reason: ReasonSelector}},
		"other path of the site":   {mk("http://shop.example/about", 200, ""), Verdict{Kind: OK}},
		"404 of an expected page":  {mk("http://shop.example/item/1", 404, ""), Verdict{Kind: Neutral}},
		"classifier: ban":          {mk("http://a.example/p/1", 200, "<p>Доступ ограничен</p>"), Verdict{Kind: Ban, Reason: "access_limited"}},
		"classifier: overrule 403": {mk("http://a.example/ok-anyway", 403, ""), Verdict{Kind: OK}},
		"classifier: bad reason":   {mk("http://a.example/bad-reason", 200, ""), Verdict{Kind: Ban, Reason: ReasonCustom}},
		"HEAD":                     {func() *Exchange { x := mk("http://shop.example/item/1", 200, ""); x.Request.Method = "HEAD"; return x }(), Verdict{Kind: OK}},
	} {
		assert.Equal(t, tc.want, verdict(tc.x), name)
	}

	// Transport errors.
	for name, tc := range map[string]struct {
		err      error
		timedOut bool
		want     Verdict
	}{
		"dial":        {&net.OpError{Op: "proxyconnect", Net: "tcp", Err: errors.New("connection refused")}, false, Verdict{Kind: ProxyFailure, Reason: ReasonProxyConnect}},
		"CONNECT 407": {&tunnelError{status: 407}, false, Verdict{Kind: ProxyFailure, Reason: ReasonProxyAuth}},
		"CONNECT 503": {&tunnelError{status: 503}, false, Verdict{Kind: ProxyFailure, Reason: ReasonProxyTunnel}},
		"timeout":     {context.Canceled, true, Verdict{Kind: ProxyFailure, Reason: ReasonProxyTimeout}},
		"reset":       {errors.New("read: connection reset by peer"), false, Verdict{Kind: ProxyFailure, Reason: ReasonProxyError}},
		"bad cert":    {fmt.Errorf("tls: %w", x509.UnknownAuthorityError{}), false, Verdict{Kind: Neutral}},
	} {
		x := mk("https://a.example/p/1", 0, "")
		x.StatusCode, x.Header, x.Err, x.timedOut = 0, nil, tc.err, tc.timedOut
		assert.Equal(t, tc.want, verdict(x), name)
	}

	// Size drop: judged once 16 sizes are known, per media type.
	for i := range baselineMinimum - 1 {
		x := mk("http://big.example/p/1", 200, strings.Repeat("x", 1000+i))
		require.Equal(t, OK, verdict(x).Kind)
		r.learn(x)
	}
	assert.Equal(t, OK, verdict(mk("http://big.example/p/2", 200, "tiny")).Kind, "too few sizes known yet")
	x := mk("http://big.example/p/1", 200, strings.Repeat("x", 1000))
	r.learn(x)
	assert.Equal(t, Verdict{Kind: Ban, Reason: ReasonSizeDrop}, verdict(mk("http://big.example/p/2", 200, "tiny")))
	assert.Equal(t, OK, verdict(mk("http://big.example/p/2", 200, strings.Repeat("x", 300))).Kind, "0.3 of the median is fine")
	assert.Equal(t, OK, verdict(mk("http://big.example/api", 200, "{}", "Content-Type", "application/json")).Kind,
		"JSON has a baseline of its own")
	assert.Equal(t, Neutral, verdict(mk("http://big.example/p/3", 404, "")).Kind, "only 2xx pages are sized")

	// A panicking classifier fails the request, it does not crash the crawler.
	sp := newSwitch(t, shared.Client(t), WithClassifier(func(*Exchange) Verdict { panic("boom") }))
	_, err := sp.cfg.rules.classify(mk("http://a.example/", 200, ""))
	assert.ErrorContains(t, err, "classifier panicked")
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for in, want := range map[string]time.Duration{
		"":                              0,
		"120":                           2 * time.Minute,
		" 7 ":                           7 * time.Second,
		"-5":                            0,
		"soon":                          0,
		"99999999999999999999999":       0, // not an int64: not a number of seconds we take
		"9223372036854775807":           100 * 365 * 24 * time.Hour,
		"Fri, 02 Jan 2026 03:05:05 GMT": time.Minute,
		"Fri, 02 Jan 2026 03:00:00 GMT": 0, // in the past
	} {
		assert.Equal(t, want, parseRetryAfter(in, now), in)
	}
}

// TestBodiesAreReadWithinBounds: classification reads no more than
// MaxBodySize, and a gzip bomb decodes no further than the limit.
func TestBodiesAreReadWithinBounds(t *testing.T) {
	site, _, s := marketBed(t, nil, false, 2)
	s.cfg.readLimit = 256 << 10 // instead of 10 MiB: the same code, a faster test
	var seen []int
	var mu sync.Mutex
	s.cfg.rules.classifiers = []Classifier{func(x *Exchange) Verdict {
		mu.Lock()
		seen = append(seen, len(x.Body))
		mu.Unlock()
		assert.True(t, x.Truncated)
		return Verdict{Kind: Pass}
	}}
	c := newPageCollector(t, s, colly.MaxBodySize(64<<10))
	var got int
	c.OnResponse(func(r *colly.Response) { got = len(r.Body) })
	require.NoError(t, c.Visit(site.URL()+"/big?kb=1024")) // 1 MiB
	assert.Equal(t, []int{64 << 10}, seen)
	assert.Equal(t, 64<<10, got, "Colly gets what it would have read itself")

	// Without MaxBodySize Colly reads the whole body: the transport reads the
	// first bytes (up to its read limit) and streams the rest unread.
	c2 := newPageCollector(t, s, colly.MaxBodySize(0))
	c2.OnResponse(func(r *colly.Response) { got = len(r.Body) })
	require.NoError(t, c2.Visit(site.URL()+"/big?kb=1024"))
	assert.Equal(t, []int{64 << 10, 256 << 10}, seen)
	assert.Equal(t, 1<<20, got)

	// An endless body is read up to the limit, then left.
	tr := &transport{s: s}
	resp := &http.Response{Body: ioNopCloser{endless{}}, Header: http.Header{}, ContentLength: -1}
	x := &Exchange{}
	require.NoError(t, tr.buffer(resp, x, &attempt{}))
	assert.Len(t, x.Body, 256<<10)
	assert.True(t, x.Truncated)

	// A gzip bomb: 1 GiB of zeros in about a MiB (1024 gzip members of 1 MiB
	// each, which gzip readers read as one stream), decoded to the limit only.
	var member bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&member, gzip.BestCompression)
	_, _ = zw.Write(make([]byte, 1<<20))
	require.NoError(t, zw.Close())
	bomb := bytes.Repeat(member.Bytes(), 1024)
	gz := &http.Response{Header: http.Header{"Content-Encoding": {"gzip"}}}
	out, ok := decodeBody(gz, bomb, 1<<20)
	assert.True(t, ok)
	assert.Len(t, out, 1<<20)
	_, ok = decodeBody(gz, []byte("not gzip at all"), 1<<20)
	assert.False(t, ok, "undecodable: content checks are skipped, Colly reports the body")
}

type endless struct{}

func (endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}

type ioNopCloser struct{ endless }

func (ioNopCloser) Close() error { return nil }

// TestBadBanOptions: every bad rule is a clear ErrConfig, never a panic.
func TestBadBanOptions(t *testing.T) {
	rdb := shared.Client(t)
	for name, tc := range map[string]struct {
		opt  Option
		says string
	}{
		"regexp":         {WithChallengeURLs(`(unclosed`), `challenge URL pattern "(unclosed"`},
		"expect regexp":  {WithExpect("", `[z-a]`, "div"), `expected-content URL pattern "[z-a]"`},
		"selector":       {WithExpect("", "", "div[[["), `CSS selector "div[[["`},
		"no selector":    {WithExpect("shop", "/p/"), "names no selector"},
		"status":         {WithBanStatus("", 403, 1000), "ban status 1000"},
		"ratio":          {WithSizeDrop(1.5), "size drop ratio 1.5"},
		"negative ratio": {WithSizeDrop(-0.1), "size drop ratio -0.1"},
		"classifier":     {WithClassifier(nil), "nil classifier"},
		"retries":        {WithRetries(-1), "retries -1"},
		"quarantine":     {WithQuarantine(time.Hour, time.Minute), "quarantine 1h0m0s, max 1m0s"},
		"zero q":         {WithQuarantine(0, time.Minute), "quarantine 0s"},
		"fail q":         {WithFailureQuarantine(-1, time.Minute), "failure quarantine"},
		"dead":           {WithDeadAfter(-2), "dead-after count -2"},
		"attempt":        {WithAttemptTimeout(-time.Second), "attempt timeout"},
	} {
		var err error
		require.NotPanics(t, func() { _, err = NewSwitch(rdb, tc.opt) }, name)
		assert.ErrorIs(t, err, ErrConfig, name)
		assert.ErrorContains(t, err, tc.says, name)
	}
	pf := New(rdb, WithExpect("", "", "div[[["))
	_, err := pf(&http.Request{URL: &url.URL{Scheme: "http", Host: "a.example"}})
	assert.ErrorIs(t, err, ErrConfig, "New's proxy function fails every request instead")
	_, err = NewSwitch(rdb, WithChallengeURLs(), WithBanStatus("x.example"), WithSizeDrop(0))
	assert.NoError(t, err, "every check can be turned off")
}
