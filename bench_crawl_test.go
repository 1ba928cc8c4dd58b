package proxyswitch

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/gocolly/colly/v2/proxy"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/redis/go-redis/v9"
)

// Issue 14's cost benchmarks, each side by side with its reference in one
// run (BENCHMARKS.md, "hot path"):
//
//	go test -c -o /tmp/ps.test .
//	for i in 1 2 3; do /tmp/ps.test -test.run '^$' -test.bench 'BenchmarkCrawl|BenchmarkLeasePairs|BenchmarkClientTimeout' \
//	  -test.benchmem -test.benchtime 2s | grep ^Benchmark; done | tee hot.txt

// BenchmarkCrawl: pages/s of one Colly collector (Async, LimitRule
// parallelism 50, revisits allowed) crawling product pages of one local
// site (8 KiB each, no delay) through the same local forward proxies, with
// Attach (the Switch's defaults; on a go-redis client with default options,
// and on one with ContextTimeoutEnabled: "-ctx") against Colly's own
// proxy.RoundRobinProxySwitcher. Besides pages/s it reports the Redis
// round trips per page (script calls in INFO commandstats: the Switch
// sends nothing else on this path), the Redis CPU per page, and how much of
// it the scripts took, in all and in the commands they ran; and for
// both, the CPU per page of this process (the crawler with the site and the
// proxies it runs: the same for both but for what the engine costs), which
// under a shared machine's load says more than pages/s.
func BenchmarkCrawl(b *testing.B) {
	for _, n := range []int{100, 20} {
		b.Run(fmt.Sprintf("proxies=%d/engine=proxyswitch", n), func(b *testing.B) { benchCrawl(b, n, "proxyswitch", crawlSite{}) })
		b.Run(fmt.Sprintf("proxies=%d/engine=proxyswitch-ctx", n), func(b *testing.B) { benchCrawl(b, n, "proxyswitch-ctx", crawlSite{}) })
		b.Run(fmt.Sprintf("proxies=%d/engine=roundrobin", n), func(b *testing.B) { benchCrawl(b, n, "roundrobin", crawlSite{}) })
	}
}

// BenchmarkCrawlSlowSite is BenchmarkCrawl at 100 proxies on a site that
// takes 50 ms to answer each page, as a remote site does: the crawl no
// longer saturates the cores (at most 50 pages in flight, so about 1,000
// pages/s), and pages/s shows what a lease costs a page in time (the wait
// for a Redis call and its batch) rather than in CPU.
func BenchmarkCrawlSlowSite(b *testing.B) {
	for _, engine := range []string{"proxyswitch", "roundrobin"} {
		b.Run("proxies=100/engine="+engine, func(b *testing.B) { benchCrawl(b, 100, engine, crawlSite{delay: 50 * time.Millisecond}) })
	}
}

// BenchmarkCrawlTLS is BenchmarkCrawl at 100 proxies for https:// pages:
// each page goes through a CONNECT tunnel of its own and a TLS handshake
// with both engines (a tunnel is a connection to the site, so the Switch
// keeps none between leases), and the handshakes weigh on the CPU per
// page as on a real crawl.
func BenchmarkCrawlTLS(b *testing.B) {
	for _, engine := range []string{"proxyswitch", "roundrobin"} {
		b.Run("proxies=100/engine="+engine, func(b *testing.B) { benchCrawl(b, 100, engine, crawlSite{tls: true}) })
	}
}

// crawlSite is the site a crawl benchmark crawls: its delay per page, and
// whether it serves https.
type crawlSite struct {
	delay time.Duration
	tls   bool
}

const crawlParallel = 50

func benchCrawl(b *testing.B, proxies int, engine string, cs crawlSite) {
	if shared.Server == nil {
		b.Skip("single-node benchmark; the shared Redis is a cluster")
	}
	ctx := context.Background()
	shop := &testbed.ShopHandler{PageSize: 8 << 10, Delay: cs.delay}
	site := testbed.NewSite(b, "shop", shop)
	var opts []Option
	c := colly.NewCollector(colly.Async(true), colly.AllowURLRevisit())
	if cs.tls {
		// Both engines on a bare transport that trusts the site.
		site = testbed.NewTLSSite(b, "shop", shop)
		base := &http.Transport{TLSClientConfig: site.TLSConfig()}
		c.WithTransport(base)
		opts = append(opts, WithBaseTransport(base))
	}
	var urls []string
	for _, p := range testbed.NewProxies(b, proxies) {
		urls = append(urls, p.URL())
	}
	if err := c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: crawlParallel}); err != nil {
		b.Fatal(err)
	}
	rdb := shared.Server.Client(b, func(o *redis.Options) {
		o.PoolSize = 2 * crawlParallel
		o.ContextTimeoutEnabled = engine == "proxyswitch-ctx"
	})
	if engine == "roundrobin" {
		rr, err := proxy.RoundRobinProxySwitcher(urls...)
		if err != nil {
			b.Fatal(err)
		}
		c.SetProxyFunc(rr)
	} else {
		s := newSwitch(b, rdb, opts...)
		if _, err := s.Add(ctx, urls...); err != nil {
			b.Fatal(err)
		}
		s.Attach(c)
		b.Cleanup(func() { _ = s.Close(ctx) })
	}
	var ok, failed atomic.Int64
	c.OnResponse(func(*colly.Response) { ok.Add(1) })
	c.OnError(func(_ *colly.Response, err error) {
		if failed.Add(1) == 1 {
			b.Log(err)
		}
	})
	// Warm up: connections, the site's free set, the scripts.
	for i := range crawlParallel {
		_ = c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), i+1))
	}
	c.Wait()
	ok.Store(0)
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	cpu0 := redisCPU(b, rdb)
	b.ReportAllocs()
	b.ResetTimer()
	start, proc0 := time.Now(), processCPU()
	for i := range b.N {
		if err := c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), i+1)); err != nil {
			b.Fatal(err)
		}
	}
	c.Wait()
	elapsed, proc := time.Since(start), processCPU()-proc0
	b.StopTimer()
	if failed.Load() > 0 || ok.Load() != int64(b.N) {
		b.Fatalf("%d pages of %d, %d failed", ok.Load(), b.N, failed.Load())
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "pages/s")
	b.ReportMetric(float64(proc.Microseconds())/float64(b.N), "cpu-µs/page")
	if engine != "roundrobin" {
		scripts, commands := redisWork(b, rdb)
		b.ReportMetric(float64(scripts.calls)/float64(b.N), "redis-trips/page")
		b.ReportMetric((redisCPU(b, rdb)-cpu0)*1e6/float64(b.N), "redis-µs/page")
		b.ReportMetric(scripts.usec/float64(b.N), "script-µs/page")
		b.ReportMetric(commands.usec/float64(b.N), "command-µs/page")
	}
}

// redisWork sums INFO commandstats since Redis' stats were reset, split
// between the script calls (EVALSHA, EVAL) and the other commands (INFO and
// CONFIG aside): the calls of each and the time Redis spent in them. The
// commands a script runs count in commandstats too, so with scripts only
// the script calls are round trips, and the time in scripts less the time
// in the commands they ran is the Lua around those: the interpreter, and
// the passing of each command's arguments and reply between Lua and Redis.
func redisWork(b *testing.B, rdb *redis.Client) (scripts, commands cmdStat) {
	for name, st := range commandStats(b, rdb) {
		switch {
		case isScriptCall(name):
			scripts.calls += st.calls
			scripts.usec += st.usec
		case name != "info" && !strings.HasPrefix(name, "config"):
			commands.calls += st.calls
			commands.usec += st.usec
		}
	}
	return scripts, commands
}

func isScriptCall(name string) bool {
	return name == "evalsha" || name == "eval" || name == "evalsha_ro" || name == "eval_ro"
}

// cmdStat is one command's line of INFO commandstats.
type cmdStat struct {
	calls int64
	usec  float64 // the time its calls took in Redis, µs
}

// commandStats returns the calls and time of each command from INFO commandstats.
func commandStats(b testing.TB, rdb *redis.Client) map[string]cmdStat {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]cmdStat{}
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_")
		if !ok {
			continue
		}
		name, fields, _ := strings.Cut(rest, ":")
		var st cmdStat
		for _, kv := range strings.Split(fields, ",") {
			if v, ok := strings.CutPrefix(kv, "calls="); ok {
				st.calls, _ = strconv.ParseInt(v, 10, 64)
			} else if v, ok := strings.CutPrefix(kv, "usec="); ok {
				st.usec, _ = strconv.ParseFloat(v, 64)
			}
		}
		out[name] = st
	}
	return out
}

// redisCPU is the redis-server's CPU time so far, user + system, seconds.
func redisCPU(b *testing.B, rdb *redis.Client) float64 {
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return total
}

// BenchmarkClientTimeout: what net/http's http.Client costs per request,
// with a Timeout set (Colly sets 10s by default), when its Transport is not
// its own *http.Transport but a RoundTripper in front of one, as Attach's
// is (or any wrapper: a logging or header-setting one). The client cannot
// know that such a RoundTripper honours the request's context, so it runs
// the timeout itself: a timer, a channel and a goroutine per request.
// Colly's round robin (a proxy function on Colly's own transport) does not
// pay it. GETs of an 8 KiB page from a local server, 50 goroutines, one
// client, through the transport itself ("direct") and through a RoundTripper
// that only forwards to it ("wrapped").
func BenchmarkClientTimeout(b *testing.B) {
	for _, wrapped := range []bool{false, true} {
		name := map[bool]string{false: "direct", true: "wrapped"}[wrapped]
		b.Run("transport="+name, func(b *testing.B) {
			page := make([]byte, 8<<10)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(page) }))
			defer srv.Close()
			tr := &http.Transport{MaxIdleConnsPerHost: crawlParallel}
			defer tr.CloseIdleConnections()
			var rt http.RoundTripper = tr
			if wrapped {
				rt = forward{tr}
			}
			client := &http.Client{Transport: rt, Timeout: 10 * time.Second}
			b.SetParallelism(crawlParallel / runtime.GOMAXPROCS(0))
			b.ReportAllocs()
			b.ResetTimer()
			proc0 := processCPU()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					res, err := client.Get(srv.URL)
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, res.Body)
					_ = res.Body.Close()
				}
			})
			b.ReportMetric(float64((processCPU()-proc0).Nanoseconds())/1e3/float64(b.N), "cpu-µs/req")
		})
	}
}

// forward is a RoundTripper that only hands each request to another.
type forward struct{ rt http.RoundTripper }

func (f forward) RoundTrip(r *http.Request) (*http.Response, error) { return f.rt.RoundTrip(r) }

// BenchmarkLeasePairs: lease + release pairs/s on one site of 10,000
// proxies, 50 and 150 goroutines, Switch.Lease and Lease.Release (defaults,
// on a client with ContextTimeoutEnabled) against minimalLease, the least a
// Redis lease can be: a sorted set of next-free times, one Lua call to
// lease (pop the lowest score, owner token in a hash) and one to release
// (owner-checked). Reports the p99 latency of a lease and the Redis CPU
// per pair.
func BenchmarkLeasePairs(b *testing.B) {
	for _, g := range []int{50, 150} {
		b.Run(fmt.Sprintf("goroutines=%d/engine=proxyswitch", g), func(b *testing.B) { benchPairs(b, g, true) })
		b.Run(fmt.Sprintf("goroutines=%d/engine=minimal", g), func(b *testing.B) { benchPairs(b, g, false) })
	}
}

// minimalLease is BenchmarkLeasePairs' reference.
var minimalLease = redis.NewScript(`
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local m = redis.call('ZRANGE', KEYS[1], '-inf', now, 'BYSCORE', 'LIMIT', 0, 1)[1]
if not m then return false end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), m)
redis.call('HSET', KEYS[2], m, ARGV[1])
return m`)

var minimalRelease = redis.NewScript(`
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[2], ARGV[1])
local t = redis.call('TIME')
redis.call('ZADD', KEYS[1], t[1] * 1000 + math.floor(t[2] / 1000), ARGV[1])
return 1`)

const pairsPool = 10_000

func benchPairs(b *testing.B, goroutines int, ours bool) {
	if shared.Server == nil {
		b.Skip("single-node benchmark; the shared Redis is a cluster")
	}
	ctx := context.Background()
	rdb := shared.Server.Client(b, func(o *redis.Options) {
		o.PoolSize = goroutines
		o.ContextTimeoutEnabled = true
	})
	urls := proxyURLs(pairsPool)
	var lease func() (func() error, error)
	if ours {
		s := newSwitch(b, rdb)
		b.Cleanup(func() { _ = s.Close(ctx) }) // before the client closes: its background work is done
		for i := 0; i < len(urls); i += 5_000 {
			if _, err := s.Add(ctx, urls[i:min(i+5_000, len(urls))]...); err != nil {
				b.Fatal(err)
			}
		}
		lease = func() (func() error, error) {
			l, err := s.Lease(ctx, "bench.example")
			if err != nil {
				return nil, err
			}
			return func() error { return l.Release(ctx) }, nil
		}
	} else {
		p := testPrefix()
		keys := []string{"{" + p + "}:free", "{" + p + "}:lease"}
		for i := 0; i < len(urls); i += 5_000 {
			z := make([]redis.Z, 0, 5_000)
			for j := i; j < min(i+5_000, len(urls)); j++ {
				z = append(z, redis.Z{Member: strconv.Itoa(j), Score: 0})
			}
			if err := rdb.ZAdd(ctx, keys[0], z...).Err(); err != nil {
				b.Fatal(err)
			}
		}
		b.Cleanup(func() { rdb.Del(ctx, keys...) })
		var seq atomic.Int64
		lease = func() (func() error, error) {
			tok := strconv.FormatInt(seq.Add(1), 36)
			m, err := minimalLease.Run(ctx, rdb, keys, tok, 30_000).Text()
			if err != nil {
				return nil, err
			}
			return func() error { return minimalRelease.Run(ctx, rdb, keys, m, tok).Err() }, nil
		}
	}
	// The first lease (the site's free set) and the scripts: not timed.
	if rel, err := lease(); err != nil {
		b.Fatal(err)
	} else if err := rel(); err != nil {
		b.Fatal(err)
	}
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	cpu0 := redisCPU(b, rdb)
	var mu sync.Mutex
	var lat []time.Duration
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for next.Add(1) <= int64(b.N) {
				t0 := time.Now()
				rel, err := lease()
				mine = append(mine, time.Since(t0))
				if err != nil {
					b.Error(err)
					return
				}
				if err := rel(); err != nil {
					b.Error(err)
					return
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "pairs/s")
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-lease-µs")
	}
	b.ReportMetric((redisCPU(b, rdb)-cpu0)*1e6/float64(b.N), "redis-µs/pair")
	scripts, _ := redisWork(b, rdb)
	b.ReportMetric(float64(scripts.calls)/float64(b.N), "redis-trips/pair")
}
