package proxyswitch

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// slowScripts counts a client's script calls and delays each, so that
// concurrent callers pile up behind the one in flight.
type slowScripts struct {
	n     atomic.Int64
	delay atomic.Int64 // ns
}

func (h *slowScripts) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *slowScripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *slowScripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := strings.ToLower(cmd.Name()); name == "evalsha" || name == "eval" {
			h.n.Add(1)
			time.Sleep(time.Duration(h.delay.Load()))
		}
		return next(ctx, cmd)
	}
}

// TestReleasesShareRoundTrips: 60 leases on three sites released at once
// share script calls (pool_call.lua, group commit), each release
// owner-checked on its own: a lease whose token is no longer the holder's
// gets ErrLeaseLost and stays, the others are released, and every
// release returns only once its outcome is in Redis.
func TestReleasesShareRoundTrips(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	hook := &slowScripts{}
	rdb.AddHook(hook)
	s := newSwitch(t, rdb)
	_, err := s.Add(ctx, proxyURLs(20)...)
	require.NoError(t, err)
	sites := []string{"a.example", "b.example", "c.example"}
	var leases []*Lease
	for _, site := range sites {
		for range 20 {
			l, err := s.Lease(ctx, site)
			require.NoError(t, err)
			leases = append(leases, l)
		}
	}
	stolen := leases[7]
	stolen.token = "not-the-holder"

	hook.delay.Store(int64(20 * time.Millisecond))
	hook.n.Store(0)
	var wg sync.WaitGroup
	errs := make([]error, len(leases))
	start := make(chan struct{})
	for i, l := range leases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = l.Release(ctx)
		}()
	}
	close(start)
	wg.Wait()
	hook.delay.Store(0)
	calls := hook.n.Load()
	t.Logf("%d releases in %d script calls", len(leases), calls)
	assert.LessOrEqual(t, calls, int64(len(leases)/4), "releases made at once share script calls")
	for i, err := range errs {
		if leases[i] == stolen {
			assert.True(t, errors.Is(err, ErrLeaseLost), "the lease no longer ours: %v", err)
			continue
		}
		assert.NoError(t, err, "lease %d", i)
	}
	for _, site := range sites {
		st, err := s.Stats(ctx, site)
		require.NoError(t, err)
		want := 0
		if site == stolen.scope {
			want = 1
		}
		assert.Equal(t, want, st.LeaseRecords, "lease records left for %s", site)
	}
}

// TestPoolCallRejectsBadScopeIndex: pool_call.lua refuses a lease
// whose scope index names no keys instead of touching other keys.
func TestPoolCallRejectsBadScopeIndex(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	s := newSwitch(t, rdb)
	k := s.keys
	keys := []string{k.fails(), k.free("a"), k.leases("a"), k.strikes("a"), k.health("a"), k.pace("a")}
	for _, idx := range []any{0, 2, "x"} {
		err := poolCallScript.Run(ctx, rdb, keys, 60000, 0, 1, idx, "m:0", "tok", 0, "", 0, "0").Err()
		require.Error(t, err, fmt.Sprint(idx))
		assert.Contains(t, err.Error(), "PSARGS")
	}
}

// callerHook records whether each lease.lua and pool_call.lua call runs on the goroutine of a
// function whose name contains caller (inline) or on another one.
type callerHook struct {
	caller          string
	inline, spawned atomic.Int64
}

func (h *callerHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *callerHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *callerHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); len(args) > 1 && strings.ToLower(cmd.Name()) == "evalsha" &&
			(args[1] == leaseScript.Hash() || args[1] == poolCallScript.Hash()) {
			buf := make([]byte, 64<<10)
			if strings.Contains(string(buf[:runtime.Stack(buf, false)]), h.caller) {
				h.inline.Add(1)
			} else {
				h.spawned.Add(1)
			}
		}
		return next(ctx, cmd)
	}
}

// TestLeasePathRunsInline: on a client that honours context deadlines
// (ContextTimeoutEnabled) a lease and its release run on the caller's
// goroutine; on a default client each on a watchdog goroutine of its own
// (bounded.Call), which go-redis' own timeouts then need.
func TestLeasePathRunsInline(t *testing.T) {
	if shared.Server == nil {
		t.Skip("single-node client options")
	}
	ctx := context.Background()
	for _, honours := range []bool{true, false} {
		rdb := shared.Server.Client(t, func(o *redis.Options) { o.ContextTimeoutEnabled = honours })
		s := newSwitch(t, rdb)
		_, err := s.Add(ctx, proxyURLs(2)...)
		require.NoError(t, err)
		h := &callerHook{caller: "TestLeasePathRunsInline"}
		rdb.AddHook(h)
		for range 3 {
			l, err := s.Lease(ctx, "a.example")
			require.NoError(t, err)
			require.NoError(t, l.Release(ctx))
		}
		if honours {
			assert.Equal(t, int64(6), h.inline.Load(), "inline")
			assert.Zero(t, h.spawned.Load(), "spawned")
		} else {
			assert.Zero(t, h.inline.Load(), "inline")
			assert.Equal(t, int64(6), h.spawned.Load(), "spawned")
		}
	}
}

// TestReleaseWakesALocalWaiter: a lease waiting for the only proxy of a
// site gets it as soon as this Switch releases it there, not after its
// backoff (2s here); a release on another site wakes nobody.
func TestReleaseWakesALocalWaiter(t *testing.T) {
	ctx := context.Background()
	s := newSwitch(t, shared.Client(t))
	s.cfg.backoffMin, s.cfg.backoffMax = 2*time.Second, 2*time.Second
	_, err := s.Add(ctx, proxyURLs(1)...)
	require.NoError(t, err)
	held, err := s.Lease(ctx, "a.example")
	require.NoError(t, err)
	other, err := s.Lease(ctx, "b.example")
	require.NoError(t, err)
	got := make(chan time.Time, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		l, err := s.Lease(ctx, "a.example")
		assert.NoError(t, err)
		got <- time.Now()
		if l != nil {
			assert.NoError(t, l.Release(ctx))
		}
	}()
	time.Sleep(100 * time.Millisecond) // the waiter tried once and sleeps
	require.NoError(t, other.Release(ctx))
	select {
	case <-got:
		t.Fatal("a release on another site woke the waiter")
	case <-time.After(100 * time.Millisecond):
	}
	released := time.Now()
	require.NoError(t, held.Release(ctx))
	at := <-got
	<-done
	assert.Less(t, at.Sub(released), 500*time.Millisecond, "woken by the release, not by its 2s backoff")
}

// failScripts fails every script call while on.
type failScripts struct{ on atomic.Bool }

func (h *failScripts) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *failScripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *failScripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := strings.ToLower(cmd.Name()); h.on.Load() && (name == "evalsha" || name == "eval") {
			err := errors.New("ERR injected script failure")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// TestFailedReleaseIsRenewedNoMore: a request's lease whose release fails
// leaves the renewer's set, so it expires by its TTL as the warning says;
// before, the renewer extended it for good and its proxy served no one
// (the demo's crawl on an embedded Redis stalled so, 480 leases held).
func TestFailedReleaseIsRenewedNoMore(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	s := newSwitch(t, rdb)
	_, err := s.Add(ctx, proxyURLs(1)...)
	require.NoError(t, err)
	l, err := s.Lease(ctx, "a.example")
	require.NoError(t, err)
	require.NoError(t, s.renew.track(l, true))
	h := &failScripts{}
	rdb.AddHook(h)
	h.on.Store(true)
	s.releaseQuietly(l)
	h.on.Store(false)
	s.renew.mu.Lock()
	_, live := s.renew.live[l]
	s.renew.mu.Unlock()
	assert.False(t, live, "a lease whose release failed is renewed no more")
}

// TestHealthyReleasesReadSharedHashesOnce: a call of many healthy releases
// of one site (pool_call.lua, release.lua once per lease) reads the fails
// hash, the site's health hash and its pace hash once, not once per release
// (release_lib.lua), and still does each release's work: a proxy's failures
// in a row end, its failure rate drops, its healthy record is written. With
// both hashes empty no release reads or deletes in them.
func TestHealthyReleasesReadSharedHashesOnce(t *testing.T) {
	healthyReleasesReadSharedHashesOnce(t, shared.Client(t), true)
}

// TestHealthyReleasesReadSharedHashesOnceOnMiniredis: the same effects on
// gopher-lua (the demo's embedded Redis), which counts no commands.
func TestHealthyReleasesReadSharedHashesOnceOnMiniredis(t *testing.T) {
	healthyReleasesReadSharedHashesOnce(t, miniredisClient(t), false)
}

func healthyReleasesReadSharedHashesOnce(t *testing.T, rdb redis.UniversalClient, counted bool) {
	ctx := context.Background()
	const n, site = 12, "a.example"
	s := newSwitch(t, rdb)
	// One more than the leases: the second round needs none of the
	// proxy its failure rate holds back (r × FlakyDelay).
	_, err := s.Add(ctx, proxyURLs(n+1)...)
	require.NoError(t, err)
	p := s.own.redis()
	// releaseAll leases every proxy on site, then gives all back healthy in one call.
	releaseAll := func(before func(ls []*Lease)) {
		t.Helper()
		var ls []*Lease
		for range n {
			l, err := s.Lease(ctx, site)
			require.NoError(t, err)
			l.healthy.Store(true)
			ls = append(ls, l)
		}
		before(ls)
		var ops []poolOp
		for _, l := range ls {
			reset, cooldown, flaky, pace := p.releaseArgs(l)
			require.True(t, reset != "" && flaky > 0 && pace, "a healthy release with the defaults")
			ops = append(ops, poolOp{rel: queuedRelease{l: l, reset: reset, cooldown: cooldown, flaky: flaky, pace: pace, at: time.Now()}})
		}
		res, err := p.callMany(ops)
		require.NoError(t, err)
		for i, r := range res {
			require.NoError(t, r.err)
			assert.EqualValues(t, 1, r.n, "release %d", i)
		}
	}

	// One proxy with failures in a row, another with a failure rate.
	var failing, flaky string
	releaseAll(func(ls []*Lease) {
		failing, flaky = ls[3].Proxy().ID(), ls[5].Proxy().ID()
		require.NoError(t, rdb.HSet(ctx, s.keys.fails(), failing, "2|0|0|"+site).Err())
		require.NoError(t, rdb.HSet(ctx, s.keys.health(site), flaky, "0.5").Err())
	})
	assert.False(t, rdb.HExists(ctx, s.keys.fails(), failing).Val(), "the healthy answer ended its failures")
	r, err := rdb.HGet(ctx, s.keys.health(site), flaky).Float64()
	require.NoError(t, err)
	assert.InDelta(t, 0.4, r, 1e-9, "its failure rate dropped by one healthy answer")
	strikes, err := rdb.HGetAll(ctx, s.keys.strikes(site)).Result()
	require.NoError(t, err)
	assert.Regexp(t, `^\d+$`, strikes["served"], "the site's latest healthy answer")
	delete(strikes, "served")
	assert.Len(t, strikes, n, "every released proxy's healthy record")
	for id, v := range strikes {
		assert.Regexp(t, `^0\|\d+\|0$`, v, "proxy %s", id)
	}
	single, ok := rdb.(*redis.Client)
	if !counted || !ok {
		return // INFO commandstats: one Redis server's
	}

	// Empty fails and health hashes: one HLEN each for the call.
	require.NoError(t, rdb.Del(ctx, s.keys.health(site)).Err())
	releaseAll(func([]*Lease) { require.NoError(t, rdb.ConfigResetStat(ctx).Err()) })
	stats := commandStats(t, single)
	assert.EqualValues(t, 1, stats["evalsha"].calls, "one call")
	assert.EqualValues(t, 2, stats["hlen"].calls, "the fails and health hashes, once each")
	assert.EqualValues(t, n, stats["hdel"].calls, "the lease records only")
	assert.EqualValues(t, 1, stats["hmget"].calls, "the pace hash, once")
	assert.LessOrEqual(t, stats["pexpire"].calls, int64(1), "the pace hash's TTL, at most once")
	assert.EqualValues(t, 2*n, stats["hget"].calls, "each release's lease record and healthy record")
	// Each release's healthy record, the site's served time once, and
	// at most one note of the pace hash's accepted rest.
	assert.GreaterOrEqual(t, stats["hset"].calls, int64(n+1), "healthy records and the served time")
	assert.LessOrEqual(t, stats["hset"].calls, int64(n+2), "the served time written once per call")
}
