package proxyswitch

import (
	"context"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/proxyswitch/proxyswitch/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// resumingWithLeases brings a Switch to "resuming", its write-back done,
// with n local leases handed over to Redis: a second member, B (a bare
// Membership, never on the broker), keeps it waiting for up to three member
// TTLs (1s each) after Redis comes back.
func resumingWithLeases(t *testing.T, n int) (*redistest.Server, *Switch, []*Lease) {
	srv, s, _, ls := resumingWith(t, 0, n)
	return srv, s, ls
}

// resumingWith is resumingWithLeases with, besides, r leases taken from
// Redis before the outage and still running.
func resumingWith(t *testing.T, r, n int) (*redistest.Server, *Switch, []*Lease, []*Lease) {
	t.Helper()
	ctx := context.Background()
	srv := redistest.Start(t)
	s := newSwitch(t, srv.Client(t), fastFallback("A")...)
	_, err := s.Add(ctx, proxyURLs(4)...)
	require.NoError(t, err)
	startSwitch(t, s)
	m, err := shard.NewMembership(srv.Client(t), shard.MemberConfig{Prefix: s.cfg.prefix, Pool: s.cfg.pool, Self: "B",
		Heartbeat: 100 * time.Millisecond, TTL: time.Second})
	require.NoError(t, err)
	require.NoError(t, m.Start(ctx))
	t.Cleanup(func() { _ = m.Stop(context.Background()) })
	require.Eventually(t, func() bool { return s.FallbackStatus().Share == 2 }, 5*time.Second, 10*time.Millisecond, "A sees B")

	var rls []*Lease
	for range r {
		l, err := s.Lease(ctx, "shop.example")
		require.NoError(t, err)
		require.Nil(t, l.local)
		rls = append(rls, l)
	}
	require.NoError(t, srv.Pause())
	if n == 0 { // trip
		l, err := s.Lease(ctx, "other.example")
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
	}
	var ls []*Lease
	for range n {
		l, err := s.Lease(ctx, "shop.example")
		require.NoError(t, err)
		require.NotNil(t, l.local)
		ls = append(ls, l)
	}
	require.NoError(t, srv.Resume())
	waitMode(t, s, modeResuming, 5*time.Second)
	require.Eventually(t, func() bool {
		s.fb.mu.RLock()
		defer s.fb.mu.RUnlock()
		return s.fb.written
	}, 5*time.Second, 5*time.Millisecond, "written back")
	require.Equal(t, n, s.FallbackStatus().Adopted, "handed over")
	require.Equal(t, modeResuming.String(), s.FallbackStatus().Mode, "B keeps A waiting")
	return srv, s, rls, ls
}

// Leases taken from Redis before the outage and ending while the Switch
// resumes: a ban reaches Redis, a release ends the record once back on the
// broker (not at its TTL).
func TestFallbackResumeEndsRedisLeases(t *testing.T) {
	ctx := context.Background()
	_, s, rls, _ := resumingWith(t, 2, 0)
	banned, freed := rls[0], rls[1]
	require.NoError(t, banned.Report(ctx, ban.Verdict{Kind: ban.Ban, Reason: ban.ReasonChallenge}))
	require.NoError(t, freed.Release(ctx))
	assert.Equal(t, modeResuming.String(), s.FallbackStatus().Mode, "still resuming when the requests ended")
	waitMode(t, s, modeBroker, 10*time.Second)
	require.Eventually(t, func() bool {
		st, err := s.Stats(ctx, "shop.example")
		return err == nil && st.Leased == 0
	}, 3*time.Second, 10*time.Millisecond, "nothing left leased")
	states, err := s.ProxyStates(ctx, "shop.example")
	require.NoError(t, err)
	for _, st := range states {
		if st.Proxy.ID() == banned.Proxy().ID() {
			assert.Equal(t, StateQuarantined, st.State, "the ban met while resuming is in Redis")
		}
	}
}

// The reviewer's TestFallbackBanDuringResumeLost: a ban met through a local
// lease while the Switch resumes reaches Redis (the proxy is quarantined
// there, the handed-over record ends), and a lease released then ends its
// record too: nothing stays leased.
func TestFallbackResumeBanReachesRedis(t *testing.T) {
	ctx := context.Background()
	srv, s, ls := resumingWithLeases(t, 2)
	rdb := srv.Client(t)
	banned, freed := ls[0], ls[1]
	require.NoError(t, banned.Report(ctx, ban.Verdict{Kind: ban.Ban, Reason: ban.ReasonChallenge}))
	require.NoError(t, freed.Release(ctx))
	assert.Equal(t, modeResuming.String(), s.FallbackStatus().Mode, "still resuming when the requests ended")

	scope := s.scopeOf("shop.example")
	for _, l := range ls {
		has, err := rdb.HExists(ctx, s.keys.leases(scope), l.member).Result()
		require.NoError(t, err)
		assert.False(t, has, "the handed-over record of %s ended in Redis", l.member)
	}
	stats, err := s.Stats(ctx, "shop.example")
	require.NoError(t, err)
	assert.Zero(t, stats.Leased, "nothing left leased")

	waitMode(t, s, modeBroker, 10*time.Second)
	states, err := s.ProxyStates(ctx, "shop.example")
	require.NoError(t, err)
	found := false
	for _, st := range states {
		if st.Proxy.ID() == banned.Proxy().ID() {
			found = true
			assert.Equal(t, StateQuarantined, st.State, "the ban met while resuming is in Redis")
			assert.Greater(t, time.Until(st.Until), time.Minute)
		}
	}
	assert.True(t, found)
	for range 3 {
		l, err := s.Lease(ctx, "shop.example")
		require.NoError(t, err)
		assert.NotEqual(t, banned.Proxy().ID(), l.Proxy().ID(), "the banned proxy stays out")
	}
}

// The reviewer's TestTaskRequestWhileResuming: a task's request (a sticky
// session, which only Redis serves) made while the Switch resumes waits
// until it is back on the broker, as plain requests do, instead of failing
// at once; past MaxWait it fails with ErrNoProxy saying why.
func TestFallbackTaskRequestWaitsWhileResuming(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	flow := newShopFlow()
	site := testbed.NewSite(t, "shop", flow)
	bed := &testbed.Bed{Sites: []*testbed.Site{site}, Proxies: testbed.NewProxies(t, 4)}
	s := newSwitch(t, srv.Client(t), fastFallback("A")...)
	_, err := s.Add(ctx, bed.ProxyURLs()...)
	require.NoError(t, err)
	startSwitch(t, s)
	m, err := shard.NewMembership(srv.Client(t), shard.MemberConfig{Prefix: s.cfg.prefix, Pool: s.cfg.pool, Self: "B",
		Heartbeat: 100 * time.Millisecond, TTL: time.Second})
	require.NoError(t, err)
	require.NoError(t, m.Start(ctx))
	t.Cleanup(func() { _ = m.Stop(context.Background()) })
	require.Eventually(t, func() bool { return len(s.FallbackStatus().Members) == 2 }, 5*time.Second, 10*time.Millisecond)

	c := attached(s)
	task := NewTaskContext("cart")
	require.NoError(t, c.Request("GET", stepURL(site, "cart", 1), nil, task, nil))

	require.NoError(t, srv.Pause())
	l, err := s.Lease(ctx, site.Host()) // trips to the local shard
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	_, err = s.sessionBackend()
	require.NoError(t, err)
	rp, err := s.sess.be.broker()
	require.ErrorIs(t, err, ErrNoProxy)
	assert.Nil(t, rp)
	assert.Contains(t, err.Error(), "leases from its local shard while Redis is unreachable")
	require.NoError(t, srv.Resume())
	waitMode(t, s, modeResuming, 5*time.Second)

	_, err = waitBroker(ctx, s.sess.be, 50*time.Millisecond)
	require.ErrorIs(t, err, ErrNoProxy)
	assert.Contains(t, err.Error(), "resuming after a Redis outage")
	assert.Contains(t, err.Error(), "MaxWait")

	require.Equal(t, modeResuming.String(), s.FallbackStatus().Mode)
	require.NoError(t, c.Request("GET", stepURL(site, "cart", 2), nil, task, nil), "the task's request waits for the broker")
	assert.Equal(t, modeBroker.String(), s.FallbackStatus().Mode)
	assert.Len(t, flow.visitor("cart").ips, 1, "one IP throughout")
	assert.Empty(t, flow.errors())
}
