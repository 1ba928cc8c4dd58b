package proxyswitch

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/ban"
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
	return handlerBed(t, "market", m, useTLS, n, opts...)
}

// handlerBed starts h as site name (HTTPS with useTLS) and n proxies, in a
// Switch's pool.
func handlerBed(t *testing.T, name string, h http.Handler, useTLS bool, n int, opts ...Option) (*testbed.Site, []*testbed.Proxy, *Switch) {
	t.Helper()
	var site *testbed.Site
	if useTLS {
		site = testbed.NewTLSSite(t, name, h)
		opts = append([]Option{WithBaseTransport(&http.Transport{TLSClientConfig: site.TLSConfig()})}, opts...)
	} else {
		site = testbed.NewSite(t, name, h)
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
		site, _, s := marketBed(t, m, false, 1, WithBans(Bans{Retries: Off}), WithTimeouts(Timeouts{MaxWait: Off}),
			WithBans(Bans{Quarantine: 100 * time.Millisecond, QuarantineMax: 10 * time.Second}))
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
		site, proxies, s := marketBed(t, m, false, 1, WithBans(Bans{Retries: Off}))
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
		assert.Equal(t, ban.ReasonChallenge, blockedReason(t, err))
		assert.Equal(t, 1, m.Count(testbed.DecidedCaptcha))
		assert.Zero(t, m.Count(testbed.DecidedCaptchaPage), "the redirect was the ban: the captcha page was never requested")
		assert.Zero(t, c.products)
		assert.Empty(t, c.others, "the captcha page never reached OnResponse")
	})

	t.Run("captcha redirect: the page again through another proxy", func(t *testing.T) {
		m := testbed.NewMarketplace(nil)
		site, proxies, s := marketBed(t, m, false, 2, WithBans(Bans{Retries: 1}))
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
			assert.Eventually(t, func() bool { return s.BanCounts()[BanKey{site.Host(), ban.ReasonChallenge}] == 1 },
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
		site, proxies, s := marketBed(t, m, false, 1, WithBans(Bans{Retries: Off}),
			WithExpect(testbed.NewSite(t, "other", nil).Host(), "", "div.nothing-there"), // another site's rule does not apply
			WithExpect("", `^/p/\d+`, "div.product", "p.description"))
		m.Burn(proxies[0].SourceIP().String(), testbed.Placeholder)
		c := newPageCollector(t, s)
		err := c.Visit(site.URL() + "/p/1")
		require.ErrorIs(t, err, ErrBanned)
		assert.Equal(t, ban.ReasonSelector, blockedReason(t, err))
		assert.Empty(t, c.others, "the placeholder never reached OnResponse")
		assert.Equal(t, 1, m.Count(testbed.DecidedPlaceholder))
	})

	t.Run("truncated page: a size drop", func(t *testing.T) {
		m := testbed.NewMarketplace(nil)
		site, proxies, s := marketBed(t, m, false, 2, WithBans(Bans{Retries: 1}), WithExpect("", `^/p/`, "div.product"))
		c := newPageCollector(t, s)
		const learnt = 20 // pages that teach the usual size: 4 more than the 16 the size check needs
		for i := range learnt {
			require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), i+1)))
		}
		m.Burn(proxies[0].SourceIP().String(), testbed.Truncate)
		for i := range 4 {
			require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), 100+i)))
		}
		assert.Equal(t, learnt+4, c.products, "every page arrived whole")
		assert.Empty(t, c.others)
		assert.Equal(t, map[BanKey]int64{{site.Host(), ban.ReasonSizeDrop}: 1}, s.BanCounts(),
			"the truncated page still has its product tag: only its size gives it away")
		assert.Equal(t, 1, m.Count(testbed.DecidedTruncated), "and the proxy was not used again")
	})

	t.Run("a ban never reaches OnResponse, even with ParseHTTPErrorResponse", func(t *testing.T) {
		m := testbed.NewMarketplace(nil)
		site, proxies, s := marketBed(t, m, false, 1, WithBans(Bans{Retries: Off}))
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
		site, _, s := marketBed(t, nil, false, 1, WithBans(Bans{Retries: 3}))
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
		{testbed.ProxyHang, false, ban.ReasonProxyError, true},
		{testbed.ProxyHang, true, ban.ReasonProxyError, true},
		{testbed.Proxy407, false, ban.ReasonProxyAuth, false},
		{testbed.Proxy407, true, ban.ReasonProxyAuth, false},
		{testbed.Proxy502, false, ban.ReasonProxyGateway, false},
		{testbed.Proxy502, true, ban.ReasonProxyTunnel, false},
		{testbed.ProxyDead, false, ban.ReasonProxyConnect, false},
		{testbed.ProxyDead, true, ban.ReasonProxyConnect, false},
		{testbed.ProxyHang, false, ban.ReasonProxyTimeout, false},
		{testbed.ProxyHang, true, ban.ReasonProxyTimeout, false},
	} {
		t.Run(fmt.Sprintf("%s tls=%v drop=%v", tc.mode, tc.tls, tc.drop), func(t *testing.T) {
			t.Parallel()
			timeout := 400 * time.Millisecond
			if tc.drop {
				timeout = 10 * time.Second // the drop, not the timeout, ends the attempt
			}
			site, proxies, s := marketBed(t, nil, tc.tls, 2, WithBans(Bans{Retries: 1}), WithTimeouts(Timeouts{Attempt: timeout}))
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

// TestBodiesAreReadWithinBounds: classification reads no more than
// MaxBodySize, and a gzip bomb decodes no further than the limit.
func TestBodiesAreReadWithinBounds(t *testing.T) {
	var seen []int
	var mu sync.Mutex
	site, _, s := marketBed(t, nil, false, 2, WithClassifier(func(x *ban.Exchange) ban.Verdict {
		mu.Lock()
		seen = append(seen, len(x.Body))
		mu.Unlock()
		assert.True(t, x.Truncated)
		return ban.Verdict{Kind: ban.Pass}
	}))
	s.cfg.readLimit = 256 << 10 // instead of 10 MiB: the same code, a faster test
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
	x := &ban.Exchange{}
	require.NoError(t, tr.buffer(resp, x, &attempt{}, nil))
	assert.Len(t, x.Body, 256<<10)
	assert.True(t, x.Truncated)

	// A gzip bomb: 1 GiB of zeros in about a MiB (1024 gzip members of 1 MiB
	// each, which gzip readers read as one stream), decoded to the limit only.
	var member bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&member, gzip.BestCompression)
	_, _ = zw.Write(make([]byte, 1<<20))
	require.NoError(t, zw.Close())
	bomb := bytes.Repeat(member.Bytes(), 1024)
	out, cut, err := gunzip(bomb, 1<<20, false)
	require.NoError(t, err)
	assert.True(t, cut)
	assert.Equal(t, 1<<20, len(out))
	_, _, err = gunzip([]byte("not gzip at all"), 1<<20, false)
	assert.Error(t, err, "undecodable: content checks are skipped, Colly reports the body")
	_, _, err = gunzip(member.Bytes()[:member.Len()/2], 1<<20, false)
	assert.Error(t, err, "a stream cut short by the site is undecodable")
	out, cut, err = gunzip(member.Bytes()[:member.Len()/2], 1<<20, true)
	require.NoError(t, err, "one cut short by the read limit is the beginning of the body")
	assert.True(t, cut)
	assert.NotEmpty(t, out)
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
		"retries":        {WithBans(Bans{Retries: -2}), "Bans.Retries -2"},
		"quarantine":     {WithBans(Bans{Quarantine: time.Hour, QuarantineMax: time.Minute}), "Bans.Quarantine 1h0m0s, QuarantineMax 1m0s"},
		"zero q":         {WithBans(Bans{Quarantine: Off, QuarantineMax: time.Minute}), "Bans.Quarantine 0s"},
		"fail q":         {WithBans(Bans{FailureQuarantine: -time.Second, FailureQuarantineMax: time.Minute}), "Bans.FailureQuarantine -1s"},
		"dead":           {WithBans(Bans{DeadAfter: -2}), "Bans.DeadAfter -2"},
		"attempt":        {WithTimeouts(Timeouts{Attempt: -time.Second}), "Timeouts.Attempt -1s"},
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

// TestBanOptionsMakeRules: the ban options become the rules of the Switch's
// ban.Detector, on top of ban.DefaultRules (the checks themselves are tested
// in package ban).
func TestBanOptionsMakeRules(t *testing.T) {
	cfg, err := newConfig(nil)
	require.NoError(t, err)
	assert.Equal(t, ban.DefaultRules(), cfg.banRules, "the defaults")

	classifier := func(x *ban.Exchange) ban.Verdict {
		if x.URL.Path == "/mine" {
			return ban.Verdict{Kind: ban.Ban, Reason: "mine"}
		}
		return ban.Verdict{Kind: ban.Pass}
	}
	cfg, err = newConfig([]Option{
		WithBanStatus("lenient.example", 429),
		WithBanStatus("", 403, 451),
		WithChallengeURLs(`/verify`),
		WithExpect("shop.example", `^/item/`, "div.item", "h1"),
		WithSizeDrop(0.5),
		WithClassifier(classifier),
	})
	require.NoError(t, err)
	r := cfg.banRules
	assert.Equal(t, map[string][]int{"": {403, 451}, "lenient.example": {429}}, r.BanStatus)
	assert.Equal(t, []string{`/verify`}, r.ChallengeURLs)
	assert.Equal(t, []ban.Expect{{Site: "shop.example", URL: `^/item/`, Selectors: []string{"div.item", "h1"}}}, r.Expect)
	assert.Equal(t, 0.5, r.SizeDrop)
	assert.Len(t, r.Classifiers, 1)

	verdict := func(rawURL string, code int, hdr ...string) ban.Verdict {
		u, err := url.Parse(rawURL)
		require.NoError(t, err)
		h := http.Header{"Content-Type": {"text/html"}}
		for i := 0; i+1 < len(hdr); i += 2 {
			h.Set(hdr[i], hdr[i+1])
		}
		v, err := cfg.detector.Classify(&ban.Exchange{Site: u.Host, URL: u, OriginURL: u, StatusCode: code, Header: h,
			Body: []byte("<p>x</p>"), Request: &http.Request{Method: http.MethodGet, URL: u}})
		require.NoError(t, err)
		return v
	}
	assert.Equal(t, ban.Verdict{Kind: ban.Ban, Reason: "mine"}, verdict("http://a.example/mine", 200))
	assert.Equal(t, ban.Verdict{Kind: ban.Ban, Reason: "http_451"}, verdict("http://a.example/p", 451))
	assert.Equal(t, ban.Verdict{Kind: ban.Neutral}, verdict("http://a.example/p", 429), "429 is no longer a ban by default")
	assert.Equal(t, ban.Verdict{Kind: ban.Neutral}, verdict("http://lenient.example/p", 403))
	assert.Equal(t, ban.Verdict{Kind: ban.Ban, Reason: "http_429"}, verdict("http://lenient.example/p", 429))
	assert.Equal(t, ban.Verdict{Kind: ban.Ban, Reason: ban.ReasonChallenge}, verdict("http://a.example/p", 302, "Location", "/verify"))
	assert.Equal(t, ban.Verdict{Kind: ban.Pass}, verdict("http://a.example/p", 302, "Location", "/captcha"),
		"the default patterns are replaced")
	assert.Equal(t, ban.Verdict{Kind: ban.Ban, Reason: ban.ReasonSelector}, verdict("http://shop.example/item/1", 200))
}

// TestUncheckedPagesAreNotBans: with expected content, a page the detector
// cannot read (HTML nested deeper than the parser allows, a body in an
// encoding nothing decodes, a selector past the read limit) reaches Colly as
// it came: no ban, no quarantine, and the observer counts it unchecked.
func TestUncheckedPagesAreNotBans(t *testing.T) {
	const product = `<html><body><div class="product">p</div>`
	pages := map[string]func(http.ResponseWriter){
		"/deep": func(w http.ResponseWriter) {
			fmt.Fprint(w, product+strings.Repeat("<div>", 600)+strings.Repeat("</div>", 600))
		},
		"/br": func(w http.ResponseWriter) {
			w.Header().Set("Content-Encoding", "br") // net/http does not decode it, nor does Colly
			fmt.Fprint(w, "\x8b\x02\x80<not html>\x03")
		},
		"/long": func(w http.ResponseWriter) {
			fmt.Fprint(w, "<html><body>"+strings.Repeat("<p>intro</p>", 4<<10)+`<div class="product">p</div>`)
		},
	}
	site := testbed.NewSite(t, "unchecked", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		pages[r.URL.Path](w)
	}))
	proxies := testbed.NewProxies(t, 1)
	s := newSwitch(t, shared.Client(t), WithBans(Bans{Retries: Off}), WithExpect("", "", "div.product"))
	_, err := s.Add(context.Background(), proxies[0].URL())
	require.NoError(t, err)
	obs := &recordingObserver{}
	s.SetObserver(obs)
	c := newPageCollector(t, s, colly.MaxBodySize(16<<10))
	for _, path := range []string{"/deep", "/br", "/long", "/deep"} {
		require.NoError(t, c.Visit(site.URL()+path), path)
	}
	assert.Equal(t, 2, c.products, "the deep page, twice")
	assert.Equal(t, 2, len(c.others), "the br body as it came, and the long page cut at MaxBodySize as Colly cuts it")
	assert.Empty(t, s.BanCounts())
	obs.mu.Lock()
	defer obs.mu.Unlock()
	require.Len(t, obs.attempts, 4)
	for _, e := range obs.attempts {
		assert.Equal(t, ban.Neutral, e.Kind)
		assert.Equal(t, ban.ReasonUnchecked, e.Reason)
	}
}
