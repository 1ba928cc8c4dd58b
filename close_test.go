package proxyswitch

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// closeCanary is the password of the proxies of these tests: no error may
// quote it.
const closeCanary = "Canary-close-pw"

// closeProxyURLs returns n proxies whose password is closeCanary.
func closeProxyURLs(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("http://user%d:%s@127.9.%d.%d:3128", i, closeCanary, 1+i/250, 1+i%250)
	}
	return out
}

// holdLeases leases n proxies of s, half on each of two sites.
func holdLeases(t *testing.T, s *Switch, n int) []*Lease {
	t.Helper()
	ctx := context.Background()
	_, err := s.Add(ctx, closeProxyURLs((n+1)/2)...)
	require.NoError(t, err)
	var leases []*Lease
	for i := range n {
		l, err := s.Lease(ctx, []string{"a.example", "b.example"}[i%2])
		require.NoError(t, err)
		leases = append(leases, l)
	}
	return leases
}

// closeWithin runs s.Close(ctx) and waits for it at most bound. Past the
// bound the test fails, and Redis (if paused) is resumed so that Close
// ends and the test does not wait out a release per lease.
func closeWithin(t *testing.T, s *Switch, ctx context.Context, bound time.Duration, srv *redistest.Server) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	type result struct {
		took time.Duration
		err  error
	}
	done := make(chan result, 1)
	go func() {
		err := s.Close(ctx)
		done <- result{time.Since(start), err}
	}()
	select {
	case r := <-done:
		return r.took, r.err
	case <-time.After(bound):
		t.Errorf("Close still running after %v", bound)
		_ = srv.Resume()
		r := <-done
		return r.took, r.err
	}
}

// TestCloseWithRedisStalled: with Redis stalled (SIGSTOP), Close of a Switch
// holding 50 leases returns within about one Redis timeout, not one per
// lease one after another (5 leases took 2.5s, 20 took 10s), or by its context's
// deadline when that comes first. Its error is one line that counts the
// leases not released, wraps the cause (ErrRedis, a deadline) and quotes no
// proxy password; after it nothing leases.
func TestCloseWithRedisStalled(t *testing.T) {
	const n = 50
	for _, tc := range []struct {
		name    string
		inline  bool          // the client honours context deadlines (bounded.Call runs inline)
		redis   time.Duration // Timeouts.Redis
		ctx     time.Duration // Close's context deadline; 0: Background
		bound   time.Duration
		wantCtx bool // the error wraps context.DeadlineExceeded of Close's context
	}{
		{name: "background", redis: 500 * time.Millisecond, bound: 1500 * time.Millisecond},
		{name: "background-inline", inline: true, redis: 500 * time.Millisecond, bound: 1500 * time.Millisecond},
		{name: "deadline-first", redis: 3 * time.Second, ctx: 300 * time.Millisecond, bound: 1200 * time.Millisecond, wantCtx: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			rdb := srv.Client(t, func(o *redis.Options) { o.ContextTimeoutEnabled = tc.inline })
			s := newSwitch(t, rdb, WithTimeouts(Timeouts{Redis: tc.redis}))
			leases := holdLeases(t, s, n)
			require.Len(t, leases, n)

			require.NoError(t, srv.Pause())
			defer func() { _ = srv.Resume() }()
			ctx := context.Background()
			if tc.ctx > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.ctx)
				defer cancel()
			}
			took, err := closeWithin(t, s, ctx, tc.bound, srv)
			t.Logf("Close of %d leases with Redis stalled: %v: %v", n, took.Round(time.Millisecond), err)
			require.Error(t, err)
			assert.Less(t, took, tc.bound)
			msg := err.Error()
			assert.NotContains(t, msg, "\n", "one line")
			assert.NotContains(t, msg, closeCanary)
			assert.Contains(t, msg, fmt.Sprintf("%d of %d leases not released", n, n))
			if tc.wantCtx {
				assert.ErrorIs(t, err, context.DeadlineExceeded)
			} else {
				assert.ErrorIs(t, err, ErrRedis)
			}

			// Fail closed: nothing leases after Close, Redis or not.
			require.NoError(t, srv.Resume())
			_, err = s.Lease(context.Background(), "a.example")
			assert.ErrorIs(t, err, ErrNoProxy)
			req, err := http.NewRequest(http.MethodGet, "http://a.example/", nil)
			require.NoError(t, err)
			u, err := s.ProxyFunc(req)
			assert.Nil(t, u)
			assert.ErrorIs(t, err, ErrNoProxy)
			assert.NoError(t, s.Close(context.Background()), "twice releases nothing more")
		})
	}
}

// TestCloseReleasesManyLeases: with Redis healthy, Close releases every one
// of many leases on two sites (no lease record left), owner-checked: a
// lease whose token is no longer its holder's is not released (its record,
// another holder's, stays) and is not an error, as a lost lease never was.
func TestCloseReleasesManyLeases(t *testing.T) {
	const n = 50
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	hook := &slowScripts{}
	rdb.AddHook(hook)
	s := newSwitch(t, rdb, WithTimeouts(Timeouts{Redis: 500 * time.Millisecond, LeaseTTL: 30 * time.Second}))
	leases := holdLeases(t, s, n)
	stolen := leases[7] // on b.example
	stolen.token = "not-the-holder"

	ctx := context.Background()
	records := func(site string) int {
		st, err := s.Stats(ctx, site)
		require.NoError(t, err)
		return st.LeaseRecords
	}
	require.Equal(t, n/2, records("a.example"))
	require.Equal(t, n/2, records("b.example"))

	hook.n.Store(0)
	require.NoError(t, s.Close(ctx))
	scripts := hook.n.Load()
	t.Logf("Close released %d leases in %d script calls", n-1, scripts)
	assert.LessOrEqual(t, scripts, int64(2), "the releases share script calls")
	assert.Zero(t, records("a.example"))
	assert.Equal(t, 1, records("b.example"), "the stolen lease's record is its holder's: it stays")
	for _, l := range leases {
		assert.True(t, l.released.Load() || l == stolen)
	}
	s.renew.mu.Lock()
	assert.Empty(t, s.renew.live)
	s.renew.mu.Unlock()
	_, err := s.Lease(ctx, "a.example")
	assert.ErrorIs(t, err, ErrNoProxy)
}

// TestCloseErrorCountsFailures: Close's error is one line that counts the
// leases not released, names each distinct cause (with its count when
// there are several) and wraps them all.
func TestCloseErrorCountsFailures(t *testing.T) {
	e := &closeError{total: 5, ttl: 30 * time.Second}
	assert.NoError(t, e.err())
	timeout := redisErr("release", fmt.Errorf("no reply within 500ms: %w", context.DeadlineExceeded))
	e.add(1, timeout)
	e.add(1, redisErr("release", fmt.Errorf("no reply within 500ms: %w", context.DeadlineExceeded)))
	err := e.err()
	require.Error(t, err)
	assert.Equal(t, "proxyswitch: close: 2 of 5 leases not released (they stay in Redis until they expire, lease TTL 30s): "+
		timeout.Error(), err.Error())
	e.add(1, fmt.Errorf("still being released:\n%w", context.Canceled))
	msg := e.err().Error()
	assert.NotContains(t, msg, "\n")
	assert.Contains(t, msg, "3 of 5 leases not released")
	assert.Contains(t, msg, timeout.Error()+" (2); still being released: context canceled (1)")
	assert.ErrorIs(t, err, ErrRedis)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorIs(t, err, context.Canceled)
}

// TestCloseWithFallbackRedisStalled: a Switch with the fallback holds
// leases from Redis when Redis stalls: Close's releases go all at once
// (fbPool.releaseMany), the failed batch trips the fallback, which takes
// them over (deferred, for a resume that no longer comes), and no lease is
// reported unreleased. The releases take one Redis timeout (the
// fallback's, 300ms). Timed by themselves (releaseAll, what Close runs):
// Stop, which Close calls next, waits out the fallback loop's call in
// flight and the membership's deregistration (bounded by its own 2s
// timeout), which vary with Redis stalled, none of them per lease.
func TestCloseWithFallbackRedisStalled(t *testing.T) {
	const n = 40
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	s := newSwitch(t, rdb, fastFallback("crawler-1")...)
	startSwitch(t, s)
	leases := holdLeases(t, s, n)
	for _, l := range leases {
		require.Nil(t, l.local, "a lease from Redis")
	}
	require.NoError(t, srv.Pause())
	defer func() { _ = srv.Resume() }()
	ctx := context.Background()
	start := time.Now()
	err := s.renew.releaseAll(ctx)
	took := time.Since(start)
	t.Logf("releases of %d leases with Redis stalled, with the fallback: %v: %v", n, took.Round(time.Millisecond), err)
	assert.Less(t, took, 3*s.cfg.fallback.timeout)
	require.NoError(t, err, "the fallback took the leases over")
	for _, l := range leases {
		assert.True(t, l.released.Load())
	}
	err = s.Close(ctx)
	if err != nil {
		assert.NotContains(t, err.Error(), "\n")
		assert.NotContains(t, err.Error(), closeCanary)
	}
	_, err = s.Lease(ctx, "a.example")
	assert.ErrorIs(t, err, ErrNoProxy)
}

// TestCloseCancelsARenewalInFlight: leases of running requests (renewed),
// Redis stalled while the renewer's call is in Redis: Close cancels that
// call rather than wait it out (one Redis timeout) before its releases
// (another): it returns within about one Redis timeout.
func TestCloseCancelsARenewalInFlight(t *testing.T) {
	const redisTimeout = time.Second
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	s := newSwitch(t, rdb, WithTimeouts(Timeouts{Redis: redisTimeout, LeaseTTL: 400 * time.Millisecond}))
	ctx := context.Background()
	_, err := s.Add(ctx, closeProxyURLs(10)...)
	require.NoError(t, err)
	for range 10 {
		_, err := s.acquire(ctx, "a.example", "", true)
		require.NoError(t, err)
	}
	require.NoError(t, srv.Pause())
	defer func() { _ = srv.Resume() }()
	time.Sleep(250 * time.Millisecond) // the renewer's tick (100ms) sent a call that hangs
	bound := 1600 * time.Millisecond
	took, err := closeWithin(t, s, ctx, bound, srv)
	t.Logf("Close of 10 renewed leases with Redis stalled: %v: %v", took.Round(time.Millisecond), err)
	assert.Less(t, took, bound)
	assert.ErrorIs(t, err, ErrRedis)
	assert.Contains(t, err.Error(), "10 of 10 leases not released")
}
