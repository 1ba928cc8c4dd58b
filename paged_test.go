package proxyswitch

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// setPageSize makes every paged or chunked operation use pages of n for
// the rest of the test.
func setPageSize(t *testing.T, n int) {
	old := pageSizeVar.Swap(int64(n))
	t.Cleanup(func() { pageSizeVar.Store(old) })
}

// meteredScripter records the largest script call going through it: its
// ARGV items and its reply's items (what a call of bounded work keeps
// small whatever the pool's size); after, if set, runs after each call
// with the number of calls so far.
type meteredScripter struct {
	redis.Scripter
	maxArgs, maxReply atomic.Int64
	calls             atomic.Int64
	after             atomic.Pointer[func(calls int64)]
}

func (m *meteredScripter) note(cmd *redis.Cmd, args []any) *redis.Cmd {
	n := m.calls.Add(1)
	if f := m.after.Load(); f != nil {
		(*f)(n)
	}
	for {
		cur := m.maxArgs.Load()
		if int64(len(args)) <= cur || m.maxArgs.CompareAndSwap(cur, int64(len(args))) {
			break
		}
	}
	if v, ok := cmd.Val().([]any); ok {
		for {
			cur := m.maxReply.Load()
			if int64(len(v)) <= cur || m.maxReply.CompareAndSwap(cur, int64(len(v))) {
				break
			}
		}
	}
	return cmd
}

func (m *meteredScripter) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return m.note(m.Scripter.Eval(ctx, script, keys, args...), args)
}

func (m *meteredScripter) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	return m.note(m.Scripter.EvalSha(ctx, sha, keys, args...), args)
}

func (m *meteredScripter) EvalRO(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return m.note(m.Scripter.EvalRO(ctx, script, keys, args...), args)
}

func (m *meteredScripter) EvalShaRO(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	return m.note(m.Scripter.EvalShaRO(ctx, sha, keys, args...), args)
}

// TestAdminCallsBounded (issue 14): with pages forced to 7 entries, every
// admin operation over a pool of 600 proxies (List, Dead, Drain, Revive,
// ProxyStates, a large Replace, the copy of the pool and its re-seed,
// Clear over 20 sites) goes
// in script calls that carry and return a page's worth, never the pool,
// and still gives the whole answer while another worker leases and
// releases on three sites.
func TestAdminCallsBounded(t *testing.T) {
	const n, page = 600, 7 // more than a hash kept as a listpack (512): HSCAN pages it
	setPageSize(t, page)
	ctx := context.Background()
	srv := redistest.Start(t)
	m := &meteredScripter{Scripter: srv.Client(t)}
	s := newSwitch(t, m)
	urls := scaleURLs(0, n)
	ch, err := s.Add(ctx, urls...)
	require.NoError(t, err)
	require.Equal(t, n, ch.Added)

	// Another worker leases and releases meanwhile.
	w := sibling(t, s, srv.Client(t))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var leases atomic.Int64
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				l, err := w.Lease(ctx, fmt.Sprintf("site-%d.example", i))
				if errors.Is(err, ErrEmptyPool) {
					continue
				}
				if !assert.NoError(t, err) {
					return
				}
				leases.Add(1)
				// Replace removes proxies leased meanwhile: their leases are lost.
				if err := l.Release(ctx); !errors.Is(err, ErrLeaseLost) {
					assert.NoError(t, err)
				}
			}
		}()
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	require.Eventually(t, func() bool { return leases.Load() > 30 }, 10*time.Second, time.Millisecond)

	list, err := s.List(ctx)
	require.NoError(t, err)
	assert.Len(t, list, n)

	drain := urls[:520]
	k, err := s.Drain(ctx, "", drain...)
	require.NoError(t, err)
	assert.Equal(t, 520, k)
	dead, err := s.Dead(ctx)
	require.NoError(t, err)
	assert.Len(t, dead, 520)
	states, err := s.ProxyStates(ctx, "site-0.example")
	require.NoError(t, err)
	require.Len(t, states, n)
	drained := 0
	for _, st := range states {
		if st.State == StateDrained {
			drained++
		}
	}
	assert.Equal(t, 520, drained)
	k, err = s.Revive(ctx, "", drain...)
	require.NoError(t, err)
	assert.Equal(t, 520, k)
	dead, err = s.Dead(ctx)
	require.NoError(t, err)
	assert.Empty(t, dead)

	ch, err = s.Replace(ctx, scaleURLs(30, n))
	require.NoError(t, err)
	assert.Equal(t, PoolChange{Added: 30, Removed: 30, Size: n}, ch)
	_, err = s.Drain(ctx, "", urls[40])
	require.NoError(t, err)

	// The copy of the pool, and its re-seed into a Redis that lost it.
	_, err = s.own.redis().refreshSnapshot(ctx)
	require.NoError(t, err)
	require.Equal(t, n, s.own.redis().snapshot().size())
	require.Len(t, s.own.redis().snapshot().dead, 2)
	close(stop)
	wg.Wait()
	stop = make(chan struct{})
	require.NoError(t, srv.Client(t).FlushAll(ctx).Err())
	written, err := s.own.redis().reseed(ctx)
	require.NoError(t, err)
	assert.Equal(t, n, written)
	list, err = s.List(ctx)
	require.NoError(t, err)
	assert.Len(t, list, n)
	dead, err = s.Dead(ctx)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	keys, err := srv.Client(t).Keys(ctx, "*:seed:*").Result()
	require.NoError(t, err)
	assert.Empty(t, keys, "no staged key left")
	assert.EqualValues(t, n, srv.Client(t).ZCard(ctx, s.keys.order()).Val(), "the order came with the pool")

	// Clear, with 20 sites: a site's keys at a time, then the rest.
	rdb := srv.Client(t)
	for i := range 20 {
		site := fmt.Sprintf("gone-%d.example", i)
		require.NoError(t, rdb.ZAdd(ctx, s.keys.sites(), redis.Z{Score: float64(time.Now().UnixMilli()), Member: site}).Err())
		require.NoError(t, rdb.HSet(ctx, s.keys.leases(site), "x:0", "t|1").Err())
		require.NoError(t, rdb.ZAdd(ctx, s.keys.free(site), redis.Z{Score: 1, Member: "x:0"}).Err())
	}
	before := m.calls.Load()
	require.NoError(t, s.Clear(ctx))
	assert.Greater(t, m.calls.Load()-before, int64(10), "Clear of 20 sites in several calls")
	keys, err = rdb.Keys(ctx, "*").Result()
	require.NoError(t, err)
	assert.Equal(t, []string{s.keys.meta()}, keys, "Clear leaves the meta hash alone")

	t.Logf("%d script calls; the largest carried %d ARGV items and returned %d items", m.calls.Load(), m.maxArgs.Load(), m.maxReply.Load())
	// HSCAN's count is a hint: a page may hold a few more entries.
	assert.LessOrEqual(t, m.maxArgs.Load(), int64(5*page+8), "ARGV items of one call")
	assert.LessOrEqual(t, m.maxReply.Load(), int64(13*3*page+8), "reply items of one call")
}

// workScripter measures the Redis work of each script call going through
// it: the commands the script ran (INFO commandstats of the server before
// and after the call, read through info; the test sends nothing else
// meanwhile but the Switch's own background calls, which go through it
// too, one script call at a time), the largest such count, and every
// whole-key read (HKEYS, HVALS, HGETALL, SMEMBERS, ZRANGE*) a script ran.
type workScripter struct {
	redis.Scripter
	mu            sync.Mutex
	info          *redis.Client
	t             *testing.T
	calls         int
	maxCmds       int
	maxReply      int
	wholeKeyReads map[string]int
}

// workSwitch starts a Redis of the test's own and returns a Switch with
// opts whose script calls go through a workScripter (reset), and a plain
// client of that Redis.
func workSwitch(t *testing.T, opts ...Option) (*Switch, *workScripter, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	w := &workScripter{Scripter: srv.Client(t), info: rdb, t: t}
	w.reset()
	return newSwitch(t, w, opts...), w, rdb
}

// commandCalls reads the calls of each command the server ran so far.
func (w *workScripter) commandCalls() map[string]int {
	txt, err := w.info.Info(context.Background(), "commandstats").Result()
	require.NoError(w.t, err)
	out := map[string]int{}
	for _, line := range strings.Split(txt, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		n, _, _ := strings.Cut(rest, ",")
		v, err := strconv.Atoi(n)
		require.NoError(w.t, err)
		out[strings.TrimPrefix(name, "cmdstat_")] = v
	}
	return out
}

func (w *workScripter) measure(run func() *redis.Cmd) *redis.Cmd {
	w.mu.Lock()
	defer w.mu.Unlock()
	before := w.commandCalls()
	cmd := run()
	after := w.commandCalls()
	cmds := 0
	for name, n := range after {
		d := n - before[name]
		switch {
		case d <= 0 || name == "info" || strings.HasPrefix(name, "eval") || strings.HasPrefix(name, "script"):
			continue
		case name == "hkeys" || name == "hvals" || name == "hgetall" || name == "smembers" || strings.HasPrefix(name, "zrange"):
			w.wholeKeyReads[name] += d
		}
		cmds += d
	}
	w.calls++
	w.maxCmds = max(w.maxCmds, cmds)
	if v, ok := cmd.Val().([]any); ok {
		w.maxReply = max(w.maxReply, len(v))
	}
	return cmd
}

// report returns what reset's last call started measuring.
func (w *workScripter) report() (calls, maxCmds, maxReply int, wholeKeyReads map[string]int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.calls, w.maxCmds, w.maxReply, maps.Clone(w.wholeKeyReads)
}

func (w *workScripter) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls, w.maxCmds, w.maxReply, w.wholeKeyReads = 0, 0, 0, map[string]int{}
}

func (w *workScripter) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return w.measure(func() *redis.Cmd { return w.Scripter.Eval(ctx, script, keys, args...) })
}

func (w *workScripter) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	return w.measure(func() *redis.Cmd { return w.Scripter.EvalSha(ctx, sha, keys, args...) })
}

func (w *workScripter) EvalRO(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return w.measure(func() *redis.Cmd { return w.Scripter.EvalRO(ctx, script, keys, args...) })
}

func (w *workScripter) EvalShaRO(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	return w.measure(func() *redis.Cmd { return w.Scripter.EvalShaRO(ctx, sha, keys, args...) })
}

// TestStateStatsClearBounded (issue 14): with pages forced to 7 entries,
// SiteState and Stats of a site where most of a pool of 4000 proxies are
// dead, banned everywhere, cooling or leased, and Clear of a pool with
// thousands of exit IPs and circuit breakers, go in script calls that each
// run a page's worth of commands and no whole-key read, and still give
// the whole answer (the same as with the default pages).
func TestStateStatsClearBounded(t *testing.T) {
	const n, page, site = 4000, 7, "shop.example"
	ctx := context.Background()
	s, w, rdb := workSwitch(t, WithRotation(Rotation{Cooldown: time.Hour}))
	urls := scaleURLs(0, n)
	_, err := s.Add(ctx, urls...)
	require.NoError(t, err)
	ids := proxyIDsOf(t, urls)

	// 600 leases held (more than a lease hash kept as a listpack, 512:
	// HSCAN pages it), 20 released (cooling), then 1500 others drained and
	// 1000 banned everywhere (200 of them dead too), and 1500 with exit IPs.
	const live, cooling, dead, banned, both = 600, 20, 1500, 1000, 200
	var held []*Lease
	busy := map[string]bool{}
	for range live + cooling {
		l, err := s.Lease(ctx, site)
		require.NoError(t, err)
		held = append(held, l)
		busy[l.Proxy().id] = true
	}
	for _, l := range held[live:] {
		require.NoError(t, l.Release(ctx))
	}
	var rest []int // the proxies neither leased nor cooling
	for i, id := range ids {
		if !busy[id] {
			rest = append(rest, i)
		}
	}
	var drain []string
	for _, i := range rest[:dead] {
		drain = append(drain, urls[i])
	}
	_, err = s.Drain(ctx, "", drain...)
	require.NoError(t, err)
	until := float64(time.Now().Add(time.Hour).UnixMilli())
	for _, i := range rest[dead-both : dead-both+banned] {
		require.NoError(t, rdb.ZAdd(ctx, s.keys.quarantine(), redis.Z{Score: until, Member: ids[i]}).Err())
	}
	for i := range 1500 {
		ip := fmt.Sprintf("203.0.%d.%d", i/250, i%250)
		require.NoError(t, rdb.HSet(ctx, s.keys.exits(), ids[n-1-i], ip).Err())
		require.NoError(t, rdb.SAdd(ctx, s.keys.exits()+":"+ip, ids[n-1-i]).Err())
	}

	want, err := s.SiteState(ctx, site)
	require.NoError(t, err)
	wantStats, err := s.Stats(ctx, site)
	require.NoError(t, err)
	t.Logf("default pages: %+v %+v", want, wantStats)
	assert.Equal(t, SiteState{Site: site, Free: n - live - cooling - dead - (banned - both), Leased: live, Cooling: cooling,
		Dead: dead, Quarantined: banned - both}, want)
	assert.Equal(t, live, wantStats.Leased)

	setPageSize(t, page)
	w.reset()
	got, err := s.SiteState(ctx, site)
	require.NoError(t, err)
	assert.Equal(t, want, got)
	calls, maxCmds, maxReply, whole := w.report()
	t.Logf("SiteState: %d calls, at most %d commands and %d reply items in one", calls, maxCmds, maxReply)
	assert.Greater(t, calls, (1500+800)/(4*page), "SiteState in many calls")
	assert.LessOrEqual(t, maxCmds, 10*4*page, "commands of one SiteState call")
	assert.LessOrEqual(t, maxReply, 5+2*4*page, "reply items of one SiteState call")
	assert.Empty(t, whole)

	// A site with more than a page of live leases: Stats pages them.
	w.reset()
	gotStats, err := s.Stats(ctx, site)
	require.NoError(t, err)
	assert.Equal(t, wantStats, gotStats)
	calls, maxCmds, maxReply, whole = w.report()
	t.Logf("Stats: %d calls, at most %d commands and %d reply items in one", calls, maxCmds, maxReply)
	assert.Greater(t, calls, 1, "Stats in several calls")
	assert.LessOrEqual(t, maxCmds, 10+page*4, "commands of one Stats call")
	assert.Empty(t, whole)

	// Clear: 1500 exit IPs and 600 circuit breakers, a page at a time.
	for i := range 600 {
		b := fmt.Sprintf("b%d.example", i)
		require.NoError(t, rdb.HSet(ctx, s.keys.breaker(), b, "1").Err())
		require.NoError(t, rdb.Set(ctx, s.keys.breakerWindow(b), "1", 0).Err())
	}
	w.reset()
	require.NoError(t, s.Clear(ctx))
	calls, maxCmds, _, _ = w.report()
	t.Logf("Clear: %d calls, at most %d commands in one", calls, maxCmds)
	assert.Greater(t, calls, (1500+600)/page-10, "Clear in many calls")
	assert.LessOrEqual(t, maxCmds, 40*page, "commands of one Clear call")
	// (The last call reads the breaker and exit hashes whole: a page's worth.)
	keys, err := rdb.Keys(ctx, "*").Result()
	require.NoError(t, err)
	assert.Equal(t, []string{s.keys.meta()}, keys, "Clear leaves the meta hash alone")
}

// TestSiteStatePagesAgree: SiteState and Stats of a site with every state
// mixed (slots leased, cooling, banned on the site while leased or not,
// proxies drained while leased or banned, banned everywhere, both) give
// the same answer whatever the page size (pages of 1 to 50 against the
// default), and SiteState agrees with ProxyStates.
func TestSiteStatePagesAgree(t *testing.T) {
	const n, site = 400, "mixed.example"
	ctx := context.Background()
	rdb := shared.Client(t)
	s := newSwitch(t, rdb, WithRotation(Rotation{Cooldown: time.Hour, Concurrency: 2}), WithTimeouts(Timeouts{MaxWait: Off}))
	urls := scaleURLs(0, n)
	_, err := s.Add(ctx, urls...)
	require.NoError(t, err)
	ids := proxyIDsOf(t, urls)
	for i := range 300 {
		l, err := s.Lease(ctx, site)
		require.NoError(t, err)
		if i%2 == 0 {
			require.NoError(t, l.Release(ctx))
		}
	}
	for i := 0; i < n; i += 7 {
		require.NoError(t, s.Ban(ctx, ids[i], site, time.Hour))
	}
	var drain []string
	for i := 0; i < n; i += 4 {
		drain = append(drain, urls[i])
	}
	_, err = s.Drain(ctx, "", drain...)
	require.NoError(t, err)
	until := float64(time.Now().Add(time.Hour).UnixMilli())
	for i := 1; i < n; i += 5 {
		require.NoError(t, rdb.ZAdd(ctx, s.keys.quarantine(), redis.Z{Score: until, Member: ids[i]}).Err())
	}

	want, err := s.SiteState(ctx, site)
	require.NoError(t, err)
	statesAgree(t, s, site)
	wantStats, err := s.Stats(ctx, site)
	require.NoError(t, err)
	t.Logf("%+v %+v", want, wantStats)
	for _, v := range []int{want.Leased, want.Cooling, want.Quarantined, want.Dead, want.Free} {
		require.Positive(t, v, "every state present: %+v", want)
	}
	for _, page := range []int{1, 2, 3, 7, 50} {
		setPageSize(t, page)
		got, err := s.SiteState(ctx, site)
		require.NoError(t, err)
		assert.Equal(t, want, got, "pages of %d", page)
		gotStats, err := s.Stats(ctx, site)
		require.NoError(t, err)
		assert.Equal(t, wantStats, gotStats, "pages of %d", page)
	}
}

// TestSiteHoldPaged: the ledger of a site probe's quarantines is read in
// pages (site_hold.lua "list", one HSCAN page per call), whole however
// small the page (600 entries: past a hash kept as a listpack, which HSCAN
// returns whole); a lifted proxy leaves it, and another site's probe
// quarantines are not this site's.
func TestSiteHoldPaged(t *testing.T) {
	ctx := context.Background()
	setPageSize(t, 3)
	s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: Off}))
	urls := proxyURLs(600)
	_, err := s.Add(ctx, urls...)
	require.NoError(t, err)
	var ids []string
	for _, u := range urls {
		p, err := ParseProxy(u)
		require.NoError(t, err)
		ids = append(ids, p.ID())
		require.NoError(t, s.Ban(ctx, p.ID(), "ozon.example", time.Hour))
	}
	noted, err := s.siteHold(ctx, "note", "ozon.example", ids, time.Minute)
	require.NoError(t, err)
	require.ElementsMatch(t, ids, noted)
	held, err := s.siteHold(ctx, "list", "ozon.example", nil, 0)
	require.NoError(t, err)
	require.ElementsMatch(t, ids, held, "a page of 3 read the whole ledger")
	lifted, err := s.siteHold(ctx, "lift", "ozon.example", ids[:1], 0)
	require.NoError(t, err)
	require.Equal(t, ids[:1], lifted)
	held, err = s.siteHold(ctx, "list", "ozon.example", nil, 0)
	require.NoError(t, err)
	require.ElementsMatch(t, ids[1:], held)
	held, err = s.siteHold(ctx, "list", "wb.example", nil, 0)
	require.NoError(t, err)
	require.Empty(t, held)

	// held: the probe's quarantines that last long enough for a probe
	// without a lease (an hour's ban: a minute yes, two hours no).
	held, err = s.siteHold(ctx, "held", "ozon.example", ids[:3], time.Minute)
	require.NoError(t, err)
	require.Equal(t, ids[1:3], held, "the lifted one is no longer held")
	held, err = s.siteHold(ctx, "held", "ozon.example", ids[1:3], 2*time.Hour)
	require.NoError(t, err)
	require.Empty(t, held)
	held, err = s.siteHold(ctx, "held", "wb.example", ids[1:3], time.Minute)
	require.NoError(t, err)
	require.Empty(t, held, "another site's probe")
}
