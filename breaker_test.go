package proxyswitch

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stormShot is one request of stormLoop: when it started (unix ms) and
// whether it reached OnResponse.
type stormShot struct {
	Start int64 `json:"s"`
	OK    bool  `json:"ok"`
}

// stormLoop runs threads workers on c, each visiting new product pages of
// base one after the other until until; a worker whose request failed
// waits 50ms before its next (a crawler goes on with other sites meanwhile).
// tag makes the URLs of one caller distinct.
func stormLoop(c *colly.Collector, base string, threads int, until time.Time, tag string) []stormShot {
	var mu sync.Mutex
	var shots []stormShot
	var seq atomic.Int64
	var wg sync.WaitGroup
	for range threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(until) {
				start := time.Now()
				err := c.Visit(fmt.Sprintf("%s/p/%d?%s", base, seq.Add(1), tag))
				mu.Lock()
				shots = append(shots, stormShot{Start: start.UnixMilli(), OK: err == nil})
				mu.Unlock()
				if err != nil {
					time.Sleep(50 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	return shots
}

// quarantinedOn counts the proxies of s's pool that wait out a quarantine
// on site for more than a minute (a lease lives 30s: these are bans).
func quarantinedOn(t *testing.T, s *Switch, site string) int {
	t.Helper()
	ctx := context.Background()
	rdb := shared.Client(t)
	tm, err := rdb.Time(ctx).Result()
	require.NoError(t, err)
	members, err := rdb.ZRangeByScore(ctx, s.keys.free(s.scopeOf(site)), &redis.ZRangeBy{
		Min: strconv.FormatInt(tm.Add(time.Minute).UnixMilli(), 10), Max: "+inf"}).Result()
	require.NoError(t, err)
	ids := map[string]bool{}
	for _, m := range members {
		id, _, _ := strings.Cut(m, ":")
		ids[id] = true
	}
	return len(ids)
}

// stormCheck runs the storm acceptance of issue 16 on shots and the storm
// site: few proxies quarantined, the site paused during the storm, and at
// least 90% of the requests started 5s after it (until 8s after) succeed.
func stormCheck(t *testing.T, storm *testbed.Storm, shots []stormShot, quarantined int, pausedMid bool) {
	t.Helper()
	before, during, after := storm.Counts()
	var late, lateOK int
	from, to := storm.To.Add(5*time.Second).UnixMilli(), storm.To.Add(8*time.Second).UnixMilli()
	for _, sh := range shots {
		if sh.Start >= from && sh.Start < to {
			late++
			if sh.OK {
				lateOK++
			}
		}
	}
	warm := storm.From.Sub(storm.To.Add(-10 * time.Second)) // 0: the storm is 10s
	_ = warm
	t.Logf("site requests: %d before (%.0f/s), %d during the 10s storm, %d after; %d proxies quarantined at its end; "+
		"%d of %d requests started 5-8s after it succeeded", before, float64(before)/stormWarmup.Seconds(), during, after,
		quarantined, lateOK, late)
	assert.LessOrEqual(t, quarantined, 5, "proxies quarantined when the storm ends")
	assert.True(t, pausedMid, "the site is paused in the middle of the storm")
	// What the pool would allow: the pace of the healthy warm-up, for 10s.
	allowed := float64(before) / stormWarmup.Seconds() * 10
	assert.Less(t, float64(during), allowed/10, "requests the site got during the storm, of %.0f the pool would allow", allowed)
	require.Positive(t, late, "requests started 5s after the storm")
	assert.GreaterOrEqual(t, float64(lateOK), 0.9*float64(late), "requests started 5s after the storm that succeed")
}

// stormWarmup is the healthy crawl before the storm.
const stormWarmup = 3 * time.Second

// watchStorm samples, in the background, whether s's pool has site paused
// 3s into the storm and how many proxies are quarantined on it when the
// storm ends; wait returns both.
func watchStorm(t *testing.T, s *Switch, site string, storm *testbed.Storm) (wait func() (paused bool, quarantined int)) {
	var paused bool
	var quarantined int
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(time.Until(storm.From.Add(3 * time.Second)))
		sites, err := s.PausedSites(context.Background())
		if err == nil {
			for _, sb := range sites {
				paused = paused || (sb.Site == site && sb.State == BreakerOpen)
			}
		}
		time.Sleep(time.Until(storm.To))
		quarantined = quarantinedOn(t, s, site)
	}()
	return func() (bool, int) { <-done; return paused, quarantined }
}

// TestBreakerStorm is issue 16's storm: every request answered 429 for 10s,
// 50 proxies, 20 workers. The breaker pauses the site instead of burning
// the pool; after the storm the crawl goes on.
func TestBreakerStorm(t *testing.T) {
	storm := testbed.NewStorm(nil, time.Now().Add(stormWarmup), 10*time.Second)
	site := testbed.NewSite(t, "storm", storm)
	_, _, s := stormBed(t, site, 50)
	c := colly.NewCollector(colly.AllowURLRevisit())
	s.Attach(c)
	wait := watchStorm(t, s, site.Host(), storm)
	shots := stormLoop(c, site.URL(), 20, storm.To.Add(8*time.Second), "")
	paused, quarantined := wait()
	stormCheck(t, storm, shots, quarantined, paused)
}

// TestBreakerStormProcesses is the storm with three collectors in separate
// processes: the pause one of them takes holds the others too.
func TestBreakerStormProcesses(t *testing.T) {
	storm := testbed.NewStorm(nil, time.Now().Add(stormWarmup), 10*time.Second)
	site := testbed.NewSite(t, "storm", storm)
	_, _, s := stormBed(t, site, 50)
	wait := watchStorm(t, s, site.Host(), storm)
	var cmds []func() []stormShot
	for i := range 3 {
		cmd := startWorker(t, workerSpec{Mode: "storm", Redis: shared.Addr(), Prefix: s.cfg.prefix, URLs: []string{site.URL()},
			Threads: 7, Until: storm.To.Add(8 * time.Second).UnixMilli(), Task: strconv.Itoa(i), MaxWait: "2s"})
		out := make(chan []stormShot, 1)
		go func() {
			b, err := cmd.Output()
			var r workerResult
			if err == nil {
				lines := strings.Split(strings.TrimSpace(string(b)), "\n")
				err = json.Unmarshal([]byte(lines[len(lines)-1]), &r)
			}
			assert.NoError(t, err, "worker %d", i)
			out <- r.Shots
		}()
		cmds = append(cmds, func() []stormShot { return <-out })
	}
	var shots []stormShot
	for _, w := range cmds {
		shots = append(shots, w()...)
	}
	paused, quarantined := wait()
	stormCheck(t, storm, shots, quarantined, paused)
}

// stormBed is a Switch of n proxies for site, waiting at most 2s for a proxy.
func stormBed(t *testing.T, site *testbed.Site, n int, opts ...Option) (*testbed.Site, []*testbed.Proxy, *Switch) {
	t.Helper()
	proxies := testbed.NewProxies(t, n)
	s := newSwitch(t, shared.Client(t), append([]Option{WithMaxWait(2 * time.Second)}, opts...)...)
	urls := make([]string, n)
	for i, p := range proxies {
		urls[i] = p.URL()
	}
	_, err := s.Add(context.Background(), urls...)
	require.NoError(t, err)
	return site, proxies, s
}

var _ = ban.Ban
