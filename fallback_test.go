package proxyswitch

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/proxyswitch/proxyswitch/shard"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fastFallback: a fallback tuned for tests: Redis counts as gone after
// 300ms, heartbeats every 100ms, attempts bounded by 600ms (the switch-over
// hold).
func fastFallback(self string) []Option {
	return []Option{WithFallback(self, nil), WithTimeouts(Timeouts{Fallback: 300 * time.Millisecond}),
		WithMembership(shard.MemberConfig{Heartbeat: 100 * time.Millisecond, TTL: time.Second}),
		WithTimeouts(Timeouts{Attempt: 600 * time.Millisecond, MaxWait: 5 * time.Second})}
}

// startSwitch starts s and stops it with the test.
func startSwitch(t *testing.T, s *Switch) {
	t.Helper()
	require.NoError(t, s.Start(context.Background()))
	t.Cleanup(func() { _ = s.Stop(context.Background()) })
}

// waitMode waits until s leases in mode m and returns how long that took.
func waitMode(t *testing.T, s *Switch, m leaseMode, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	require.Eventually(t, func() bool { return s.FallbackStatus().Mode == m.String() }, within, 5*time.Millisecond,
		"mode %v, want %v", s.FallbackStatus().Mode, m)
	return time.Since(start)
}

// One server: Redis killed, leases go on from the local shard, a ban is
// learnt locally; Redis restarted empty: the pool is re-seeded, the ban
// written back, the lease still running handed over to Redis.
func TestFallbackKillAndRestartEmpty(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	s := newSwitch(t, rdb, fastFallback("crawler-1")...)

	_, err := s.Lease(ctx, "shop.example")
	require.ErrorIs(t, err, ErrNoProxy, "no lease before Start")
	require.ErrorIs(t, err, ErrConfig)

	_, err = s.Add(ctx, proxyURLs(4)...)
	require.NoError(t, err)
	startSwitch(t, s)
	st := s.FallbackStatus()
	require.Equal(t, modeBroker.String(), st.Mode)
	require.Equal(t, []string{"crawler-1"}, st.Members)
	require.Equal(t, 4, st.Share, "the only server owns the whole pool")

	fromRedis, err := s.Lease(ctx, "shop.example")
	require.NoError(t, err)
	require.Nil(t, fromRedis.local)

	require.NoError(t, srv.Kill())
	start := time.Now()
	local, err := s.Lease(ctx, "shop.example")
	took := time.Since(start)
	require.NoError(t, err)
	t.Logf("first lease after SIGKILL: from the local shard after %v (fallback timeout 300ms, hold 600ms)", took.Round(time.Millisecond))
	assert.Less(t, took, 2*time.Second)
	require.NotNil(t, local.local)
	assert.NotEqual(t, fromRedis.Proxy().ID(), local.Proxy().ID(), "the Redis lease still running is reserved")
	assert.Equal(t, modeLocal.String(), s.FallbackStatus().Mode)

	banned := local.Proxy().ID()
	// A challenge: proof by itself, the base quarantine at once (a 403 would be a first strike).
	require.NoError(t, local.Report(ctx, ban.Verdict{Kind: ban.Ban, Reason: ban.ReasonChallenge}))
	held, err := s.Lease(ctx, "shop.example")
	require.NoError(t, err)
	require.NotNil(t, held.local)
	assert.NotEqual(t, banned, held.Proxy().ID())
	require.NoError(t, fromRedis.Release(ctx), "a Redis lease released while Redis is gone: deferred")

	require.NoError(t, srv.Restart())
	back := waitMode(t, s, modeBroker, 5*time.Second)
	t.Logf("broker resumed %v after Redis restarted empty", back.Round(time.Millisecond))
	st = s.FallbackStatus()
	assert.Equal(t, 4, st.Reseeded)
	assert.Equal(t, 1, st.BansWritten)
	assert.Equal(t, 1, st.Adopted)
	assert.Equal(t, 1, st.Outages)
	n, err := rdb.HLen(ctx, s.keys.proxies()).Result()
	require.NoError(t, err)
	assert.EqualValues(t, 4, n, "the pool is back in Redis")

	stats, err := s.Stats(ctx, "shop.example")
	require.NoError(t, err)
	assert.Equal(t, 1, stats.Leased, "the local lease still running is held in Redis")
	score, err := rdb.ZScore(ctx, s.keys.free("shop.example"), banned+":0").Result()
	require.NoError(t, err)
	assert.Greater(t, int64(score), time.Now().Add(10*time.Minute).UnixMilli(), "the local ban is in Redis")

	// From Redis again: neither the banned proxy nor the held one.
	for range 2 {
		l, err := s.Lease(ctx, "shop.example")
		require.NoError(t, err)
		assert.Nil(t, l.local)
		assert.NotContains(t, []string{banned, held.Proxy().ID()}, l.Proxy().ID())
	}
	require.NoError(t, held.Release(ctx))
	stats, err = s.Stats(ctx, "shop.example")
	require.NoError(t, err)
	assert.Equal(t, 2, stats.Leased, "the handed-over lease ended in Redis too")
}

// A hung Redis (SIGSTOP): every call is bounded by the fallback timeout, the
// Switch goes local, and comes back when Redis does; nothing is re-seeded.
func TestFallbackHungRedis(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	s := newSwitch(t, rdb, fastFallback("crawler-1")...)
	_, err := s.Add(ctx, proxyURLs(3)...)
	require.NoError(t, err)
	startSwitch(t, s)

	require.NoError(t, srv.Pause())
	resumed := false
	defer func() {
		if !resumed {
			_ = srv.Resume()
		}
	}()
	start := time.Now()
	l, err := s.Lease(ctx, "shop.example")
	took := time.Since(start)
	require.NoError(t, err)
	require.NotNil(t, l.local)
	t.Logf("first lease after SIGSTOP: from the local shard after %v", took.Round(time.Millisecond))
	assert.Less(t, took, 2*time.Second)
	require.NoError(t, l.Release(ctx))

	require.NoError(t, srv.Resume())
	resumed = true
	back := waitMode(t, s, modeBroker, 5*time.Second)
	t.Logf("broker resumed %v after Redis woke up", back.Round(time.Millisecond))
	assert.Zero(t, s.FallbackStatus().Reseeded, "Redis kept the pool")
	l, err = s.Lease(ctx, "shop.example")
	require.NoError(t, err)
	assert.Nil(t, l.local)
}

// Errors that are not an outage (a script error, the caller's own
// cancellation) never switch to the local shard.
func TestFallbackTripsOnlyOnOutages(t *testing.T) {
	ctx := context.Background()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	assert.False(t, isOutage(ctx, nil))
	assert.False(t, isOutage(cancelled, context.Canceled))
	assert.False(t, isOutage(ctx, redis.ErrClosed))
	assert.False(t, isOutage(ctx, redisErr("lease", proxyRedisError("WRONGTYPE Operation against a key"))))
	assert.True(t, isOutage(ctx, redisErr("lease", proxyRedisError("LOADING Redis is loading"))))
	assert.True(t, isOutage(ctx, redisErr("lease", context.DeadlineExceeded)))
}

type proxyRedisError string

func (e proxyRedisError) Error() string { return string(e) }
func (proxyRedisError) RedisError()     {}

func TestFallbackBadOptions(t *testing.T) {
	rdb := shared.Client(t)
	for name, opts := range map[string][]Option{
		"no member ID":     {WithFallback("", nil)},
		"space in ID":      {WithSharding("crawler 1", shard.Modulo{})},
		"both schemes":     {WithFallback("a", nil), WithSharding("a", nil)},
		"tiny timeout":     {WithFallback("a", nil), WithTimeouts(Timeouts{Fallback: time.Millisecond})},
		"negative timeout": {WithTimeouts(Timeouts{Fallback: -time.Second})},
	} {
		_, err := NewSwitch(rdb, opts...)
		assert.ErrorIs(t, err, ErrConfig, name)
	}
	s := newSwitch(t, rdb)
	require.NoError(t, s.Start(context.Background()), "Start without a fallback does nothing")
	require.NoError(t, s.Stop(context.Background()))
	assert.Equal(t, modeBroker.String(), s.FallbackStatus().Mode)

	f := newSwitch(t, rdb, WithFallback("a"+strconv.Itoa(1), nil))
	require.NoError(t, f.Start(context.Background()))
	require.ErrorIs(t, f.Start(context.Background()), ErrConfig, "twice")
	require.NoError(t, f.Stop(context.Background()))
	_, err := f.Lease(context.Background(), "x.example")
	require.ErrorIs(t, err, ErrNoProxy, "after Stop")
}

// On a 3-master Redis Cluster: the master holding the pool's slot is
// SIGKILLed and restarted empty (it keeps its slots); the Switch goes local
// and comes back with the pool re-seeded.
func TestFallbackOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	ctx := context.Background()
	cl := redistest.StartCluster(t, 3)
	rdb := cl.Client(t)
	s := newSwitch(t, rdb, fastFallback("crawler-1")...)
	_, err := s.Add(ctx, proxyURLs(4)...)
	require.NoError(t, err)
	startSwitch(t, s)
	master, err := rdb.MasterForKey(ctx, s.keys.proxies())
	require.NoError(t, err)
	var node *redistest.Server
	for _, n := range cl.Nodes {
		if n.Addr() == master.Options().Addr {
			node = n
		}
	}
	require.NotNil(t, node, "the pool's master %s", master.Options().Addr)

	require.NoError(t, node.Kill())
	start := time.Now()
	l, err := s.Lease(ctx, "shop.example")
	require.NoError(t, err)
	require.NotNil(t, l.local)
	t.Logf("the pool's master killed: first lease from the local shard after %v", time.Since(start).Round(time.Millisecond))
	require.NoError(t, l.Release(ctx))

	require.NoError(t, node.Restart())
	back := waitMode(t, s, modeBroker, 15*time.Second)
	t.Logf("broker resumed %v after the master restarted empty (the cluster notices it first)", back.Round(time.Millisecond))
	assert.Equal(t, 4, s.FallbackStatus().Reseeded)
	l, err = s.Lease(ctx, "shop.example")
	require.NoError(t, err)
	assert.Nil(t, l.local)
}
