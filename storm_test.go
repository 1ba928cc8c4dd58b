package proxyswitch

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/proxyswitch/proxyswitch/internal/testlog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Site storms of proxy failures (storm.go), and the one-IP redirect chain
// (transport.go's retry).

// outOfRotation counts the proxies of s's pool quarantined or dead on site.
func outOfRotation(t *testing.T, s *Switch, site string) int {
	t.Helper()
	st, err := s.ProxyStates(context.Background(), site)
	require.NoError(t, err)
	n := 0
	for _, p := range st {
		if p.State == StateQuarantined || p.State == StateDead {
			n++
		}
	}
	return n
}

// failureStorm runs a crawl of 4 workers through n proxies on a site
// whose storm (from 1s on, for 2s) is given by set, with the breaker's
// pause 3s (longer than the storm: its probes meet a healthy site) and a
// wait for a proxy of 8s (a request the pause holds waits it out). It
// checks that the site is paused during the storm, that at most 2 proxies
// are out of the site's rotation when the storm ends and at the end of
// the crawl, that every request started after the storm succeeds, and
// that no request fails with ErrPageRefused.
func failureStorm(t *testing.T, n int, set func(*testbed.Storm), opts ...Option) {
	t.Helper()
	storm := testbed.NewStorm(nil, time.Now().Add(time.Second), 2*time.Second)
	set(storm)
	site := testbed.NewSite(t, "storm", storm)
	_, _, s := stormBed(t, site, n, append([]Option{WithTimeouts(Timeouts{MaxWait: 8 * time.Second}),
		WithBreaker(Breaker{Pause: 3 * time.Second})}, opts...)...)
	c := colly.NewCollector(colly.AllowURLRevisit())
	s.Attach(c)

	var paused atomic.Bool
	var atEnd atomic.Int64
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		ctx := context.Background()
		for time.Now().Before(storm.To) {
			if sites, err := s.PausedSites(ctx); err == nil && len(sites) > 0 {
				paused.Store(true)
			}
			time.Sleep(20 * time.Millisecond)
		}
		atEnd.Store(int64(outOfRotation(t, s, site.Host())))
	}()
	shots := stormLoop(c, site.URL(), 4, storm.To.Add(2*time.Second), "")
	<-watched

	var late, lateOK int
	for _, sh := range shots {
		assert.NotContains(t, sh.Err, "page refused", "a storm's failure is not the page's")
		if sh.Start >= storm.To.UnixMilli() {
			late++
			if sh.OK {
				lateOK++
			} else {
				t.Logf("failed after the storm: %s", sh.Err)
			}
		}
	}
	before, during, after := storm.Counts()
	t.Logf("site requests: %d before, %d during, %d after the storm; %d proxies out of rotation at its end, %d now",
		before, during, after, atEnd.Load(), outOfRotation(t, s, site.Host()))
	assert.True(t, paused.Load(), "the site is paused during the storm")
	assert.LessOrEqual(t, atEnd.Load(), int64(2), "proxies out of the site's rotation when the storm ends")
	assert.LessOrEqual(t, outOfRotation(t, s, site.Host()), 2, "proxies out of the site's rotation after the crawl")
	require.Positive(t, late)
	assert.Equal(t, late, lateOK, "requests started after the storm that succeed")
}

// TestSiteGatewayStormPausesTheSite: the site answers 502 to everyone for
// 2s (through a plain-HTTP proxy, each proxy's 502: proxy_gateway). The
// proxies are fine: the breaker pauses the site instead of quarantining
// the pool, and the crawl goes on after the storm. (Before, every proxy
// was quarantined for about a minute within half a second, the breaker
// never opened, and the requests after the storm failed with ErrNoProxy.)
func TestSiteGatewayStormPausesTheSite(t *testing.T) {
	failureStorm(t, 12, func(st *testbed.Storm) { st.Status = http.StatusBadGateway })
}

// TestSmallPoolStormPausesTheSite: the storms above on a pool of 5
// proxies, fewer than Breaker.Burst: no run of Burst distinct proxies can
// form, and once every proxy is out no attempt adds to the rate. Every
// proxy that served the site in the window failing in a row opens the
// breaker all the same (the few rule, breaker.lua). (Before, all 5 were
// quarantined for a minute: nothing was served for 35 s after a 2 s storm.)
func TestSmallPoolStormPausesTheSite(t *testing.T) {
	t.Run("502", func(t *testing.T) {
		failureStorm(t, 5, func(st *testbed.Storm) { st.Status = http.StatusBadGateway })
	})
	t.Run("slowdown", func(t *testing.T) {
		failureStorm(t, 5, func(st *testbed.Storm) { st.Delay = 1500 * time.Millisecond },
			WithTimeouts(Timeouts{MaxWait: 8 * time.Second, Attempt: 300 * time.Millisecond}))
	})
}

// TestSiteSlowdownPausesTheSite: the site answers every request 1.5s late
// for 2s, with Timeouts.Attempt 300ms: every attempt times out
// (proxy_timeout), through whatever proxy. The site is paused, the pool is
// not burnt.
func TestSiteSlowdownPausesTheSite(t *testing.T) {
	failureStorm(t, 12, func(st *testbed.Storm) { st.Delay = 1500 * time.Millisecond },
		WithTimeouts(Timeouts{MaxWait: 8 * time.Second, Attempt: 300 * time.Millisecond}))
}

// slowPagesSite is a site whose /slow/ pages take 2s for every IP (a
// page-level slowness, not the proxies'); its other pages answer at once.
func slowPagesSite(t *testing.T, name string) *testbed.Site {
	return testbed.NewSite(t, name, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/slow/") {
			select {
			case <-time.After(2 * time.Second):
			case <-r.Context().Done():
				return
			}
		}
		fmt.Fprintf(w, `<html><body><div class="product">%s</div></body></html>`, r.URL.Path)
	}))
}

// TestSlowPagesKeepThePool: a few pages slow for every IP (a page-level
// slowness, not the proxies'), with Timeouts.Attempt 300ms, among good
// pages once every proxy has served the site. Each slow page fails
// (ErrProxyFailed) through the proxies it tried, and takes their
// quarantines back (they worked on the site): the pool stays whole, the
// good pages are served, and the breaker does not pause the site (it
// serves).
func TestSlowPagesKeepThePool(t *testing.T) {
	ctx := context.Background()
	site := slowPagesSite(t, "slowpages")
	// Twelve proxies: the slow pages' nine tries never wait for a proxy
	// one of them took back. (A proxy that failed twice in a row, with no
	// healthy answer in between, would stay out: its second failure is
	// its own, never taken back.)
	_, _, s := stormBed(t, site, 12, WithTimeouts(Timeouts{MaxWait: 5 * time.Second, Attempt: 300 * time.Millisecond}))
	c := colly.NewCollector(colly.AllowURLRevisit(), colly.Async(true))
	require.NoError(t, c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: 4}))
	s.Attach(c)
	var mu sync.Mutex
	var ok int
	var errs []error
	c.OnResponse(func(*colly.Response) { mu.Lock(); ok++; mu.Unlock() })
	c.OnError(func(r *colly.Response, err error) {
		mu.Lock()
		defer mu.Unlock()
		if !strings.HasPrefix(r.Request.URL.Path, "/slow/") {
			errs = append(errs, err)
		}
	})
	// Every proxy serves the site first (twice round the pool): only a
	// proxy that worked there has a failure taken back.
	for i := range 24 {
		require.NoError(t, c.Visit(fmt.Sprintf("%s/warm/%d", site.URL(), i)))
	}
	c.Wait()
	for i := range 30 {
		require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), i)))
		if i == 5 {
			for j := range 3 {
				require.NoError(t, c.Visit(fmt.Sprintf("%s/slow/%d", site.URL(), j)))
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.Wait()
	assert.Empty(t, errs, "good pages that failed")
	assert.Equal(t, 24+30, ok, "good pages served")
	assert.Zero(t, outOfRotation(t, s, site.Host()), "proxies out of the site's rotation")
	paused, err := s.PausedSites(ctx)
	require.NoError(t, err)
	assert.Empty(t, paused, "the site serves: no pause")
}

// TestSmallPoolSlowPageKeepsTheSite: on a pool of 3 proxies that all
// served the site (fewer than Breaker.Burst: the few rule's ground), a page
// slow for every IP, asked alone, fails through all 3 (its tries), with no
// healthy answer in between: every proxy healthy in the window is in the
// run. One request's tries never open the breaker (the few rule needs more
// healthy proxies than one request tries, Bans.Retries + 2): the site is
// not paused, the page's quarantines are taken back, and the next pages
// are served at once.
func TestSmallPoolSlowPageKeepsTheSite(t *testing.T) {
	ctx := context.Background()
	site := slowPagesSite(t, "slowpage")
	_, _, s := stormBed(t, site, 3, WithTimeouts(Timeouts{MaxWait: 5 * time.Second, Attempt: 300 * time.Millisecond}))
	c := colly.NewCollector(colly.AllowURLRevisit())
	s.Attach(c)
	for i := range 6 {
		require.NoError(t, c.Visit(fmt.Sprintf("%s/warm/%d", site.URL(), i)))
	}
	err := c.Visit(site.URL() + "/slow/1")
	require.ErrorIs(t, err, ErrProxyFailed, "the slow page fails through every proxy it tried")
	time.Sleep(2 * DefaultBreakerFlush) // the breaker's report is in
	paused, err := s.PausedSites(ctx)
	require.NoError(t, err)
	assert.Empty(t, paused, "one slow page pauses no site")
	assert.Zero(t, outOfRotation(t, s, site.Host()), "proxies out of the site's rotation")
	start := time.Now()
	for i := range 5 {
		require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), i)))
	}
	assert.Less(t, time.Since(start), 2*time.Second, "the pages after it are served at once")
}

// TestOneBadProxyStillQuarantined: one proxy of six is dead, slow (with
// Timeouts.Attempt) or answers 502 for every site. It is still taken out of
// the site's rotation at its first failure, the crawl goes on through the
// others, and the breaker stays closed: one proxy failing is no storm. (A
// guard of the storm rules against blaming the site for a bad proxy.)
func TestOneBadProxyStillQuarantined(t *testing.T) {
	for _, mode := range []testbed.ProxyMode{testbed.ProxyDead, testbed.ProxySlow, testbed.Proxy502} {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := context.Background()
			site := testbed.NewSite(t, "shop", nil)
			_, proxies, s := stormBed(t, site, 6, WithTimeouts(Timeouts{MaxWait: 5 * time.Second, Attempt: 500 * time.Millisecond}))
			bad := proxies[0]
			bad.SetDelay(5 * time.Second)
			bad.SetMode(mode)
			c := colly.NewCollector(colly.AllowURLRevisit())
			s.Attach(c)
			var errs []error
			c.OnError(func(_ *colly.Response, err error) { errs = append(errs, err) })
			for i := range 60 {
				require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), i+1)))
			}
			assert.Empty(t, errs)
			st, err := s.ProxyStates(ctx, site.Host())
			require.NoError(t, err)
			out := map[string]string{}
			for _, p := range st {
				if p.State == StateQuarantined || p.State == StateDead {
					out[p.Proxy.URL().Host] = p.State
				}
			}
			assert.Len(t, out, 1, "only the bad proxy is out of rotation: %v", out)
			assert.Contains(t, out, bad.Addr(), "the bad proxy is out of rotation")
			paused, err := s.PausedSites(ctx)
			require.NoError(t, err)
			assert.Empty(t, paused, "one bad proxy pauses no site")
		})
	}
}

// loginChain is a site that sends the IP ip through a login chain, every
// page of it: /p/N -> 302 /session/refresh?next=/p/N -> 302 /signin (for
// everyone: the session refresh has no session to refresh); the other
// IPs get the page.
type loginChain struct {
	ip      string
	mu      sync.Mutex
	refresh map[string]int // client IP -> requests of /session/refresh
	burnt   int            // pages asked by ip
}

func (h *loginChain) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ip, _, _ := net.SplitHostPort(r.RemoteAddr)
	switch {
	case r.URL.Path == "/signin":
		fmt.Fprint(w, `<html><body><form>sign in</form></body></html>`)
		return
	case r.URL.Path == "/session/refresh":
		h.mu.Lock()
		h.refresh[ip]++
		h.mu.Unlock()
		http.Redirect(w, r, "/signin?next="+r.URL.Query().Get("next"), http.StatusFound)
		return
	case ip == h.ip:
		h.mu.Lock()
		h.burnt++
		h.mu.Unlock()
		http.Redirect(w, r, "/session/refresh?next="+r.URL.Path, http.StatusFound)
		return
	}
	fmt.Fprintf(w, `<html><body><div class="product">%s</div></body></html>`, r.URL.Path)
}

// TestLoginChainForOneIPBansOnlyIt: one IP is sent through a login chain
// (its page redirects to a session refresh, which redirects to the sign-in
// page: a challenge). The retry through another proxy starts where a
// fresh client would, from the page asked for, not from the intermediate
// hop (which sends everyone to the sign-in page): only that IP's proxy is
// banned, and the page comes through another, with Colly's revisit check
// on. (Before, the session refresh was sent again through other proxies,
// each banned in turn, and the page failed with ErrBanned.)
func TestLoginChainForOneIPBansOnlyIt(t *testing.T) {
	ctx := context.Background()
	proxies := testbed.NewProxies(t, 4)
	h := &loginChain{ip: proxies[0].SourceIP().String(), refresh: map[string]int{}}
	site := testbed.NewSite(t, "shop", h)
	s := newSwitch(t, shared.Client(t))
	_, err := s.Add(ctx, (&testbed.Bed{Proxies: proxies}).ProxyURLs()...)
	require.NoError(t, err)
	c := colly.NewCollector() // Colly's defaults: the revisit check is on
	s.Attach(c)
	var served []string
	var errs []error
	c.OnResponse(func(r *colly.Response) {
		if strings.Contains(string(r.Body), `class="product"`) {
			served = append(served, r.Request.URL.Path)
		}
	})
	c.OnError(func(_ *colly.Response, err error) { errs = append(errs, err) })
	n := 0
	for ; n < 200; n++ {
		_ = c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), n)) // an error is in errs
		h.mu.Lock()
		hit := h.burnt > 0
		h.mu.Unlock()
		if hit && n >= 10 {
			break
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	require.Positive(t, h.burnt, "the login IP was leased")
	assert.Empty(t, errs, "OnError")
	assert.Len(t, served, n+1, "every page served")
	assert.Equal(t, map[string]int{h.ip: h.burnt}, h.refresh, "the session refresh asked by the login IP only")
	assert.Equal(t, map[BanKey]int64{{site.Host(), ban.ReasonChallenge}: 1}, s.BanCounts(), "one ban: the login IP's")
	assert.Equal(t, 1, outOfRotation(t, s, site.Host()), "one proxy out of the site's rotation")
}

// badProxyCrawl crawls pages 1..n of site one at a time through s and
// returns the pages served and the errors met.
func badProxyCrawl(t *testing.T, s *Switch, site *testbed.Site, n int) (served int, errs []error) {
	t.Helper()
	c := colly.NewCollector(colly.AllowURLRevisit())
	s.Attach(c)
	c.OnResponse(func(*colly.Response) { served++ })
	c.OnError(func(_ *colly.Response, err error) { errs = append(errs, err) })
	for i := range n {
		_ = c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), i+1)) // an error is in errs
	}
	return served, errs
}

// inRotation returns the testbed proxies of s's pool in the order of its
// rotation (the order zset: a site's cursor walks it).
func inRotation(t *testing.T, s *Switch, proxies []*testbed.Proxy) []*testbed.Proxy {
	t.Helper()
	ctx := context.Background()
	ids, err := shared.Client(t).ZRange(ctx, s.keys.order(), 0, -1).Result()
	require.NoError(t, err)
	byID := map[string]*testbed.Proxy{}
	for _, p := range proxies {
		px, err := ParseProxy(p.URL())
		require.NoError(t, err)
		byID[px.ID()] = p
	}
	var out []*testbed.Proxy
	for _, id := range ids {
		if p := byID[id]; p != nil {
			out = append(out, p)
		}
	}
	require.Len(t, out, len(proxies))
	return out
}

// TestBadProxiesAreNotTakenBack: 3 proxies of 6, next to each other in
// the rotation, answer 502 for every site (proxy_gateway, a failure the
// site may cause too) and never served the site. A page whose three tries
// meet the three of them fails (at most once: then they are out), but
// their failures are theirs: nothing takes their quarantines back (a URL
// failing through proxies with no evidence that they work is no page
// failing for everyone), each is tried once (the failure quarantine is a
// minute), and every other page is served. (With every such failure taken
// back once a URL failed through two proxies, the bad proxies came back
// at once and failed a page on every round of the rotation: 4 of 30 good
// pages in the review, with the bad proxies never out of rotation.)
func TestBadProxiesAreNotTakenBack(t *testing.T) {
	ctx := context.Background()
	site := testbed.NewSite(t, "shop", nil)
	_, proxies, s := stormBed(t, site, 6, WithTimeouts(Timeouts{MaxWait: 5 * time.Second}))
	bad := inRotation(t, s, proxies)[:3]
	for _, p := range bad {
		p.SetMode(testbed.Proxy502)
	}
	served, errs := badProxyCrawl(t, s, site, 30)
	assert.LessOrEqual(t, len(errs), 1, "pages that failed: %v", errs)
	assert.GreaterOrEqual(t, served, 29, "pages served")
	st, err := s.ProxyStates(ctx, site.Host())
	require.NoError(t, err)
	state := map[string]string{}
	for _, p := range st {
		state[p.Proxy.URL().Host] = p.State
	}
	for _, p := range bad {
		assert.LessOrEqual(t, p.Requests(), 1, "requests through bad proxy %s: tried once, never taken back", p.Addr())
		if p.Requests() > 0 {
			assert.Equal(t, StateQuarantined, state[p.Addr()], "bad proxy %s out of rotation", p.Addr())
		}
	}
	paused, err := s.PausedSites(ctx)
	require.NoError(t, err)
	assert.Empty(t, paused, "bad proxies pause no site")
}

// TestHalfOpenBadProxiesDoNotReopen: the site's breaker is half-open (a
// short pause ended) while 4 proxies of 10 answer 502 for every site and
// never served it. A probe that meets one is a proxy failure, not the
// site's storm: the proxy is quarantined and the breaker is not opened
// again; the good probes close it. (Before, each such failure was
// absorbed as storm evidence: it reopened the breaker for twice the pause
// and left the proxy in rotation to do it again, pausing the site several
// times over.)
func TestHalfOpenBadProxiesDoNotReopen(t *testing.T) {
	ctx := context.Background()
	var logs testlog.Buffer
	site := testbed.NewSite(t, "shop", nil)
	// Five tries: a page is served even through the four bad proxies in a
	// row (the pool's rotation may place them so).
	_, proxies, s := stormBed(t, site, 10, WithTimeouts(Timeouts{MaxWait: 10 * time.Second}), WithLogger(logs.Logger()),
		WithBreaker(Breaker{Pause: 100 * time.Millisecond}), WithBans(Bans{Retries: 4}))
	bad := proxies[:4]
	for _, p := range bad {
		p.SetMode(testbed.Proxy502)
	}
	_, err := s.PauseSite(ctx, site.Host(), 100*time.Millisecond)
	require.NoError(t, err)
	served, errs := badProxyCrawl(t, s, site, 30)
	assert.Empty(t, errs, "pages that failed")
	assert.Equal(t, 30, served, "pages served")
	assert.Zero(t, strings.Count(logs.String(), "site paused by its circuit breaker"),
		"the breaker reopened on bad proxies' failures: %s", logs.String())
	for _, p := range bad {
		assert.LessOrEqual(t, p.Requests(), 1, "requests through bad proxy %s: quarantined at its failure", p.Addr())
	}
	paused, err := s.PausedSites(ctx)
	require.NoError(t, err)
	assert.Empty(t, paused, "the good probes closed the breaker")
}

// TestFailureEvidence: a proxy failure of the site's kind is evidence
// (healthy before, penalize.lua) only from a proxy that worked on the
// site since its last failure there; taking one back (unfail.lua) never
// lowers the proxy's failures in a row below what the later ones warrant.
func TestFailureEvidence(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	s := newSwitch(t, rdb)
	_, err := s.Add(ctx, proxyURLs(1)...)
	require.NoError(t, err)
	const a, b = "a.example", "b.example"
	gw := ban.Verdict{Kind: ban.ProxyFailure, Reason: ban.ReasonProxyGateway}
	l, err := s.Lease(ctx, a)
	require.NoError(t, err)
	p := l.Proxy()
	require.NoError(t, l.Report(ctx, ban.Verdict{Kind: ban.OK})) // a healthy answer on a
	never, err := s.penalize(ctx, b, p, nil, gw)
	require.NoError(t, err)
	assert.False(t, never.healthy, "a failure on a site the proxy never served is its own")
	first, err := s.penalize(ctx, a, p, nil, gw)
	require.NoError(t, err)
	assert.True(t, first.healthy, "its first failure after a healthy answer: it worked")
	again, err := s.penalize(ctx, b, p, nil, gw)
	require.NoError(t, err)
	assert.Equal(t, 3, again.strikes, "failures in a row")

	// The failure on a is taken back: its quarantine there ends, but the
	// failures after it stand.
	require.NoError(t, s.own.redis().unfail(ctx, a, p, first))
	rec, err := rdb.HGet(ctx, s.keys.fails(), p.ID()).Result()
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(rec, "3|"), "failures in a row after the take-back: %q", rec)
	st, err := s.ProxyStates(ctx, a)
	require.NoError(t, err)
	require.Len(t, st, 1)
	assert.NotEqual(t, StateQuarantined, st[0].State, "its quarantine on a taken back")

	// Taken back, it is still its last failure on a: the next one, with no
	// healthy answer in between, is its own.
	next, err := s.penalize(ctx, a, p, nil, gw)
	require.NoError(t, err)
	assert.False(t, next.healthy, "a second failure in a row is the proxy's")
}

// TestGatewayStormOutlastsThePause: a site-side 502 storm longer than the
// breaker's pause. The half-open breaker's probes meet the storm through
// proxies that worked on the site before it (the breaker's lift keeps them
// so): it opens again rather than quarantine its probes' proxies one by
// one, and the pool is whole when the storm ends.
func TestGatewayStormOutlastsThePause(t *testing.T) {
	var logs testlog.Buffer
	storm := testbed.NewStorm(nil, time.Now().Add(time.Second), 3*time.Second)
	storm.Status = http.StatusBadGateway
	site := testbed.NewSite(t, "storm", storm)
	_, _, s := stormBed(t, site, 12, WithTimeouts(Timeouts{MaxWait: 10 * time.Second}), WithLogger(logs.Logger()),
		WithBreaker(Breaker{Pause: 500 * time.Millisecond}))
	c := colly.NewCollector(colly.AllowURLRevisit())
	s.Attach(c)
	shots := stormLoop(c, site.URL(), 4, storm.To.Add(3*time.Second), "")
	var late, lateOK int
	for _, sh := range shots {
		if sh.Start >= storm.To.Add(2*time.Second).UnixMilli() {
			late++
			if sh.OK {
				lateOK++
			}
		}
	}
	// Logged by the report that opened it, or by the lease it refused
	// first ("site paused (circuit breaker or PauseSite)").
	opened := strings.Count(logs.String(), "msg=\"proxyswitch: site paused")
	t.Logf("breaker opened %d times; %d proxies out of rotation", opened, outOfRotation(t, s, site.Host()))
	assert.GreaterOrEqual(t, opened, 2, "the half-open breaker met the storm and opened again")
	assert.LessOrEqual(t, outOfRotation(t, s, site.Host()), 2, "proxies out of the site's rotation")
	require.Positive(t, late)
	assert.Equal(t, late, lateOK, "requests started well after the storm that succeed")
}
