package proxyswitch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The clients a lease call in doubt is met with: go-redis' default (its
// read timeout, shortened to a second here, outlives the Switch's Redis
// timeout: the call goes on on a worker, bounded.Call), and one that
// honours context deadlines (the call runs inline and gives up with the
// Switch's timeout).
var doubtClients = []struct {
	name string
	opt  func(*redis.Options)
}{
	{"read-timeout", func(o *redis.Options) { o.ReadTimeout = time.Second }},
	{"context-deadlines", func(o *redis.Options) { o.ContextTimeoutEnabled = true }},
}

// stalledLease pauses srv, has sw.Lease time out against it, waits until
// the client gave up the call too (its connection closed, the command in
// Redis' socket), then resumes srv: the lease call that Redis runs on
// waking, which nobody holds.
func stalledLease(t *testing.T, srv *redistest.Server, sw *Switch, site string) {
	t.Helper()
	// A lease first: Redis has the scripts (a fresh one would answer the
	// stalled EVALSHA with NOSCRIPT, and lease nothing).
	l, err := sw.Lease(context.Background(), site)
	require.NoError(t, err)
	require.NoError(t, l.Release(context.Background()))
	require.NoError(t, srv.Pause())
	resumed := false
	defer func() {
		if !resumed {
			_ = srv.Resume()
		}
	}()
	start := time.Now()
	_, err = sw.Lease(context.Background(), site)
	require.ErrorIs(t, err, ErrNoProxy)
	require.ErrorIs(t, err, ErrRedis)
	assert.Less(t, time.Since(start), 2*time.Second)
	time.Sleep(1500 * time.Millisecond) // past the client's own read timeout
	require.NoError(t, srv.Resume())
	resumed = true
}

// leasedOn returns the site's leased slots.
func leasedOn(t *testing.T, sw *Switch, site string) int {
	t.Helper()
	st, err := sw.SiteState(context.Background(), site)
	require.NoError(t, err)
	return st.Leased
}

// noneLeased reports whether no slot of site is leased (false on an error:
// for assert.Eventually, whose condition runs on a goroutine of its own).
func noneLeased(sw *Switch, site string) bool {
	st, err := sw.SiteState(context.Background(), site)
	return err == nil && st.Leased == 0
}

// TestReclaimStalledLease is the reviewer's repro: a lease call that timed
// out while Redis was stalled runs when Redis wakes; its lease, which
// nobody holds, goes back within a couple of seconds, not the lease TTL,
// and the next Lease gets the proxy.
func TestReclaimStalledLease(t *testing.T) {
	for _, c := range doubtClients {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			srv := redistest.Start(t)
			sw := newSwitch(t, srv.Client(t, c.opt), WithTimeouts(Timeouts{MaxWait: 3 * time.Second, Redis: 500 * time.Millisecond}))
			_, err := sw.Replace(ctx, proxyURLs(1))
			require.NoError(t, err)
			const site = "example.test"
			stalledLease(t, srv, sw, site)
			resumed := time.Now()
			assert.Eventually(t, func() bool { return noneLeased(sw, site) }, 4*time.Second, 50*time.Millisecond,
				"the lease of the call that timed out is given back")
			t.Logf("given back %v after Redis woke", time.Since(resumed).Round(time.Millisecond))
			start := time.Now()
			l, err := sw.Lease(ctx, site)
			require.NoError(t, err)
			assert.Less(t, time.Since(start), time.Second, "the proxy is free")
			require.NoError(t, l.Release(ctx))
			require.NoError(t, sw.Close(ctx))
			assert.Equal(t, 0, sw.doubts.pending())
		})
	}
}

// TestReclaimOnClose: Close, called as soon as Redis wakes, gives the
// stalled call's lease back before it returns.
func TestReclaimOnClose(t *testing.T) {
	for _, c := range doubtClients {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			srv := redistest.Start(t)
			rdb := srv.Client(t, c.opt)
			sw := newSwitch(t, rdb, WithTimeouts(Timeouts{MaxWait: 3 * time.Second, Redis: 500 * time.Millisecond}))
			_, err := sw.Replace(ctx, proxyURLs(1))
			require.NoError(t, err)
			const site = "example.test"
			stalledLease(t, srv, sw, site)
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			require.NoError(t, sw.Close(cctx))
			assert.Equal(t, 0, sw.doubts.pending())
			other, err := sw.poolSwitch(sw.cfg.pool) // the same pool, read by another Switch
			require.NoError(t, err)
			assert.Equal(t, 0, leasedOn(t, other, site), "Close gave the lease back")
		})
	}
}

// TestReclaimCloseReportsUnchecked: Close with Redis still stalled says
// that a call in doubt could not be checked, rather than return nil.
func TestReclaimCloseReportsUnchecked(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client(t, func(o *redis.Options) { o.ContextTimeoutEnabled = true }) // the outcome is known at once
	sw := newSwitch(t, rdb, WithTimeouts(Timeouts{MaxWait: 3 * time.Second, Redis: 300 * time.Millisecond}))
	_, err := sw.Replace(ctx, proxyURLs(1))
	require.NoError(t, err)
	require.NoError(t, srv.Pause())
	defer srv.Resume()
	_, err = sw.Lease(ctx, "example.test")
	require.ErrorIs(t, err, ErrRedis)
	assert.Equal(t, 1, sw.doubts.pending())
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	err = sw.Close(cctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "1 lease calls of unknown outcome not checked")
	assert.Equal(t, 0, sw.doubts.pending())
}

// TestReclaimNothingBeforeRedis: a lease call that failed before reaching
// Redis (Redis killed: no connection) is in no doubt: nothing is
// remembered, no background work is left, Close returns at once. (A client
// still dialling when the Switch's bound passes gives up with the context's
// error, which says nothing of where the call was: that call is in doubt,
// and its sweep, once Redis is back, finds nothing: the second part.)
func TestReclaimNothingBeforeRedis(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	t.Run("dial error", func(t *testing.T) {
		rdb := srv.Client(t, func(o *redis.Options) { o.DialerRetries, o.MaxRetries = 1, -1 })
		sw := newSwitch(t, rdb, WithTimeouts(Timeouts{MaxWait: 3 * time.Second, Redis: 500 * time.Millisecond}))
		_, err := sw.Replace(ctx, proxyURLs(1))
		require.NoError(t, err)
		require.NoError(t, srv.Kill())
		_, err = sw.Lease(ctx, "example.test")
		require.ErrorIs(t, err, ErrNoProxy)
		require.ErrorIs(t, err, ErrRedis)
		// The call's real outcome (no connection) may come a little after
		// the Switch's bound (bounded.Call's late).
		assert.Eventually(t, func() bool {
			sw.doubts.mu.Lock()
			defer sw.doubts.mu.Unlock()
			return sw.doubts.n == 0 && !sw.doubts.running
		}, 3*time.Second, 20*time.Millisecond, "a call that never reached Redis is in no doubt: %v", err)
		start := time.Now()
		require.NoError(t, sw.Close(ctx))
		assert.Less(t, time.Since(start), time.Second)
	})
	t.Run("restarted", func(t *testing.T) {
		require.NoError(t, srv.Restart())
		sw := newSwitch(t, srv.Client(t), WithTimeouts(Timeouts{MaxWait: 3 * time.Second, Redis: 500 * time.Millisecond}))
		_, err := sw.Replace(ctx, proxyURLs(1))
		require.NoError(t, err)
		require.NoError(t, srv.Kill())
		_, err = sw.Lease(ctx, "example.test")
		require.ErrorIs(t, err, ErrRedis)
		require.NoError(t, srv.Restart()) // empty
		_, err = sw.Replace(ctx, proxyURLs(1))
		require.NoError(t, err)
		l, err := sw.Lease(ctx, "example.test")
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		assert.Equal(t, 0, leasedOn(t, sw, "example.test"))
		require.NoError(t, sw.Close(ctx), "whatever was in doubt was looked for")
		assert.Equal(t, 0, sw.doubts.pending())
	})
}

// TestReclaimOnlyItsOwn: the sweep releases the leases of the tokens in
// doubt and no other: a lease held on the same site, even one with the same
// token prefix (the same Switch), stays held.
func TestReclaimOnlyItsOwn(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	sw := newSwitch(t, rdb, WithTimeouts(Timeouts{MaxWait: Off}))
	_, err := sw.Replace(ctx, proxyURLs(3))
	require.NoError(t, err)
	const site = "example.test"
	held, err := sw.Lease(ctx, site)
	require.NoError(t, err)
	// A lease of a token nobody holds, as a call in doubt leaves it.
	rp := sw.own.redis()
	token := sw.newToken()
	res, err := leaseScript.Run(ctx, rdb, rp.scopeKeys.get(rp, site).lease, append([]any{site, token, sw.cfg.leaseTTL.Milliseconds(),
		sw.cfg.cooldown.Milliseconds(), sw.cfg.slots, sw.cfg.idleTTL.Milliseconds(), "", ""}, sw.brk.leaseArgs(site)...)...).Slice()
	require.NoError(t, err)
	require.EqualValues(t, 1, res[0])
	require.Equal(t, 2, leasedOn(t, sw, site))
	n, err := rp.reclaim(ctx, site, []string{token, "not-a-token", held.token + "x"})
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.Equal(t, 1, leasedOn(t, sw, site), "only the lease of the token in doubt went back")
	require.NoError(t, held.Release(ctx), "the held lease is still its holder's")
	n, err = rp.reclaim(ctx, site, []string{token})
	require.NoError(t, err)
	assert.Equal(t, 0, n, "given back once")
}

// TestReclaimPaged: the sweep goes through a lease hash larger than its
// page in several calls and finds every lease in doubt.
func TestReclaimPaged(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	sw := newSwitch(t, rdb, WithTimeouts(Timeouts{MaxWait: Off}))
	_, err := sw.Replace(ctx, proxyURLs(1500))
	require.NoError(t, err)
	const site = "example.test"
	rp := sw.own.redis()
	var doubtful []string
	for i := range 1200 {
		token := sw.newToken()
		res, err := leaseScript.Run(ctx, rdb, rp.scopeKeys.get(rp, site).lease, append([]any{site, token, sw.cfg.leaseTTL.Milliseconds(),
			sw.cfg.cooldown.Milliseconds(), sw.cfg.slots, sw.cfg.idleTTL.Milliseconds(), "", ""}, sw.brk.leaseArgs(site)...)...).Slice()
		require.NoError(t, err)
		require.EqualValues(t, 1, res[0])
		if i%3 == 0 {
			doubtful = append(doubtful, token)
		}
	}
	n, err := rp.reclaim(ctx, site, doubtful)
	require.NoError(t, err)
	assert.Equal(t, len(doubtful), n)
	assert.Equal(t, 1200-len(doubtful), leasedOn(t, sw, site))
}

// TestReclaimConcurrent: two workers (two Switches, two Redis clients of
// either kind), several goroutines each leasing, holding and releasing
// proxies of one site, while Redis is paused past the clients' timeouts and
// resumed mid-run. No proxy ever has two holders on the site at once, and
// once the run is over no lease is left, within seconds (not the lease
// TTL), before Close.
func TestReclaimConcurrent(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	const site = "example.test"
	opts := []Option{WithTimeouts(Timeouts{MaxWait: 2 * time.Second, Redis: 300 * time.Millisecond})}
	prefix := testPrefix()
	var sws []*Switch
	for _, c := range doubtClients {
		sw, err := NewSwitch(srv.Client(t, c.opt), append([]Option{WithPrefix(prefix)}, opts...)...)
		require.NoError(t, err)
		sws = append(sws, sw)
	}
	_, err := sws[0].Replace(ctx, proxyURLs(5))
	require.NoError(t, err)

	var mu sync.Mutex
	holders := map[string]int{}
	var overlaps, leases, failures atomic.Int64
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w := range 8 {
		sw := sws[w%len(sws)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for runCtx.Err() == nil {
				l, err := sw.Lease(runCtx, site)
				if err != nil {
					failures.Add(1)
					time.Sleep(20 * time.Millisecond)
					continue
				}
				leases.Add(1)
				id := l.Proxy().ID()
				mu.Lock()
				holders[id]++
				if holders[id] > 1 {
					overlaps.Add(1)
				}
				mu.Unlock()
				time.Sleep(time.Duration(5+w) * time.Millisecond)
				mu.Lock()
				holders[id]-- // its holder stops using it as it asks for the release
				mu.Unlock()
				for try := 0; ; try++ {
					err := l.Release(ctx)
					if err == nil || errors.Is(err, ErrLeaseLost) {
						break
					}
					if try == 100 {
						t.Errorf("release: %v", err)
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	require.NoError(t, srv.Pause())
	time.Sleep(2500 * time.Millisecond) // past both clients' timeouts: the calls in flight are in doubt
	require.NoError(t, srv.Resume())
	time.Sleep(time.Second)
	stop()
	wg.Wait()
	t.Logf("%d leases, %d failed attempts", leases.Load(), failures.Load())
	assert.Zero(t, overlaps.Load(), "two holders of one proxy on the site at once")
	doubted := 0
	for _, sw := range sws {
		doubted += sw.doubts.pending()
	}
	assert.Positive(t, doubted, "the pause left calls in doubt")
	assert.Eventually(t, func() bool { return noneLeased(sws[0], site) }, 5*time.Second, 50*time.Millisecond,
		"no lease is left after the run")
	for i, sw := range sws {
		require.NoError(t, sw.Close(ctx), fmt.Sprintf("switch %d", i))
	}
	assert.Equal(t, 0, leasedOn(t, sws[0], site))
}
