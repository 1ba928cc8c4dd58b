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
	return infoField(t, rdb, "memory", "used_memory")
}

// infoField is the integer field of INFO section.
func infoField(t *testing.T, rdb *redis.Client, section, field string) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), section).Result()
	require.NoError(t, err)
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatalf("no %s in INFO %s", field, section)
	return 0
}

// TestMillionProxies (issue 14): a pool of 1M proxies with default options.
// Replace loads it and replaces a tenth of it, the first lease on each of
// ten sites succeeds, List, ProxyStates, Drain, Dead and Revive work over
// it, it is re-seeded after Redis loses it, Clear empties it, and no Redis
// command of the run takes longer than 50 ms (Redis's SLOWLOG; a PING loop
// reports what other clients waited, its p99 bounded by 50 ms too). A
// command over 50 ms sends the whole run again on a new Redis, and fails the
// test when the same command is over 50 ms in the same phase again: work
// repeats, a stall of the machine does not. A site costs Redis memory for
// the slots out on it, not for the pool: at most 16 bytes per proxy per
// site. PROXYSWITCH_SCALE=n
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
	over, p99 := scaleRun(t, n)
	// SLOWLOG and the PING loop measure wall time: on a machine loaded past
	// its cores a few-ms command can be descheduled for 100 ms. The 50 ms
	// bound is asserted when the load allows a measure (PROXYSWITCH_SCALE_STRICT=1
	// asserts it anyway); the work per call is bounded either way.
	if load := loadPerCPU(); load > 1 && os.Getenv("PROXYSWITCH_SCALE_STRICT") == "" {
		t.Logf("load average %.1f per CPU: the 50 ms bounds are reported, not asserted", load)
		return
	}
	assert.LessOrEqual(t, p99, 50*time.Millisecond, "p99 of a concurrent PING")
	if len(over) == 0 {
		return
	}
	// Even an idle machine stalls a process now and then (a VM's vCPU taken
	// away, the kernel's own work): a 2 ms command then takes 100. Work does
	// not move: a script whose calls grow with the pool is slow again in the
	// same phase. A second run on a new Redis tells the two apart.
	t.Logf("over 50 ms: %v; running it all again: a command slow from its work is slow again", over)
	again, _ := scaleRun(t, n)
	var twice []string
	for _, o := range again {
		for _, f := range over {
			if o.phase == f.phase && o.command == f.command {
				twice = append(twice, fmt.Sprintf("%v and %v", f, o))
				break
			}
		}
	}
	assert.Empty(t, twice, "no Redis command took longer than 50 ms (in the same phase of two runs)")
	if len(again) > 0 && len(twice) == 0 {
		t.Logf("over 50 ms in the second run, in other phases: %v (stalls, not work)", again)
	}
}

// slowEntry is a SLOWLOG entry over 50 ms of the scale test.
type slowEntry struct {
	d              time.Duration
	command, phase string
}

func (e slowEntry) String() string { return fmt.Sprintf("%v %s (%s)", e.d, e.command, e.phase) }

// scaleRun is one run of TestMillionProxies on a Redis of its own: it
// returns the SLOWLOG entries over 50 ms and the p99 of the PING loop.
func scaleRun(t *testing.T, n int) ([]slowEntry, time.Duration) {
	const sites, leasesPerSite = 10, 200
	ctx := context.Background()
	srv := redistest.Start(t)
	defer srv.Close() // the next run's Redis needs the memory
	rdb := srv.Client(t)
	// Everything over 10 ms is logged (and reported by script); over 50 ms fails.
	require.NoError(t, rdb.ConfigSet(ctx, "slowlog-log-slower-than", "10000").Err())
	require.NoError(t, rdb.ConfigSet(ctx, "slowlog-max-len", "100000").Err())
	require.NoError(t, rdb.SlowLogReset(ctx).Err())
	require.NoError(t, rdb.ConfigResetStat(ctx).Err())
	// Default options but a cooldown that keeps every proxy used in its
	// site's busy set until the memory is measured.
	s := newSwitch(t, rdb, WithRotation(Rotation{Cooldown: time.Minute}))
	// Before its Redis goes: a Switch left running could find the next
	// run's Redis on the same port and re-seed its copy there.
	defer func() { _ = s.Close(ctx) }()

	stop := make(chan struct{})
	pings := pingLoop(srv.Client(t), stop)
	phases := &scalePhases{t: t, rdb: rdb, lastSlow: -1}

	m := phases.mark()
	ch, err := s.Replace(ctx, scaleURLs(0, n))
	require.NoError(t, err)
	require.Equal(t, n, ch.Added)
	phases.report(m, fmt.Sprintf("Replace of an empty pool with %d proxies", n))

	base := usedMemory(t, rdb)
	m = phases.mark()
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
	phases.report(m, fmt.Sprintf("%d lease+release pairs on %d sites", sites*leasesPerSite, sites))
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

	m = phases.mark()
	ch, err = s.Replace(ctx, scaleURLs(n/10, n))
	require.NoError(t, err)
	assert.Equal(t, n/10, ch.Added)
	assert.Equal(t, n/10, ch.Removed)
	assert.Equal(t, n, ch.Size)
	phases.report(m, fmt.Sprintf("Replace of a tenth of %d proxies", n))
	l, err := s.Lease(ctx, "site-new.example")
	require.NoError(t, err, "a lease after the Replace")
	require.NoError(t, l.Release(ctx))

	// The admin reads and the chunked operations, at the pool's size.
	m = phases.mark()
	list, err := s.List(ctx)
	require.NoError(t, err)
	assert.Len(t, list, n)
	phases.report(m, "List")
	m = phases.mark()
	states, err := s.ProxyStates(ctx, "site-0.example")
	require.NoError(t, err)
	assert.Len(t, states, n)
	phases.report(m, "ProxyStates")
	drain := scaleURLs(n/10, min(n/10, 5000))
	m = phases.mark()
	k, err := s.Drain(ctx, "", drain...)
	require.NoError(t, err)
	assert.Equal(t, len(drain), k)
	dead, err := s.Dead(ctx)
	require.NoError(t, err)
	assert.Len(t, dead, len(drain))
	phases.report(m, fmt.Sprintf("Drain and Dead of %d proxies over %d sites", len(drain), sites+1))
	m = phases.mark()
	st, err := s.SiteState(ctx, "site-0.example")
	require.NoError(t, err)
	assert.Equal(t, len(drain), st.Dead)
	assert.Equal(t, n, st.Free+st.Leased+st.Cooling+st.Quarantined+st.Dead)
	stats, err := s.Stats(ctx, "site-0.example")
	require.NoError(t, err)
	assert.Equal(t, n, stats.Proxies)
	phases.report(m, fmt.Sprintf("SiteState and Stats of a site with %d dead proxies", len(drain)))
	m = phases.mark()
	k, err = s.Revive(ctx, "", drain...)
	require.NoError(t, err)
	assert.Equal(t, len(drain), k)
	phases.report(m, fmt.Sprintf("Revive of %d proxies over %d sites", len(drain), sites+1))

	// Redis loses the pool: the copy goes back in pages.
	m = phases.mark()
	_, err = s.own.redis().refreshSnapshot(ctx)
	require.NoError(t, err)
	require.Equal(t, n, s.own.redis().snapshot().size())
	phases.report(m, "the copy of the pool read")
	require.NoError(t, rdb.FlushAllAsync(ctx).Err())
	// A Redis that lost the pool restarted or failed over: its memory is not
	// being freed while the copy goes back. Let FLUSHALL ASYNC's background
	// free finish first (on 2 cores it competes with Redis's main thread).
	require.Eventually(t, func() bool {
		return infoField(t, rdb, "memory", "lazyfree_pending_objects") == 0
	}, time.Minute, 10*time.Millisecond, "FLUSHALL ASYNC's background free")
	m = phases.mark()
	written, err := s.own.redis().reseed(ctx)
	require.NoError(t, err)
	assert.Equal(t, n, written)
	assert.EqualValues(t, n, rdb.HLen(ctx, s.keys.proxies()).Val())
	phases.report(m, fmt.Sprintf("re-seed of %d proxies", n))

	m = phases.mark()
	require.NoError(t, s.Clear(ctx))
	phases.report(m, "Clear")

	close(stop)
	lat := pings()
	require.NotEmpty(t, lat)
	t.Logf("PING loop: %d pings, median %v, p99 %v, max %v", len(lat), lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1])
	phases.report(phases.mark(), "after the phases")
	reportCommandStats(t, rdb)
	return phases.over, lat[len(lat)*99/100]
}

// scalePhases measures the scale test phase by phase: each phase's wall
// time, Redis CPU time and script calls (INFO cpu and commandstats: Redis
// CPU per call is known whatever the load, wall time on a loaded machine is
// not), and the SLOWLOG entries written during it, so that a slow command
// is reported with the phase that ran it.
type scalePhases struct {
	t        *testing.T
	rdb      *redis.Client
	lastSlow int64       // the last SLOWLOG entry id reported
	over     []slowEntry // the entries over 50 ms, with their phase
}

// cpuMark is where Redis stood when a phase began.
type cpuMark struct {
	at    time.Time
	cpu   float64
	calls int64
}

func (p *scalePhases) mark() cpuMark {
	p.t.Helper()
	cpu, calls := redisMainCPU(p.t, p.rdb)
	return cpuMark{at: time.Now(), cpu: cpu, calls: calls}
}

// report logs the phase's wall time, Redis CPU time and script calls, and
// its SLOWLOG entries (those since the last report).
func (p *scalePhases) report(m cpuMark, what string) {
	t := p.t
	t.Helper()
	wall := time.Since(m.at)
	cpu, calls := redisMainCPU(t, p.rdb)
	d := time.Duration((cpu - m.cpu) * float64(time.Second))
	k := calls - m.calls
	t.Logf("%s: %v; Redis CPU %v in %d script calls, %v per call", what, wall.Round(time.Millisecond),
		d.Round(time.Millisecond), k, (d / time.Duration(max(k, 1))).Round(time.Microsecond))
	p.slowlog(what)
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

// slowlog logs the longest SLOWLOG entry per script (by name) written since
// the last call, and keeps those over 50 ms in p.over.
func (p *scalePhases) slowlog(phase string) {
	t := p.t
	t.Helper()
	names := map[string]string{}
	for name, sc := range allScripts {
		names[sc.Hash()] = name
	}
	slow, err := p.rdb.SlowLogGet(context.Background(), 100000).Result()
	require.NoError(t, err)
	type agg struct {
		n   int
		max time.Duration
	}
	by := map[string]*agg{}
	last := p.lastSlow
	for _, e := range slow {
		if e.ID <= p.lastSlow {
			continue
		}
		last = max(last, e.ID)
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
			p.over = append(p.over, slowEntry{d: e.Duration, command: name, phase: phase})
		}
	}
	p.lastSlow = last
	for _, name := range slices.Sorted(maps.Keys(by)) {
		t.Logf("  SLOWLOG (over 10 ms): %s: %d entries, max %v", name, by[name].n, by[name].max)
	}
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
