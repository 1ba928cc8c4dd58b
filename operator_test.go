package proxyswitch

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSiteStateAndOperatorActions(t *testing.T) {
	ctx := context.Background()
	const site = "ozon.example"
	s := newSwitch(t, shared.Client(t), WithRotation(Rotation{Cooldown: time.Minute}), WithTimeouts(Timeouts{MaxWait: Off}))
	urls := proxyURLs(5)
	_, err := s.Add(ctx, urls...)
	require.NoError(t, err)
	ids := make([]string, len(urls))
	for i, u := range urls {
		p, _ := ParseProxy(u)
		ids[i] = p.ID()
	}

	st, err := s.SiteState(ctx, site)
	require.NoError(t, err)
	assert.Equal(t, SiteState{Site: site, Free: 5}, st, "a site never leased: all free")

	held, err := s.Lease(ctx, site) // leased
	require.NoError(t, err)
	cooled, err := s.Lease(ctx, site)
	require.NoError(t, err)
	require.NoError(t, cooled.Release(ctx)) // cooling down for a minute
	var banned, drained string
	for _, id := range ids {
		if id != held.Proxy().ID() && id != cooled.Proxy().ID() {
			if banned == "" {
				banned = id
			} else if drained == "" {
				drained = id
			}
		}
	}
	require.NoError(t, s.Ban(ctx, banned, site, time.Hour))
	require.NoError(t, func() error { _, err := s.Drain(ctx, "", urls[indexOf(ids, drained)]); return err }()) // by URL

	st, err = s.SiteState(ctx, site)
	require.NoError(t, err)
	assert.Equal(t, SiteState{Site: site, Free: 1, Leased: 1, Cooling: 1, Quarantined: 1, Dead: 1}, st)

	dead, err := s.Dead(ctx)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	assert.Equal(t, "drained", dead[0].Reason)

	// Only the one free proxy can be leased.
	l, err := s.Lease(ctx, site)
	require.NoError(t, err)
	assert.NotContains(t, []string{banned, drained, held.Proxy().ID(), cooled.Proxy().ID()}, l.Proxy().ID())
	_, err = s.Lease(ctx, site)
	require.ErrorIs(t, err, ErrNoProxy)

	require.NoError(t, s.Unban(ctx, banned, site))
	n, err := s.Revive(ctx, "", drained)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	got := map[string]bool{}
	for range 2 {
		l, err := s.Lease(ctx, site)
		require.NoError(t, err)
		got[l.Proxy().ID()] = true
	}
	assert.Equal(t, map[string]bool{banned: true, drained: true}, got, "unbanned and revived proxies are back")

	assert.ErrorIs(t, s.Ban(ctx, "0123456789abcdef", site, time.Minute), ErrNotInPool)
	_, err = s.Drain(ctx, "", "ftp://nope")
	assert.ErrorIs(t, err, ErrInvalidProxy)
	assert.ErrorIs(t, s.Ban(ctx, banned, site, 0), ErrConfig)
}

func TestBanOnASiteNeverLeased(t *testing.T) {
	ctx := context.Background()
	s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: Off}))
	urls := proxyURLs(3)
	_, err := s.Add(ctx, urls...)
	require.NoError(t, err)
	p, _ := ParseProxy(urls[0])
	require.NoError(t, s.Ban(ctx, p.ID(), "fresh.example", time.Hour))
	st, err := s.SiteState(ctx, "fresh.example")
	require.NoError(t, err)
	assert.Equal(t, SiteState{Site: "fresh.example", Free: 2, Quarantined: 1}, st)
	for range 2 {
		l, err := s.Lease(ctx, "fresh.example")
		require.NoError(t, err)
		assert.NotEqual(t, p.ID(), l.Proxy().ID(), "the banned proxy is never leased")
	}
	_, err = s.Lease(ctx, "fresh.example")
	require.ErrorIs(t, err, ErrNoProxy)
}

// Banning a proxy that is in use leases another one for a moment (to make
// sure the site's set exists) and hands it back untouched: no cooldown on
// a proxy no request went through.
func TestBanOfABusyProxyLeavesOthersFree(t *testing.T) {
	ctx := context.Background()
	s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: Off}), WithRotation(Rotation{Cooldown: time.Minute}))
	_, err := s.Add(ctx, proxyURLs(3)...)
	require.NoError(t, err)
	busy, err := s.Lease(ctx, "busy.example")
	require.NoError(t, err)
	require.NoError(t, s.Ban(ctx, busy.Proxy().ID(), "busy.example", time.Hour))
	st, err := s.SiteState(ctx, "busy.example")
	require.NoError(t, err)
	assert.Equal(t, SiteState{Site: "busy.example", Free: 2, Leased: 1}, st, "the two others are free, none cooling (a banned slot in use counts as leased)")
	for range 2 {
		l, err := s.Lease(ctx, "busy.example")
		require.NoError(t, err)
		assert.NotEqual(t, busy.Proxy().ID(), l.Proxy().ID())
	}
}

func TestPoolConcurrency(t *testing.T) {
	ctx := context.Background()
	s := newSwitch(t, shared.Client(t), WithRotation(Rotation{Concurrency: 4}))
	_, err := s.Add(ctx, proxyURLs(2)...)
	require.NoError(t, err)
	st, err := s.Stats(ctx, "ozon.example")
	require.NoError(t, err)
	assert.Zero(t, st.Concurrency, "nothing leased yet")
	l, err := s.Lease(ctx, "ozon.example")
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	other := sibling(t, s, shared.Client(t)) // another worker, its own client
	st, err = other.Stats(ctx, "avito.example")
	require.NoError(t, err)
	assert.Equal(t, 4, st.Concurrency)
	require.NoError(t, shared.Client(t).HSet(ctx, s.keys.meta(), "slots", "four").Err())
	_, err = s.Stats(ctx, "ozon.example")
	assert.ErrorIs(t, err, ErrCorrupt)
}

func indexOf(xs []string, x string) int {
	for i, v := range xs {
		if v == x {
			return i
		}
	}
	return -1
}

func TestClearTouchesOnlyItsPool(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	s := newSwitch(t, rdb, WithPool("a"))
	other := sibling(t, s, rdb)
	other.cfg.pool = "a*" // a pool whose name a glob on "a" would match
	require.NoError(t, other.build())
	longer := sibling(t, s, rdb)
	longer.cfg.prefix += "x"
	require.NoError(t, longer.build())
	for _, sw := range []*Switch{s, other, longer} {
		_, err := sw.Add(ctx, proxyURLs(2)...)
		require.NoError(t, err)
		l, err := sw.Lease(ctx, "ozon.example")
		require.NoError(t, err)
		require.NoError(t, sw.Ban(ctx, l.Proxy().ID(), "ozon.example", time.Minute))
	}
	before := func(sw *Switch) int {
		n, err := rdb.Exists(ctx, sw.keys.proxies(), sw.keys.sites(), sw.keys.free("ozon.example"),
			sw.keys.leases("ozon.example"), sw.keys.strikes("ozon.example"), sw.keys.meta()).Result()
		require.NoError(t, err)
		return int(n)
	}
	require.Equal(t, 6, before(s))
	require.NoError(t, s.Clear(ctx))
	assert.Equal(t, 1, before(s), "every key of the pool is gone but its meta hash")
	assert.Equal(t, []string{s.keys.meta()}, keysMatching(t, rdb, "{"+s.cfg.prefix+":a}*"))
	meta, err := rdb.HGetAll(ctx, s.keys.meta()).Result()
	require.NoError(t, err)
	assert.Equal(t, "1", meta["emptied"], "the mark that the pool is empty on purpose: never re-seeded")
	assert.Len(t, meta, 2, "emptied and version: %v", meta)
	assert.Equal(t, 6, before(other), "a pool named like a glob is untouched")
	assert.Equal(t, 6, before(longer), "a longer prefix is untouched")
	_, err = s.Lease(ctx, "ozon.example")
	assert.ErrorIs(t, err, ErrEmptyPool)
}

// recordingObserver records every event the Switch sends its observer.
type recordingObserver struct {
	mu          sync.Mutex
	attempts    []AttemptEvent
	quarantines []QuarantineEvent
	sessions    []SessionEvent
	evidence    []EvidenceEvent
}

func (o *recordingObserver) ObserveEvidence(e EvidenceEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.evidence = append(o.evidence, e)
}

// evidenceOf counts the evidence events by What.
func (o *recordingObserver) evidenceOf() map[string]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := map[string]int{}
	for _, e := range o.evidence {
		n[e.What]++
	}
	return n
}

func (o *recordingObserver) ObserveAttempt(e AttemptEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.attempts = append(o.attempts, e)
}

func (o *recordingObserver) ObserveQuarantine(e QuarantineEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.quarantines = append(o.quarantines, e)
}

func (o *recordingObserver) ObserveSession(e SessionEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.sessions = append(o.sessions, e)
}

// attemptKinds counts the attempts by verdict kind.
func (o *recordingObserver) attemptKinds() map[ban.Kind]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := map[ban.Kind]int{}
	for _, e := range o.attempts {
		n[e.Kind]++
	}
	return n
}

func TestObserverSeesAttemptsAndQuarantines(t *testing.T) {
	bed, s := bedSwitch(t, 1, 4, WithBans(Bans{Quarantine: time.Minute, QuarantineMax: time.Hour}))
	obs := &recordingObserver{}
	s.SetObserver(obs)
	c := colly.NewCollector(colly.AllowURLRevisit())
	s.Attach(c)
	for i := range 5 {
		require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", bed.Sites[0].URL(), i+1)))
	}
	_ = c.Visit(bed.Sites[0].URL() + "/status/404")
	// Refused through two proxies healthy on the site's other pages: the
	// page's answer (Bans.EvidenceFirst), given up after two attempts.
	err := c.Visit(bed.Sites[0].URL() + "/status/403") // a 429 is the pace, never the page (rateLimited)
	require.ErrorIs(t, err, ErrPageRefused)
	require.NoError(t, s.Ban(context.Background(), bed.ProxyURLs()[0], "elsewhere.example", time.Minute))

	kinds := obs.attemptKinds()
	obs.mu.Lock()
	defer obs.mu.Unlock()
	assert.Equal(t, 5, kinds[ban.OK])
	assert.Equal(t, 1, kinds[ban.Neutral])
	assert.Equal(t, 2, kinds[ban.Ban], "the first try and one retry: the page refuses them both")
	require.Len(t, obs.quarantines, 3)
	last := obs.quarantines[2]
	assert.Equal(t, ReasonOperator, last.Reason)
	assert.Equal(t, "elsewhere.example", last.Site)
	assert.GreaterOrEqual(t, last.Duration, time.Minute)
	for _, q := range obs.quarantines {
		assert.Len(t, q.ProxyID, 16, "IDs, never URLs")
	}
	s.SetObserver(nil)
}

var _ = testbed.NewSite
