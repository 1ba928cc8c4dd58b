package proxyswitch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/proxyswitch/proxyswitch/internal/testlog"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// End-to-end tests: real Colly collectors, a real redis-server, fake sites
// and fake proxies on loopback (internal/testbed) as the ground truth.

// bedSwitch starts a bed and a Switch whose pool holds the bed's proxies.
func bedSwitch(t *testing.T, sites, proxies int, opts ...Option) (*testbed.Bed, *Switch) {
	t.Helper()
	bed := testbed.NewBed(t, sites, proxies)
	s := newSwitch(t, shared.Client(t), opts...)
	_, err := s.Add(context.Background(), bed.ProxyURLs()...)
	require.NoError(t, err)
	return bed, s
}

// assertNoLeases checks that no lease record is left in Redis for any site
// and no binding is left in the Switch.
func assertNoLeases(t *testing.T, s *Switch, sites ...*testbed.Site) {
	t.Helper()
	for _, site := range sites {
		st, err := s.Stats(context.Background(), site.Host())
		require.NoError(t, err)
		assert.Zero(t, st.LeaseRecords, "lease records left for %s", site.Name())
		assert.Zero(t, st.Leased, "live leases left for %s", site.Name())
	}
	assert.Zero(t, s.reg.size(), "bindings left in the Switch")
}

func assertGroundTruth(t *testing.T, bed *testbed.Bed) {
	t.Helper()
	siteColl, proxyColl := bed.Collisions()
	assert.Zero(t, siteColl, "moments a site saw two requests from one IP at once")
	assert.Zero(t, proxyColl, "moments a proxy carried two requests to one site at once")
	assert.Zero(t, bed.DirectHits(), "requests that reached a site without a proxy")
}

func TestCollectorWithDefaultsThroughAttach(t *testing.T) {
	bed, s := bedSwitch(t, 1, 3)
	c := colly.NewCollector() // Colly's defaults: 10s timeout, sync
	s.Attach(c)
	var proxyURLs []string
	c.OnResponse(func(r *colly.Response) { proxyURLs = append(proxyURLs, r.Request.ProxyURL) })
	for i := range 6 {
		require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", bed.Sites[0].URL(), i+1)))
	}
	require.Len(t, proxyURLs, 6)
	ips := bed.Sites[0].Recorder().IPs()
	assert.Len(t, ips, 3, "least recently used first spreads the load over all proxies")
	for _, n := range ips {
		assert.Equal(t, 2, n)
	}
	assertGroundTruth(t, bed)
	assertNoLeases(t, s, bed.Sites...)
}

// TestNoLeakOnAnyPath crawls through every way a Colly request can end:
// success, 4xx and 5xx, same-site and cross-site redirects, timeouts, dead
// and hanging proxies, aborts in OnRequest and OnResponseHeaders, Retry,
// MaxBodySize, a header map shared by many requests, Async, and the ban
// paths (403 and 503 are bans, the dead proxy a proxy failure: quarantine,
// retry through another proxy, give up): afterwards no lease is left in
// Redis and none in the Switch.
func TestNoLeakOnAnyPath(t *testing.T) {
	// Short quarantines: ten 403s and 503s with their retries must not take
	// all eight proxies out of rotation for the rest of the test.
	bed, s := bedSwitch(t, 2, 8, WithTimeouts(Timeouts{MaxWait: 20 * time.Second}),
		WithBans(Bans{Quarantine: 50 * time.Millisecond, QuarantineMax: 400 * time.Millisecond, FailureQuarantine: 50 * time.Millisecond, FailureQuarantineMax: 400 * time.Millisecond}))
	bed.Proxies[6].SetMode(testbed.ProxyDead)
	bed.Proxies[7].SetMode(testbed.ProxyHang)
	a, b := bed.Sites[0].URL(), bed.Sites[1].URL()

	c := colly.NewCollector(colly.Async(true), colly.AllowURLRevisit(), colly.MaxBodySize(16<<10))
	s.Attach(c)
	c.SetRequestTimeout(1500 * time.Millisecond)
	require.NoError(t, c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: 12}))

	var retries, abortedReq, abortedHdr, errs, oks atomic.Int64
	c.OnRequest(func(r *colly.Request) {
		if strings.Contains(r.URL.RawQuery, "abort=req") {
			abortedReq.Add(1)
			r.Abort()
		}
	})
	c.OnResponseHeaders(func(r *colly.Response) {
		if strings.Contains(r.Request.URL.RawQuery, "abort=hdr") {
			abortedHdr.Add(1)
			r.Request.Abort()
		}
	})
	c.OnResponse(func(*colly.Response) { oks.Add(1) })
	c.OnError(func(r *colly.Response, err error) {
		errs.Add(1)
		if r.StatusCode == http.StatusInternalServerError && r.Ctx.GetAny("retried") == nil {
			r.Ctx.Put("retried", true)
			retries.Add(1)
			_ = r.Request.Retry()
		}
	})

	for i := range 10 {
		for _, u := range []string{
			fmt.Sprintf("%s/p/%d", a, i+1),
			fmt.Sprintf("%s/p/%d", b, i+1),
			a + "/status/404",
			b + "/status/403",
			a + "/status/500",
			a + "/status/503",
			a + "/redirect?n=3",
			a + "/redirect?to=" + b + "/p/1",
			b + "/slow?d=3s",  // times out
			a + "/big?kb=200", // cut by MaxBodySize
			a + "/p/1?abort=req",
			b + "/p/1?abort=hdr",
		} {
			require.NoError(t, c.Visit(u))
		}
	}
	c.Wait()

	t.Logf("ok=%d errors=%d retries=%d aborted in OnRequest=%d in OnResponseHeaders=%d",
		oks.Load(), errs.Load(), retries.Load(), abortedReq.Load(), abortedHdr.Load())
	// Some requests land on the dead or the hanging proxy, so only lower
	// bounds are certain; what matters is that every path was taken.
	assert.Positive(t, retries.Load())
	assert.Equal(t, int64(10), abortedReq.Load())
	assert.Positive(t, abortedHdr.Load())
	assert.Greater(t, oks.Load(), int64(20))
	bans := s.BanCounts()
	assert.Positive(t, bans[BanKey{bed.Sites[1].Host(), "http_403"}], "%v", bans)
	assert.Positive(t, bans[BanKey{bed.Sites[0].Host(), "http_503"}], "%v", bans)
	assertGroundTruth(t, bed)
	assertNoLeases(t, s, bed.Sites...)

	// One header map passed to many requests (Collector.Request), one after
	// another: each request still gets a binding of its own. (Colly itself
	// writes into the map, so sharing one across Async requests is a data
	// race inside Colly; this stays synchronous.)
	bed.Proxies[6].SetMode(testbed.ProxyOK)
	bed.Proxies[7].SetMode(testbed.ProxyOK)
	sc := colly.NewCollector(colly.AllowURLRevisit())
	s.Attach(sc)
	shared := http.Header{"X-Shared": []string{"one map for many requests"}}
	var sharedOK int
	sc.OnResponse(func(*colly.Response) { sharedOK++ })
	for i := range 5 {
		require.NoError(t, sc.Request("GET", fmt.Sprintf("%s/p/%d?shared", a, i+1), nil, nil, shared))
	}
	assert.Equal(t, 5, sharedOK)
	assertNoLeases(t, s, bed.Sites...)
}

func TestRedirectChainKeepsOneIP(t *testing.T) {
	bed, s := bedSwitch(t, 2, 6, WithRotation(Rotation{Cooldown: time.Second}))
	a, b := bed.Sites[0], bed.Sites[1]
	c := colly.NewCollector()
	s.Attach(c)
	var final []string
	c.OnResponse(func(r *colly.Response) { final = append(final, r.Request.URL.String()) })

	require.NoError(t, c.Visit(a.URL()+"/redirect?n=3"))
	hits := a.Recorder().Hits()
	require.Len(t, hits, 4, "three redirects and the landing page")
	for _, h := range hits {
		assert.Equal(t, hits[0].ClientIP, h.ClientIP, "one IP for the whole chain, even with a cooldown")
	}

	require.NoError(t, c.Visit(a.URL()+"/redirect?to="+b.URL()+"/p/7"))
	ah, bh := a.Recorder().Hits(), b.Recorder().Hits()
	require.Len(t, bh, 1)
	assert.Equal(t, ah[len(ah)-1].ClientIP, bh[0].ClientIP, "a cross-site hop keeps the IP when it is free there")
	assert.Equal(t, []string{a.URL() + "/p/1", b.URL() + "/p/7"}, final)
	assertNoLeases(t, s, a, b)
}

func TestProxyURLIsFilledWithoutPassword(t *testing.T) {
	const secret = "Canary-proxy-pw"
	bed := testbed.NewBed(t, 1, 2)
	for _, p := range bed.Proxies {
		p.SetCredentials("crawler", secret)
	}
	s := newSwitch(t, shared.Client(t))
	_, err := s.Add(context.Background(), bed.ProxyURLs()...)
	require.NoError(t, err)
	var logs bytes.Buffer
	s.cfg.logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))

	c := colly.NewCollector()
	s.Attach(c)
	var seen []string
	c.OnResponse(func(r *colly.Response) { seen = append(seen, r.Request.ProxyURL) })
	c.OnError(func(r *colly.Response, _ error) { seen = append(seen, r.Request.ProxyURL) })
	require.NoError(t, c.Visit(bed.Sites[0].URL()+"/p/1"))
	require.Error(t, c.Visit(bed.Sites[0].URL()+"/status/404"))
	require.Len(t, seen, 2)
	for _, u := range seen {
		assert.Regexp(t, `^http://xxxxx:xxxxx@127\.0\.0\.1:\d+$`, u)
	}
	assert.Equal(t, 2, bed.Sites[0].Recorder().Count(), "the proxies accepted the credentials")
	assert.NotContains(t, logs.String(), secret)
}

func TestFailClosed(t *testing.T) {
	site := testbed.NewSite(t, "shop", nil)

	visit := func(t *testing.T, c *colly.Collector) (visitErr, hookErr error) {
		c.OnError(func(_ *colly.Response, err error) { hookErr = err })
		return c.Visit(site.URL() + "/p/1"), hookErr
	}

	t.Run("empty pool", func(t *testing.T) {
		c := colly.NewCollector()
		newSwitch(t, shared.Client(t)).Attach(c)
		err, hookErr := visit(t, c)
		assert.ErrorIs(t, err, ErrNoProxy)
		assert.ErrorIs(t, err, ErrEmptyPool)
		assert.ErrorIs(t, hookErr, ErrNoProxy, "OnError sees it too")
	})
	t.Run("redis down", func(t *testing.T) {
		srv := redistest.Start(t)
		s := newSwitch(t, srv.Client(t), WithTimeouts(Timeouts{Redis: 300 * time.Millisecond}))
		_, err := s.Add(context.Background(), testbed.NewProxy(t, testbed.SourceIP(0)).URL())
		require.NoError(t, err)
		require.NoError(t, srv.Kill())
		c := colly.NewCollector()
		s.Attach(c)
		err, hookErr := visit(t, c)
		assert.ErrorIs(t, err, ErrNoProxy)
		assert.ErrorIs(t, err, ErrRedis)
		assert.ErrorIs(t, hookErr, ErrRedis)
	})
	t.Run("redis hung", func(t *testing.T) {
		srv := redistest.Start(t)
		s := newSwitch(t, srv.Client(t), WithTimeouts(Timeouts{Redis: 300 * time.Millisecond}))
		_, err := s.Add(context.Background(), testbed.NewProxy(t, testbed.SourceIP(0)).URL())
		require.NoError(t, err)
		require.NoError(t, srv.Pause())
		defer srv.Resume()
		c := colly.NewCollector()
		s.Attach(c)
		start := time.Now()
		err, _ = visit(t, c)
		assert.ErrorIs(t, err, ErrRedis)
		assert.Less(t, time.Since(start), 2*time.Second)
	})
	t.Run("invalid options", func(t *testing.T) {
		c := colly.NewCollector()
		c.SetProxyFunc(New(shared.Client(t), WithTimeouts(Timeouts{LeaseTTL: -1})))
		err, _ := visit(t, c)
		assert.ErrorIs(t, err, ErrNoProxy)
		assert.ErrorIs(t, err, ErrConfig)
	})
	t.Run("all proxies busy", func(t *testing.T) {
		s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: 200 * time.Millisecond}))
		_, err := s.Add(context.Background(), testbed.NewProxy(t, testbed.SourceIP(0)).URL())
		require.NoError(t, err)
		l, err := s.Lease(context.Background(), site.Host())
		require.NoError(t, err)
		defer l.Release(context.Background())
		c := colly.NewCollector(colly.Async(true))
		s.Attach(c)
		var hookErr error
		c.OnError(func(_ *colly.Response, err error) { hookErr = err })
		require.NoError(t, c.Visit(site.URL()+"/p/2"))
		c.Wait()
		assert.ErrorIs(t, hookErr, ErrNoProxy)
	})
	assert.Zero(t, site.Recorder().Count(), "no request ever left without a proxy")
}

func TestProxyFuncAloneWarnsOnceAndReleases(t *testing.T) {
	bed := testbed.NewBed(t, 1, 3)
	var logs testlog.Buffer
	s := newSwitch(t, shared.Client(t), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))), WithTimeouts(Timeouts{LeaseTTL: time.Second}))
	_, err := s.Add(context.Background(), bed.ProxyURLs()...)
	require.NoError(t, err)

	c := colly.NewCollector(colly.Async(true), colly.AllowURLRevisit())
	c.SetProxyFunc(s.ProxyFunc) // no hooks
	require.NoError(t, c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: 3}))
	var ok atomic.Int64
	c.OnResponse(func(*colly.Response) { ok.Add(1) })
	c.OnError(func(_ *colly.Response, err error) { t.Log(err) })
	for i := range 30 {
		require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", bed.Sites[0].URL(), i+1)))
	}
	c.Wait()
	assert.Equal(t, int64(30), ok.Load(), "30 requests through 3 proxies: each lease was given back, not held for its TTL")
	assert.Equal(t, 1, strings.Count(logs.String(), "without the release hooks"), "told once")
	assertGroundTruth(t, bed)
	require.Eventually(t, func() bool {
		st, err := s.Stats(context.Background(), bed.Sites[0].Host())
		return err == nil && st.LeaseRecords == 0
	}, 2*time.Second, 20*time.Millisecond)

	// Without a request timeout there is no context end: the lease TTL bounds the hold.
	c2 := colly.NewCollector()
	c2.SetRequestTimeout(0)
	c2.SetProxyFunc(s.ProxyFunc)
	require.NoError(t, c2.Visit(bed.Sites[0].URL()+"/p/1"))
	time.Sleep(1200 * time.Millisecond)
	st, err := s.Stats(context.Background(), bed.Sites[0].Host())
	require.NoError(t, err)
	assert.Zero(t, st.Leased, "no proxy is held longer than the lease TTL")
}

// crawlURLs returns n product URLs spread round-robin over the sites.
func crawlURLs(sites []*testbed.Site, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s/p/%d", sites[i%len(sites)].URL(), i+1)
	}
	return out
}

// TestNoCollisionsAcrossCollectors: three collectors in this process, each
// with its own Redis client and 50 parallel workers, more workers than
// proxies per site, so every lease is contended.
func TestNoCollisionsAcrossCollectors(t *testing.T) {
	const collectors, workers, perCollector = 3, 50, 2000
	bed, s := bedSwitch(t, 4, 30, WithTimeouts(Timeouts{MaxWait: 30 * time.Second}))
	urls := crawlURLs(bed.Sites, collectors*perCollector)
	var ok, failed atomic.Int64
	var wg sync.WaitGroup
	for i := range collectors {
		sw := sibling(t, s, shared.Client(t))
		c := colly.NewCollector(colly.Async(true), colly.AllowURLRevisit())
		sw.Attach(c)
		c.SetRequestTimeout(30 * time.Second)
		require.NoError(t, c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: workers}))
		c.OnResponse(func(*colly.Response) { ok.Add(1) })
		c.OnError(func(_ *colly.Response, err error) { failed.Add(1); t.Log(err) })
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, u := range urls[i*perCollector : (i+1)*perCollector] {
				_ = c.Visit(u)
			}
			c.Wait()
		}()
	}
	wg.Wait()
	assert.Equal(t, int64(collectors*perCollector), ok.Load())
	assert.Zero(t, failed.Load())
	assert.Equal(t, collectors*perCollector, bed.SiteHits())
	assertGroundTruth(t, bed)
	assertNoLeases(t, s, bed.Sites...)
}

// TestNoCollisionsAcrossProcesses is the acceptance run: three worker
// processes, each its own collector with its own Redis client and 50
// parallel workers, 21,000 requests in all through 40 proxies to 4 sites.
func TestNoCollisionsAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("long")
	}
	const procs, workers, perProc = 3, 50, 7000
	bed, s := bedSwitch(t, 4, 40)
	urls := crawlURLs(bed.Sites, procs*perProc)
	type out struct {
		res workerResult
		err error
	}
	results := make(chan out, procs)
	start := time.Now()
	for i := range procs {
		cmd := startWorker(t, workerSpec{Mode: "crawl", Redis: shared.Addr(), Prefix: s.cfg.prefix,
			URLs: urls[i*perProc : (i+1)*perProc], Threads: workers})
		go func() {
			b, err := cmd.Output()
			if err != nil {
				results <- out{err: err}
				return
			}
			r, err := parseWorkerResult(b)
			results <- out{r, err}
		}()
	}
	total := 0
	for range procs {
		o := <-results
		require.NoError(t, o.err)
		assert.Zero(t, o.res.Failed)
		total += o.res.OK
	}
	elapsed := time.Since(start)
	assert.Equal(t, procs*perProc, total)
	assert.Equal(t, procs*perProc, bed.SiteHits(), "the sites saw every request")
	assertGroundTruth(t, bed)
	assertNoLeases(t, s, bed.Sites...)
	t.Logf("%d requests from %d processes x %d workers through %d proxies in %v (%.0f req/s)",
		total, procs, workers, len(bed.Proxies), elapsed.Round(time.Millisecond), float64(total)/elapsed.Seconds())
}

// TestKilledWorkerLeasesComeBack: a process holding leases is SIGKILLed; its
// proxies can be leased again within the lease TTL plus a second.
func TestKilledWorkerLeasesComeBack(t *testing.T) {
	const ttl = 2 * time.Second
	s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: Off, LeaseTTL: ttl}))
	_, err := s.Add(context.Background(), proxyURLs(3)...)
	require.NoError(t, err)
	sites := []string{"ozon.example", "ozon.example", "ozon.example", "avito.example"}
	cmd := startWorker(t, workerSpec{Mode: "hold", Redis: shared.Addr(), Prefix: s.cfg.prefix, LeaseTTL: ttl.String(), HoldSites: sites})
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line := make([]byte, 5)
	_, err = io.ReadFull(stdout, line)
	require.NoError(t, err)
	require.Equal(t, "held\n", string(line))

	_, err = s.Lease(context.Background(), "ozon.example")
	require.ErrorIs(t, err, ErrNoProxy, "the worker holds every proxy for ozon")
	require.NoError(t, cmd.Process.Kill())
	killed := time.Now()
	_ = cmd.Wait()

	var got int
	for got < 3 && time.Since(killed) < ttl+time.Second {
		if l, err := s.Lease(context.Background(), "ozon.example"); err == nil {
			got++
			_ = l
		} else {
			require.ErrorIs(t, err, ErrNoProxy)
			time.Sleep(20 * time.Millisecond)
		}
	}
	assert.Equal(t, 3, got, "all three proxies leasable again within TTL + 1s")
	t.Logf("all proxies back %v after SIGKILL (TTL %v)", time.Since(killed).Round(time.Millisecond), ttl)
}

func TestErrNoProxyThroughCollyWrapping(t *testing.T) {
	c := colly.NewCollector()
	c.SetProxyFunc(New(shared.Client(t), WithPrefix(testPrefix())))
	err := c.Visit(testbed.NewSite(t, "x", nil).URL())
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrNoProxy) && errors.Is(err, ErrEmptyPool), err.Error())
	var _ redis.Scripter = shared.Client(t)
}
