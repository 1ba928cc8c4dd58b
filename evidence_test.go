package proxyswitch

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

// TestBanEvidenceLadder pins what penalize.lua makes of the evidence
// (Bans.EvidenceFirst): a first refusal gets the first quarantine, the same
// proxy refused again or its refusal confirmed gets the base one, a
// challenge redirect gets the base one at once, and a healthy answer is
// reported with the next strike. WithBans(Bans{EvidenceFirst: Off, PageProxies: Off}) is the old verdict.
func TestBanEvidenceLadder(t *testing.T) {
	ctx := context.Background()
	const first, base, maxq = 100 * time.Millisecond, 400 * time.Millisecond, 4 * time.Second
	// WithRotation(Rotation{FlakyDelay: Off}): the quarantines alone hold the proxy back (a
	// verdict also raises its failure rate: selection_test.go).
	s := newSwitch(t, shared.Client(t), WithBans(Bans{Quarantine: base, QuarantineMax: maxq, EvidenceFirst: first, PageProxies: 2}), WithTimeouts(Timeouts{MaxWait: 5 * time.Second}),
		WithRotation(Rotation{FlakyDelay: Off}))
	_, err := s.Add(ctx, proxyURLs(1)...)
	require.NoError(t, err)
	const site = "shop.example"
	ban403 := ban.Verdict{Kind: ban.Ban, Reason: "http_403"}
	within := func(got, want time.Duration, what string) {
		t.Helper()
		assert.GreaterOrEqual(t, got, want*85/100-time.Millisecond, what)
		assert.LessOrEqual(t, got, want*115/100+time.Millisecond, what)
	}
	lease := func() *Lease {
		t.Helper()
		l, err := s.Lease(ctx, site)
		require.NoError(t, err)
		return l
	}

	// Never served on the site: a strike, not healthy.
	l := lease()
	pen, err := s.penalize(ctx, site, l.proxy, l, ban403)
	require.NoError(t, err)
	assert.True(t, pen.first)
	assert.False(t, pen.healthy)
	within(pen.quarantine, first, "first strike")
	// The same proxy refused again (after the first quarantine): a ban.
	l = lease()
	pen, err = s.penalize(ctx, site, l.proxy, l, ban403)
	require.NoError(t, err)
	assert.False(t, pen.first)
	assert.Equal(t, 2, pen.strikes)
	within(pen.quarantine, base, "second strike")

	// A healthy answer: the next refusal is a first strike of a healthy proxy.
	l = lease()
	require.NoError(t, l.Report(ctx, ban.Verdict{Kind: ban.OK}))
	l = lease()
	pen, err = s.penalize(ctx, site, l.proxy, l, ban403)
	require.NoError(t, err)
	assert.True(t, pen.first)
	assert.True(t, pen.healthy)
	within(pen.quarantine, first, "first strike after a healthy answer")
	// Confirmed: the base quarantine, from the confirmation on.
	rp := l.be.redis()
	before := time.Now()
	confirmed, err := rp.confirm(ctx, site, l.proxy, pen)
	require.NoError(t, err)
	assert.True(t, confirmed)
	end := quarantineEnd(t, s, site, l.proxy)
	// From the confirmation on, however long it took under load.
	assert.GreaterOrEqual(t, end.Sub(before), base*85/100-5*time.Millisecond, "confirmed strike")
	assert.LessOrEqual(t, end.Sub(before), base*115/100+time.Since(before), "confirmed strike")
	// A stale confirmation (the strike's end does not match) changes nothing.
	confirmed, err = rp.confirm(ctx, site, l.proxy, pen)
	require.NoError(t, err)
	assert.False(t, confirmed, "stale")
	assert.Equal(t, end, quarantineEnd(t, s, site, l.proxy))
	// A request still under way through it meets the same refusal: the
	// same offence, which never shortens the confirmed quarantine.
	again, err := s.penalize(ctx, site, l.proxy, nil, ban403)
	require.NoError(t, err)
	assert.False(t, again.first)
	assert.Equal(t, end, again.until)
	assert.Equal(t, end, quarantineEnd(t, s, site, l.proxy))

	// A challenge redirect is proof by itself.
	require.NoError(t, s.Unban(ctx, l.proxy.ID(), site))
	l = lease()
	require.NoError(t, l.Report(ctx, ban.Verdict{Kind: ban.OK}))
	l = lease()
	pen, err = s.penalize(ctx, site, l.proxy, l, ban.Verdict{Kind: ban.Ban, Reason: ban.ReasonChallenge})
	require.NoError(t, err)
	assert.False(t, pen.first)
	within(pen.quarantine, base, "challenge")

	// Lifting a first strike frees the proxy and keeps it healthy.
	require.NoError(t, s.Unban(ctx, l.proxy.ID(), site))
	l = lease()
	require.NoError(t, l.Report(ctx, ban.Verdict{Kind: ban.OK}))
	l = lease()
	pen, err = s.penalize(ctx, site, l.proxy, l, ban403)
	require.NoError(t, err)
	require.True(t, pen.first)
	require.NoError(t, rp.lift(ctx, site, l.proxy, pen))
	assert.True(t, leaseAll(t, s, site)[l.proxy.ID()], "free again at once")
	l = lease()
	pen, err = s.penalize(ctx, site, l.proxy, l, ban403)
	require.NoError(t, err)
	assert.True(t, pen.healthy, "still healthy after the lift")
	assert.False(t, pen.witness, "but no witness of a page: a lift is no healthy answer")
	assert.Equal(t, 1, pen.strikes)

	// Today's behaviour: every refusal is a ban at once.
	old := newSwitch(t, shared.Client(t), WithBans(Bans{Quarantine: base, QuarantineMax: maxq, EvidenceFirst: Off, PageProxies: Off}))
	_, err = old.Add(ctx, proxyURLs(1)...)
	require.NoError(t, err)
	l, err = old.Lease(ctx, site)
	require.NoError(t, err)
	pen, err = old.penalize(ctx, site, l.proxy, l, ban403)
	require.NoError(t, err)
	assert.False(t, pen.first)
	within(pen.quarantine, base, "WithBans(Bans{EvidenceFirst: Off, PageProxies: Off})")
}

// TestPageRefusals is issue 16's acceptance for refused pages: a site
// answers 403 to every client on every 10th of its 400 pages; 20 proxies,
// one Async collector with parallelism 20. The other pages succeed, the
// refused ones fail naming their 403 (ErrPageRefused), and the pool is
// still whole at the end.
func TestPageRefusals(t *testing.T) {
	if testing.Short() {
		t.Skip("a crawl")
	}
	ctx := context.Background()
	const proxies, pages, every, workers = 20, 400, 10, 20
	h := &testbed.RefusedPages{Next: testbed.DefaultHandler(), Every: every}
	site := testbed.NewSite(t, "refusing", h)
	ps := testbed.NewProxies(t, proxies)
	urls := make([]string, proxies)
	for i, p := range ps {
		urls[i] = p.URL()
	}
	s := newSwitch(t, shared.Client(t))
	_, err := s.Add(ctx, urls...)
	require.NoError(t, err)

	c := colly.NewCollector(colly.Async(true))
	s.Attach(c)
	require.NoError(t, c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: workers}))
	var mu sync.Mutex
	served := map[string]int{}
	failed := map[string]error{}
	recordPages(c, &mu, served, failed)
	start := time.Now()
	for i := 1; i <= pages; i++ {
		require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), i)))
	}
	c.Wait()
	elapsed := time.Since(start)

	normal, named, noProxy, pageRefused := 0, 0, 0, 0
	for i := 1; i <= pages; i++ {
		path := fmt.Sprintf("/p/%d", i)
		err := failed[path]
		if err != nil && strings.Contains(err.Error(), "no proxy available") {
			noProxy++
			assert.ErrorIs(t, err, ErrNoProxy, "%s: %v", path, err)
		}
		if !h.Refused(path) {
			if served[path] == 1 && err == nil {
				normal++
			} else {
				t.Logf("%s: served %d, err %v", path, served[path], err)
			}
			continue
		}
		assert.Zero(t, served[path], path)
		var be *BlockedError
		if assert.True(t, errors.As(err, &be), "%s: want a *BlockedError, got %v", path, err) &&
			assert.Equal(t, 403, be.Status, "%s: %v", path, err) {
			named++
			assert.Contains(t, err.Error(), "403 Forbidden")
			if errors.Is(err, ErrPageRefused) {
				pageRefused++
				assert.NotErrorIs(t, err, ErrBanned)
			}
		}
	}
	free := len(leaseAll(t, s, site.Host()))
	t.Logf("%v: %d of %d other pages served, %d of %d refused pages failed naming their 403 (%d as ErrPageRefused), %d no-proxy errors; %d of %d proxies free at the end; bans %v",
		elapsed.Round(time.Millisecond), normal, pages-pages/every, named, pages/every, pageRefused, noProxy, free, proxies, s.BanCounts())
	assert.GreaterOrEqual(t, normal, (pages-pages/every)*99/100, "other pages served")
	assert.Equal(t, pages/every, named, "refused pages failing with their 403")
	// Every refused page is the page's answer, even with refused pages in
	// flight at once using up the healthy witnesses (the every-try rule,
	// ban.go's pageRefused; 9cbd84f tolerated one ban before it).
	assert.Equal(t, pages/every, pageRefused, "refused pages judged the page's answer (ErrPageRefused)")
	assert.GreaterOrEqual(t, free, proxies-2, "proxies quarantined at the end")
	assert.Zero(t, site.Recorder().Collisions())
	assert.Zero(t, site.Recorder().DirectHits())
}

// recordPages counts, under mu, the responses c hands over by URL path
// (served) and the error of each path that failed.
func recordPages(c *colly.Collector, mu *sync.Mutex, served map[string]int, failed map[string]error) {
	c.OnResponse(func(r *colly.Response) {
		mu.Lock()
		defer mu.Unlock()
		served[r.Request.URL.Path]++
	})
	c.OnError(func(r *colly.Response, err error) {
		mu.Lock()
		defer mu.Unlock()
		failed[r.Request.URL.Path] = err
	})
}

// TestNoProxyErrorSurvivesClientTimeout: a request that waits for a proxy
// until Colly's request timeout (net/http's Client.Timeout) fails with an
// error that still matches ErrNoProxy, in OnError and in Visit
// (noProxySurvivesClientTimeout, causes_test.go).
func TestNoProxyErrorSurvivesClientTimeout(t *testing.T) {
	noProxySurvivesClientTimeout(t, false, time.Second)
}

// TestPageRefusalsAcrossCollectors runs the refused pages of
// TestPageRefusals through two collectors with their own Redis clients, 20
// parallel requests each, with 3 of the 20 proxies burnt from the start
// (the site answers their IPs 403 on every page): the strikes, lifts and
// confirmations of both collectors meet on the same proxies. Every other
// page is served, each refused page fails naming its 403, no IP is used
// twice at once, the healthy proxies are free at the end, and each burnt
// proxy is refused on one of the other pages at most: the page served
// through another proxy then confirms its strike. (A burnt proxy first to
// meet a refused page is lifted with the page's strikes, unproven, and
// meets its next page.)
func TestPageRefusalsAcrossCollectors(t *testing.T) {
	if testing.Short() {
		t.Skip("a crawl")
	}
	ctx := context.Background()
	const proxies, burnt, pages, every, workers, collectors = 20, 3, 400, 10, 20, 2
	h := &testbed.RefusedPages{Next: testbed.DefaultHandler(), Every: every}
	m := testbed.NewMarketplace(h)
	m.CaptchaOnConcurrent = true
	site := testbed.NewSite(t, "refusing", m)
	ps := testbed.NewProxies(t, proxies)
	urls := make([]string, proxies)
	burntIPs := map[string]bool{}
	for i, p := range ps {
		urls[i] = p.URL()
		if i < burnt {
			m.Burn(p.SourceIP().String(), testbed.Forbid)
			burntIPs[p.SourceIP().String()] = true
		}
	}
	s := newSwitch(t, shared.Client(t))
	_, err := s.Add(ctx, urls...)
	require.NoError(t, err)

	var mu sync.Mutex
	served := map[string]int{}
	failed := map[string]error{}
	var wg sync.WaitGroup
	var sws []*Switch
	for i := range collectors {
		c := colly.NewCollector(colly.Async(true))
		sw := sibling(t, s, shared.Client(t))
		sw.Attach(c)
		sws = append(sws, sw)
		require.NoError(t, c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: workers}))
		recordPages(c, &mu, served, failed)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := i + 1; n <= pages; n += collectors {
				assert.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), n)))
			}
			c.Wait()
		}()
	}
	wg.Wait()
	bans := map[BanKey]int64{}
	for _, sw := range sws {
		for k, n := range sw.BanCounts() {
			bans[k] += n
		}
	}
	t.Logf("bans %v", bans)

	normal, page, banned := 0, 0, 0
	unresolved := map[string]bool{} // refused pages that ended as bans
	for i := 1; i <= pages; i++ {
		path := fmt.Sprintf("/p/%d", i)
		err := failed[path]
		if !h.Refused(path) {
			assert.NoError(t, err, path)
			if served[path] == 1 {
				normal++
			}
			continue
		}
		assert.Zero(t, served[path], path)
		var be *BlockedError
		if assert.True(t, errors.As(err, &be), "%s: want a *BlockedError, got %v", path, err) {
			assert.Equal(t, 403, be.Status, "%s: %v", path, err)
			if errors.Is(err, ErrPageRefused) {
				page++
			} else {
				banned++ // retries ran out before two healthy proxies were refused
				unresolved[path] = true
			}
		}
	}
	free := leaseAll(t, s, site.Host())
	healthyFree := 0
	for _, p := range ps[burnt:] {
		if free[proxyID(p)] {
			healthyFree++
		}
	}
	burntOther := map[string]int{} // burnt IP -> other pages it was refused on
	burntHits := 0
	// A page that ended as a ban keeps the first strikes it cost (nothing
	// settled them, unresolvedRefusals): the healthy proxies it was refused
	// through may still be out at the end, with their first quarantine.
	struck := map[string]bool{}
	for _, hit := range m.Hits() {
		if unresolved[hit.Path] && !burntIPs[hit.IP] {
			struck[hit.IP] = true
		}
		if burntIPs[hit.IP] {
			burntHits++
			if !h.Refused(hit.Path) {
				burntOther[hit.IP]++
			}
		}
	}
	t.Logf("%d of %d other pages served; refused pages: %d as the page's answer, %d as bans (struck %d healthy proxies); free at the end: %d of %d healthy proxies; requests from burnt IPs: %d, on other pages %v",
		normal, pages-pages/every, page, banned, len(struck), healthyFree, proxies-burnt, burntHits, burntOther)
	assert.Equal(t, pages-pages/every, normal, "other pages served once each")
	assert.GreaterOrEqual(t, page, pages/every*9/10, "refused pages told from bans")
	assert.GreaterOrEqual(t, healthyFree, proxies-burnt-2-len(struck), "healthy proxies free at the end")
	for ip, n := range burntOther {
		assert.LessOrEqual(t, n, 1, "burnt IP %s refused on other pages", ip)
	}
	for _, p := range ps[:burnt] {
		if burntOther[p.SourceIP().String()] == 0 {
			continue
		}
		pp, err := ParseProxy(p.URL())
		require.NoError(t, err)
		// Confirmed: the base quarantine (30m), not the first one (1m).
		assert.Greater(t, time.Until(quarantineEnd(t, s, site.Host(), pp)), 20*time.Minute, "burnt IP %s", p.SourceIP())
	}
	assert.Zero(t, m.Count(testbed.DecidedCaptcha), "two requests from one IP at once")
	assert.Zero(t, site.Recorder().Collisions())
	assert.Zero(t, site.Recorder().DirectHits())
}

// TestNoProxyAfterABanNamesTheAnswer: a request refused through one proxy
// whose retry then waits for a proxy until its timeout fails with an error
// that matches ErrNoProxy and names the refusal before it (ErrBanned, the
// 403).
func TestNoProxyAfterABanNamesTheAnswer(t *testing.T) {
	ctx := context.Background()
	m := testbed.NewMarketplace(nil)
	site, proxies, s := marketBed(t, m, false, 2, WithTimeouts(Timeouts{MaxWait: time.Minute}))
	m.Burn(proxies[0].SourceIP().String(), testbed.Forbid)
	other, err := ParseProxy(proxies[1].URL())
	require.NoError(t, err)
	held, err := s.Lease(ctx, site.Host()) // least recently used: the first proxy added
	require.NoError(t, err)
	if held.Proxy().ID() != other.ID() {
		require.NoError(t, held.Release(ctx))
		held, err = s.Lease(ctx, site.Host())
		require.NoError(t, err)
	}
	require.Equal(t, other.ID(), held.Proxy().ID())
	defer held.Release(ctx)

	c := newPageCollector(t, s)
	c.SetRequestTimeout(time.Second)
	err = c.Visit(site.URL() + "/p/1")
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrNoProxy)
	assert.ErrorIs(t, err, ErrBanned)
	var be *BlockedError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, 403, be.Status)
	assert.Contains(t, err.Error(), "403 Forbidden")
	require.Len(t, c.errs, 1)
	assert.ErrorIs(t, c.errs[0], ErrNoProxy, "OnError")
	assert.Equal(t, 1, m.Count(testbed.DecidedForbidden))
}

// TestBurntTogetherIsNoPage: three of six proxies healthy on a site are
// burnt at once (the site answers their IPs 403 from then on) while one
// collector crawls pages one after the other, through the proxies in turn
// (least recently used first): the first, third and fourth of the turn.
// The first is refused on the next page, which the second serves: its
// strike is confirmed, a verdict. The page after it is refused through the
// third and the fourth, both healthy on the site before: no page refusing
// everyone, as the fourth's last healthy answer is older than the verdict
// on the first (it may have been burnt with it); the fifth serves the page
// and confirms their strikes. Every page is served, each burnt IP refused
// once, and quarantined for the base quarantine.
func TestBurntTogetherIsNoPage(t *testing.T) {
	m := testbed.NewMarketplace(nil)
	site, proxies, s := marketBed(t, m, false, 6, WithBans(Bans{Retries: 3}))
	c := newPageCollector(t, s)
	visit := func(from, to int) {
		t.Helper()
		for i := from; i <= to; i++ {
			require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), i)))
		}
	}
	visit(1, 12) // each proxy healthy on the site, twice
	hits := site.Recorder().Hits()
	var turn []string // the proxies' IPs, least recently used first
	for _, h := range hits[len(hits)-6:] {
		turn = append(turn, h.ClientIP)
	}
	burnt := []string{turn[0], turn[2], turn[3]}
	for _, ip := range burnt {
		m.Burn(ip, testbed.Forbid)
	}
	visit(13, 30)
	assert.Equal(t, 30, c.products)
	assert.Empty(t, c.errs)
	assert.Equal(t, 3, m.Count(testbed.DecidedForbidden), "each burnt IP refused once")
	for _, p := range proxies {
		if !slices.Contains(burnt, p.SourceIP().String()) {
			continue
		}
		pp, err := ParseProxy(p.URL())
		require.NoError(t, err)
		assert.Greater(t, time.Until(quarantineEnd(t, s, site.Host(), pp)), 20*time.Minute, "burnt IP %s confirmed", p.SourceIP())
	}
	assert.Len(t, leaseAll(t, s, site.Host()), 3, "the healthy proxies are free")
}
