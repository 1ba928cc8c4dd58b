package proxyswitch

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
)

// addSites gives the pool of s sites from..to-1 as a broad crawl leaves
// them: each in the sites zset, with a cursor, a busy set holding a slot of
// each of ids out for an hour, and a strikes record of each.
func addSites(t *testing.T, rdb *redis.Client, s *Switch, from, to int, ids []string) {
	t.Helper()
	ctx := context.Background()
	now := time.Now().UnixMilli()
	for lo := from; lo < to; lo += 500 {
		pipe := rdb.Pipeline()
		for i := lo; i < min(lo+500, to); i++ {
			site := fmt.Sprintf("s%d.example", i)
			pipe.ZAdd(ctx, s.keys.sites(), redis.Z{Score: float64(now), Member: site})
			pipe.HSet(ctx, s.keys.cursor(), site, fmt.Sprintf("0|%d", now))
			for _, id := range ids {
				pipe.ZAdd(ctx, s.keys.free(site), redis.Z{Score: float64(now + 3_600_000), Member: id + ":0"})
				pipe.HSet(ctx, s.keys.strikes(site), id, fmt.Sprintf("1|%d|%d", now, now+3_600_000))
			}
		}
		_, err := pipe.Exec(ctx)
		require.NoError(t, err)
	}
}

// TestWorkDoesNotGrowWithSites (issue 14, "no script blocks Redis for
// long"): a proxy's death, a ban on every site, Drain, Revive, Remove,
// Replace and a gateway session's rotation cost Redis the same commands
// with 20,000 live sites as with 100. Before, each visited every site's
// keys: measured on 2 cores at 20,000 sites, a death 163 ms, and at 100,000
// a rotation 867 ms, Remove 385 ms, Drain 226 ms, Revive 188 ms. The bound
// is on commands counted (INFO commandstats), which load does not change,
// and a generous one on the longest call.
func TestWorkDoesNotGrowWithSites(t *testing.T) {
	if testing.Short() {
		t.Skip("20,000 sites")
	}
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	s := newSwitch(t, rdb, WithTimeouts(Timeouts{MaxWait: Off}), WithBans(Bans{DeadAfter: 1}))
	all := sibling(t, s, rdb)
	all.cfg.banAllSites = true
	urls := proxyURLs(40)
	_, err := s.Add(ctx, append([]string{"http://user-session-{session:4}:pw@gw.example:7000"}, urls...)...)
	require.NoError(t, err)
	ps, err := ParseProxies(urls)
	require.NoError(t, err)
	var ids []string
	for _, p := range ps {
		ids = append(ids, p.id)
	}

	// One round of every operation on proxies of its own (round r uses
	// ps[10r..10r+9]); returns the commands and the longest EVALSHA of each.
	type cost struct {
		calls int64
		usec  int64
	}
	round := func(r int) map[string]cost {
		p := ps[10*r : 10*r+10]
		out := map[string]cost{}
		run := func(name string, f func()) {
			w := measure(t, rdb, f)
			out[name] = cost{w.calls, w.evalUsec / max(w.evals, 1)}
		}
		run("death", func() {
			_, err := s.penalize(ctx, "a.example", p[0], nil, ban.Verdict{Kind: ban.ProxyFailure, Reason: ban.ReasonProxyConnect})
			require.NoError(t, err)
		})
		run("ban on every site", func() {
			_, err := all.penalize(ctx, "a.example", p[1], nil, ban.Verdict{Kind: ban.Ban, Reason: "http_403"})
			require.NoError(t, err)
		})
		run("drain", func() {
			n, err := s.Drain(ctx, "", p[2].id)
			require.NoError(t, err)
			require.Equal(t, 1, n)
		})
		run("revive", func() {
			n, err := s.Revive(ctx, "", p[2].id, p[0].id)
			require.NoError(t, err)
			require.Equal(t, 2, n)
		})
		run("remove", func() {
			ch, err := s.Remove(ctx, p[3].id)
			require.NoError(t, err)
			require.Equal(t, 1, ch.Removed)
		})
		run("rotate", func() {
			gws, err := rdb.HKeys(ctx, s.keys.gateways()).Result()
			require.NoError(t, err)
			require.NotEmpty(t, gws)
			gw, err := s.proxyFor(rdb.HGet(ctx, s.keys.proxies(), gws[0]).Val())
			require.NoError(t, err)
			_, err = s.penalize(ctx, "a.example", gw, nil, ban.Verdict{Kind: ban.Ban, Reason: "http_403"})
			require.NoError(t, err)
		})
		return out
	}

	sites := 20_000 // PROXYSWITCH_SCALE_SITES for another number (BENCHMARKS.md: 100,000)
	if v, err := strconv.Atoi(os.Getenv("PROXYSWITCH_SCALE_SITES")); err == nil && v > 100 {
		sites = v
	}
	addSites(t, rdb, s, 0, 100, ids)
	small := round(0)
	addSites(t, rdb, s, 100, sites, ids)
	large := round(1)
	for name, c := range small {
		l := large[name]
		t.Logf("%-18s 100 sites: %4d commands, %6d µs per call; %d sites: %4d commands, %6d µs per call",
			name, c.calls, c.usec, sites, l.calls, l.usec)
		assert.LessOrEqual(t, l.calls, c.calls+20, "%s: commands grow with the sites", name)
		assert.Less(t, l.usec, int64(25_000), "%s: a call of %d µs at %d sites", name, l.usec, sites)
	}

	// A Replace that drops 5 and adds 5 (one atomic call), at 20,000 sites.
	keep := urls[25:]
	w := measure(t, rdb, func() {
		_, err := s.Replace(ctx, append(keep, proxyURLs(45)[40:]...))
		require.NoError(t, err)
	})
	t.Logf("replace at %d sites: %d commands, %d µs per call", sites, w.calls, w.evalUsec/max(w.evals, 1))
	assert.Less(t, w.calls, int64(2_000), "replace visits the sites")
	for _, site := range []string{"s7.example", fmt.Sprintf("s%d.example", sites-1)} {
		assert.Equal(t, int64(len(ids)), rdb.ZCard(ctx, s.keys.free(site)).Val(), "%s: no site visited", site)
	}
}

// TestRemovedProxiesLeaveEachSite: a removed proxy's state on a site (its
// slots out there, expired leases, strikes) goes at that site's next
// leases, not in the removal's call; a live lease stays with its holder,
// whose release works; a proxy added back keeps what it has.
func TestRemovedProxiesLeaveEachSite(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	s := newSwitch(t, rdb, WithTimeouts(Timeouts{MaxWait: Off}), WithRotation(Rotation{FlakyDelay: Off}))
	urls := proxyURLs(4)
	_, err := s.Add(ctx, urls...)
	require.NoError(t, err)
	ps, err := ParseProxies(urls)
	require.NoError(t, err)
	gone, back, held := ps[0], ps[1], ps[2]

	// On b.example: gone and back banned for an hour, held leased.
	for _, p := range []*Proxy{gone, back} {
		_, err := s.penalize(ctx, "b.example", p, nil, ban.Verdict{Kind: ban.Ban, Reason: "http_403"})
		require.NoError(t, err)
	}
	l, err := s.LeaseProxy(ctx, "b.example", held.id)
	require.NoError(t, err)
	// An expired lease left by a holder that died.
	require.NoError(t, rdb.HSet(ctx, s.keys.leases("b.example"), gone.id+":0", "dead-holder|1").Err())

	ch, err := s.Remove(ctx, gone.id, back.id, held.id)
	require.NoError(t, err)
	require.Equal(t, 3, ch.Removed)
	members := func() []string {
		m, err := rdb.ZRange(ctx, s.keys.free("b.example"), 0, -1).Result()
		require.NoError(t, err)
		return m
	}
	assert.Contains(t, members(), gone.id+":0", "the removal itself visits no site")
	_, err = s.Add(ctx, urls[1])
	require.NoError(t, err)

	// The site's next lease a second later forgets them.
	time.Sleep(1100 * time.Millisecond)
	l2, err := s.Lease(ctx, "b.example")
	require.NoError(t, err)
	assert.Equal(t, ps[3].id, l2.proxy.id, "back is still banned here, the others left")
	m := strings.Join(members(), " ")
	assert.NotContains(t, m, gone.id)
	assert.Contains(t, m, back.id+":0", "a proxy added back keeps its ban")
	assert.Contains(t, m, held.id+":0", "a live lease stays")
	assert.False(t, rdb.HExists(ctx, s.keys.leases("b.example"), gone.id+":0").Val(), "the expired lease went")
	assert.False(t, rdb.HExists(ctx, s.keys.strikes("b.example"), gone.id).Val(), "its strikes went")
	assert.True(t, rdb.HExists(ctx, s.keys.strikes("b.example"), back.id).Val(), "back's strikes stay")
	require.NoError(t, l.Release(ctx), "the live lease's holder releases it")
	require.NoError(t, l2.Release(ctx))
}

// threeInOrder returns a Switch (no wait, no flaky delay, then opts) on a
// pool of three proxies, in the order the rotation offers them (that of
// their IDs, lease.lua): a lease on a new site meets q first.
func threeInOrder(t *testing.T, opts ...Option) (s *Switch, q, p, r *Proxy) {
	t.Helper()
	s = newSwitch(t, shared.Client(t), append([]Option{WithTimeouts(Timeouts{MaxWait: Off}),
		WithRotation(Rotation{FlakyDelay: Off})}, opts...)...)
	urls := proxyURLs(3)
	_, err := s.Add(context.Background(), urls...)
	require.NoError(t, err)
	ps, err := ParseProxies(urls)
	require.NoError(t, err)
	slices.SortFunc(ps, func(a, b *Proxy) int { return strings.Compare(a.id, b.id) })
	return s, ps[0], ps[1], ps[2]
}

// leasesGet checks that n leases in a row on site (no wait allowed) each
// get proxy r, released at once.
func leasesGet(t *testing.T, s *Switch, site string, r *Proxy, n int) {
	t.Helper()
	for i := range n {
		l, err := s.Lease(context.Background(), site)
		require.NoError(t, err, "lease %d: %s is free", i, r)
		assert.Equal(t, r.id, l.proxy.id)
		require.NoError(t, l.Release(context.Background()))
	}
}

// TestDeathOnOneSiteReachesTheOthers: a proxy that dies on one site is
// out on every other one at once (their keys untouched by the death), a
// site where it was quarantined does not take it for one more proxy out
// (no false "every proxy is out" while one is free), a sticky session on
// another site retires, and Revive brings it back.
func TestDeathOnOneSiteReachesTheOthers(t *testing.T) {
	ctx := context.Background()
	s, q, p, r := threeInOrder(t, WithBans(Bans{DeadAfter: 1}))

	// p quarantined for an hour on b.example, then dead of a failure on a.example.
	_, err := s.penalize(ctx, "b.example", p, nil, ban.Verdict{Kind: ban.Ban, Reason: "http_403"})
	require.NoError(t, err)
	_, err = s.penalize(ctx, "a.example", p, nil, ban.Verdict{Kind: ban.ProxyFailure, Reason: ban.ReasonProxyConnect})
	require.NoError(t, err)

	// On b.example, q held: every lease gets r, never a wait.
	lq, err := s.LeaseProxy(ctx, "b.example", q.id)
	require.NoError(t, err)
	leasesGet(t, s, "b.example", r, 12)
	require.NoError(t, lq.Release(ctx))
	for range 4 {
		assert.NotContains(t, leaseAll(t, s, "c.example"), p.id, "a site new to it skips it")
	}
	n, err := s.Revive(ctx, "", p.id)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	assert.Contains(t, leaseAll(t, s, "c.example"), p.id, "revived")
}

// TestSessionRetiresOnDeathOrBanElsewhere: a sticky session's proxy that
// dies, or is banned on every site, while on another site retires the
// session at its next request, though neither wrote the session's site.
func TestSessionRetiresOnDeathOrBanElsewhere(t *testing.T) {
	for _, c := range []struct {
		name, reason string
		verdict      ban.Verdict
	}{
		{"death", SessionProxyDead, ban.Verdict{Kind: ban.ProxyFailure, Reason: ban.ReasonProxyConnect}},
		{"ban on every site", SessionQuarantined, ban.Verdict{Kind: ban.Ban, Reason: "http_403"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var mu sync.Mutex
			var retired []SessionRetirement
			flow, site, _, s := sessionShop(t, 3, WithBans(Bans{DeadAfter: 1, AllSites: c.reason == SessionQuarantined}),
				WithSessions(Sessions{Retired: func(r SessionRetirement) {
					mu.Lock()
					retired = append(retired, r)
					mu.Unlock()
				}}))
			col := attached(s)
			const task = "cart-7"
			ctx := NewTaskContext(task)
			for n := 1; n <= 2; n++ {
				require.NoError(t, col.Request("GET", stepURL(site, task, n), nil, ctx, nil))
			}
			info := SessionOf(ctx)
			require.NotNil(t, info)
			p, err := s.find(context.Background(), info.ProxyID)
			require.NoError(t, err)
			_, err = s.penalize(context.Background(), "elsewhere.example", p, nil, c.verdict)
			require.NoError(t, err)

			require.NoError(t, col.Request("GET", stepURL(site, task, 3), nil, ctx, nil))
			ips := flow.visitor(task).ips
			require.Len(t, ips, 2, "a new IP")
			mu.Lock()
			defer mu.Unlock()
			require.Len(t, retired, 1)
			assert.Equal(t, c.reason, retired[0].Reason)
			assert.Equal(t, info.ID, retired[0].ID)
		})
	}
}

// TestRemovedProxyIsNoSlotOut: a proxy removed while quarantined on a site
// does not count there as one more slot out: with the other proxy held,
// a lease gets the free one at once, no wait for "every proxy out".
func TestRemovedProxyIsNoSlotOut(t *testing.T) {
	ctx := context.Background()
	s, q, p, r := threeInOrder(t)

	_, err := s.penalize(ctx, "b.example", p, nil, ban.Verdict{Kind: ban.Ban, Reason: "http_403"})
	require.NoError(t, err)
	lq, err := s.LeaseProxy(ctx, "b.example", q.id)
	require.NoError(t, err)
	_, err = s.Remove(ctx, p.id)
	require.NoError(t, err)
	leasesGet(t, s, "b.example", r, 6)
	require.NoError(t, lq.Release(ctx))
}
