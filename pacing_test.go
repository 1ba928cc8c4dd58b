package proxyswitch

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/redis/go-redis/v9"
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
	s := newSwitch(t, shared.Client(t), opts...)
	_, err := s.Add(context.Background(), bed.ProxyURLs()...)
	require.NoError(t, err)
	other := sibling(t, s, shared.Client(t))
	for len(site.Attempts()) < attempts { // one batch each: no drain in between
		before := len(site.Attempts())
		var wg sync.WaitGroup
		for _, sw := range []*Switch{s, other} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				crawlAsync(t, sw, srv, attempts/2, 20)
			}()
		}
		wg.Wait()
		require.Greater(t, len(site.Attempts()), before+attempts/10, "the crawl stalled")
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
// 20 proxies, default options (the quarantines, the circuit breaker, the
// flaky delay) and no cooldown configured; after the first 500 requests
// the 429 share stays under 2%, and pages/s is at least 80% of the best a
// fixed cooldown achieves. The sweep is the generous reference: learned
// pacing, the flaky delay and the breaker off, and a refused proxy
// quarantined for 100-400ms only (with the default quarantines a fixed
// cooldown below the site's pace burns the pool), so that a cooldown a
// little below the site's pace scores its best.
func TestLearnedPacing(t *testing.T) {
	if testing.Short() {
		t.Skip("a 1,500-request crawl and a sweep")
	}
	const every = 200 * time.Millisecond
	refused, pps := paceRun(t, every, 1500, 500)
	t.Logf("learned: 429 share %.3f, %.1f pages/s after the first 500 requests", refused, pps)
	best, bestCD := 0.0, time.Duration(0)
	for _, cd := range []time.Duration{80 * time.Millisecond, 120 * time.Millisecond, 160 * time.Millisecond, 200 * time.Millisecond} {
		r, p := paceRun(t, every, 400, 100, WithRotation(Rotation{Cooldown: cd, LearnedPacing: Off, FlakyDelay: Off}),
			WithBans(Bans{Quarantine: 100 * time.Millisecond, QuarantineMax: 400 * time.Millisecond}), WithBreaker(Breaker{Disabled: true}))
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
// WithRotation(Rotation{LearnedPacing: Off}) leave it alone.
func TestLearnedPaceMechanics(t *testing.T) {
	ctx := context.Background()
	const site = "paced.example"
	s := newSwitch(t, shared.Client(t), WithBans(Bans{Quarantine: time.Millisecond, QuarantineMax: time.Millisecond}), WithTimeouts(Timeouts{MaxWait: 5 * time.Second}), WithRotation(Rotation{FlakyDelay: Off}))
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
	assert.InDelta(t, 50, learned().Milliseconds(), 1, "WithRotation(Rotation{LearnedPacing: Off}) learns nothing")
	// A site that wants a minute between two requests of an IP: the
	// refusal of a proxy that rested 150ms is the pace (TestPacedRefusalHold).
	require.NoError(t, shared.Client(t).HSet(ctx, s.keys.pace(site), "rest", 60000).Err())
	refuse(ban.Verdict{Kind: ban.Ban, Reason: "http_429"})
	assert.InDelta(t, 62.5, float64(learned().Milliseconds()), 1, "a settled pace grows by a quarter")
}

// breakerBans sums the bans in site's breaker window (breaker.lua's "b"
// buckets) and reports whether proxy id is among its quarantined ones.
func breakerBans(t *testing.T, s *Switch, site, id string) (bans int, listed bool) {
	t.Helper()
	h, err := shared.Client(t).HGetAll(context.Background(), s.keys.breakerWindow(site)).Result()
	require.NoError(t, err)
	for f, v := range h {
		if strings.HasPrefix(f, "b") {
			n, err := strconv.Atoi(v)
			require.NoError(t, err)
			bans += n
		}
	}
	_, listed = h["q"+id]
	return bans, listed
}

// TestPacedRefusalHold: under learned pacing a rate-limit refusal of a
// proxy that had not rested (its last healthy answer on the site younger
// than twice the site's accepted rest) is the site's pace: the proxy waits
// the learned cooldown, or the Retry-After if longer, with no strike and
// nothing for the circuit breaker. A rested proxy refused is no pace: a
// first strike, at once evidence for the breaker, and the cooldown stays.
// Healthy answers note the accepted rest: a shorter one replaces it, a
// longer one moves it up by a 32nd at most.
func TestPacedRefusalHold(t *testing.T) {
	ctx := context.Background()
	const site = "paced.example"
	s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: 5 * time.Second}), WithRotation(Rotation{FlakyDelay: Off}))
	_, err := s.Add(ctx, proxyURLs(2)...)
	require.NoError(t, err)
	rdb := shared.Client(t)
	pace := s.keys.pace(site)
	rest := func() float64 {
		v, err := rdb.HGet(ctx, pace, "rest").Float64()
		require.NoError(t, err)
		return v
	}
	serve := func() *Proxy {
		l, err := s.Lease(ctx, site)
		require.NoError(t, err)
		require.NoError(t, l.Report(ctx, ban.Verdict{Kind: ban.OK}))
		return l.proxy
	}
	ban429 := ban.Verdict{Kind: ban.Ban, Reason: "http_429"}
	refuse := func(v ban.Verdict) (penalty, *Proxy) {
		l, err := s.Lease(ctx, site)
		require.NoError(t, err)
		pen, err := s.penalize(ctx, site, l.proxy, l, v)
		require.NoError(t, err)
		return pen, l.proxy
	}

	serve()
	serve() // each proxy's first healthy answer: no rest yet
	assert.Zero(t, rdb.HExists(ctx, pace, "rest").Val())
	time.Sleep(40 * time.Millisecond)
	serve() // the first proxy again, some 40ms later
	r := rest()
	assert.GreaterOrEqual(t, r, 40.0)
	time.Sleep(time.Duration(2*r)*time.Millisecond + 100*time.Millisecond)
	p := serve() // a longer rest: up by at most a 32nd
	assert.InDelta(t, r*33/32, rest(), 1)
	require.NoError(t, rdb.HSet(ctx, pace, "rest", 60000).Err()) // a site that wants a minute between two requests of an IP

	// Not rested: the pace's refusal.
	pen, q := refuse(ban429)
	require.NotEqual(t, p.id, q.id, "least recently used")
	assert.True(t, pen.hold)
	assert.False(t, pen.first)
	assert.Equal(t, 100*time.Millisecond, pen.quarantine, "the learned cooldown, raised from 0")
	assert.WithinDuration(t, time.Now().Add(100*time.Millisecond), quarantineEnd(t, s, site, q), 50*time.Millisecond)
	v, err := rdb.HGet(ctx, s.keys.strikes(site), q.id).Result()
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(v, "0|"), "still healthy on the site: %s", v)
	bans, listed := breakerBans(t, s, site, q.id)
	assert.Zero(t, bans, "no evidence for the breaker")
	assert.False(t, listed)
	pen, _ = refuse(ban.Verdict{Kind: ban.Ban, Reason: "http_503", RetryAfter: 2 * time.Second})
	assert.True(t, pen.hold, "a Retry-After is a rate limit too")
	assert.Equal(t, 2*time.Second, pen.quarantine, "the Retry-After, longer than the cooldown")

	// Rested: no pace. A first strike, and a ban for the breaker at once.
	require.NoError(t, s.Unban(ctx, q.id, site))
	require.NoError(t, rdb.HSet(ctx, pace, "rest", 1).Err())
	time.Sleep(250 * time.Millisecond) // past the cooldown too
	st, err := s.SiteState(ctx, site)
	require.NoError(t, err)
	before := st.Learned
	pen, q = refuse(ban429)
	assert.False(t, pen.hold)
	assert.True(t, pen.first)
	assert.Greater(t, pen.quarantine, 50*time.Second, "the first quarantine (1m)")
	bans, listed = breakerBans(t, s, site, q.id)
	assert.Equal(t, 1, bans)
	assert.True(t, listed)
	st, err = s.SiteState(ctx, site)
	require.NoError(t, err)
	assert.Equal(t, before, st.Learned, "a rested refusal leaves the cooldown alone")
}

// TestPaceRaisePushesBounded: a rate-limit refusal that raises the learned
// cooldown pushes out the slots cooling down on the site by the difference,
// at most a thousand of them per raise (one script call stays short however
// many proxies cool down there), the soonest free first.
func TestPaceRaisePushesBounded(t *testing.T) {
	ctx := context.Background()
	const site = "crowded.example"
	rdb := shared.Client(t)
	s := newSwitch(t, rdb)
	_, err := s.Add(ctx, proxyURLs(1)...)
	require.NoError(t, err)
	l, err := s.Lease(ctx, site)
	require.NoError(t, err)
	now := time.Now().UnixMilli()
	const n = 3000
	zs := make([]redis.Z, n)
	for i := range zs { // slots of other proxies cooling down, one ms apart
		zs[i] = redis.Z{Score: float64(now + 10_000 + int64(i)), Member: fmt.Sprintf("%016x:0", i+1)}
	}
	require.NoError(t, rdb.ZAdd(ctx, s.keys.free(site), zs...).Err())
	// The site's learned cooldown is 30 s, not raised lately; the proxy was
	// healthy there just now (the pace's refusal, not a ban).
	require.NoError(t, rdb.HSet(ctx, s.keys.pace(site), "c", "30000.000", "cut", "0", "ok", "0", "step", "0.1").Err())
	require.NoError(t, rdb.HSet(ctx, s.keys.strikes(site), l.proxy.id, fmt.Sprintf("0|%d|0", now)).Err())
	require.NoError(t, l.Report(ctx, ban.Verdict{Kind: ban.Ban, Reason: ban.StatusReason(429)}))
	c, err := rdb.HGet(ctx, s.keys.pace(site), "c").Float64()
	require.NoError(t, err)
	require.Equal(t, 60000.0, c, "raised twice over")
	for i, z := range zs {
		got, err := rdb.ZScore(ctx, s.keys.free(site), z.Member.(string)).Result()
		require.NoError(t, err)
		if i < 1000 {
			require.Equal(t, z.Score+30000, got, "slot %d: one of the thousand soonest, pushed by the difference", i)
		} else {
			require.Equal(t, z.Score, got, "slot %d: beyond the thousand, as it was", i)
		}
	}
}
