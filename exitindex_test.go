package proxyswitch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// noteExitsOf records exit IP ip(i) for each proxy of urls (exit_note.lua,
// 1000 pairs a call) and returns their IDs.
func noteExitsOf(t testing.TB, rdb redis.Scripter, s *Switch, urls []string, ip func(i int) string) []string {
	t.Helper()
	ctx := context.Background()
	keys := []string{s.keys.exits(), s.keys.sites(), s.keys.meta(), s.keys.proxies()}
	ids := make([]string, len(urls))
	args := []any{s.keys.base}
	flush := func() {
		if len(args) > 1 {
			require.NoError(t, exitNoteScript.Run(ctx, rdb, keys, args...).Err())
		}
		args = []any{s.keys.base}
	}
	for i, u := range urls {
		p, err := ParseProxy(u)
		require.NoError(t, err)
		ids[i] = p.ID()
		if ip == nil {
			continue
		}
		args = append(args, ids[i], ip(i))
		if len(args) > 2000 {
			flush()
		}
	}
	flush()
	return ids
}

// exitPool returns a Switch (opts) on a pool of n proxies (proxyURLs)
// whose exits are recorded as ip(i) (none with ip nil), their URLs and IDs.
func exitPool(t *testing.T, rdb redis.UniversalClient, n int, ip func(i int) string, opts ...Option) (*Switch, []string, []string) {
	t.Helper()
	s := newSwitch(t, rdb, opts...)
	urls := proxyURLs(n)
	_, err := s.Add(context.Background(), urls...)
	require.NoError(t, err)
	return s, urls, noteExitsOf(t, rdb, s, urls, ip)
}

// TestExitLeaseWorkBoundedPerIP (the review's measurement): a lease.lua
// call's work on a pool whose entries share exit IPs no longer grows with
// the entries per IP. 20,000 entries on one IP, or 10 IPs of 2,000, every
// IP with its K = 4 slots out on the site: each lease call looked at 128
// entries whose IPs were all out, reading every entry of each IP met
// (SMEMBERS, then ZMSCORE of each of its 4 slots): 42 ms a call on
// average (max 47 ms) with one IP, 65 ms (max 163 ms) with ten, on 2
// shared cores. Now it reads the IPs' indexes (the entries that may have a
// slot out: 4 per IP here): under 10 ms a call on average (0.9 and 1.3 ms
// measured, max 3.7 ms: a call of the scan below), none over Redis's 50
// ms, read from the server's SLOWLOG. The pool is saturated by its IPs:
// once lease.lua's scan for entries without an exit has gone through the
// pool (calls of 2048 entries), the reply is the time until the soonest
// IP's slot comes back (the leases' 30 s TTL), not the 1 ms of a pool
// looked at in part (before: 1 ms every call, the caller polling Redis
// every millisecond), and a worker waiting a second backs off as for a
// busy pool (16 lease calls measured; under 40).
func TestExitLeaseWorkBoundedPerIP(t *testing.T) {
	if testing.Short() {
		t.Skip("20,000 proxies with exits")
	}
	for _, c := range []struct {
		name string
		ips  int
	}{{"1x20000", 1}, {"10x2000", 10}} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			srv := redistest.Start(t)
			rdb := srv.Client(t)
			const k = 4
			s, _, _ := exitPool(t, rdb, 20000, func(i int) string { return fmt.Sprintf("10.9.0.%d", i%c.ips) }, WithRotation(Rotation{Concurrency: k}), WithTimeouts(Timeouts{MaxWait: time.Second}))

			const site = "big.example"
			keys := s.keys.lease(site)
			for i := range c.ips * k {
				res, err := leaseScript.Run(ctx, rdb, keys, leaseArgv(s, site, fmt.Sprintf("hold%d", i))...).Slice()
				require.NoError(t, err)
				require.EqualValues(t, 1, res[0], "lease %d: %v", i, res)
			}

			require.NoError(t, rdb.ConfigSet(ctx, "slowlog-log-slower-than", "0").Err())
			require.NoError(t, rdb.ConfigSet(ctx, "slowlog-max-len", "100000").Err())
			require.NoError(t, rdb.SlowLogReset(ctx).Err())
			const calls = 30
			var waits []int64
			for i := range calls {
				res, err := leaseScript.Run(ctx, rdb, keys, leaseArgv(s, site, fmt.Sprintf("try%d", i))...).Slice()
				require.NoError(t, err)
				require.EqualValues(t, 0, res[0], "every IP is out: %v", res)
				waits = append(waits, res[1].(int64))
			}
			slow, err := rdb.SlowLogGet(ctx, 100000).Result()
			require.NoError(t, err)
			var n int
			var sum, most time.Duration
			for _, e := range slow {
				if len(e.Args) == 0 || !strings.EqualFold(e.Args[0], "evalsha") {
					continue
				}
				n++
				sum += e.Duration
				most = max(most, e.Duration)
			}
			require.Equal(t, calls, n, "SLOWLOG entries of the lease calls")
			t.Logf("%d lease calls: mean %v, max %v (SLOWLOG); waits %v", n, sum/time.Duration(n), most, waits)
			assert.Less(t, sum/time.Duration(n), 10*time.Millisecond, "mean lease call")
			assert.Less(t, most, 50*time.Millisecond, "no lease call blocks Redis 50 ms")

			// The wait: 1 ms while the scan for entries without an exit
			// runs, then the leases' TTL left, every call.
			first := -1
			for i, w := range waits {
				if w > 1 {
					first = i
					break
				}
			}
			require.GreaterOrEqual(t, first, 0, "a pool saturated by its IPs answers a real wait: %v", waits)
			assert.LessOrEqual(t, first, 12, "calls before the wait is known: %v", waits)
			for _, w := range waits[first:] {
				assert.Greater(t, w, int64(20000), "the wait is the held leases' TTL left: %v", waits)
			}

			// A worker waiting a second backs off as for a busy pool,
			// instead of a lease call every millisecond.
			counted := srv.Client(t)
			var tries atomic.Int64
			counted.AddHook(countHook{&tries})
			_, err = sibling(t, s, counted).Lease(ctx, site)
			require.ErrorIs(t, err, ErrNoProxy)
			t.Logf("lease calls in a second of waiting: %d", tries.Load())
			assert.Less(t, tries.Load(), int64(40), "lease calls in a second of waiting")
		})
	}
}

// TestExitIndexFollowsTheEntries: the per-site index of the entries of an
// exit IP with slots out (lib.lua's exit_mark) follows what counted before
// it, so that the IP's K slots stay shared: a lease taken before its
// proxy's exit was recorded holds the IP it joins; a dead entry's lease
// does not, until Revive brings it back; an entry whose exit changes takes
// its lease to its new IP and leaves the old one free; a ban on every site
// holds the IP on a site where the banned entry never went, whether its
// exit was known when it was banned or recorded after. (K = 1.)
func TestExitIndexFollowsTheEntries(t *testing.T) { exitIndexFollowsTheEntries(t, shared.Client(t)) }

// TestExitIndexFollowsTheEntriesOnMiniredis: the same on gopher-lua.
func TestExitIndexFollowsTheEntriesOnMiniredis(t *testing.T) {
	rdb := miniredisClient(t)
	exitIndexFollowsTheEntries(t, rdb)
}

func exitIndexFollowsTheEntries(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	s, urls, ids := exitPool(t, rdb, 5, nil, WithBans(Bans{AllSites: true}))
	// The indexes count as built (lease.lua's migrate), as in a pool whose
	// leases met exits before: what is checked is what keeps them.
	require.NoError(t, rdb.HSet(ctx, s.keys.meta(), "exitidx", "done").Err())
	note := func(pairs ...string) {
		t.Helper()
		args := []any{s.keys.base}
		for _, p := range pairs {
			args = append(args, p)
		}
		require.NoError(t, exitNoteScript.Run(ctx, rdb, []string{s.keys.exits(), s.keys.sites(), s.keys.meta(), s.keys.proxies()}, args...).Err())
	}
	site := "a.example"
	// firm leases id on site if free: the granted member, or "" (a wait).
	firm := func(id, tok string) string {
		t.Helper()
		return granted(t, leaseAlone(t, rdb, s, site, id, tok, 0))
	}
	release := func(member, tok string) {
		t.Helper()
		keys := []string{s.keys.free(site), s.keys.leases(site), s.keys.strikes(site), s.keys.fails(), s.keys.health(site), s.keys.pace(site)}
		n, err := releaseScript.Run(ctx, rdb, keys, member, tok, 0, "", 0, "0", s.cfg.idleTTL.Milliseconds()).Int64()
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
	}

	m0 := firm(ids[0], "t0")
	require.NotEmpty(t, m0, "no exits yet: 0 is free")
	note(ids[0], "10.0.0.1", ids[1], "10.0.0.1")
	assert.Empty(t, firm(ids[1], "t1"), "0's lease, taken before its exit was known, holds the IP it joined")

	_, err := s.Drain(ctx, "", ids[0])
	require.NoError(t, err)
	m1 := firm(ids[1], "t1")
	require.NotEmpty(t, m1, "a dead entry's lease does not hold its IP")
	release(m1, "t1")
	_, err = s.Revive(ctx, "", ids[0])
	require.NoError(t, err)
	assert.Empty(t, firm(ids[1], "t1"), "revived, 0's lease holds the IP again")

	note(ids[0], "10.0.0.2", ids[2], "10.0.0.2")
	assert.Empty(t, firm(ids[2], "t2"), "0 took its lease to its new IP")
	m1 = firm(ids[1], "t1")
	require.NotEmpty(t, m1, "the IP 0 left is free")
	release(m1, "t1")
	release(m0, "t0")

	// A ban on every site, put on another site, holds the IP here: 3's,
	// banned with its exit known (penalize.lua names it in the IP's ban
	// index), and 4's, banned before its exit was known (exit_note.lua
	// names it when it joins its IP).
	note(ids[3], "10.0.0.3")
	require.NoError(t, s.Ban(ctx, urls[3], "b.example", time.Hour))
	note(ids[2], "10.0.0.3")
	assert.Empty(t, firm(ids[2], "t2"), "3's ban on every site holds the IP it shares with 2")
	require.NoError(t, s.Ban(ctx, urls[4], "b.example", time.Hour))
	note(ids[4], "10.0.0.4", ids[1], "10.0.0.4")
	assert.Empty(t, firm(ids[1], "t1"), "4's ban on every site holds the IP it joined")
	// A site met after the bans: only the IPs' ban indexes know them.
	site = "new.example"
	assert.Empty(t, firm(ids[2], "t2"), "3's ban holds its IP on a site met after it")
	assert.Empty(t, firm(ids[1], "t1"), "4's ban holds its IP on a site met after it")
	// Dead, 3 holds nothing (its IP's ban index lets it go); revived while
	// banned, it holds its IP again (revive.lua names it there).
	_, err = s.Drain(ctx, "", ids[3])
	require.NoError(t, err)
	m2 := firm(ids[2], "t2")
	require.NotEmpty(t, m2, "3 is dead: its ban holds nothing")
	release(m2, "t2")
	_, err = s.Revive(ctx, "", ids[3])
	require.NoError(t, err)
	site = "newer.example"
	assert.Empty(t, firm(ids[2], "t2"), "revived, 3's ban holds its IP again")
}

// TestExitIndexStaysSmall: a site's exit index holds about the entries
// out there, not every entry ever leased there: 300 leases and releases
// in turn over 300 entries of 100 IPs leave a handful in it (each grant
// checks two at random, lease.lua's sweep).
func TestExitIndexStaysSmall(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	s, _, _ := exitPool(t, rdb, 300, func(i int) string { return fmt.Sprintf("10.0.7.%d", i%100) })
	const site = "small.example"
	for range 300 {
		l, err := s.Lease(ctx, site)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
	}
	n, err := rdb.ZCard(ctx, s.keys.base+":exitout:"+site).Result()
	require.NoError(t, err)
	t.Logf("exit index of the site: %d entries after 300 leases", n)
	assert.Less(t, n, int64(30), "entries in the site's exit index")
	assert.Positive(t, n, "the index exists")
}

// TestExitIndexBuiltFromWhatIsOut: a pool whose exits were recorded, with
// slots out, by Switches that wrote no exit index (as an older version
// left it: the indexes and the meta's "exitidx" deleted here) gets them
// built by its next leases from its busy sets and quarantine zset before
// any exit count is trusted: a lease taken then still holds its IP, and a
// ban on every site too. (K = 1.)
func TestExitIndexBuiltFromWhatIsOut(t *testing.T) {
	exitIndexBuiltFromWhatIsOut(t, shared.Client(t))
}

// TestExitIndexBuiltFromWhatIsOutOnMiniredis: the same on gopher-lua.
func TestExitIndexBuiltFromWhatIsOutOnMiniredis(t *testing.T) {
	rdb := miniredisClient(t)
	exitIndexBuiltFromWhatIsOut(t, rdb)
}

func exitIndexBuiltFromWhatIsOut(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	s, urls, ids := exitPool(t, rdb, 4, func(i int) string { return fmt.Sprintf("10.0.8.%d", i/2) }, WithBans(Bans{AllSites: true}))
	const site = "old.example"
	firm := func(id, tok string) string {
		t.Helper()
		return granted(t, leaseAlone(t, rdb, s, site, id, tok, 0))
	}
	require.NotEmpty(t, firm(ids[0], "t0"))
	require.NoError(t, s.Ban(ctx, urls[2], "b.example", time.Hour))
	// What an older version leaves: no index, no mark.
	require.NoError(t, rdb.Del(ctx, s.keys.base+":exitout:"+site, s.keys.base+":exitout:b.example",
		s.keys.base+":exitban:10.0.8.0", s.keys.base+":exitban:10.0.8.1").Err())
	require.NoError(t, rdb.HDel(ctx, s.keys.meta(), "exitidx").Err())

	assert.Empty(t, firm(ids[1], "t1"), "0's lease holds the IP 1 shares")
	assert.Empty(t, firm(ids[3], "t3"), "2's ban on every site holds the IP 3 shares")
	assert.Equal(t, "done", rdb.HGet(ctx, s.keys.meta(), "exitidx").Val())
}

// TestExitIndexLateReleaseAndRenewal: a slot whose lease expired is free,
// and a lease that looks at its IP drops its entry from the site's exit
// index; a late release that puts it out again (its cooldown) and a late
// renewal (the renewer's extend_many.lua renews while the record is the
// caller's) name it again, so that it holds its IP as it did. (K = 1.)
func TestExitIndexLateReleaseAndRenewal(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	s, _, ids := exitPool(t, rdb, 3, func(int) string { return "10.0.9.1" })
	const site = "late.example"
	lease := func(id, tok string, ttl int64) string {
		t.Helper()
		return granted(t, leaseAlone(t, rdb, s, site, id, tok, ttl))
	}
	index := func() []string {
		v, err := rdb.ZRange(ctx, s.keys.base+":exitout:"+site, 0, -1).Result()
		require.NoError(t, err)
		return v
	}

	m0 := lease(ids[0], "t0", 30)
	require.NotEmpty(t, m0)
	time.Sleep(60 * time.Millisecond)
	m1 := lease(ids[1], "t1", 30)
	require.NotEmpty(t, m1, "0's lease expired: the IP is free")
	assert.NotContains(t, index(), "10.0.9.1|"+ids[0], "the look at the IP dropped 0")
	keys := []string{s.keys.free(site), s.keys.leases(site), s.keys.strikes(site), s.keys.fails(), s.keys.health(site), s.keys.pace(site)}
	n, err := releaseScript.Run(ctx, rdb, keys, m0, "t0", 60000, "", 0, "0", s.cfg.idleTTL.Milliseconds()).Int64()
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "released after its expiry")
	assert.Contains(t, index(), "10.0.9.1|"+ids[0], "its cooldown named it again")

	// 1's lease expires unseen; a late renewal takes it back.
	time.Sleep(60 * time.Millisecond)
	require.NoError(t, rdb.ZRem(ctx, s.keys.free(site), m0).Err()) // 0's cooldown ends
	m2 := lease(ids[2], "t2", 30)
	require.NotEmpty(t, m2, "0 rested, 1's lease expired: the IP is free")
	assert.NotContains(t, index(), "10.0.9.1|"+ids[1])
	res, err := extendManyScript.Run(ctx, rdb, []string{s.keys.free(site), s.keys.leases(site)}, 60000, 1, m1, "t1").Int64Slice()
	require.NoError(t, err)
	require.NotZero(t, res[0], "renewed late")
	assert.Contains(t, index(), "10.0.9.1|"+ids[1], "its renewal named it again")
	time.Sleep(60 * time.Millisecond) // 2's lease expires
	assert.Empty(t, lease(ids[0], "t0b", 30000), "1's renewed lease holds the IP")
}

// TestExitIndexFallbackWriteback: what a Switch's local shard wrote back
// (fallback_writeback.lua) holds the exit IPs too: a ban on one site and
// a lease still running, each of an entry sharing its IP with another, and
// a ban on every site, keep the other entry off the site. (K = 1.)
func TestExitIndexFallbackWriteback(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	s, _, ids := exitPool(t, rdb, 6, func(i int) string { return fmt.Sprintf("10.0.10.%d", i/2) })
	const site = "back.example"
	k := s.keys
	require.NoError(t, rdb.HSet(ctx, k.meta(), "exitidx", "done").Err()) // built: the write-back must keep them
	head := []any{k.base, s.cfg.idleTTL.Milliseconds(), s.cfg.slots, s.cfg.maxQuarantine.Milliseconds()}
	argv := append(head,
		"ban", site, ids[0], "", 60000,
		"lease", site, ids[2]+":0", "local-token", 60000,
		"ban", "", ids[4], "", 60000)
	res, err := fallbackWritebackScript.Run(ctx, rdb, []string{k.proxies(), k.sites(), k.meta(), k.dead(), k.quarantine()}, argv...).Int64Slice()
	require.NoError(t, err)
	require.Equal(t, []int64{2, 1}, res)
	for _, id := range []string{ids[1], ids[3], ids[5]} {
		a := leaseArgv(s, site, "t-"+id)
		a[6], a[7] = id, "1"
		r, err := leaseScript.Run(ctx, rdb, k.lease(site), a...).Slice()
		require.NoError(t, err)
		assert.EqualValues(t, 0, r[0], "the entry sharing %s's IP waits: %v", id, r)
	}
}

// TestExitJoinReachesEverySite: an entry whose exit IP is recorded while
// it holds a lease on a site far down the sites (300 leased since) holds
// its IP there at once: another entry of that IP is not leased on that
// site while the lease runs. (The join named the entry on the 256 last
// sites only; each site now applies it from the sweep zset before it
// counts an IP.)
func TestExitJoinReachesEverySite(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	s := newSwitch(t, rdb, WithTimeouts(Timeouts{MaxWait: Off}), WithRotation(Rotation{FlakyDelay: Off}))
	urls := proxyURLs(2)
	_, err := s.Add(ctx, urls...)
	require.NoError(t, err)
	ps, err := ParseProxies(urls)
	require.NoError(t, err)
	noteExitsOf(t, rdb, s, urls[1:], func(int) string { return "10.0.11.1" }) // exits on: the other entry's known
	l, err := s.LeaseProxy(ctx, "far.example", ps[0].id)
	require.NoError(t, err)
	later := time.Now().UnixMilli() + 1000
	for i := range 300 {
		require.NoError(t, rdb.ZAdd(ctx, s.keys.sites(), redis.Z{Score: float64(later + int64(i)), Member: fmt.Sprintf("s%d.example", i)}).Err())
	}
	noteExitsOf(t, rdb, s, urls[:1], func(int) string { return "10.0.11.1" }) // the leased entry joins the IP

	for range 3 {
		_, err := s.Lease(ctx, "far.example")
		require.ErrorIs(t, err, ErrNoProxy, "the IP is out on far.example while the lease runs")
	}
	require.NoError(t, l.Release(ctx))
	l2, err := s.Lease(ctx, "far.example")
	require.NoError(t, err, "free once released")
	require.NoError(t, l2.Release(ctx))
}

// TestExitCarryBoundedPerIP (issue 14): an exit change of an entry that
// rests on 201 sites and is banned on every site, on an IP of 20,000
// entries, costs Redis the commands it costs on an IP of 200, and its
// exit_note.lua call does not block Redis 50 ms. Before, exit_note.lua
// wrote each entry left on the old IP, every slot on every site where the
// entry rested, and each into the quarantine zset: measured on 2 shared
// cores at caa419c, 81,029 commands and 181 ms (213 ms another run) for
// 200 entries, 8,068,307 commands and 17.1 s for 20,000 (Redis answering
// BUSY to every other client meanwhile). Now it writes the old IP's holds (one per site where the entry
// rests, one for every site while its ban lasts: {prefix:pool}:exithold),
// which a lease reads for each IP it counts. The hold does what the writes
// did: on a site where the entry rested, no entry left on the old IP is
// leased until the rest ends; while the ban lasts, none is leased on any
// site, a site first leased after the change too; past the ban, on a site
// where the entry did not rest, they are. A plain lease, every IP out,
// waits for the hold (exit_all_out). An entry that leaves the old IP
// afterwards is not held.
func TestExitCarryBoundedPerIP(t *testing.T) {
	if testing.Short() {
		t.Skip("20,000 proxies with exits")
	}
	costs := map[int]int64{}
	for _, n := range []int{200, 20000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			ctx := context.Background()
			srv := redistest.Start(t)
			rdb := srv.Client(t)
			s, urls, ids := exitPool(t, rdb, n, func(int) string { return "10.8.0.1" }, WithTimeouts(Timeouts{MaxWait: Off}), WithRotation(Rotation{FlakyDelay: Off}))
			mover, left, leaver := ids[0], ids[1], ids[2]

			// waitFor is the wait lease.lua answers for id alone on site
			// (0: it was free, leased and released at once).
			waitFor := func(site, id string) int64 {
				t.Helper()
				res := leaseAlone(t, rdb, s, site, id, "probe-"+site, 0)
				if res[0].(int64) == 1 {
					keys := []string{s.keys.free(site), s.keys.leases(site), s.keys.strikes(site), s.keys.fails(), s.keys.health(site), s.keys.pace(site)}
					n, err := releaseScript.Run(ctx, rdb, keys, res[1], "probe-"+site, 0, "", 0, "0", s.cfg.idleTTL.Milliseconds()).Int64()
					require.NoError(t, err)
					require.EqualValues(t, 1, n)
					return 0
				}
				require.EqualValues(t, 0, res[0], "%s on %s: %v", id, site, res)
				return res[1].(int64)
			}
			near := func(want, got int64, what string) {
				t.Helper()
				assert.InDelta(t, want-time.Now().UnixMilli(), got, 500, "%s: waits %d ms", what, got)
			}
			require.Zero(t, waitFor("warm.example", left), "a first lease builds the exit indexes")

			addSites(t, rdb, s, 0, 200, []string{mover}) // resting an hour on s0..s199.example
			now := time.Now().UnixMilli()
			banEnd, restEnd := now+2000, now+4000
			require.NoError(t, rdb.ZAdd(ctx, s.keys.sites(), redis.Z{Score: float64(now), Member: "rest.example"}).Err())
			require.NoError(t, rdb.ZAdd(ctx, s.keys.free("rest.example"), redis.Z{Score: float64(restEnd), Member: mover + ":0"}).Err())
			require.NoError(t, rdb.ZAdd(ctx, s.keys.quarantine(), redis.Z{Score: float64(banEnd), Member: mover}).Err())

			// The change, through a client that waits for a slow script
			// (a regression fails the bounds below, not with BUSY).
			patient := srv.Client(t, func(o *redis.Options) { o.ReadTimeout = time.Minute })
			require.NoError(t, rdb.ConfigSet(ctx, "slowlog-log-slower-than", "0").Err())
			require.NoError(t, rdb.SlowLogReset(ctx).Err())
			w := measure(t, rdb, func() { noteExitsOf(t, patient, s, urls[:1], func(int) string { return "10.8.0.2" }) })
			slow, err := rdb.SlowLogGet(ctx, 100).Result()
			require.NoError(t, err)
			var took time.Duration
			for _, e := range slow {
				if len(e.Args) > 0 && strings.EqualFold(e.Args[0], "evalsha") {
					took = max(took, e.Duration)
				}
			}
			require.NoError(t, rdb.ConfigSet(ctx, "slowlog-log-slower-than", "10000").Err())
			costs[n] = w.calls
			t.Logf("exit change on an IP of %d entries: %d commands, exit_note %v (SLOWLOG)", n, w.calls, took)
			assert.Less(t, took, 50*time.Millisecond, "exit_note blocks Redis")
			assert.EqualValues(t, n-1, rdb.SCard(ctx, s.keys.exits()+":10.8.0.1").Val())
			if time.Now().UnixMilli() > banEnd-500 {
				t.Fatalf("the change took until %d ms before the ban's end: nothing left to check", banEnd-time.Now().UnixMilli())
			}
			// A plain lease: every IP is out (the old one held, the new one
			// by the mover's ban), and once lease.lua's scan for entries
			// without an exit has gone through the pool (2048 a call), the
			// wait is the ban's end (exit_all_out), not 1 ms.
			var wait int64
			for i := 0; i < 15 && wait <= 1; i++ {
				res, err := leaseScript.Run(ctx, rdb, s.keys.lease("plain.example"), leaseArgv(s, "plain.example", fmt.Sprint("plain", i))...).Slice()
				require.NoError(t, err)
				require.EqualValues(t, 0, res[0], "every IP is out: %v", res)
				wait = res[1].(int64)
			}
			near(banEnd, wait, "a plain lease, every IP out")

			noteExitsOf(t, rdb, s, urls[2:3], func(int) string { return "10.8.0.3" }) // leaver leaves the old IP

			near(restEnd, waitFor("rest.example", left), "left entry where the mover rested")
			near(banEnd, waitFor("fresh.example", left), "left entry on a site first leased after the change, under the ban")
			near(now+3_600_000, waitFor("s7.example", left), "left entry where the mover rests an hour")
			assert.Zero(t, waitFor("fresh.example", leaver), "an entry that left the old IP is not held")

			time.Sleep(time.Until(time.UnixMilli(banEnd + 100)))
			assert.Zero(t, waitFor("fresh.example", left), "past the ban, where the mover did not rest")
			near(restEnd, waitFor("rest.example", left), "left entry where the mover rested, past the ban")
			near(now+3_600_000, waitFor("s7.example", left), "left entry where the mover rests an hour, past the ban")
			time.Sleep(time.Until(time.UnixMilli(restEnd + 100)))
			assert.Zero(t, waitFor("rest.example", left), "past the rest")
		})
	}
	if small, large := costs[200], costs[20000]; small > 0 && large > 0 {
		assert.LessOrEqual(t, large, small+20, "exit_note's commands grow with the IP's entries: %d at 200, %d at 20,000", small, large)
	}
}

// TestExitCarryUnbanAndClear: the holds an exit change leaves on the old
// IP (exit_note.lua's IP holds) on the sites where the entry that left was
// banned: Unban of an entry of the IP on one of those sites lifts the
// IP's hold there (not on the others, not the entry's own ban, which went
// with it to its new IP); a hold on every site (the entry was banned on
// every site) stays. A lease of one entry of a held IP, waiting for it
// alone (a session's), is answered a firm wait. Clear deletes the holds
// with the pool.
func TestExitCarryUnbanAndClear(t *testing.T) { exitCarryUnbanAndClear(t, shared.Client(t)) }

// TestExitCarryUnbanAndClearOnMiniredis: the same on gopher-lua.
func TestExitCarryUnbanAndClearOnMiniredis(t *testing.T) {
	exitCarryUnbanAndClear(t, miniredisClient(t))
}

func exitCarryUnbanAndClear(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	ips := []string{"10.0.20.1", "10.0.20.1", "10.0.20.1", "10.0.20.5", "10.0.20.5"}
	s, urls, ids := exitPool(t, rdb, len(ips), func(i int) string { return ips[i] }, WithTimeouts(Timeouts{MaxWait: Off}))
	free := func(site, id string) bool {
		t.Helper()
		l, err := s.LeaseProxy(ctx, site, id)
		if errors.Is(err, ErrNoProxy) {
			return false
		}
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		return true
	}
	require.NoError(t, s.Ban(ctx, ids[0], "a.example", time.Hour))
	require.NoError(t, s.Ban(ctx, ids[0], "b.example", time.Hour))
	require.NoError(t, rdb.ZAdd(ctx, s.keys.quarantine(), redis.Z{Score: float64(time.Now().Add(time.Hour).UnixMilli()), Member: ids[3]}).Err())
	noteExitsOf(t, rdb, s, []string{urls[0], urls[3]}, func(i int) string { return []string{"10.0.20.2", "10.0.20.6"}[i] })

	assert.False(t, free("a.example", ids[1]), "the old IP is held where 0 was banned")
	assert.False(t, free("b.example", ids[1]), "the old IP is held where 0 was banned")
	assert.False(t, free("a.example", ids[4]), "3's old IP is held on every site")
	assert.False(t, free("c.example", ids[4]), "3's old IP is held on every site")
	// A session waiting for its own proxy on a held IP is told that the
	// wait is firm (a hold ends at its score, as a quarantine does), so it
	// moves on rather than polling up to MaxWait.
	for _, c := range []struct{ site, id string }{{"a.example", ids[1]}, {"c.example", ids[4]}} {
		res := leaseAlone(t, rdb, s, c.site, c.id, "s:held", 0)
		require.EqualValues(t, 0, res[0], "%v", res)
		assert.EqualValues(t, 1, res[2], "%s on %s: a firm wait", c.id, c.site)
	}

	require.NoError(t, s.Unban(ctx, ids[1], "a.example"))
	assert.True(t, free("a.example", ids[2]), "Unban of one entry lifts its IP's hold on the site")
	assert.False(t, free("b.example", ids[2]), "and not on another site")
	assert.False(t, free("a.example", ids[0]), "the entry that left keeps its own ban")
	require.NoError(t, s.Unban(ctx, ids[4], "a.example"))
	assert.False(t, free("a.example", ids[4]), "a hold on every site stays")
	assert.False(t, free("c.example", ids[3]), "3 keeps its own ban on every site")

	require.EqualValues(t, 1, rdb.Exists(ctx, s.keys.base+":exithold").Val(), "the IP holds")
	require.NoError(t, s.Clear(ctx))
	assert.Equal(t, []string{s.keys.meta()}, keysMatching(t, rdb, s.keys.base+"*"), "Clear leaves nothing but the meta hash")
}
