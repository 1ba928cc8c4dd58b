package proxyswitch

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Chaos tests of issue 6: three collectors, each with its own Switch, Redis
// client and member ID, crawl two sites through 30 proxies while Redis is
// SIGKILLed and restarted empty, or SIGSTOPped and woken up. The sites'
// recorders are the ground truth: no two requests from one IP at once, ever,
// and during the outage every IP serves one collector only.

const chaosCollectors = 3

type chaosCollector struct {
	name string
	sw   *Switch
	c    *colly.Collector

	mu        sync.Mutex
	responses []chaosHit // every response: when the request started and ended
	failed    atomic.Int64
}

type chaosHit struct{ start, end time.Time }

// firstAfter returns when the first request started at or after t got its
// response.
func (cc *chaosCollector) firstAfter(t time.Time) (time.Time, bool) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	var first time.Time
	for _, h := range cc.responses {
		if !h.start.Before(t) && (first.IsZero() || h.end.Before(first)) {
			first = h.end
		}
	}
	return first, !first.IsZero()
}

func TestChaosRedisKilledAndRestartedEmpty(t *testing.T) {
	chaos(t, "kill")
}

func TestChaosRedisHung(t *testing.T) {
	chaos(t, "pause")
}

func chaos(t *testing.T, fault string) {
	if testing.Short() {
		t.Skip("chaos test")
	}
	ctx := context.Background()
	srv := redistest.Start(t)
	var sites []*testbed.Site
	for i := range 2 {
		sites = append(sites, testbed.NewSite(t, fmt.Sprintf("shop-%d", i), &testbed.ShopHandler{Delay: 5 * time.Millisecond}))
	}
	proxies := testbed.NewProxies(t, 30)
	bed := &testbed.Bed{Sites: sites, Proxies: proxies}
	prefix := testPrefix()

	var ccs []*chaosCollector
	for i := range chaosCollectors {
		name := fmt.Sprintf("crawler-%d", i+1)
		sw, err := NewSwitch(srv.Client(t), append(fastFallback(name), WithPrefix(prefix), WithTimeouts(Timeouts{MaxWait: 8 * time.Second}))...)
		require.NoError(t, err)
		if i == 0 {
			_, err = sw.Add(ctx, bed.ProxyURLs()...)
			require.NoError(t, err)
		}
		startSwitch(t, sw)
		cc := &chaosCollector{name: name, sw: sw, c: colly.NewCollector(colly.AllowURLRevisit())}
		sw.Attach(cc.c)
		cc.c.OnRequest(func(r *colly.Request) { r.Ctx.Put("start", time.Now()) })
		cc.c.OnResponse(func(r *colly.Response) {
			start, _ := r.Ctx.GetAny("start").(time.Time)
			cc.mu.Lock()
			cc.responses = append(cc.responses, chaosHit{start, time.Now()})
			cc.mu.Unlock()
		})
		ccs = append(ccs, cc)
	}
	for _, cc := range ccs {
		// Every server sees the others, and is seen by them (a newcomer
		// takes no share before: fallback.go).
		require.Eventually(t, func() bool {
			st := cc.sw.FallbackStatus()
			return len(st.Members) == chaosCollectors && st.Share > 0
		}, 3*time.Second, 10*time.Millisecond)
	}
	for _, cc := range ccs {
		st := cc.sw.FallbackStatus()
		t.Logf("%s: share of %d proxies among %v", cc.name, st.Share, st.Members)
		assert.InDelta(t, 10, st.Share, 1)
	}

	// Four workers per collector and site, each visiting page after page.
	crawlCtx, stopCrawl := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var seq atomic.Int64
	for _, cc := range ccs {
		for _, site := range sites {
			for range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for crawlCtx.Err() == nil {
						u := fmt.Sprintf("%s/p/%d?c=%s", site.URL(), seq.Add(1), cc.name)
						if err := cc.c.Visit(u); err != nil {
							cc.failed.Add(1)
							t.Logf("%s: %v", cc.name, err)
						}
					}
				}()
			}
		}
	}
	stop := sync.OnceFunc(func() { stopCrawl(); wg.Wait() })
	defer stop()

	time.Sleep(time.Second) // on the broker
	broker := bed.SiteHits()

	// The fault.
	faultAt := time.Now()
	if fault == "kill" {
		require.NoError(t, srv.Kill())
	} else {
		require.NoError(t, srv.Pause())
		defer func() { _ = srv.Resume() }()
	}
	var allLocal time.Time
	for _, cc := range ccs {
		waitMode(t, cc.sw, modeLocal, 2*time.Second)
	}
	allLocal = time.Now()
	for _, cc := range ccs {
		require.Eventually(t, func() bool { _, ok := cc.firstAfter(faultAt); return ok }, 3*time.Second, 5*time.Millisecond,
			"%s: no request started after the fault got an answer", cc.name)
		first, _ := cc.firstAfter(faultAt)
		t.Logf("%s (%s): switched to its local shard; the first request started after the fault answered %v after it",
			cc.name, fault, first.Sub(faultAt).Round(time.Millisecond))
		assert.Less(t, first.Sub(faultAt), 2*time.Second, "%s: the crawl went on within 2s", cc.name)
	}
	// Any request leased from Redis before the fault is over by now: from
	// here to the end of the outage every IP serves one collector.
	outageFrom := allLocal.Add(600 * time.Millisecond) // the attempt bound
	time.Sleep(1500 * time.Millisecond)
	duringOutage := bed.SiteHits()

	recoverAt := time.Now()
	if fault == "kill" {
		require.NoError(t, srv.Restart())
	} else {
		require.NoError(t, srv.Resume())
	}
	redisBack := time.Now()
	for _, cc := range ccs {
		waitMode(t, cc.sw, modeBroker, 5*time.Second)
		st := cc.sw.FallbackStatus()
		t.Logf("%s: on the broker again %v after Redis was back (re-seeded %d proxies, handed over %d leases, %d outage(s))",
			cc.name, st.Since.Sub(redisBack).Round(time.Millisecond), st.Reseeded, st.Adopted, st.Outages)
	}
	resumed := time.Since(redisBack)
	t.Logf("all %d collectors on the broker %v after Redis was back (%s took %v)", chaosCollectors, resumed.Round(time.Millisecond),
		map[string]string{"kill": "restart", "pause": "SIGCONT"}[fault], redisBack.Sub(recoverAt).Round(time.Millisecond))
	assert.Less(t, resumed, 5*time.Second)
	n, err := srv.Client(t).HLen(ctx, ccs[0].sw.keys.proxies()).Result()
	require.NoError(t, err)
	assert.EqualValues(t, 30, n, "the pool is in Redis")
	if fault == "kill" {
		reseeded := 0
		for _, cc := range ccs {
			reseeded += cc.sw.FallbackStatus().Reseeded
		}
		assert.Equal(t, 30, reseeded, "one collector re-seeded the pool, once")
	}
	time.Sleep(time.Second) // on the broker again
	stop()

	after := bed.SiteHits()
	t.Logf("hits: %d on the broker before the fault, %d until Redis was back, %d after", broker, duringOutage-broker, after-duringOutage)
	for _, cc := range ccs {
		assert.Zero(t, cc.failed.Load(), "%s: failed requests", cc.name)
	}
	assertGroundTruth(t, bed)

	// Per-IP ownership during the outage, at the sites.
	owners := map[string]map[string]bool{}
	for _, s := range sites {
		for _, h := range s.Recorder().Hits() {
			if h.Start.Before(outageFrom) || h.Start.After(recoverAt) {
				continue
			}
			q, _ := url.ParseQuery(h.Query)
			if owners[h.ClientIP] == nil {
				owners[h.ClientIP] = map[string]bool{}
			}
			owners[h.ClientIP][q.Get("c")] = true
		}
	}
	shared := 0
	for ip, by := range owners {
		if len(by) > 1 {
			shared++
			var names []string
			for n := range by {
				names = append(names, n)
			}
			slices.Sort(names)
			t.Errorf("IP %s served %v during the outage", ip, names)
		}
	}
	t.Logf("during the outage %d IPs served requests, %d of them more than one collector", len(owners), shared)
	assert.GreaterOrEqual(t, len(owners), 25, "the shares together cover the pool")
}
