package proxyswitch

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch/internal/engine"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var exitNoteScript = engine.Root.Script("exit_note")

// TestLeaseScriptExitsGroup: with exits recorded (0-4 on A, 5-7 on B, 8
// and 9 none), one lease.lua call of ten tokens grants one lease per exit
// IP and one per entry without an exit: 4; a firm lease of another entry
// of A waits; a release frees A for the others.
func TestLeaseScriptExitsGroup(t *testing.T) { leaseScriptExitsGroup(t, shared.Client(t)) }

// TestLeaseScriptExitsGroupOnMiniredis: the same on gopher-lua.
func TestLeaseScriptExitsGroupOnMiniredis(t *testing.T) {
	rdb := miniredisClient(t)
	leaseScriptExitsGroup(t, rdb)
}

func leaseScriptExitsGroup(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	s := newSwitch(t, rdb)
	urls := proxyURLs(10)
	_, err := s.Add(ctx, urls...)
	require.NoError(t, err)
	ids := make([]string, len(urls))
	exit := map[string]string{}
	args := []any{s.keys.base}
	for i, u := range urls {
		p, err := ParseProxy(u)
		require.NoError(t, err)
		ids[i] = p.ID()
		switch {
		case i < 5:
			exit[ids[i]] = "10.0.0.1"
		case i < 8:
			exit[ids[i]] = "10.0.0.2"
		default:
			continue
		}
		args = append(args, ids[i], exit[ids[i]])
	}
	res, err := exitNoteScript.Run(ctx, rdb, []string{s.keys.exits(), s.keys.sites(), s.keys.meta(), s.keys.proxies()}, args...).Slice()
	require.NoError(t, err)
	for i := 0; i < len(res); i += 2 {
		assert.EqualValues(t, 1, res[i], "first record")
	}

	keys := s.keys.lease("a.example")
	res, err = leaseScript.Run(ctx, rdb, keys, leaseArgv(s, "a.example", "t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8", "t9")...).Slice()
	require.NoError(t, err)
	require.EqualValues(t, 2, res[0], "%v", res)
	per := map[string]int{}
	var heldA string
	for i := 4; i < len(res); i += 2 {
		id, _, _ := strings.Cut(res[i].(string), ":")
		ip := exit[id]
		if ip == "" {
			ip = id
		}
		per[ip]++
		if ip == "10.0.0.1" {
			heldA = id
		}
	}
	assert.Equal(t, map[string]int{"10.0.0.1": 1, "10.0.0.2": 1, ids[8]: 1, ids[9]: 1}, per)

	// A firm lease of another entry of A: a wait, not a grant.
	other := ids[0]
	if other == heldA {
		other = ids[1]
	}
	res = leaseAlone(t, rdb, s, "a.example", other, "f1", 0)
	assert.EqualValues(t, 0, res[0], "%v", res)

	// Elsewhere A is free.
	res = leaseAlone(t, rdb, s, "b.example", other, "f2", 0)
	assert.EqualValues(t, 1, res[0], "%v", res)
}

// BenchmarkLeaseExits: lease and release of one site, 20 (or 5) leases
// held at once (held leases keep IPs busy, so a lease looks past them), in
// a pool of 1000 without exits, with exits in pairs (500 IPs of 2), and
// with 20 IPs of 50 entries each (a gateway's sessions over few exits:
// with 20 held, 19 of the 20 IPs are busy at each lease). Run:
//
//	go test -run '^$' -bench 'BenchmarkLeaseExits' -benchtime 2000x .
func BenchmarkLeaseExits(b *testing.B) {
	for _, mode := range []struct {
		name string
		ips  int // 0: no exits
		held int
	}{{"exits=none", 0, 20}, {"exits=pairs", 500, 20}, {"exits=20x50", 20, 20}, {"exits=20x50/held=5", 20, 5}} {
		b.Run(mode.name, func(b *testing.B) { benchLeaseExits(b, 1000, mode.ips, mode.held) })
	}
}

func benchLeaseExits(b *testing.B, size, ips, held int) {
	if shared.Server == nil {
		b.Skip("single-node benchmark; the shared Redis is a cluster")
	}
	ctx := context.Background()
	rdb := shared.Server.Client(b)
	s := newSwitch(b, rdb)
	urls := proxyURLs(size)
	_, err := s.Add(ctx, urls...)
	require.NoError(b, err)
	if ips > 0 {
		args := []any{s.keys.base}
		for i, u := range urls {
			p, err := ParseProxy(u)
			require.NoError(b, err)
			args = append(args, p.ID(), "10.1."+strconv.Itoa(i%ips/250)+"."+strconv.Itoa(i%ips%250))
		}
		require.NoError(b, exitNoteScript.Run(ctx, rdb, []string{s.keys.exits(), s.keys.sites(), s.keys.meta(), s.keys.proxies()}, args...).Err())
	}
	ring := make([]*Lease, held)
	for i := range ring {
		ring[i], err = s.Lease(ctx, "bench.example")
		require.NoError(b, err)
	}
	require.NoError(b, rdb.ConfigResetStat(ctx).Err())
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k := i % held
		require.NoError(b, ring[k].Release(ctx))
		ring[k], err = s.Lease(ctx, "bench.example")
		require.NoError(b, err)
	}
	b.StopTimer()
	reportScriptTime(b, rdb)
	for _, l := range ring {
		_ = l.Release(ctx)
	}
}

// TestExitNoteScript: exit_note.lua records, keeps, changes (counted in
// the meta hash) and forgets an exit; a proxy not in the pool is not
// recorded; Clear deletes the exit keys; odd arguments and a foreign
// prefix are refused.
func TestExitNoteScript(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	s := newSwitch(t, rdb)
	urls := proxyURLs(2)
	_, err := s.Add(ctx, urls...)
	require.NoError(t, err)
	p, err := ParseProxy(urls[0])
	require.NoError(t, err)
	keys := []string{s.keys.exits(), s.keys.sites(), s.keys.meta(), s.keys.proxies()}
	note := func(args ...any) []any {
		t.Helper()
		res, err := exitNoteScript.Run(ctx, rdb, keys, append([]any{s.keys.base}, args...)...).Slice()
		require.NoError(t, err)
		return res
	}
	assert.Equal(t, []any{int64(1), ""}, note(p.ID(), "10.0.0.1"))
	assert.Equal(t, []any{int64(0), "10.0.0.1"}, note(p.ID(), "10.0.0.1"))
	assert.Equal(t, []any{int64(2), "10.0.0.1", int64(-1), ""}, note(p.ID(), "10.0.0.2", "nosuchproxy", "10.0.0.2"))
	n, err := rdb.HGet(ctx, s.keys.meta(), "exit_changes").Int()
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	ids, err := rdb.SMembers(ctx, s.keys.exits()+":10.0.0.2").Result()
	require.NoError(t, err)
	assert.Equal(t, []string{p.ID()}, ids)
	assert.Zero(t, rdb.Exists(ctx, s.keys.exits()+":10.0.0.1").Val(), "the old IP's set is left empty")
	assert.Equal(t, []any{int64(3), "10.0.0.2"}, note(p.ID(), ""))
	assert.Zero(t, rdb.HLen(ctx, s.keys.exits()).Val())

	// Clear deletes the exit keys with the pool.
	note(p.ID(), "10.0.0.3")
	require.NoError(t, s.Clear(ctx))
	assert.Zero(t, rdb.Exists(ctx, s.keys.exits(), s.keys.exits()+":10.0.0.3").Val())

	err = exitNoteScript.Run(ctx, rdb, keys, s.keys.base, p.ID()).Err()
	require.ErrorContains(t, err, "PSARGS")
	err = exitNoteScript.Run(ctx, rdb, keys, "{other:pool}", p.ID(), "10.0.0.1").Err()
	require.ErrorContains(t, err, "PSKEYS")
}

// TestLeaseScriptExitsConcurrency: with Rotation.Concurrency 2, the
// entries of one exit IP have 2 slots on a site between them, not 2 each.
func TestLeaseScriptExitsConcurrency(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	s := newSwitch(t, rdb, WithRotation(Rotation{Concurrency: 2}))
	urls := proxyURLs(3)
	_, err := s.Add(ctx, urls...)
	require.NoError(t, err)
	args := []any{s.keys.base}
	for _, u := range urls {
		p, err := ParseProxy(u)
		require.NoError(t, err)
		args = append(args, p.ID(), "10.0.0.9")
	}
	require.NoError(t, exitNoteScript.Run(ctx, rdb, []string{s.keys.exits(), s.keys.sites(), s.keys.meta(), s.keys.proxies()}, args...).Err())
	res, err := leaseScript.Run(ctx, rdb, s.keys.lease("a.example"), leaseArgv(s, "a.example", "t0", "t1", "t2", "t3", "t4", "t5")...).Slice()
	require.NoError(t, err)
	require.EqualValues(t, 2, res[0], "%v", res)
	assert.Len(t, res, 4+2*2, "three entries of one IP, 2 slots: 2 grants")
}

// TestStrictExitsWaitWithoutPolling: under strict exits, a pool larger
// than one call's look (300 entries) whose entries with a known exit are
// all leased, the rest unknown: a waiting lease backs off as for a busy
// pool (lease.lua's all_out counts the unknown entries out), instead of
// looking at the next 128 entries every millisecond.
func TestStrictExitsWaitWithoutPolling(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	var calls atomic.Int64
	rdb.AddHook(countHook{&calls})
	s := newSwitch(t, rdb, WithTimeouts(Timeouts{MaxWait: time.Second}))
	urls := proxyURLs(300)
	_, err := s.Add(ctx, urls...)
	require.NoError(t, err)
	args := []any{s.keys.base}
	known := map[string]bool{}
	for i, u := range urls[:10] {
		p, err := ParseProxy(u)
		require.NoError(t, err)
		known[p.ID()] = true
		args = append(args, p.ID(), fmt.Sprintf("10.0.1.%d", i))
	}
	require.NoError(t, exitNoteScript.Run(ctx, rdb, []string{s.keys.exits(), s.keys.sites(), s.keys.meta(), s.keys.proxies()}, args...).Err())
	require.NoError(t, engine.Root.Script("exit_strict").Run(ctx, rdb, []string{s.keys.meta()}, 60000).Err())

	for range 10 {
		l, err := s.Lease(ctx, "ozon.example")
		require.NoError(t, err)
		require.True(t, known[l.Proxy().ID()], "an entry with no exit was leased under strict exits")
	}
	calls.Store(0)
	_, err = s.Lease(ctx, "ozon.example")
	require.ErrorIs(t, err, ErrNoProxy)
	assert.Less(t, calls.Load(), int64(40), "attempts in one second of waiting")
}
