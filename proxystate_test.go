package proxyswitch

import (
	"context"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// leaseProxy leases proxy id for site (it must be free) and releases the
// lease with the test.
func leaseProxy(t *testing.T, s *Switch, site, id string) *Lease {
	t.Helper()
	l, err := s.acquire(context.Background(), site, id, false)
	require.NoError(t, err)
	require.Equal(t, id, l.Proxy().ID(), "the proxy asked for was not free")
	t.Cleanup(func() { _ = l.Release(context.Background()) })
	return l
}

// statesAgree reads ProxyStates and SiteState for site, checks that the
// slot counts of the proxies add up to SiteState's, and returns the states
// by proxy ID.
func statesAgree(t *testing.T, s *Switch, site string) map[string]ProxyState {
	t.Helper()
	ctx := context.Background()
	ps, err := s.ProxyStates(ctx, site)
	require.NoError(t, err)
	st, err := s.SiteState(ctx, site)
	require.NoError(t, err)
	sum := SiteState{Site: site}
	byID := make(map[string]ProxyState, len(ps))
	for i, p := range ps {
		sum.Free += p.FreeSlots
		sum.Leased += p.LeasedSlots
		sum.Cooling += p.CoolingSlots
		sum.Quarantined += p.QuarantinedSlots
		sum.Dead += p.DeadSlots
		byID[p.Proxy.ID()] = p
		if i > 0 {
			assert.LessOrEqual(t, ps[i-1].Proxy.String(), p.Proxy.String(), "ordered by redacted URL")
		}
	}
	assert.Equal(t, st, sum, "slot counts of ProxyStates(%q) add up to SiteState", site)
	return byID
}

func proxyIDsOf(t *testing.T, urls []string) []string {
	t.Helper()
	ids := make([]string, len(urls))
	for i, u := range urls {
		p, err := ParseProxy(u)
		require.NoError(t, err)
		ids[i] = p.ID()
	}
	return ids
}

func TestProxyStatesEveryState(t *testing.T) {
	ctx := context.Background()
	const site = "ozon.example"
	rdb := shared.Client(t)
	s := newSwitch(t, rdb, WithRotation(Rotation{Cooldown: time.Minute}), WithTimeouts(Timeouts{MaxWait: Off}), WithBans(Bans{DeadAfter: 1, Quarantine: 20 * time.Millisecond, QuarantineMax: 12 * time.Hour}))
	urls := proxyURLs(8)
	_, err := s.Add(ctx, urls...)
	require.NoError(t, err)
	ids := proxyIDsOf(t, urls)
	held, cooled, banned, drained, dead, free, busyBan, twice := ids[0], ids[1], ids[2], ids[3], ids[4], ids[5], ids[6], ids[7]

	// A site never leased: every proxy free.
	got := statesAgree(t, s, site)
	require.Len(t, got, 8)
	for _, id := range ids {
		assert.Equal(t, ProxyState{Proxy: got[id].Proxy, State: StateFree, FreeSlots: 1}, got[id])
	}

	l := leaseProxy(t, s, site, held)
	c := leaseProxy(t, s, site, cooled)
	require.NoError(t, c.Release(ctx))
	cooledAt := time.Now()
	require.NoError(t, s.Ban(ctx, banned, site, time.Hour))
	bannedAt := time.Now()
	require.NoError(t, func() error { _, err := s.Drain(ctx, "", drained); return err }())
	d := leaseProxy(t, s, "avito.example", dead)
	require.NoError(t, d.Report(ctx, ban.Verdict{Kind: ban.ProxyFailure, Reason: ban.ReasonProxyConnect}))
	// Banned while a request through it is under way: the slot stays
	// leased (SiteState counts it so), the proxy is quarantined.
	// (Ban leases and releases another proxy to make sure the site's keys
	// exist; a worker without a cooldown, so that the proxy stays free.)
	b := leaseProxy(t, s, site, busyBan)
	nocool := sibling(t, s, rdb)
	nocool.cfg.cooldown = 0
	require.NoError(t, nocool.Ban(ctx, busyBan, site, time.Hour))
	// Two offences in a row: the first quarantine ran out before the second.
	require.NoError(t, s.Ban(ctx, twice, site, time.Millisecond))
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, s.Ban(ctx, twice, site, time.Hour))

	got = statesAgree(t, s, site)
	assert.Equal(t, StateLeased, got[held].State)
	assert.True(t, l.Expiry().Equal(got[held].Until), "until the lease's expiry")
	assert.Equal(t, 1, got[held].LeasedSlots)

	assert.Equal(t, StateCooling, got[cooled].State)
	assert.WithinDuration(t, cooledAt.Add(time.Minute), got[cooled].Until, 2*time.Second)
	assert.Equal(t, 1, got[cooled].CoolingSlots)

	assert.Equal(t, StateQuarantined, got[banned].State)
	assert.WithinDuration(t, bannedAt.Add(time.Hour), got[banned].Until, 2*time.Second)
	assert.Equal(t, 1, got[banned].Strikes)
	assert.False(t, got[banned].BanAllSites)
	assert.Equal(t, 1, got[banned].QuarantinedSlots)

	assert.Equal(t, StateDrained, got[drained].State)
	assert.Equal(t, "drained", got[drained].Reason)
	assert.WithinDuration(t, time.Now(), got[drained].Since, 5*time.Second)
	assert.True(t, got[drained].Until.IsZero())
	assert.Equal(t, 1, got[drained].DeadSlots)

	assert.Equal(t, StateDead, got[dead].State)
	assert.Equal(t, ban.ReasonProxyConnect, got[dead].Reason)
	assert.Equal(t, 1, got[dead].DeadSlots)

	assert.Equal(t, ProxyState{Proxy: got[free].Proxy, State: StateFree, FreeSlots: 1}, got[free])

	assert.Equal(t, StateQuarantined, got[busyBan].State)
	assert.Equal(t, 1, got[busyBan].LeasedSlots)
	assert.Zero(t, got[busyBan].QuarantinedSlots)
	assert.WithinDuration(t, time.Now().Add(time.Hour), got[busyBan].Until, 5*time.Second)
	assert.True(t, got[busyBan].Until.After(b.Expiry()))

	assert.Equal(t, StateQuarantined, got[twice].State)
	assert.Equal(t, 2, got[twice].Strikes)

	// The dead proxy on the site it died on, and on a site never leased.
	assert.Equal(t, StateDead, statesAgree(t, s, "avito.example")[dead].State)
	fresh := statesAgree(t, s, "fresh.example")
	assert.Equal(t, StateDead, fresh[dead].State)
	assert.Equal(t, 1, fresh[dead].DeadSlots)
	assert.Equal(t, StateDrained, fresh[drained].State)
	assert.Equal(t, StateFree, fresh[banned].State, "a ban on one site only")

	// Unban, revive, release: back to free (cooling after the release).
	require.NoError(t, s.Unban(ctx, banned, site))
	_, err = s.Revive(ctx, "", drained, dead)
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	got = statesAgree(t, s, site)
	assert.Equal(t, ProxyState{Proxy: got[banned].Proxy, State: StateFree, FreeSlots: 1}, got[banned], "unban ends the run of bans too")
	assert.Equal(t, StateFree, got[drained].State)
	assert.Equal(t, StateFree, got[dead].State)
	assert.Equal(t, StateCooling, got[held].State)
}

// TestProxyStatesFailingProxyIsQuarantined: a proxy failure's quarantine
// writes no strike (bans in a row), yet the proxy is quarantined there, not
// cooling, in ProxyStates and in SiteState, until it answers healthily
// again; a proxy resting after a healthy answer is cooling.
func TestProxyStatesFailingProxyIsQuarantined(t *testing.T) {
	ctx := context.Background()
	const site = "ozon.example"
	s := newSwitch(t, shared.Client(t), WithRotation(Rotation{Cooldown: time.Minute}), WithTimeouts(Timeouts{MaxWait: Off}),
		WithBans(Bans{DeadAfter: 3}))
	urls := proxyURLs(3)
	_, err := s.Add(ctx, urls...)
	require.NoError(t, err)
	ids := proxyIDsOf(t, urls)
	failing, resting := ids[0], ids[1]
	// Healthy on another site first: it cools there, and a failure on
	// site quarantines it on site only.
	require.NoError(t, leaseProxy(t, s, "avito.example", failing).Report(ctx, ban.Verdict{Kind: ban.OK}))
	l := leaseProxy(t, s, site, failing)
	require.NoError(t, l.Report(ctx, ban.Verdict{Kind: ban.ProxyFailure, Reason: ban.ReasonProxyTimeout}))
	failedAt := time.Now()
	require.NoError(t, leaseProxy(t, s, site, resting).Report(ctx, ban.Verdict{Kind: ban.OK}))

	got := statesAgree(t, s, site)
	assert.Equal(t, StateQuarantined, got[failing].State)
	assert.Equal(t, 1, got[failing].QuarantinedSlots)
	assert.Zero(t, got[failing].Strikes, "a failure is no ban in a row")
	assert.WithinDuration(t, failedAt.Add(time.Minute), got[failing].Until, 15*time.Second, "Bans.FailureQuarantine, with jitter")
	assert.Equal(t, StateCooling, got[resting].State)
	st, err := s.SiteState(ctx, site)
	require.NoError(t, err)
	assert.Equal(t, 1, st.Quarantined)
	assert.Equal(t, 1, st.Cooling)
	other := statesAgree(t, s, "avito.example")
	assert.Equal(t, StateCooling, other[failing].State, "a failure quarantines on its site only")
}

func TestProxyStatesBanAllSites(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	s := newSwitch(t, rdb, WithTimeouts(Timeouts{MaxWait: Off}), WithBans(Bans{AllSites: true}))
	urls := proxyURLs(3)
	_, err := s.Add(ctx, urls...)
	require.NoError(t, err)
	ids := proxyIDsOf(t, urls)
	leaseProxy(t, s, "avito.example", ids[1]) // the site's keys exist
	require.NoError(t, s.Ban(ctx, ids[0], "ozon.example", time.Hour))

	on := statesAgree(t, s, "ozon.example")
	assert.Equal(t, StateQuarantined, on[ids[0]].State)
	assert.Equal(t, 1, on[ids[0]].Strikes)
	assert.True(t, on[ids[0]].BanAllSites)

	other := statesAgree(t, s, "avito.example")
	assert.Equal(t, StateQuarantined, other[ids[0]].State)
	assert.Zero(t, other[ids[0]].Strikes, "the offence counts on the site it happened on")
	assert.True(t, other[ids[0]].BanAllSites)
	assert.WithinDuration(t, on[ids[0]].Until, other[ids[0]].Until, time.Second)
	assert.Equal(t, StateLeased, other[ids[1]].State)

	// A site never leased starts the proxy quarantined (lease.lua), and
	// ProxyStates and SiteState say so.
	fresh := statesAgree(t, s, "fresh.example")
	require.Len(t, fresh, 3)
	for _, p := range fresh {
		if p.Proxy.ID() == ids[0] {
			assert.Equal(t, StateQuarantined, p.State)
			assert.True(t, p.BanAllSites)
			assert.Equal(t, 1, p.QuarantinedSlots)
			assert.WithinDuration(t, on[ids[0]].Until, p.Until, time.Second)
		} else {
			assert.Equal(t, StateFree, p.State)
		}
	}
	for range 2 {
		l, err := s.Lease(ctx, "fresh.example")
		require.NoError(t, err)
		assert.NotEqual(t, ids[0], l.Proxy().ID())
	}
}

func TestProxyStatesConcurrency(t *testing.T) {
	ctx := context.Background()
	const site = "wb.example"
	rdb := shared.Client(t)
	s := newSwitch(t, rdb, WithRotation(Rotation{Concurrency: 2}), WithTimeouts(Timeouts{MaxWait: Off}))
	paced := sibling(t, s, rdb)
	paced.cfg.cooldown = time.Minute // a worker with a cooldown: pacing holds a proxy's other slot
	urls := proxyURLs(7)
	_, err := s.Add(ctx, urls...)
	require.NoError(t, err)
	ids := proxyIDsOf(t, urls)
	full, half, banned, drained, free, busyBan, cooled := ids[0], ids[1], ids[2], ids[3], ids[4], ids[5], ids[6]

	// A pool never leased: k slots per proxy, as Stats and SiteState count them.
	never := statesAgree(t, s, site)
	require.Len(t, never, 7)
	for _, p := range never {
		assert.Equal(t, ProxyState{Proxy: p.Proxy, State: StateFree, FreeSlots: 2}, p)
	}
	leaseProxy(t, s, "other.example", free)
	got := statesAgree(t, s, site)
	for _, id := range ids {
		assert.Equal(t, ProxyState{Proxy: got[id].Proxy, State: StateFree, FreeSlots: 2}, got[id], "a site never leased")
	}

	l1 := leaseProxy(t, s, site, full)
	l2 := leaseProxy(t, s, site, full)
	leaseProxy(t, s, site, half)
	require.NoError(t, s.Ban(ctx, banned, site, time.Hour)) // takes the proxy itself: nothing else changes
	require.NoError(t, func() error { _, err := s.Drain(ctx, "", drained); return err }())
	leaseProxy(t, s, site, busyBan)
	require.NoError(t, s.Ban(ctx, busyBan, site, time.Hour)) // takes and ends the other slot
	c := leaseProxy(t, paced, site, cooled)
	require.NoError(t, c.Release(ctx))

	got = statesAgree(t, s, site)
	assert.Equal(t, StateLeased, got[full].State)
	assert.Equal(t, 2, got[full].LeasedSlots)
	latest := l1.Expiry()
	if l2.Expiry().After(latest) {
		latest = l2.Expiry()
	}
	assert.True(t, latest.Equal(got[full].Until), "until the last of its leases")

	assert.Equal(t, StateLeased, got[half].State)
	assert.Equal(t, 1, got[half].LeasedSlots)
	assert.Equal(t, 1, got[half].FreeSlots)

	assert.Equal(t, StateQuarantined, got[banned].State)
	assert.Equal(t, 2, got[banned].QuarantinedSlots)
	assert.Equal(t, StateDrained, got[drained].State)
	assert.Equal(t, 2, got[drained].DeadSlots)
	assert.Equal(t, ProxyState{Proxy: got[free].Proxy, State: StateFree, FreeSlots: 2}, got[free])

	assert.Equal(t, StateQuarantined, got[busyBan].State)
	assert.Equal(t, 1, got[busyBan].LeasedSlots)
	assert.Equal(t, 1, got[busyBan].QuarantinedSlots)
	assert.Equal(t, 1, got[busyBan].Strikes)

	assert.Equal(t, StateCooling, got[cooled].State)
	assert.Equal(t, 2, got[cooled].CoolingSlots)
	assert.WithinDuration(t, time.Now().Add(time.Minute), got[cooled].Until, 5*time.Second)

	// A Switch configured with k=1 reads the pool's k from Redis.
	one := sibling(t, s, rdb)
	one.cfg.slots = 1
	ps, err := one.ProxyStates(ctx, site)
	require.NoError(t, err)
	require.Len(t, ps, 7)
	for _, p := range ps {
		assert.Equal(t, 2, p.FreeSlots+p.LeasedSlots+p.CoolingSlots+p.QuarantinedSlots+p.DeadSlots, p.Proxy.ID())
	}
}

func TestProxyStatesScopeGlobal(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	s := newSwitch(t, rdb, WithRotation(Rotation{Scope: ScopeGlobal}), WithTimeouts(Timeouts{MaxWait: Off}))
	urls := proxyURLs(2)
	_, err := s.Add(ctx, urls...)
	require.NoError(t, err)
	ids := proxyIDsOf(t, urls)
	leaseProxy(t, s, "ozon.example", ids[0])
	for _, site := range []string{"ozon.example", "avito.example", ""} {
		ps, err := s.ProxyStates(ctx, site)
		require.NoError(t, err, site)
		require.Len(t, ps, 2)
		for _, p := range ps {
			want := map[bool]string{true: StateLeased, false: StateFree}[p.Proxy.ID() == ids[0]]
			assert.Equal(t, want, p.State, "site %q", site)
		}
	}
	statesAgree(t, s, "avito.example")

	// A per-site Switch reads the global scope as the site "*".
	persite := sibling(t, s, rdb)
	persite.cfg.scope = ScopeSite
	ps, err := persite.ProxyStates(ctx, globalSite)
	require.NoError(t, err)
	leased := 0
	for _, p := range ps {
		leased += p.LeasedSlots
	}
	assert.Equal(t, 1, leased)
	_, err = persite.ProxyStates(ctx, "")
	assert.ErrorIs(t, err, ErrConfig)
}

func TestProxyStatesEmptyPoolAndErrors(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	s := newSwitch(t, rdb)
	ps, err := s.ProxyStates(ctx, "ozon.example")
	require.NoError(t, err)
	assert.Empty(t, ps)

	srv := redistest.Start(t)
	down := newSwitch(t, srv.Client(t), WithTimeouts(Timeouts{Redis: 300 * time.Millisecond}))
	require.NoError(t, srv.Kill())
	_, err = down.ProxyStates(ctx, "ozon.example")
	assert.ErrorIs(t, err, ErrRedis)
}

// TestProxyStatesCorrupt damages the keys the script reads: values that are
// not what the package writes count as absent (as SiteState counts them),
// a proxy URL that does not parse fails with ErrCorrupt.
func TestProxyStatesCorrupt(t *testing.T) {
	ctx := context.Background()
	const site = "ozon.example"
	rdb := shared.Client(t)
	s := newSwitch(t, rdb, WithRotation(Rotation{Cooldown: time.Minute}), WithTimeouts(Timeouts{MaxWait: Off}))
	urls := proxyURLs(3)
	_, err := s.Add(ctx, urls...)
	require.NoError(t, err)
	ids := proxyIDsOf(t, urls)
	leaseProxy(t, s, site, ids[0])
	require.NoError(t, s.Ban(ctx, ids[1], site, time.Hour))
	require.NoError(t, rdb.HSet(ctx, s.keys.leases(site), ids[0]+":0", "token|garbage").Err())
	require.NoError(t, rdb.HSet(ctx, s.keys.strikes(site), ids[1], "x|y|z").Err())
	require.NoError(t, rdb.HSet(ctx, s.keys.dead(), ids[2], "not a time").Err())
	got := statesAgree(t, s, site)
	assert.Equal(t, StateCooling, got[ids[0]].State, "a lease record that does not parse is no lease")
	assert.Equal(t, StateCooling, got[ids[1]].State, "a strikes record that does not parse is no ban")
	assert.Zero(t, got[ids[1]].Strikes)
	assert.Equal(t, StateDead, got[ids[2]].State)
	assert.True(t, got[ids[2]].Since.IsZero())

	require.NoError(t, rdb.HSet(ctx, s.keys.proxies(), "0123456789abcdef", "ftp://u:Canary-secret@h:1").Err())
	_, err = s.ProxyStates(ctx, site)
	require.ErrorIs(t, err, ErrCorrupt)
	assert.NotContains(t, err.Error(), "Canary-secret")
}

func TestParseProxyStatesRejectsMalformedReplies(t *testing.T) {
	s := newSwitch(t, shared.Client(t))
	good := []any{int64(1000), int64(1), int64(1),
		"0123456789abcdef", "http://127.0.0.1:3128", "", int64(0), int64(0),
		int64(1), int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), int64(0)}
	ps, err := s.parseProxyStates(good)
	require.NoError(t, err)
	require.Len(t, ps, 1)
	assert.Equal(t, StateFree, ps[0].State)

	with := func(i int, v any) []any {
		r := append([]any(nil), good...)
		r[i] = v
		return r
	}
	for name, res := range map[string][]any{
		"nil":             nil,
		"header only":     good[:3],
		"short":           good[:len(good)-1],
		"long":            append(append([]any(nil), good...), int64(0)),
		"count too big":   with(2, int64(2)),
		"negative count":  with(2, int64(-1)),
		"zero slots":      with(1, int64(0)),
		"now not integer": with(0, "1000"),
		"id not string":   with(3, int64(7)),
		"url not string":  with(4, nil),
		"count as string": with(8, "1"),
		"negative slots":  with(8, int64(-1)),
		"too many slots":  with(9, int64(1)),
		"bad URL":         with(4, "ftp://h:1"),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := s.parseProxyStates(res)
			assert.ErrorIs(t, err, ErrCorrupt)
		})
	}
}

// TestProxyStatesOnMiniredis runs the script where a dead proxy's score
// reads "1e+15", which gopher-lua's tonumber cannot parse.
func TestProxyStatesOnMiniredis(t *testing.T) {
	ctx := context.Background()
	rdb := miniredisClient(t)
	s := newSwitch(t, rdb, WithRotation(Rotation{Cooldown: time.Minute}), WithTimeouts(Timeouts{MaxWait: Off}))
	urls := proxyURLs(3)
	_, err := s.Add(ctx, urls...)
	require.NoError(t, err)
	ids := proxyIDsOf(t, urls)
	leaseProxy(t, s, "ozon.example", ids[0])
	require.NoError(t, func() error { _, err := s.Drain(ctx, "", ids[1]); return err }())
	_, err = rdb.ZScore(ctx, s.keys.free("ozon.example"), ids[1]+":0").Result()
	require.ErrorIs(t, err, redis.Nil, "a site's busy set holds only what is out there: the dead hash says the rest")

	ps, err := s.ProxyStates(ctx, "ozon.example")
	require.NoError(t, err)
	byID := map[string]string{}
	dead := 0
	for _, p := range ps {
		byID[p.Proxy.ID()] = p.State
		dead += p.DeadSlots
	}
	assert.Equal(t, map[string]string{ids[0]: StateLeased, ids[1]: StateDrained, ids[2]: StateFree}, byID)
	assert.Equal(t, 1, dead)
}
