package proxyswitch

import (
	"context"
	"errors"
	"fmt"
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

// Pages that refuse every IP must not burn the pool (ban.go, pageRefused):
// on a cold site, after a long run of them, and behind a login wall.

// everyoneRefused is a shop whose /gone/{n} pages refuse every IP (a 403,
// or with sel a page without its product, a missing selector) and whose
// /wall/{n} pages redirect every IP to the login page; the rest is next.
type everyoneRefused struct {
	next http.Handler
	sel  bool
}

func (h everyoneRefused) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case strings.HasPrefix(r.URL.Path, "/gone/") && h.sel:
		w.Header().Set("Content-Type", "text/html")
		_, _ = w.Write([]byte(`<html><body><div class="gone">This product is no longer sold.</div>` +
			strings.Repeat("<p>Other products you may like.</p>", 40) + `</body></html>`))
	case strings.HasPrefix(r.URL.Path, "/gone/"):
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte("<html><body>Forbidden</body></html>"))
	case strings.HasPrefix(r.URL.Path, "/wall/"):
		http.Redirect(w, r, "/login?next="+r.URL.Path, http.StatusFound)
	default:
		h.next.ServeHTTP(w, r)
	}
}

// refusalBed is a site of everyoneRefused behind a marketplace guard (m,
// for IPs refused on every page), n proxies, and a Switch whose log is
// kept (the breaker's pauses are logged at Warn).
type refusalBed struct {
	site    *testbed.Site
	m       *testbed.Marketplace
	proxies []*testbed.Proxy
	s       *Switch
	log     *testlog.Buffer
}

func newRefusalBed(t *testing.T, sel bool, n int, opts ...Option) *refusalBed {
	t.Helper()
	b := &refusalBed{m: testbed.NewMarketplace(everyoneRefused{next: testbed.DefaultHandler(), sel: sel}), log: &testlog.Buffer{}}
	b.site = testbed.NewSite(t, "shop", b.m)
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

// breakerOpened reports whether the site's circuit breaker paused it at
// any time (logged), or holds it now.
func (b *refusalBed) breakerOpened(t *testing.T) bool {
	t.Helper()
	paused, err := b.s.PausedSites(context.Background())
	require.NoError(t, err)
	return len(paused) > 0 || strings.Contains(b.log.String(), "site paused")
}

// outcome is what became of each URL path of a crawl: served, or its error.
type outcome struct {
	mu     sync.Mutex
	served map[string]int
	failed map[string]error
}

func record(c *colly.Collector) *outcome {
	o := &outcome{served: map[string]int{}, failed: map[string]error{}}
	recordPages(c, &o.mu, o.served, o.failed)
	return o
}

// goodServed asserts that each of the good pages /p/1 to /p/<good> was
// served once and did not fail, and returns how many were.
func (o *outcome) goodServed(t *testing.T, good int) int {
	t.Helper()
	served := 0
	for i := 1; i <= good; i++ {
		path := fmt.Sprintf("/p/%d", i)
		if assert.NoError(t, o.failed[path], path) && assert.Equal(t, 1, o.served[path], path) {
			served++
		}
	}
	return served
}

// checkRefused asserts that path failed as the page's answer, not a ban.
func checkRefused(t *testing.T, err error, path, reason string) {
	t.Helper()
	var be *BlockedError
	if assert.True(t, errors.As(err, &be), "%s: want a *BlockedError, got %v", path, err) {
		assert.ErrorIs(t, err, ErrPageRefused, path)
		assert.NotErrorIs(t, err, ErrBanned, path)
		assert.Equal(t, reason, be.Verdict.Reason, path)
	}
}

// TestRefusedPagesOnAColdSite: deleted pages (403 to every IP, or a page
// missing its product for everyone) met at the start of a crawl, before
// any proxy had a healthy answer on the site, with an Async collector of
// parallelism 5 and 20 proxies: first the refused pages, then 30 good
// ones, or both interleaved. Each refused page fails with ErrPageRefused
// (three distinct proxies refused it on its last try: no healthy witnesses
// exist yet), every good page is served, the site's breaker never opens,
// and no proxy is left quarantined at the end. Before the every-try rule,
// each refused page ended as a ban after three tries: its strikes stayed
// and went to the breaker as unresolved, which opened (Burst 8). (With 10
// proxies, the five pages' first two tries hold the whole pool: see
// pageRefused's every-try rule, a limit left open.)
//
// Interleaved, a limit of the unproven-lift rule (lift.lua, the H2 fix):
// the good pages take the fresh proxies, and a refused page asked for
// late may find on its retries only proxies other refused pages lifted
// before any of them was served a page: unproven, no fresh first strikes,
// as a banned IP lifted with a page would be. That page then ends as a
// ban (one page in about 1 run of 4 here), its proxies' strikes first
// strikes of the short quarantine: two such pages are tolerated, their
// proxies out for no more than the first quarantine, and nothing else.
func TestRefusedPagesOnAColdSite(t *testing.T) {
	for _, tc := range []struct {
		name    string
		sel     bool
		mixed   bool
		proxies int
	}{
		{"403 first", false, false, 20},
		{"missing selector first", true, false, 20},
		{"403 interleaved", false, true, 20},
		{"missing selector interleaved", true, true, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const gone, good = 5, 30
			b := newRefusalBed(t, tc.sel, tc.proxies)
			c := colly.NewCollector(colly.Async(true))
			b.s.Attach(c)
			require.NoError(t, c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: 5}))
			c.SetRequestTimeout(time.Minute)
			o := record(c)
			visit := func(path string) { require.NoError(t, c.Visit(b.site.URL()+path)) }
			for i := 1; i <= max(gone, good); i++ {
				if i <= gone {
					visit(fmt.Sprintf("/gone/%d", i))
				}
				if tc.mixed && i <= good {
					visit(fmt.Sprintf("/p/%d", i))
				}
			}
			if !tc.mixed {
				c.Wait()
				for i := 1; i <= good; i++ {
					visit(fmt.Sprintf("/p/%d", i))
				}
			}
			c.Wait()

			reason := "http_403"
			if tc.sel {
				reason = ban.ReasonSelector
			}
			banned := 0
			for i := 1; i <= gone; i++ {
				path := fmt.Sprintf("/gone/%d", i)
				assert.Zero(t, o.served[path], path)
				if tc.mixed && errors.Is(o.failed[path], ErrBanned) && banned < 2 {
					banned++ // the limit above
					t.Logf("%s: %v", path, o.failed[path])
					continue
				}
				checkRefused(t, o.failed[path], path, reason)
			}
			servedGood := o.goodServed(t, good)
			free := leaseAll(t, b.s, b.site.Host())
			t.Logf("good pages served %d of %d; proxies free at the end %d of %d; bans %v",
				servedGood, good, len(free), tc.proxies, b.s.BanCounts())
			assert.False(t, b.breakerOpened(t), "the site's breaker opened")
			if banned == 0 {
				assert.Len(t, free, tc.proxies, "every proxy free at the end")
			} else {
				assert.GreaterOrEqual(t, len(free), tc.proxies-3*banned, "proxies free at the end")
				for _, p := range b.proxies {
					pp, err := ParseProxy(p.URL())
					require.NoError(t, err)
					assert.Less(t, time.Until(quarantineEnd(t, b.s, b.site.Host(), pp)), 2*time.Minute,
						"%s: out for more than a first strike", p.SourceIP())
				}
			}
			assert.Zero(t, b.site.Recorder().DirectHits())
		})
	}
}

// TestLongRunOfRefusedPages: a synchronous collector warms a pool of 12
// proxies on the site (each healthy there, three times), then meets 12
// different deleted pages in a row, 3 good pages, and one deleted page 8
// times in a row, then 12 good pages. Every deleted page fails with
// ErrPageRefused: the first ones on their second try (two healthy
// witnesses), the later ones, once every proxy's healthy answer is older
// than a lift, on their last (three distinct first strikes). No proxy is
// left quarantined, the breaker never opens, every good page is served.
// Before the every-try rule, the witnesses ran out after six pages: the
// next ones ended as bans, their strikes reported to the breaker, which
// paused the site.
func TestLongRunOfRefusedPages(t *testing.T) {
	const proxies = 12
	b := newRefusalBed(t, false, proxies)
	c := newPageCollector(t, b.s)
	c.SetRequestTimeout(time.Minute)
	var refused []string // the deleted pages' visits, in order
	visit := func(path string) {
		t.Helper()
		err := c.Visit(b.site.URL() + path)
		if strings.HasPrefix(path, "/gone/") {
			refused = append(refused, path)
			checkRefused(t, err, path, "http_403")
			return
		}
		assert.NoError(t, err, path)
	}
	n := 0
	good := func(k int) {
		for range k {
			n++
			visit(fmt.Sprintf("/p/%d", n))
		}
	}
	good(3 * proxies)
	for i := 1; i <= 12; i++ {
		visit(fmt.Sprintf("/gone/%d", i))
	}
	good(3)
	for range 8 {
		visit("/gone/same")
	}
	good(12)

	assert.Equal(t, n, c.products, "good pages served")
	assert.Len(t, c.errs, len(refused), "errors: the deleted pages' alone")
	free := leaseAll(t, b.s, b.site.Host())
	t.Logf("%d deleted-page visits, %d good pages served; proxies free at the end %d of %d; bans %v",
		len(refused), c.products, len(free), proxies, b.s.BanCounts())
	assert.False(t, b.breakerOpened(t), "the site's breaker opened")
	assert.Len(t, free, proxies, "every proxy free at the end")
}

// TestLoginWallForEveryone: some pages of a site redirect every IP to its
// login page (a listing behind a login wall), while two of the 24 proxies
// are burnt (the site redirects them to its captcha on every page). An
// Async collector (parallelism 5) crawls 100 good pages, 5 walled ones,
// 100 more good ones. Each walled page fails with ErrPageRefused (the
// challenge redirect, through three distinct proxies on its last try),
// every good page is served, the breaker never opens, and at the end the
// 22 healthy proxies are free while each burnt one met is quarantined for
// the base quarantine: its challenge, a strike, was confirmed when another
// proxy was served the page. Before, a challenge redirect was a ban at
// once: each walled page quarantined three healthy proxies for ~30 min and
// reported them to the breaker (15 walled pages' worth would open it).
func TestLoginWallForEveryone(t *testing.T) {
	const proxies, burnt, walled, good = 24, 2, 5, 200
	b := newRefusalBed(t, false, proxies)
	burntIPs := map[string]bool{}
	for _, p := range b.proxies[:burnt] {
		b.m.Burn(p.SourceIP().String(), testbed.Challenge)
		burntIPs[p.SourceIP().String()] = true
	}
	c := colly.NewCollector(colly.Async(true))
	b.s.Attach(c)
	require.NoError(t, c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: 5}))
	c.SetRequestTimeout(time.Minute)
	o := record(c)
	for i := 1; i <= good; i++ {
		require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", b.site.URL(), i)))
		if i == good/2 {
			for j := 1; j <= walled; j++ {
				require.NoError(t, c.Visit(fmt.Sprintf("%s/wall/%d", b.site.URL(), j)))
			}
		}
	}
	c.Wait()

	// A walled page whose tries met a burnt IP already struck (no fresh
	// first strike) cannot be told from a page refusing only some IPs: it
	// ends as a ban, and the burnt IP's strike stays a first strike (the
	// short quarantine). Seen once in a clean-clone CI run (Redis Cluster,
	// under load); one such page is tolerated, and then one burnt IP held
	// for the first quarantine only.
	bannedWalls := 0
	for j := 1; j <= walled; j++ {
		path := fmt.Sprintf("/wall/%d", j)
		if errors.Is(o.failed[path], ErrBanned) && bannedWalls == 0 {
			bannedWalls++
			continue
		}
		checkRefused(t, o.failed[path], path, ban.ReasonChallenge)
	}
	servedGood := o.goodServed(t, good)
	free := leaseAll(t, b.s, b.site.Host())
	healthyFree, burntOut := 0, 0
	for _, p := range b.proxies {
		pp, err := ParseProxy(p.URL())
		require.NoError(t, err)
		switch {
		case !burntIPs[p.SourceIP().String()]:
			if free[pp.ID()] {
				healthyFree++
			}
		case b.site.Recorder().IPs()[p.SourceIP().String()] > 0:
			burntOut++
			assert.False(t, free[pp.ID()], "burnt IP %s free", p.SourceIP())
			end := time.Until(quarantineEnd(t, b.s, b.site.Host(), pp))
			if bannedWalls > 0 && end < 20*time.Minute {
				bannedWalls-- // the tolerated walled page's burnt IP: a first strike
				assert.Greater(t, end, time.Duration(0), "burnt IP %s quarantined", p.SourceIP())
				continue
			}
			assert.Greater(t, end, 20*time.Minute, "burnt IP %s: its challenge confirmed", p.SourceIP())
		}
	}
	t.Logf("good pages served %d of %d; healthy proxies free %d of %d; burnt proxies met and quarantined %d; bans %v",
		servedGood, good, healthyFree, proxies-burnt, burntOut, b.s.BanCounts())
	assert.False(t, b.breakerOpened(t), "the site's breaker opened")
	assert.Equal(t, proxies-burnt, healthyFree, "healthy proxies free at the end")
	for _, h := range b.site.Recorder().Hits() {
		assert.NotEqual(t, "/login", h.Path, "the login page was requested by %s", h.ClientIP)
	}
	assert.Zero(t, b.site.Recorder().DirectHits())
}

// stormAll answers 403 to every request once on is set: a storm of
// refusals of every page, for every IP.
type stormAll struct {
	next http.Handler
	on   atomic.Bool
}

func (h *stormAll) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.on.Load() {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte("<html><body>Forbidden</body></html>"))
		return
	}
	h.next.ServeHTTP(w, r)
}

// TestForbiddenStormStillPausesTheSite: the page-or-IP judgment does not
// hide a storm. A site serving 20 proxies (each healthy there) starts
// answering 403 to every page for every IP; an Async collector
// (parallelism 5) goes on crawling new pages. The first refused pages are
// judged the pages' own answers, but once twice the breaker's Burst of
// them came in a row with nothing served (stormSuspect), the Switch pauses
// the site for itself (its own guess: the fleet's breaker hears nothing of
// it), and the later requests fail with ErrSitePaused: most of the pool is
// free at the end.
func TestForbiddenStormStillPausesTheSite(t *testing.T) {
	const proxies = 20
	h := &stormAll{next: testbed.DefaultHandler()}
	site, _, s := handlerBed(t, "storm", h, false, proxies)
	log := &testlog.Buffer{}
	s.cfg.logger = log.Logger()
	c := colly.NewCollector(colly.Async(true))
	s.Attach(c)
	require.NoError(t, c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: 5}))
	c.SetRequestTimeout(3 * time.Second)
	o := record(c)
	for i := 1; i <= 2*proxies; i++ {
		require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), i)))
	}
	c.Wait()
	require.Len(t, o.failed, 0, "before the storm")
	h.on.Store(true)
	for i := 2*proxies + 1; i <= 2*proxies+80; i++ {
		require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), i)))
	}
	c.Wait()
	paused := 0
	for _, err := range o.failed {
		if errors.Is(err, ErrSitePaused) {
			paused++
		}
	}
	states, err := s.ProxyStates(context.Background(), site.Host())
	require.NoError(t, err)
	out := 0
	for _, st := range states {
		if st.State == StateQuarantined || st.State == StateDead {
			out++
		}
	}
	t.Logf("storm: %d requests failed, %d of them on the paused site; proxies quarantined at the end %d of %d",
		len(o.failed), paused, out, proxies)
	assert.True(t, strings.Contains(log.String(), "site paused"), "the site's breaker opened")
	assert.LessOrEqual(t, out, proxies/2, "proxies quarantined at the end")
}
