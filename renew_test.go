package proxyswitch

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/proxyswitch/proxyswitch/internal/testlog"
	"github.com/proxyswitch/proxyswitch/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Renewal (issue 13, item 3) and Close (item 4). The sites' recorders are
// the ground truth: a request that outlives its lease TTL must never see
// another request from its IP arrive at its site meanwhile.

// renewTTL is the lease TTL of these tests: short, so that requests of a
// few TTLs stay fast, and long enough that the renewer's tick (a quarter
// of it) has slack on a loaded machine.
const renewTTL = 400 * time.Millisecond

// TestLongRequestKeepsItsLease: one proxy; a request runs 5 TTLs with no
// deadline, or 11 TTLs with a deadline beyond ten TTLs (where the TTL used
// to stop stretching), while a second worker (its own Switch and Redis
// client) keeps asking for the proxy for the same site. It gets it only
// once the long request is over: 0 overlaps at the site.
func TestLongRequestKeepsItsLease(t *testing.T) {
	for _, tc := range []struct {
		name     string
		timeout  time.Duration // the long request's Colly request timeout; 0 for none
		duration time.Duration
	}{
		{"no deadline", 0, 5 * renewTTL},
		{"deadline beyond ten TTLs", 40 * renewTTL, 11 * renewTTL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bed, s := bedSwitch(t, 1, 1, WithTimeouts(Timeouts{LeaseTTL: renewTTL, MaxWait: 30 * time.Second}))
			site := bed.Sites[0]

			long := colly.NewCollector(colly.Async(true))
			s.Attach(long)
			long.SetRequestTimeout(tc.timeout)
			var longErr error
			var longOK atomic.Bool
			long.OnResponse(func(*colly.Response) { longOK.Store(true) })
			long.OnError(func(_ *colly.Response, err error) { longErr = err })
			start := time.Now()
			require.NoError(t, long.Visit(fmt.Sprintf("%s/slow?d=%s", site.URL(), tc.duration)))
			require.Eventually(t, func() bool { return site.Recorder().InFlight() == 1 }, 5*time.Second, 5*time.Millisecond)

			other := sibling(t, s, shared.Client(t))
			c := colly.NewCollector(colly.Async(true), colly.AllowURLRevisit())
			other.Attach(c)
			c.SetRequestTimeout(30 * time.Second)
			var ok, failed atomic.Int64
			var firstAt atomic.Int64
			c.OnResponse(func(*colly.Response) {
				ok.Add(1)
				firstAt.CompareAndSwap(0, time.Now().UnixNano())
			})
			c.OnError(func(_ *colly.Response, err error) { failed.Add(1); t.Log(err) })
			for i := range 3 {
				require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), i+1)))
			}
			long.Wait()
			c.Wait()

			require.NoError(t, longErr)
			assert.True(t, longOK.Load())
			assert.Equal(t, int64(3), ok.Load())
			assert.Zero(t, failed.Load())
			assert.GreaterOrEqual(t, time.Unix(0, firstAt.Load()).Sub(start), tc.duration,
				"the other worker got the proxy only after the long request")
			assertGroundTruth(t, bed)
			assertNoLeases(t, s, site)
		})
	}
}

// TestKilledHolderOfALongRequestFreesItsProxy: a worker process runs a
// request far longer than the lease TTL (Colly's default 10s timeout, beyond
// ten TTLs) and is SIGKILLed after a few TTLs, its lease renewed all along:
// the proxy is leasable again within TTL + 1s.
func TestKilledHolderOfALongRequestFreesItsProxy(t *testing.T) {
	const ttl = 500 * time.Millisecond
	bed, s := bedSwitch(t, 1, 1, WithTimeouts(Timeouts{LeaseTTL: ttl, MaxWait: Off}))
	site := bed.Sites[0]
	cmd := startWorker(t, workerSpec{Mode: "crawl", Redis: shared.Addr(), Prefix: s.cfg.prefix, LeaseTTL: ttl.String(),
		URLs: []string{site.URL() + "/slow?d=30s"}, Threads: 1})
	cmd.Stdout = io.Discard
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	require.Eventually(t, func() bool { return site.Recorder().InFlight() == 1 }, 20*time.Second, 5*time.Millisecond)

	time.Sleep(3 * ttl)
	_, err := s.Lease(context.Background(), site.Host())
	require.ErrorIs(t, err, ErrNoProxy, "the worker's lease was renewed past its TTL")
	require.NoError(t, cmd.Process.Kill())
	killed := time.Now()
	_ = cmd.Wait()

	var l *Lease
	for l == nil && time.Since(killed) < ttl+time.Second {
		if l, err = s.Lease(context.Background(), site.Host()); err != nil {
			require.ErrorIs(t, err, ErrNoProxy)
			time.Sleep(10 * time.Millisecond)
		}
	}
	require.NotNil(t, l, "the proxy was not leasable within TTL + 1s of the SIGKILL")
	t.Logf("proxy back %v after SIGKILL (TTL %v)", time.Since(killed).Round(time.Millisecond), ttl)
	require.NoError(t, l.Release(context.Background()))
}

// TestLostLeaseFailsItsRequest: the lease of a running request vanishes
// from Redis (as when Redis loses it, or an operator clears the pool): the
// renewer reports it, and the request fails with ErrLeaseLost instead of
// reaching OnResponse as if its proxy had been exclusive.
func TestLostLeaseFailsItsRequest(t *testing.T) {
	var logs testlog.Buffer
	bed, s := bedSwitch(t, 1, 1, WithTimeouts(Timeouts{LeaseTTL: renewTTL}), WithLogger(logs.Logger()))
	site := bed.Sites[0]
	c := colly.NewCollector(colly.Async(true))
	s.Attach(c)
	var gotErr error
	var responses atomic.Int64
	c.OnResponse(func(*colly.Response) { responses.Add(1) })
	c.OnError(func(_ *colly.Response, err error) { gotErr = err })
	require.NoError(t, c.Visit(site.URL()+"/slow?d=1s"))
	require.Eventually(t, func() bool { return site.Recorder().InFlight() == 1 }, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, shared.Client(t).Del(context.Background(), s.keys.leases(site.Host())).Err())
	c.Wait()

	assert.Zero(t, responses.Load())
	require.ErrorIs(t, gotErr, ErrLeaseLost)
	assert.Equal(t, 1, strings.Count(logs.String(), "lost its lease"), logs.String())
	assert.NotContains(t, logs.String(), "outlived", "reported once")
	assert.NotContains(t, logs.String(), ":pw@", "no password in the logs")
}

// TestRenewerStartsOnDemandAndStops: no goroutine before the first lease,
// one while leases live, none once they are released or on Close.
func TestRenewerStartsOnDemandAndStops(t *testing.T) {
	ctx := context.Background()
	s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{LeaseTTL: renewTTL}))
	_, err := s.Add(ctx, proxyURLs(2)...)
	require.NoError(t, err)
	running := func() bool {
		s.renew.mu.Lock()
		defer s.renew.mu.Unlock()
		return s.renew.running
	}
	assert.False(t, running())
	l, err := s.acquire(ctx, "ozon.example", "", true)
	require.NoError(t, err)
	assert.True(t, running())
	time.Sleep(3 * renewTTL)
	require.NoError(t, l.Extend(ctx, 0), "renewed: still live after 3 TTLs (Extend fails on an expired lease)")
	require.NoError(t, l.Release(ctx))
	require.Eventually(t, func() bool { return !running() }, 2*renewTTL, 5*time.Millisecond, "idle: the goroutine ends")

	_, err = s.acquire(ctx, "ozon.example", "", true)
	require.NoError(t, err)
	assert.True(t, running(), "started again")
	require.NoError(t, s.Close(ctx))
	assert.False(t, running())
	st, err := s.Stats(ctx, "ozon.example")
	require.NoError(t, err)
	assert.Zero(t, st.LeaseRecords)
}

// TestLocalShardLeasesAreRenewed: a lease from the local shard (here under
// WithSharding) is renewed in memory like a Redis one.
func TestLocalShardLeasesAreRenewed(t *testing.T) {
	ctx := context.Background()
	prefix := testPrefix()
	admin, err := NewSwitch(shared.Client(t), WithPrefix(prefix))
	require.NoError(t, err)
	_, err = admin.Add(ctx, proxyURLs(1)...)
	require.NoError(t, err)
	sw, err := NewSwitch(shared.Client(t), WithPrefix(prefix), WithSharding("solo", nil), WithTimeouts(Timeouts{LeaseTTL: renewTTL, Fallback: 300 * time.Millisecond}), WithMembership(shard.MemberConfig{Heartbeat: 100 * time.Millisecond, TTL: time.Second}),
		WithTimeouts(Timeouts{Attempt: 100 * time.Millisecond, MaxWait: 5 * time.Second}))
	require.NoError(t, err)
	startSwitch(t, sw)
	l, err := sw.acquire(ctx, "ozon.example", "", true)
	require.NoError(t, err)
	require.NotNil(t, l.local, "a lease of the local shard")

	time.Sleep(3 * renewTTL)
	short, cancel := context.WithTimeout(ctx, renewTTL/2)
	defer cancel()
	_, err = sw.acquire(short, "ozon.example", "", false)
	require.ErrorIs(t, err, ErrNoProxy, "its only proxy is still held, 3 TTLs on")
	assert.Greater(t, time.Until(l.Expiry()), renewTTL/4)
	require.NoError(t, sw.Close(ctx))
	assert.ErrorIs(t, l.Extend(ctx, 0), ErrLeaseLost, "Close released it")
}

// TestRenewalUnderContention: three workers with their own Redis clients,
// 30 goroutines each, hold leases of the ProxyFunc kind on three sites for
// up to three TTLs each, longer than the TTL, with the renewer's batches
// covering every site at once: no proxy is ever held twice for one site,
// and nothing is left in Redis.
func TestRenewalUnderContention(t *testing.T) {
	ctx := context.Background()
	// Holds run to 2.25 TTLs: without renewal they are lost. The TTL leaves
	// a renewal (every TTL/4) 750ms to come late on a loaded machine: at
	// 300ms a -race run under a load of 15 on 2 cores lost leases.
	const ttl = time.Second
	base := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{LeaseTTL: ttl, MaxWait: 30 * time.Second}))
	_, err := base.Add(ctx, proxyURLs(15)...)
	require.NoError(t, err)
	sites := []string{"ozon.example", "avito.example", "wb.example"}

	var holders ledger
	var leases atomic.Int64
	var wg sync.WaitGroup
	var sws []*Switch
	for w := range 3 {
		sw := sibling(t, base, shared.Client(t))
		sws = append(sws, sw)
		for g := range 30 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				site := sites[(w+g)%len(sites)]
				for i := range 3 {
					l, err := sw.acquire(ctx, site, "", true)
					if !assert.NoError(t, err) {
						return
					}
					holders.hold(site, l, time.Duration((g+i)%4)*ttl*3/4)
					leases.Add(1)
					if !assert.NoError(t, l.Release(ctx)) {
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	assert.Equal(t, int64(3*30*3), leases.Load())
	assert.Zero(t, holders.collisions.Load(), "a proxy held twice for one site")
	for _, sw := range sws {
		require.NoError(t, sw.Close(ctx))
	}
	for _, site := range sites {
		st, err := base.Stats(ctx, site)
		require.NoError(t, err)
		assert.Zero(t, st.LeaseRecords, site)
	}
}

// TestCloseReleasesEverything: leases of the plain proxy function whose
// request context never ends (no request timeout: nothing releases them),
// of a hooked request still running, and of Switch.Lease are all in Redis
// until Close, and none after it. After Close every lease attempt fails
// closed, and no request leaves.
func TestCloseReleasesEverything(t *testing.T) {
	ctx := context.Background()
	bed, s := bedSwitch(t, 2, 4, WithTimeouts(Timeouts{LeaseTTL: 30 * time.Second}))
	plain, slow := bed.Sites[0], bed.Sites[1]

	c := colly.NewCollector(colly.AllowURLRevisit())
	c.SetRequestTimeout(0)
	c.SetProxyFunc(s.ProxyFunc)
	for i := range 2 {
		require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", plain.URL(), i+1)))
	}
	hooked := colly.NewCollector(colly.Async(true))
	s.Attach(hooked)
	var hookedErr error
	hooked.OnError(func(_ *colly.Response, err error) { hookedErr = err })
	require.NoError(t, hooked.Visit(slow.URL()+"/slow?d=1s"))
	require.Eventually(t, func() bool { return slow.Recorder().InFlight() == 1 }, 5*time.Second, 5*time.Millisecond)
	_, err := s.Lease(ctx, slow.Host())
	require.NoError(t, err)

	held := func(site *testbed.Site) int {
		st, err := s.Stats(ctx, site.Host())
		require.NoError(t, err)
		return st.LeaseRecords
	}
	require.Equal(t, 2, held(plain), "the plain proxy function's leases stay until their TTL")
	require.Equal(t, 2, held(slow))

	require.NoError(t, s.Close(ctx))
	assert.Zero(t, held(plain))
	assert.Zero(t, held(slow))
	hooked.Wait()
	assert.ErrorIs(t, hookedErr, ErrLeaseLost, "the running request lost its exclusivity: it fails")
	assertNoLeases(t, s, plain, slow)

	hits := bed.SiteHits()
	req, err := http.NewRequest(http.MethodGet, plain.URL()+"/p/8", nil)
	require.NoError(t, err)
	u, err := s.ProxyFunc(req)
	assert.Nil(t, u)
	assert.ErrorIs(t, err, ErrNoProxy)
	_, err = s.Lease(ctx, plain.Host())
	assert.ErrorIs(t, err, ErrNoProxy)
	err = c.Visit(plain.URL() + "/p/9")
	assert.ErrorIs(t, err, ErrNoProxy)
	assert.Equal(t, hits, bed.SiteHits(), "no request after Close")
	assertGroundTruth(t, bed)
	require.NoError(t, s.Close(ctx), "twice is fine")
}

// TestCloseWaitsForReleasesInFlight: Close returns only once the releases
// that contexts ending on other goroutines started are done.
func TestCloseWaitsForReleasesInFlight(t *testing.T) {
	ctx := context.Background()
	bed, s := bedSwitch(t, 1, 20, WithTimeouts(Timeouts{LeaseTTL: 30 * time.Second}))
	site := bed.Sites[0]
	var cancels []context.CancelFunc
	for i := range 20 {
		rctx, cancel := context.WithCancel(ctx)
		cancels = append(cancels, cancel)
		req, err := http.NewRequestWithContext(rctx, http.MethodGet, fmt.Sprintf("%s/p/%d", site.URL(), i), nil)
		require.NoError(t, err)
		_, err = s.ProxyFunc(req)
		require.NoError(t, err)
	}
	for _, cancel := range cancels {
		cancel() // each starts a release on a goroutine of its own
	}
	require.NoError(t, s.Close(ctx))
	st, err := s.Stats(ctx, site.Host())
	require.NoError(t, err)
	assert.Zero(t, st.LeaseRecords)
	assert.Zero(t, st.Leased)
}

// BenchmarkRenewerTrack is what the renewer costs a request: one lease into
// the set and out of it, from many goroutines at once (50 workers, as
// BenchmarkLease), with no Redis call.
func BenchmarkRenewerTrack(b *testing.B) {
	s := newSwitch(b, shared.Client(b))
	b.SetParallelism(benchWorkers / max(1, runtimeProcs()))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			l := &Lease{sw: s}
			if err := s.renew.track(l, true); err != nil {
				b.Error(err)
				return
			}
			s.renew.drop(l)
		}
	})
}
