package proxyswitch

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/proxyswitch/proxyswitch/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Shared-nothing sharding (static modulo and consistent hashing): three
// collectors lease only from their own shares, in memory, with Redis used
// for the member list and the pool; a fourth joins mid-crawl and gets its
// share without a collision; Redis dies and nothing notices.
func TestShardingSharedNothing(t *testing.T) {
	for name, sh := range map[string]shard.Sharder{"modulo": shard.Modulo{}, "rendezvous": shard.Rendezvous{}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel() // mostly waiting: heartbeats and hand-over holds
			ctx := context.Background()
			srv := redistest.Start(t)
			bed := testbed.NewBed(t, 2, 24)
			prefix := testPrefix()
			opts := func(self string) []Option {
				return []Option{WithPrefix(prefix), WithSharding(self, sh), WithTimeouts(Timeouts{Fallback: 300 * time.Millisecond}),
					WithMembership(shard.MemberConfig{Heartbeat: 100 * time.Millisecond, TTL: time.Second}),
					WithTimeouts(Timeouts{Attempt: time.Second, MaxWait: 5 * time.Second}),
					// A proxy that times out on a loaded machine (CI) is out
					// for a moment, not a minute: a share of two proxies
					// would otherwise run dry, which is not what this tests.
					WithBans(Bans{FailureQuarantine: 200 * time.Millisecond, FailureQuarantineMax: time.Second})}
			}
			admin, err := NewSwitch(srv.Client(t), WithPrefix(prefix))
			require.NoError(t, err)
			_, err = admin.Add(ctx, bed.ProxyURLs()...)
			require.NoError(t, err)

			type worker struct {
				name string
				sw   *Switch
				c    *colly.Collector
			}
			var failed atomic.Int64
			join := func(name string) *worker {
				sw, err := NewSwitch(srv.Client(t), opts(name)...)
				require.NoError(t, err)
				startSwitch(t, sw)
				require.Equal(t, modeLocal.String(), sw.FallbackStatus().Mode)
				c := colly.NewCollector(colly.AllowURLRevisit())
				sw.Attach(c)
				c.OnError(func(_ *colly.Response, err error) { failed.Add(1); t.Logf("%s: %v", name, err) })
				return &worker{name, sw, c}
			}
			var ws []*worker
			for i := range 3 {
				ws = append(ws, join(fmt.Sprintf("crawler-%d", i+1)))
			}
			for _, w := range ws {
				require.Eventually(t, func() bool { return len(w.sw.FallbackStatus().Members) == 3 }, 3*time.Second, 10*time.Millisecond)
			}

			// The last to join waits until the others can have stopped using
			// its share (they started alone, with the whole pool).
			time.Sleep(ws[2].sw.fb.handover())

			crawlCtx, stopCrawl := context.WithCancel(ctx)
			var wg sync.WaitGroup
			var seq atomic.Int64
			crawl := func(w *worker) {
				for _, site := range bed.Sites {
					for range 3 {
						wg.Add(1)
						go func() {
							defer wg.Done()
							for crawlCtx.Err() == nil {
								_ = w.c.Visit(fmt.Sprintf("%s/p/%d?c=%s", site.URL(), seq.Add(1), w.name))
							}
						}()
					}
				}
			}
			for _, w := range ws {
				crawl(w)
			}
			stop := sync.OnceFunc(func() { stopCrawl(); wg.Wait() })
			defer stop()

			// Enough of the pool in use that "one collector per IP" is no
			// vacuous truth (a loaded machine crawls slower: wait for it).
			require.Eventually(t, func() bool { return len(ipsSince(bed, time.Time{})) >= 20 }, 10*time.Second, 20*time.Millisecond)
			joinedAt := time.Now()
			ws = append(ws, join("crawler-4"))
			crawl(ws[3])
			for _, w := range ws {
				require.Eventually(t, func() bool { return len(w.sw.FallbackStatus().Members) == 4 }, 3*time.Second, 10*time.Millisecond)
			}
			settled := time.Now().Add(ws[3].sw.fb.handover())
			total := 0
			for _, w := range ws {
				st := w.sw.FallbackStatus()
				total += st.Share
				t.Logf("%s: %d proxies", w.name, st.Share)
			}
			assert.Equal(t, 24, total, "the four shares cover the pool")
			time.Sleep(time.Until(settled))
			require.Eventually(t, func() bool { return len(ipsSince(bed, settled)) >= 20 }, 10*time.Second, 20*time.Millisecond)

			require.NoError(t, srv.Kill())
			before := bed.SiteHits()
			assert.Eventually(t, func() bool { return bed.SiteHits()-before > 50 }, 5*time.Second, 10*time.Millisecond,
				"the crawl goes on without Redis")
			stop()

			assert.Zero(t, failed.Load(), "failed requests")
			assertGroundTruth(t, bed)
			// Every IP serves one collector while the member list stands still.
			for _, window := range [][2]time.Time{{time.Time{}, joinedAt}, {settled, time.Now()}} {
				owners := map[string]map[string]bool{}
				for _, s := range bed.Sites {
					for _, h := range s.Recorder().Hits() {
						if h.Start.Before(window[0]) || h.Start.After(window[1]) {
							continue
						}
						q, _ := url.ParseQuery(h.Query)
						if owners[h.ClientIP] == nil {
							owners[h.ClientIP] = map[string]bool{}
						}
						owners[h.ClientIP][q.Get("c")] = true
					}
				}
				per := map[string]int{}
				for ip, by := range owners {
					assert.Len(t, by, 1, "IP %s served %v", ip, by)
					for c := range by {
						per[c]++
					}
				}
				t.Logf("IPs per collector from %v: %v", window[0].Format("15:04:05.000"), per)
				assert.GreaterOrEqual(t, len(owners), 20)
			}
			t.Logf("%d hits, no collision, one collector per IP before crawler-4 joined and %v after", bed.SiteHits(), ws[3].sw.fb.handover())
		})
	}
}

// ipsSince returns the client IPs the bed's sites saw requests from that
// started at from or later.
func ipsSince(bed *testbed.Bed, from time.Time) map[string]bool {
	ips := map[string]bool{}
	for _, s := range bed.Sites {
		for _, h := range s.Recorder().Hits() {
			if !h.Start.Before(from) {
				ips[h.ClientIP] = true
			}
		}
	}
	return ips
}
