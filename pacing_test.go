package proxyswitch

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// paceRun crawls a site allowing each IP one request per every (429
// beyond) through 20 proxies with two collectors (Switches with Redis
// clients of their own: two servers sharing the learned pace), 20 workers
// each, until it has seen attempts requests, and returns its 429 share and
// its pages per second over the attempts after the first skip.
func paceRun(t *testing.T, every time.Duration, attempts, skip int, opts ...Option) (refused, pagesPerSec float64) {
	t.Helper()
	site := &testbed.PerIPLimit{Every: every}
	srv := testbed.NewSite(t, "paced", site)
	bed := &testbed.Bed{Proxies: testbed.NewProxies(t, 20)}
	// The site circuit breaker is off: this measures pacing alone. (With
	// it on, the learning phase's 429s can pause the site: under -race on
	// a loaded machine the crawl then outran the test's timeout.)
	s := newSwitch(t, shared.Client(t), append([]Option{WithQuarantine(100*time.Millisecond, 400*time.Millisecond),
		WithRetries(2), WithBreaker(Breaker{Disabled: true})}, opts...)...)
	_, err := s.Add(context.Background(), bed.ProxyURLs()...)
	require.NoError(t, err)
	other := sibling(t, s, shared.Client(t))
	for len(site.Attempts()) < attempts { // one batch each: no drain in between
		var wg sync.WaitGroup
		for _, sw := range []*Switch{s, other} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				crawlAsync(t, sw, srv, attempts/2, 20)
			}()
		}
		wg.Wait()
	}
	as := site.Attempts()[skip:attempts]
	ok := 0
	for _, a := range as {
		if a.Status == http.StatusOK {
			ok++
		}
	}
	span := as[len(as)-1].At.Sub(as[0].At).Seconds()
	return 1 - float64(ok)/float64(len(as)), float64(ok) / span
}

// TestLearnedPacing is issue 16's acceptance for learned pacing, scaled
// down ten times (a site allowing each IP one request per 200ms, not 2s):
// 20 proxies and no cooldown configured; after the first 500 requests the
// 429 share stays under 2%, and pages/s is at least 80% of the best a
// fixed cooldown achieves (a sweep, learned pacing off, and the flaky
// delay off, as a 429 would count against the proxy). The quarantine of
// a refused proxy is short (100-400ms): what paces the crawl is the
// cooldown, learned or fixed.
func TestLearnedPacing(t *testing.T) {
	if testing.Short() {
		t.Skip("a 1,500-request crawl and a sweep")
	}
	const every = 200 * time.Millisecond
	refused, pps := paceRun(t, every, 1500, 500)
	t.Logf("learned: 429 share %.3f, %.1f pages/s after the first 500 requests", refused, pps)
	best, bestCD := 0.0, time.Duration(0)
	for _, cd := range []time.Duration{80 * time.Millisecond, 120 * time.Millisecond, 160 * time.Millisecond, 200 * time.Millisecond} {
		r, p := paceRun(t, every, 400, 100, WithCooldown(cd), WithLearnedPacing(0), WithFlakyDelay(0))
		t.Logf("fixed cooldown %v: 429 share %.3f, %.1f pages/s", cd, r, p)
		if p > best {
			best, bestCD = p, cd
		}
	}
	assert.Less(t, refused, 0.02, "429 share after the first 500 requests")
	assert.GreaterOrEqual(t, pps, 0.8*best, "pages/s against the best fixed cooldown (%v: %.1f)", bestCD, best)
}

// TestLearnedPaceMechanics: a rate-limit refusal raises the site's learned
// cooldown (from 0 to 100ms; refusals within a cooldown of the raise answer
// requests sent before it and change nothing), a healthy answer's release
// uses it and shortens it by one step, 200 healthy answers bring the rate
// per IP back halfway from the one refused at 0 (2x the raised one: 50ms),
// SiteState reports it, and other refusals, an operator's ban or
// WithLearnedPacing(0) leave it alone.
func TestLearnedPaceMechanics(t *testing.T) {
	ctx := context.Background()
	const site = "paced.example"
	s := newSwitch(t, shared.Client(t), WithQuarantine(time.Millisecond, time.Millisecond), WithMaxWait(5*time.Second), WithFlakyDelay(0))
	_, err := s.Add(ctx, proxyURLs(3)...)
	require.NoError(t, err)
	learned := func() time.Duration {
		st, err := s.SiteState(ctx, site)
		require.NoError(t, err)
		return st.Learned
	}
	refuse := func(v ban.Verdict) {
		l, err := s.Lease(ctx, site)
		require.NoError(t, err)
		_, err = s.penalize(ctx, site, l.proxy, l, v)
		require.NoError(t, err)
	}
	refuse(ban.Verdict{Kind: ban.Ban, Reason: "http_403"})
	assert.Zero(t, learned(), "a 403 says nothing of the pace")
	third, err := ParseProxy(proxyURLs(3)[2])
	require.NoError(t, err)
	require.NoError(t, s.Ban(ctx, third.ID(), site, time.Hour))
	assert.Zero(t, learned(), "nor does an operator's ban, though it has a Retry-After")
	refuse(ban.Verdict{Kind: ban.Ban, Reason: "http_429"})
	assert.Equal(t, 100*time.Millisecond, learned(), "the first raise from 0")
	refuse(ban.Verdict{Kind: ban.Ban, Reason: "http_503", RetryAfter: time.Second})
	assert.Equal(t, 100*time.Millisecond, learned(), "a refusal within a cooldown of the raise changes nothing")

	l, err := s.Lease(ctx, site)
	require.NoError(t, err)
	require.NoError(t, l.Report(ctx, ban.Verdict{Kind: ban.OK}))
	free := time.UnixMilli(int64(shared.Client(t).ZScore(ctx, s.keys.free(site), l.member).Val()))
	assert.WithinDuration(t, time.Now().Add(100*time.Millisecond), free, 30*time.Millisecond, "the release paced the proxy")
	for range 199 {
		l, err := s.Lease(ctx, site)
		require.NoError(t, err)
		require.NoError(t, l.Report(ctx, ban.Verdict{Kind: ban.OK}))
	}
	assert.InDelta(t, 50, learned().Milliseconds(), 1, "200 healthy answers climb back to twice the raised rate")

	off := sibling(t, s, shared.Client(t))
	off.cfg.paceMax = 0
	time.Sleep(150 * time.Millisecond)
	l, err = off.Lease(ctx, site)
	require.NoError(t, err)
	_, err = off.penalize(ctx, site, l.proxy, l, ban.Verdict{Kind: ban.Ban, Reason: "http_429"})
	require.NoError(t, err)
	assert.InDelta(t, 50, learned().Milliseconds(), 1, "WithLearnedPacing(0) learns nothing")
	refuse(ban.Verdict{Kind: ban.Ban, Reason: "http_429"})
	assert.InDelta(t, 62.5, float64(learned().Milliseconds()), 1, "a settled pace grows by a quarter")
}
