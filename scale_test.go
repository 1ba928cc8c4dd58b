package proxyswitch

import (
	"context"
	"fmt"
	"maps"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scaleURLs is n distinct proxy URLs, the i-th of them from offset.
func scaleURLs(offset, n int) []string {
	out := make([]string, n)
	for i := range n {
		v := offset + i
		out[i] = fmt.Sprintf("http://10.%d.%d.%d:%d", v>>16&255, v>>8&255, v&255, 3128+v>>24)
	}
	return out
}

// pingLoop pings rdb every few ms until stop and returns each round
// trip's latency: what any other client of a Redis blocked by a long
// script would wait.
func pingLoop(rdb *redis.Client, stop <-chan struct{}) func() []time.Duration {
	var mu sync.Mutex
	var lat []time.Duration
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			t := time.Now()
			if rdb.Ping(context.Background()).Err() == nil {
				mu.Lock()
				lat = append(lat, time.Since(t))
				mu.Unlock()
			}
		}
	}()
	return func() []time.Duration {
		<-done
		mu.Lock()
		defer mu.Unlock()
		slices.Sort(lat)
		return lat
	}
}

// usedMemory is INFO memory's used_memory.
func usedMemory(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "memory").Result()
	require.NoError(t, err)
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatal("no used_memory in INFO memory")
	return 0
}

// TestMillionProxies (issue 14): a pool of 1M proxies with default options.
// Replace loads it and replaces a tenth of it, the first lease on each of
// ten sites succeeds, List, ProxyStates, Drain, Dead and Revive work over
// it, it is re-seeded after Redis loses it, Clear empties it, and no Redis command of the run
// takes longer than 50 ms (Redis's SLOWLOG; a PING loop reports what other
// clients waited). A site costs Redis memory for the slots out on it, not
// for the pool: at most 16 bytes per proxy per site. PROXYSWITCH_SCALE=n
// runs it with n proxies instead. Under -race it runs with 100,000 unless
// PROXYSWITCH_SCALE says otherwise: the race detector makes its walks take
// minutes (200 s against 60 s here) and has nothing to find in them, one
// goroutine calling at a time; .ci/run runs the full size without -race.
func TestMillionProxies(t *testing.T) {
	if testing.Short() {
		t.Skip("1M proxies: seconds of Redis work")
	}
	n := 1_000_000
	if raceOn {
		n = 100_000
		t.Logf("-race: %d proxies (go test -run 'TestMillionProxies$' . without -race runs 1M)", n)
	}
	if v, err := strconv.Atoi(os.Getenv("PROXYSWITCH_SCALE")); err == nil && v > 0 {
		n = v
	}
	const sites, leasesPerSite = 10, 200
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	// Everything over 10 ms is logged (and reported by script); over 50 ms fails.
	require.NoError(t, rdb.ConfigSet(ctx, "slowlog-log-slower-than", "10000").Err())
	require.NoError(t, rdb.ConfigSet(ctx, "slowlog-max-len", "100000").Err())
	require.NoError(t, rdb.SlowLogReset(ctx).Err())
	require.NoError(t, rdb.ConfigResetStat(ctx).Err())
	// Default options but a cooldown that keeps every proxy used in its
	// site's busy set until the memory is measured.
	s := newSwitch(t, rdb, WithRotation(Rotation{Cooldown: time.Minute}))

	stop := make(chan struct{})
	pings := pingLoop(srv.Client(t), stop)

	m := markCPU(t, rdb)
	ch, err := s.Replace(ctx, scaleURLs(0, n))
	require.NoError(t, err)
	require.Equal(t, n, ch.Added)
	m.report(t, rdb, fmt.Sprintf("Replace of an empty pool with %d proxies", n))

	base := usedMemory(t, rdb)
	m = markCPU(t, rdb)
	for i := range sites {
		site := fmt.Sprintf("site-%d.example", i)
		t0 := time.Now()
		l, err := s.Lease(ctx, site)
		require.NoError(t, err, "the first lease on a new site")
		if i == 0 {
			t.Logf("first lease on a new site: %v", time.Since(t0).Round(time.Microsecond))
		}
		require.NoError(t, l.Release(ctx))
		for range leasesPerSite - 1 {
			l, err := s.Lease(ctx, site)
			require.NoError(t, err)
			require.NoError(t, l.Release(ctx))
		}
	}
	m.report(t, rdb, fmt.Sprintf("%d lease+release pairs on %d sites", sites*leasesPerSite, sites))
	perSite := usedMemory(t, rdb) - base
	var keyBytes, entries int64
	for i := range sites {
		site := fmt.Sprintf("site-%d.example", i)
		for _, k := range []string{s.keys.free(site), s.keys.leases(site)} {
			if b, err := rdb.MemoryUsage(ctx, k).Result(); err == nil {
				keyBytes += b
			}
		}
		entries += rdb.ZCard(ctx, s.keys.free(site)).Val()
	}
	assert.Equal(t, int64(sites*leasesPerSite), entries, "each site's busy set holds the proxies cooling down there, no more")
	bytesPerProxySite := float64(perSite) / float64(n*sites)
	t.Logf("Redis memory of %d sites over a pool of %d, %d proxies cooling on each: %d bytes (used_memory), %d bytes (MEMORY USAGE of their keys, %.0f per proxy cooling): %.3f bytes per proxy per site",
		sites, n, leasesPerSite, perSite, keyBytes, float64(keyBytes)/float64(entries), bytesPerProxySite)
	assert.LessOrEqual(t, bytesPerProxySite, 16.0, "bytes per proxy per site")

	m = markCPU(t, rdb)
	ch, err = s.Replace(ctx, scaleURLs(n/10, n))
	require.NoError(t, err)
	assert.Equal(t, n/10, ch.Added)
	assert.Equal(t, n/10, ch.Removed)
	assert.Equal(t, n, ch.Size)
	m.report(t, rdb, fmt.Sprintf("Replace of a tenth of %d proxies", n))
	l, err := s.Lease(ctx, "site-new.example")
	require.NoError(t, err, "a lease after the Replace")
	require.NoError(t, l.Release(ctx))

	// The admin reads and the chunked operations, at the pool's size.
	m = markCPU(t, rdb)
	list, err := s.List(ctx)
	require.NoError(t, err)
	assert.Len(t, list, n)
	m.report(t, rdb, "List")
	m = markCPU(t, rdb)
	states, err := s.ProxyStates(ctx, "site-0.example")
	require.NoError(t, err)
	assert.Len(t, states, n)
	m.report(t, rdb, "ProxyStates")
	drain := scaleURLs(n/10, min(n/10, 5000))
	m = markCPU(t, rdb)
	k, err := s.Drain(ctx, "", drain...)
	require.NoError(t, err)
	assert.Equal(t, len(drain), k)
	dead, err := s.Dead(ctx)
	require.NoError(t, err)
	assert.Len(t, dead, len(drain))
	m.report(t, rdb, fmt.Sprintf("Drain and Dead of %d proxies over %d sites", len(drain), sites+1))
	m = markCPU(t, rdb)
	st, err := s.SiteState(ctx, "site-0.example")
	require.NoError(t, err)
	assert.Equal(t, len(drain), st.Dead)
	assert.Equal(t, n, st.Free+st.Leased+st.Cooling+st.Quarantined+st.Dead)
	stats, err := s.Stats(ctx, "site-0.example")
	require.NoError(t, err)
	assert.Equal(t, n, stats.Proxies)
	m.report(t, rdb, fmt.Sprintf("SiteState and Stats of a site with %d dead proxies", len(drain)))
	m = markCPU(t, rdb)
	k, err = s.Revive(ctx, "", drain...)
	require.NoError(t, err)
	assert.Equal(t, len(drain), k)
	m.report(t, rdb, fmt.Sprintf("Revive of %d proxies over %d sites", len(drain), sites+1))

	// Redis loses the pool: the copy goes back in pages.
	m = markCPU(t, rdb)
	_, err = s.own.redis().refreshSnapshot(ctx)
	require.NoError(t, err)
	require.Equal(t, n, s.own.redis().snapshot().size())
	m.report(t, rdb, "the copy of the pool read")
	require.NoError(t, rdb.FlushAllAsync(ctx).Err())
	m = markCPU(t, rdb)
	written, err := s.own.redis().reseed(ctx)
	require.NoError(t, err)
	assert.Equal(t, n, written)
	assert.EqualValues(t, n, rdb.HLen(ctx, s.keys.proxies()).Val())
	m.report(t, rdb, fmt.Sprintf("re-seed of %d proxies", n))

	m = markCPU(t, rdb)
	require.NoError(t, s.Clear(ctx))
	m.report(t, rdb, "Clear")

	close(stop)
	lat := pings()
	require.NotEmpty(t, lat)
	t.Logf("PING loop: %d pings, median %v, p99 %v, max %v", len(lat), lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1])
	slow50 := reportSlowlog(t, rdb)
	reportCommandStats(t, rdb)
	// SLOWLOG and the PING loop measure wall time: on a machine loaded past
	// its cores a few-ms command can be descheduled for 100 ms. The 50 ms
	// bound is asserted when the load allows a measure (PROXYSWITCH_SCALE_STRICT=1
	// asserts it anyway); the work per call is bounded either way.
	if load := loadPerCPU(); load > 1 && os.Getenv("PROXYSWITCH_SCALE_STRICT") == "" {
		t.Logf("load average %.1f per CPU: the 50 ms bounds are reported, not asserted", load)
		return
	}
	assert.Empty(t, slow50, "no Redis command took longer than 50 ms")
	assert.LessOrEqual(t, lat[len(lat)*99/100], 50*time.Millisecond, "p99 of a concurrent PING")
}

// cpuMark is where Redis stood when a phase of the scale test began: the
// main thread's CPU time (INFO cpu) and the script calls made (INFO
// commandstats), so that the phase's Redis CPU per script call is known
// whatever the load (wall time on a loaded machine is not).
type cpuMark struct {
	at    time.Time
	cpu   float64
	calls int64
}

func markCPU(t *testing.T, rdb *redis.Client) cpuMark {
	t.Helper()
	cpu, calls := redisMainCPU(t, rdb)
	return cpuMark{at: time.Now(), cpu: cpu, calls: calls}
}

// report logs the phase's wall time, Redis CPU time and script calls.
func (m cpuMark) report(t *testing.T, rdb *redis.Client, what string) {
	t.Helper()
	wall := time.Since(m.at)
	cpu, calls := redisMainCPU(t, rdb)
	d := time.Duration((cpu - m.cpu) * float64(time.Second))
	k := calls - m.calls
	t.Logf("%s: %v; Redis CPU %v in %d script calls, %v per call", what, wall.Round(time.Millisecond),
		d.Round(time.Millisecond), k, (d / time.Duration(max(k, 1))).Round(time.Microsecond))
}

// redisMainCPU is the CPU time of Redis's main thread (seconds) and the number
// of EVAL and EVALSHA calls so far.
func redisMainCPU(t *testing.T, rdb *redis.Client) (float64, int64) {
	t.Helper()
	info, err := rdb.Info(context.Background(), "cpu", "commandstats").Result()
	require.NoError(t, err)
	var cpu float64
	var calls int64
	for _, line := range strings.Split(info, "\n") {
		name, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch name {
		case "used_cpu_sys_main_thread", "used_cpu_user_main_thread":
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err)
			cpu += f
		case "cmdstat_evalsha", "cmdstat_eval":
			for _, kv := range strings.Split(v, ",") {
				if c, ok := strings.CutPrefix(kv, "calls="); ok {
					n, err := strconv.ParseInt(c, 10, 64)
					require.NoError(t, err)
					calls += n
				}
			}
		}
	}
	return cpu, calls
}

// reportSlowlog logs the SLOWLOG's longest entry per script (by name) and
// returns the entries over 50 ms.
func reportSlowlog(t *testing.T, rdb *redis.Client) []string {
	t.Helper()
	ctx := context.Background()
	names := map[string]string{}
	for name, sc := range allScripts {
		names[sc.Hash()] = name
	}
	slow, err := rdb.SlowLogGet(ctx, 100000).Result()
	require.NoError(t, err)
	type agg struct {
		n   int
		max time.Duration
	}
	by := map[string]*agg{}
	var over []string
	for _, e := range slow {
		name := ""
		if len(e.Args) > 0 {
			name = strings.ToLower(fmt.Sprint(e.Args[0]))
		}
		if len(e.Args) > 1 && (name == "evalsha" || name == "evalsha_ro") {
			if n, ok := names[fmt.Sprint(e.Args[1])]; ok {
				name = n + ".lua"
			}
		}
		a := by[name]
		if a == nil {
			a = &agg{}
			by[name] = a
		}
		a.n++
		a.max = max(a.max, e.Duration)
		if e.Duration > 50*time.Millisecond {
			over = append(over, fmt.Sprintf("%v %s", e.Duration, name))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(by)) {
		t.Logf("SLOWLOG (over 10 ms): %s: %d entries, max %v", name, by[name].n, by[name].max)
	}
	if len(by) == 0 {
		t.Logf("SLOWLOG: no command over 10 ms")
	}
	return over
}

// reportCommandStats logs INFO commandstats' calls and usec_per_call of
// the commands the run used: Redis CPU per call, whatever the load.
func reportCommandStats(t *testing.T, rdb *redis.Client) {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	for _, line := range strings.Split(info, "\n") {
		if name, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && strings.HasPrefix(name, "cmdstat_") {
			t.Logf("%s: %s", name, v)
		}
	}
}

// loadPerCPU is the 1-minute load average per CPU (0 where unknown).
func loadPerCPU() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f, err := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	if err != nil {
		return 0
	}
	return f / float64(runtime.NumCPU())
}

// TestRotationBoundedScan: lease.lua looks at a bounded window of the
// pool's order per call, so with the only free proxy far past a site's
// cursor, a lease still finds it (the cursor moves window by window, the
// caller retrying after 1 ms), and with every proxy out the wait is the
// soonest end, not the 1 ms of a window. Every proxy is offered once per
// turn: 300 leases in a row take 300 proxies.
func TestRotationBoundedScan(t *testing.T) {
	ctx := context.Background()
	const n, site = 300, "shop.example"
	s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: 5 * time.Second, LeaseTTL: time.Minute}))
	_, err := s.Add(ctx, scaleURLs(0, n)...)
	require.NoError(t, err)
	held := map[string]*Lease{}
	for range n {
		l, err := s.Lease(ctx, site)
		require.NoError(t, err)
		require.NotContains(t, held, l.Proxy().ID(), "a proxy offered twice in one turn")
		held[l.Proxy().ID()] = l
	}
	// Free one proxy: the next lease must find it wherever the cursor is.
	var one *Lease
	for _, l := range held {
		one = l
		break
	}
	require.NoError(t, one.Release(ctx))
	l, err := s.Lease(ctx, site)
	require.NoError(t, err)
	assert.Equal(t, one.Proxy().ID(), l.Proxy().ID(), "the only free proxy")
	held[l.Proxy().ID()] = l

	// Every proxy out: the wait names the soonest lease end (a minute).
	w := sibling(t, s, shared.Client(t))
	w.cfg.maxWait = 0
	_, wait, err := w.own.tryLease(ctx, site, site, "")
	require.NoError(t, err)
	assert.Greater(t, wait, 30*time.Second, "the wait of a pool leased out is the soonest lease end")

	// A site's busy set holds what is out on it, no more.
	for _, l := range held {
		require.NoError(t, l.Release(ctx))
	}
	for range 2 * n { // the leases prune two passed entries each
		l, err := s.Lease(ctx, site)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
	}
	assert.Zero(t, shared.Client(t).ZCard(ctx, s.keys.free(site)).Val(), "no cooldown: nothing out, no entries")
}
