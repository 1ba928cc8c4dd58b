package proxyswitch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/proxyswitch/proxyswitch/internal/testlog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Regressions of the page-or-IP judgment (ban.go, pageRefused) found by a
// review of its every-try rule and challenge strikes.

// TestBannedIPsStayMarkedAfterAPageVerdict (H2): on a cold site that bans 8
// of 12 IPs (403 on every page) and serves every page to the others, a
// synchronous collector crawls 40 good pages. A good page can be judged
// the page's answer only when its three tries met banned IPs, two of them
// at least new to the site (the every-try rule cannot tell them from a
// page refusing everyone); the strikes it lifts stay on record as
// unproven lifts, so each banned IP is a fresh first strike at most once:
// at most 8/2 = 4 such pages, and every banned IP the site saw keeps its
// strike, a marker or a later one, at the end, none forgotten. Before, a lift deleted the strike
// record of a proxy never healthy on the site: its next refusal was a
// fresh first strike again, the same banned IPs passed for pages over and
// over (12 good pages failed ErrPageRefused in the review's run) and some
// ended free, their record gone.
func TestBannedIPsStayMarkedAfterAPageVerdict(t *testing.T) {
	const proxies, banned, good = 12, 8, 40
	b := newRefusalBed(t, false, proxies)
	bannedIPs := map[string]bool{}
	for _, p := range b.proxies[:banned] {
		b.m.Burn(p.SourceIP().String(), testbed.Forbid)
		bannedIPs[p.SourceIP().String()] = true
	}
	c := newPageCollector(t, b.s)
	c.SetRequestTimeout(time.Minute)
	pageVerdicts, bans := 0, 0
	for i := 1; i <= good; i++ {
		err := c.Visit(fmt.Sprintf("%s/p/%d", b.site.URL(), i))
		switch {
		case errors.Is(err, ErrPageRefused):
			pageVerdicts++
		case err != nil:
			bans++
		}
	}
	ctx := context.Background()
	strikes := shared.Client(t).HGetAll(ctx, b.s.keys.strikes(b.s.scopeOf(b.site.Host()))).Val()
	seen := b.site.Recorder().IPs()
	met, forgotten := 0, 0
	for _, p := range b.proxies[:banned] {
		if seen[p.SourceIP().String()] == 0 {
			continue
		}
		met++
		pp, err := ParseProxy(p.URL())
		require.NoError(t, err)
		rec := strikes[pp.ID()]
		if rec == "" || strings.HasPrefix(rec, "0|") {
			forgotten++
			t.Logf("banned IP %s: strike record %q", p.SourceIP(), rec)
		}
	}
	t.Logf("good pages: %d judged refused by the page, %d failed otherwise, %d served; banned IPs met %d, forgotten %d; bans %v",
		pageVerdicts, bans, c.products, met, forgotten, b.s.BanCounts())
	assert.LessOrEqual(t, pageVerdicts, banned/2, "good pages judged the page's answer")
	assert.Zero(t, forgotten, "banned IPs whose strike was forgotten")
	assert.Zero(t, b.site.Recorder().DirectHits())
}

// TestPageVerdictLiftsOnlyItsReason (M1): three proxies healthy on a site
// whose /gone/ pages answer 403 to everyone. In rounds, the pool is warmed
// on good pages, the site burns one proxy (a redirect to its captcha on
// every page) and a deleted page is asked for, until the burnt proxy met
// one. Its challenge strike is no part of the page's 403s: the page
// verdict (two healthy witnesses) lifts their strikes alone, and the burnt
// proxy stays quarantined. Before, a page verdict lifted every first
// strike the page cost, the challenge's too: the burnt proxy was free
// again, and healthy as lifted (a witness).
func TestPageVerdictLiftsOnlyItsReason(t *testing.T) {
	const proxies = 3
	b := newRefusalBed(t, false, proxies)
	c := newPageCollector(t, b.s)
	c.SetRequestTimeout(time.Minute)
	burnt := b.proxies[0]
	ip := burnt.SourceIP().String()
	met := func() bool {
		for _, h := range b.site.Recorder().Hits() {
			if h.ClientIP == ip && strings.HasPrefix(h.Path, "/gone/") {
				return true
			}
		}
		return false
	}
	n, good := 0, 0
	for n < 10 && !met() {
		b.m.Burn(ip, testbed.Serve)
		for range 3 * proxies {
			good++
			require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", b.site.URL(), good)))
		}
		b.m.Burn(ip, testbed.Challenge)
		n++
		path := fmt.Sprintf("/gone/%d", n)
		checkRefused(t, c.Visit(b.site.URL()+path), path, "http_403")
	}
	require.True(t, met(), "the burnt proxy met no deleted page in %d", n)
	pp, err := ParseProxy(burnt.URL())
	require.NoError(t, err)
	free := leaseAll(t, b.s, b.site.Host())
	t.Logf("rounds %d; proxies free %d of %d; bans %v", n, len(free), proxies, b.s.BanCounts())
	assert.False(t, free[pp.ID()], "the burnt proxy is free")
	assert.Greater(t, time.Until(quarantineEnd(t, b.s, b.site.Host(), pp)), 20*time.Second, "the burnt proxy's strike")
	assert.Len(t, free, proxies-1, "the healthy proxies free")
}

// movedPages is everyoneRefused behind permanent redirects: /old/{rest}
// answers 301 to /{rest} (a site's moved pages: /old/p/1 to /p/1,
// /old/wall/1 to the login wall /wall/1, /old/gone/1 to a deleted page).
type movedPages struct{ next http.Handler }

func (h movedPages) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if rest, ok := strings.CutPrefix(r.URL.Path, "/old/"); ok {
		http.Redirect(w, r, "/"+rest, http.StatusMovedPermanently)
		return
	}
	h.next.ServeHTTP(w, r)
}

// newMovedBed is newRefusalBed with movedPages in front of the site.
func newMovedBed(t *testing.T, n int, opts ...Option) *refusalBed {
	t.Helper()
	b := &refusalBed{m: testbed.NewMarketplace(movedPages{everyoneRefused{next: testbed.DefaultHandler()}}), log: &testlog.Buffer{}}
	b.site = testbed.NewSite(t, "moved", b.m)
	b.proxies = testbed.NewProxies(t, n)
	opts = append([]Option{WithLogger(b.log.Logger()), WithExpect(b.site.Host(), `^/(p|gone)/`, ".product")}, opts...)
	b.s = newSwitch(t, shared.Client(t), opts...)
	urls := make([]string, n)
	for i, p := range b.proxies {
		urls[i] = p.URL()
	}
	_, err := b.s.Add(context.Background(), urls...)
	require.NoError(t, err)
	return b
}

// TestChallengeConfirmedBehindAPermanentRedirect (M2): two proxies, one
// of them burnt (the site redirects it to its captcha on every page); a
// synchronous collector asks for moved pages (/old/p/n, a 301 to /p/n)
// until the burnt proxy met one. Its challenge, a strike on /old/p/n, is
// confirmed when the other proxy is served the page behind the 301: the
// burnt proxy is quarantined for the base quarantine (30m), not the first
// one (1m). Before, only the served URL's (/p/n) strikes were confirmed.
func TestChallengeConfirmedBehindAPermanentRedirect(t *testing.T) {
	b := newMovedBed(t, 2)
	burnt := b.proxies[0]
	ip := burnt.SourceIP().String()
	b.m.Burn(ip, testbed.Challenge)
	c := newPageCollector(t, b.s)
	c.SetRequestTimeout(time.Minute)
	n := 0
	for n < 10 && b.site.Recorder().IPs()[ip] == 0 {
		n++
		require.NoError(t, c.Visit(fmt.Sprintf("%s/old/p/%d", b.site.URL(), n)))
	}
	require.NotZero(t, b.site.Recorder().IPs()[ip], "the burnt proxy met no page in %d", n)
	pp, err := ParseProxy(burnt.URL())
	require.NoError(t, err)
	left := time.Until(quarantineEnd(t, b.s, b.site.Host(), pp))
	t.Logf("pages %d, products %d; the burnt proxy's quarantine %v; bans %v", n, c.products, left.Round(time.Second), b.s.BanCounts())
	assert.Equal(t, n, c.products, "pages served")
	assert.Greater(t, left, 20*time.Minute, "the burnt proxy's challenge confirmed")
}

// TestPageWallsBehindAPermanentRedirect (M3): a login wall and a deleted
// page reached through a 301 (/old/wall/n, /old/gone/n) on a cold site of
// 12 proxies, asked for by a synchronous collector, then good pages. The
// hop behind the 301 counts as the page asked for: the wall's challenge
// redirects are strikes and, like the deleted page's 403s, the page's
// answer on the last try (three distinct first strikes): ErrPageRefused,
// and every proxy is free at the end. Before, any redirect on the way
// switched both rules off: each such page ended as a ban of the proxies
// it met (for the wall, three proxies out for the base quarantine).
func TestPageWallsBehindAPermanentRedirect(t *testing.T) {
	for _, tc := range []struct{ path, reason string }{
		{"/old/wall/", ban.ReasonChallenge},
		{"/old/gone/", "http_403"},
	} {
		t.Run(strings.Trim(tc.path, "/"), func(t *testing.T) {
			const proxies = 12
			b := newMovedBed(t, proxies)
			c := newPageCollector(t, b.s)
			c.SetRequestTimeout(time.Minute)
			for i := 1; i <= 2; i++ {
				path := fmt.Sprintf("%s%d", tc.path, i)
				checkRefused(t, c.Visit(b.site.URL()+path), path, tc.reason)
			}
			for i := 1; i <= proxies; i++ {
				assert.NoError(t, c.Visit(fmt.Sprintf("%s/old/p/%d", b.site.URL(), i)))
			}
			free := leaseAll(t, b.s, b.site.Host())
			t.Logf("products %d; proxies free %d of %d; bans %v", c.products, len(free), proxies, b.s.BanCounts())
			assert.Equal(t, proxies, c.products, "good pages served")
			assert.Len(t, free, proxies, "every proxy free at the end")
			assert.False(t, b.breakerOpened(t), "the site's breaker opened")
			for _, h := range b.site.Recorder().Hits() {
				assert.NotEqual(t, "/login", h.Path, "the login page was requested by %s", h.ClientIP)
			}
		})
	}
}

// TestStormGuardPausesOneSwitchAlone (M5): a Switch warms a pool of 12 on
// a site, then meets 2*Burst+8 deleted pages in a row (403 for everyone)
// and nothing else: its storm guard guesses a storm after 2*Burst page
// verdicts, and pauses the site for itself alone (the later deleted pages
// fail with ErrSitePaused at once, the earlier ones with ErrPageRefused,
// none as a ban). The fleet's circuit breaker never opens: another Switch
// of the same pool (another server) is served its 12 good pages at once,
// and no proxy is quarantined. Before, the guard left the refusals
// unresolved, reported them to the fleet's breaker as bans, and the
// breaker paused the site for every server.
func TestStormGuardPausesOneSwitchAlone(t *testing.T) {
	const proxies = 12
	b := newRefusalBed(t, false, proxies, WithTimeouts(Timeouts{MaxWait: Off}))
	c := newPageCollector(t, b.s)
	c.SetRequestTimeout(time.Minute)
	for i := 1; i <= 3*proxies; i++ {
		require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", b.site.URL(), i)))
	}
	gone := 2*b.s.cfg.breaker.Burst + 8
	refused, paused := 0, 0
	for i := 1; i <= gone; i++ {
		path := fmt.Sprintf("/gone/%d", i)
		err := c.Visit(b.site.URL() + path)
		var pe *SitePausedError
		switch {
		case errors.Is(err, ErrPageRefused):
			refused++
		case errors.As(err, &pe):
			paused++
			assert.True(t, pe.Local, "%s: the pause is this Switch's: %v", path, err)
			assert.Contains(t, err.Error(), "on this Switch alone", path)
		default:
			t.Errorf("%s: want ErrPageRefused or ErrSitePaused, got %v", path, err)
		}
	}
	ctx := context.Background()
	fleet, err := b.s.PausedSites(ctx)
	require.NoError(t, err)

	other := sibling(t, b.s, shared.Client(t))
	oc := newPageCollector(t, other)
	oc.SetRequestTimeout(time.Minute)
	for i := 1; i <= proxies; i++ {
		assert.NoError(t, oc.Visit(fmt.Sprintf("%s/p/%d", b.site.URL(), 1000+i)))
	}
	free := leaseAll(t, b.s, b.site.Host())
	t.Logf("deleted pages: %d ErrPageRefused, %d ErrSitePaused; fleet pauses %v; the other Switch served %d of %d; proxies free %d of %d; bans %v",
		refused, paused, fleet, oc.products, proxies, len(free), proxies, b.s.BanCounts())
	assert.Empty(t, fleet, "the fleet's breaker paused the site")
	assert.GreaterOrEqual(t, refused, 2*b.s.cfg.breaker.Burst, "deleted pages judged before the guard")
	assert.Positive(t, paused, "deleted pages met by the local pause")
	assert.True(t, strings.Contains(b.log.String(), "paused on this Switch alone"), "the local pause logged")
	assert.Equal(t, proxies, oc.products, "the other Switch's pages served")
	assert.Len(t, free, proxies, "every proxy free at the end")

	// ResumeSite ends the local pause too (MaxWait Off: a pause still on
	// would fail the page at once).
	require.NoError(t, b.s.ResumeSite(ctx, b.site.Host()))
	assert.NoError(t, c.Visit(b.site.URL()+"/p/2000"), "served once resumed")
}

// The storm guard's local pause is waited out as a breaker's pause is
// (up to Timeouts.MaxWait): a page asked for during it is served once it
// ends (a storm that ended meanwhile loses no page), and the run of page
// verdicts that caused it goes on after it (one more deleted page pauses
// the site again at once). A run is forgotten after the breaker's Window
// plus Pause without a page verdict.
func TestStormGuardPauseIsWaitedOut(t *testing.T) {
	const proxies = 12
	pause := 700 * time.Millisecond
	b := newRefusalBed(t, false, proxies, WithBreaker(Breaker{Pause: pause, Window: 500 * time.Millisecond}))
	c := newPageCollector(t, b.s)
	c.SetRequestTimeout(time.Minute)
	for i := 1; i <= 3*proxies; i++ {
		require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", b.site.URL(), i)))
	}
	guard := 2 * b.s.cfg.breaker.Burst
	for i := 1; i <= guard; i++ {
		err := c.Visit(fmt.Sprintf("%s/gone/%d", b.site.URL(), i))
		require.ErrorIs(t, err, ErrPageRefused, "before the guard")
	}
	_, _, on := b.s.pageRuns.paused(b.site.Host())
	require.True(t, on, "the guard paused the site here")
	start := time.Now()
	require.NoError(t, c.Visit(b.site.URL()+"/p/500"), "a page asked for during the pause waits it out")
	waited := time.Since(start)
	assert.Greater(t, waited, pause/4, "it waited for the pause")
	_, _, on = b.s.pageRuns.paused(b.site.Host())
	assert.False(t, on, "the page served ended the run")

	// A new run: verdicts far apart (past Window + Pause) do not add up.
	for i := 1; i < guard; i++ {
		require.ErrorIs(t, c.Visit(fmt.Sprintf("%s/gone/%d", b.site.URL(), 100+i)), ErrPageRefused)
	}
	time.Sleep(b.s.cfg.breaker.Window + pause + 200*time.Millisecond)
	require.ErrorIs(t, c.Visit(b.site.URL()+"/gone/200"), ErrPageRefused)
	_, _, on = b.s.pageRuns.paused(b.site.Host())
	assert.False(t, on, "a stale run started again: no pause")
	assert.Len(t, leaseAll(t, b.s, b.site.Host()), proxies, "every proxy free at the end")
}

// A cold site whose crawl starts with more refused pages than a third of
// the pool (14 deleted pages on 20 proxies, one at a time): each page's
// proxies are lifted unproven (never healthy there), so the later pages
// find no fresh first strikes and may end as bans; those unproven strikes
// are no evidence against the site (unresolvedRefusals), so the breaker
// never opens, no proxy is held past its first quarantine, and the good
// pages that follow are served. (Review H-1 of the merged ban evidence:
// the breaker opened, the pages after it failed ErrNoProxy, 0 of 20
// proxies were free.)
func TestManyRefusedPagesFirstOnAColdSite(t *testing.T) {
	const proxies, gone, good = 20, 14, 20
	b := newRefusalBed(t, false, proxies)
	c := newPageCollector(t, b.s)
	c.SetRequestTimeout(time.Minute)
	kinds := map[string]int{}
	for i := 1; i <= gone; i++ {
		err := c.Visit(fmt.Sprintf("%s/gone/%d", b.site.URL(), i))
		switch {
		case errors.Is(err, ErrPageRefused):
			kinds["page"]++
		case errors.Is(err, ErrBanned):
			kinds["banned"]++
		default:
			t.Errorf("/gone/%d: want ErrPageRefused or ErrBanned, got %v", i, err)
		}
	}
	for i := 1; i <= good; i++ {
		assert.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", b.site.URL(), i)))
	}
	opened := b.breakerOpened(t)
	t.Logf("deleted pages: %v; good pages served %d of %d; breaker opened %v", kinds, c.products, good, opened)
	assert.False(t, opened, "refused pages opened the site's breaker")
	assert.GreaterOrEqual(t, kinds["page"], gone/2, "most deleted pages judged the page's answer")
	assert.Equal(t, good, c.products, "good pages served")
	states, err := b.s.ProxyStates(context.Background(), b.site.Host())
	require.NoError(t, err)
	for _, st := range states {
		if st.State == StateQuarantined {
			assert.Less(t, time.Until(st.Until), 2*time.Minute, "%s held past its first quarantine", st.Proxy)
		}
	}
}

// A request waiting out the storm guard's local pause goes as soon as the
// run ends (a page served, ResumeSite), not at the pause's end; a run gone
// stale, its pause over, is forgotten.
func TestPageRunWaitersGoWhenTheRunEnds(t *testing.T) {
	var p pageRuns
	p.add("s", time.Minute)
	p.pause("s", 5*time.Second, func(time.Time) {})
	done := make(chan error, 1)
	go func() { done <- p.wait(context.Background(), "s", time.Minute) }()
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	p.served("s")
	select {
	case err := <-done:
		require.NoError(t, err)
		assert.Less(t, time.Since(start), time.Second)
	case <-time.After(3 * time.Second):
		t.Fatal("the waiter stayed after the run ended")
	}

	p.add("x", 10*time.Millisecond)
	assert.EqualValues(t, 1, p.n.Load())
	time.Sleep(30 * time.Millisecond)
	_, _, on := p.paused("x")
	assert.False(t, on)
	assert.Zero(t, p.n.Load(), "a stale run is forgotten")
}
