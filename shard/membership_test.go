package shard

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fastBeat is the config of server id in pool "default" under prefix: 50ms
// heartbeats; a TTL with room for a loaded test machine.
func fastBeat(prefix, id string) MemberConfig {
	return MemberConfig{Prefix: prefix, Pool: "default", Self: id, Heartbeat: 50 * time.Millisecond, TTL: 600 * time.Millisecond}
}

// newMember is a started Membership on rdb (a client of its own: a server
// of its own); it is stopped with the test.
func newMember(t *testing.T, rdb redis.Scripter, cfg MemberConfig) *Membership {
	t.Helper()
	m, err := NewMembership(rdb, cfg)
	require.NoError(t, err)
	require.NoError(t, m.Start(context.Background()))
	t.Cleanup(func() { _ = m.Stop(context.Background()) })
	return m
}

// Several servers, each with its own client, see one sorted live list.
func TestMembershipLiveList(t *testing.T) {
	ctx := context.Background()
	p := testPrefix()
	ms := []*Membership{
		newMember(t, sharedClient(t), fastBeat(p, "crawler-b")),
		newMember(t, sharedClient(t), fastBeat(p, "crawler-c")),
		newMember(t, sharedClient(t), fastBeat(p, "crawler-a")),
	}
	want := []string{"crawler-a", "crawler-b", "crawler-c"}
	for _, m := range ms {
		got, err := m.Members(ctx)
		require.NoError(t, err)
		assert.Equal(t, want, got)
	}
	// The heartbeats keep every server's last known list current.
	require.Eventually(t, func() bool {
		for _, m := range ms {
			if got, at := m.LastKnown(); !assert.ObjectsAreEqual(want, got) || time.Since(at) > time.Second {
				return false
			}
		}
		return true
	}, 2*time.Second, 10*time.Millisecond)

	// Another pool has its own list, and so has another prefix.
	for _, cfg := range []MemberConfig{
		{Prefix: p, Pool: "residential", Self: "crawler-a"},
		{Prefix: testPrefix(), Pool: "default", Self: "crawler-a"},
	} {
		other, err := NewMembership(sharedClient(t), cfg)
		require.NoError(t, err)
		got, err := other.Members(ctx)
		require.NoError(t, err)
		assert.Empty(t, got)
		list, at := other.LastKnown()
		assert.Empty(t, list)
		assert.False(t, at.IsZero())
	}
}

// A server that stops heartbeating (crashed: no goodbye) drops out of the
// others' lists after the TTL; one that stops cleanly drops out at once.
func TestMembershipDropsSilentMember(t *testing.T) {
	p := testPrefix()
	var mu sync.Mutex
	var seen [][]string
	cfg := fastBeat(p, "a")
	cfg.Changed = func(l []string) {
		mu.Lock()
		seen = append(seen, l)
		mu.Unlock()
	}
	a := newMember(t, sharedClient(t), cfg)

	crashCtx, crash := context.WithCancel(context.Background())
	b, err := NewMembership(sharedClient(t), fastBeat(p, "b"))
	require.NoError(t, err)
	require.NoError(t, b.Start(crashCtx))
	c := newMember(t, sharedClient(t), fastBeat(p, "c"))
	require.Eventually(t, func() bool { l, _ := a.LastKnown(); return len(l) == 3 }, time.Second, 5*time.Millisecond)

	crash()
	start := time.Now()
	require.Eventually(t, func() bool { l, _ := a.LastKnown(); return !slices.Contains(l, "b") }, 3*time.Second, 5*time.Millisecond)
	took := time.Since(start)
	t.Logf("a silent member dropped out after %v (TTL 600ms, heartbeat 50ms)", took.Round(time.Millisecond))
	assert.Less(t, took, 600*time.Millisecond+5*50*time.Millisecond, "TTL plus a few heartbeats")
	assert.GreaterOrEqual(t, took, 500*time.Millisecond, "not before its registration ran out")

	require.NoError(t, c.Stop(context.Background()))
	got, err := a.Members(context.Background())
	require.NoError(t, err)
	assert.Equal(t, []string{"a"}, got, "a clean stop leaves at once")
	require.NoError(t, b.Stop(context.Background()), "stopping after the context ended only deregisters")

	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) > 0 && assert.ObjectsAreEqual([]string{"a"}, seen[len(seen)-1])
	}, time.Second, 5*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"a", "b", "c"}, seen[len(seen)-3], "the callback saw each change once, in order: %v", seen)
	assert.Equal(t, []string{"a", "c"}, seen[len(seen)-2])
}

// Two live processes can never hold one ID: they would use one share.
func TestMembershipIDTaken(t *testing.T) {
	ctx := context.Background()
	p := testPrefix()
	first := newMember(t, sharedClient(t), fastBeat(p, "crawler-1"))
	second, err := NewMembership(sharedClient(t), fastBeat(p, "crawler-1"))
	require.NoError(t, err)
	err = second.Start(ctx)
	require.ErrorIs(t, err, ErrMemberTaken)
	assert.Contains(t, err.Error(), "crawler-1")
	assert.ErrorIs(t, first.Start(ctx), ErrConfig, "already started")

	require.NoError(t, first.Stop(ctx))
	require.NoError(t, second.Start(ctx), "free once the holder left")
	t.Cleanup(func() { _ = second.Stop(ctx) })
	require.NoError(t, first.Stop(ctx), "a second Stop does nothing")
	got, err := second.Members(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"crawler-1"}, got)
}

// Redis killed: heartbeats fail fast, the last known list stays. Redis back
// empty: every server is registered again at its next heartbeat, with no
// operator. Redis hung: each call gives up after its own timeout.
func TestMembershipSurvivesRedisOutage(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	p := testPrefix()
	cfg := func(id string) MemberConfig {
		c := fastBeat(p, id)
		c.Timeout = 300 * time.Millisecond
		return c
	}
	a := newMember(t, srv.Client(t), cfg("a"))
	newMember(t, srv.Client(t), cfg("b"))
	require.Eventually(t, func() bool { l, _ := a.LastKnown(); return len(l) == 2 }, time.Second, 5*time.Millisecond)

	require.NoError(t, srv.Kill())
	_, err := a.Members(ctx)
	require.ErrorIs(t, err, ErrRedis)
	time.Sleep(700 * time.Millisecond) // beyond the TTL: heartbeats fail meanwhile
	list, _ := a.LastKnown()
	assert.Equal(t, []string{"a", "b"}, list, "the last known list survives the outage")

	require.NoError(t, srv.Restart())
	start := time.Now()
	require.Eventually(t, func() bool {
		got, err := a.Members(ctx)
		return err == nil && assert.ObjectsAreEqual([]string{"a", "b"}, got)
	}, 2*time.Second, 5*time.Millisecond)
	t.Logf("both members registered again %v after Redis restarted empty", time.Since(start).Round(time.Millisecond))

	require.NoError(t, srv.Pause())
	start = time.Now()
	_, err = a.Members(ctx)
	took := time.Since(start)
	require.NoError(t, srv.Resume())
	require.ErrorIs(t, err, ErrRedis)
	t.Logf("a call to a hung Redis gave up after %v (Redis timeout 300ms)", took.Round(time.Millisecond))
	assert.Less(t, took, 600*time.Millisecond)
}

// The membership keys are named as proxyswitch names them, live in the
// pool's slot and expire with the last registration.
func TestMembershipKeys(t *testing.T) {
	ctx := context.Background()
	rdb := sharedClient(t)
	p := testPrefix()
	m := newMember(t, sharedClient(t), MemberConfig{Prefix: p, Pool: "datacenter", Self: "a",
		Heartbeat: time.Second, TTL: 3 * time.Second})
	base := "{" + p + ":datacenter}"
	assert.Equal(t, []string{base + ":members", base + ":member-owners", base + ":member-joins", base + ":member-acks", base + ":member-lapsed"}, m.keys)
	for i, k := range m.keys[:4] {
		ttl, err := rdb.PTTL(ctx, k).Result()
		require.NoError(t, err)
		assert.Greater(t, ttl, 2*time.Second, k)
		if i == 3 { // the acks outlive a lapse by the lapse keep
			assert.LessOrEqual(t, ttl, 4*time.Second+m.LapseKeep(), k)
		} else {
			assert.LessOrEqual(t, ttl, 4*time.Second, k)
		}
	}
	require.NoError(t, m.Stop(ctx))
	n, err := rdb.Exists(ctx, m.keys...).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "nothing left once the last server left")
}

func TestMembershipOnCluster(t *testing.T) {
	ctx := context.Background()
	cl := redistest.StartCluster(t, 3)
	p := testPrefix()
	a := newMember(t, cl.Client(t), fastBeat(p, "a"))
	newMember(t, cl.Client(t), fastBeat(p, "b"))
	got, err := a.Members(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b"}, got)
}

func TestMembershipBadInput(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	t.Cleanup(func() { _ = rdb.Close() })
	ok := MemberConfig{Prefix: "proxyswitch", Pool: "default", Self: "a"}
	with := func(f func(*MemberConfig)) MemberConfig { c := ok; f(&c); return c }
	for name, tc := range map[string]struct {
		rdb redis.Scripter
		cfg MemberConfig
	}{
		"nil client":         {nil, ok},
		"empty ID":           {rdb, with(func(c *MemberConfig) { c.Self = "" })},
		"space in ID":        {rdb, with(func(c *MemberConfig) { c.Self = "crawler 1" })},
		"newline in ID":      {rdb, with(func(c *MemberConfig) { c.Self = "crawler\n1" })},
		"invalid UTF-8":      {rdb, with(func(c *MemberConfig) { c.Self = "crawler\xff" })},
		"long ID":            {rdb, with(func(c *MemberConfig) { c.Self = strings.Repeat("x", 201) })},
		"empty prefix":       {rdb, with(func(c *MemberConfig) { c.Prefix = "" })},
		"empty pool":         {rdb, with(func(c *MemberConfig) { c.Pool = "" })},
		"brace in prefix":    {rdb, with(func(c *MemberConfig) { c.Prefix = "a{b" })},
		"space in pool":      {rdb, with(func(c *MemberConfig) { c.Pool = "data center" })},
		"line break in pool": {rdb, with(func(c *MemberConfig) { c.Pool = "a\r" })},
		"negative heartbeat": {rdb, with(func(c *MemberConfig) { c.Heartbeat = -time.Second })},
		"negative timeout":   {rdb, with(func(c *MemberConfig) { c.Timeout = -time.Second })},
		"TTL below 2 beats":  {rdb, with(func(c *MemberConfig) { c.Heartbeat, c.TTL = time.Second, 1500*time.Millisecond })},
		"TTL below defaults": {rdb, with(func(c *MemberConfig) { c.TTL = time.Second })},
		"TTL below its beat": {rdb, with(func(c *MemberConfig) { c.Heartbeat, c.TTL = 5*time.Second, 3*time.Second })},
	} {
		_, err := NewMembership(tc.rdb, tc.cfg)
		assert.ErrorIs(t, err, ErrConfig, name)
	}
	assert.NoError(t, ValidMemberID(strings.Repeat("x", 200)))
	m, err := NewMembership(rdb, with(func(c *MemberConfig) { c.Self = "crawler-1.example.com" }))
	require.NoError(t, err)
	assert.Equal(t, "crawler-1.example.com", m.Self())
	require.NoError(t, m.Stop(context.Background()), "Stop before Start does nothing")
}

// Zero fields take their defaults: a 1s heartbeat, a TTL of three
// heartbeats, a 2s Redis timeout, slog.Default(), no callback. The
// callback is told the first list read.
func TestMembershipDefaults(t *testing.T) {
	p := testPrefix()
	m, err := NewMembership(sharedClient(t), MemberConfig{Prefix: p, Pool: "default", Self: "a"})
	require.NoError(t, err)
	assert.Equal(t, time.Second, m.cfg.Heartbeat)
	assert.Equal(t, 3*time.Second, m.cfg.TTL)
	assert.Equal(t, 2*time.Second, m.cfg.Timeout)
	assert.NotNil(t, m.cfg.Logger)
	_, err = m.Members(context.Background())
	require.NoError(t, err, "no callback, no call")

	var calls [][]string
	cfg := MemberConfig{Prefix: p, Pool: "default", Self: "b", Heartbeat: 100 * time.Millisecond,
		Changed: func(l []string) { calls = append(calls, l) }}
	told, err := NewMembership(sharedClient(t), cfg)
	require.NoError(t, err)
	assert.Equal(t, 100*time.Millisecond, told.cfg.Heartbeat)
	assert.Equal(t, 300*time.Millisecond, told.cfg.TTL, "three heartbeats")
	_, err = told.Members(context.Background())
	require.NoError(t, err)
	assert.Equal(t, [][]string{{}}, calls, "the callback is told the first list")
	_, err = told.Members(context.Background())
	require.NoError(t, err)
	assert.Len(t, calls, 1, "and only changes after it")

	cfg.TTL = 150 * time.Millisecond
	_, err = NewMembership(sharedClient(t), cfg)
	assert.ErrorIs(t, err, ErrConfig, "a TTL is checked against the heartbeat")
}

// FallbackView: a newcomer is settled (its share may count) only once every
// member that joined before it holds a list naming it; a member whose
// registration ran out with no leave stays in the view (it may still lease
// locally) and keeps newcomers unsettled; one that left cleanly does not.
func TestMembershipFallbackView(t *testing.T) {
	ctx := context.Background()
	p := testPrefix()
	slow := func(id string) MemberConfig { // beats by hand only
		return MemberConfig{Prefix: p, Pool: "default", Self: id, Heartbeat: time.Hour, TTL: 2 * time.Hour}
	}
	beat := func(m *Membership) ([]string, bool) {
		t.Helper()
		// Each step in a millisecond of its own: a list read in the
		// millisecond a member joined does not count as naming it.
		time.Sleep(2 * time.Millisecond)
		require.NoError(t, m.beat(ctx))
		return m.FallbackView()
	}
	a := newMember(t, sharedClient(t), slow("a"))
	view, settled := a.FallbackView()
	assert.Equal(t, []string{"a"}, view)
	assert.True(t, settled, "alone")
	view, settled = beat(a)
	assert.Equal(t, []string{"a"}, view)
	assert.True(t, settled, "alone, once it holds a list of its registration")

	b := newMember(t, sharedClient(t), slow("b"))
	view, settled = beat(b)
	assert.Equal(t, []string{"a", "b"}, view)
	assert.False(t, settled, "a has not read a list naming b")
	view, settled = beat(a) // a reads [a b], but acks the list before it
	assert.Equal(t, []string{"a", "b"}, view)
	assert.True(t, settled, "a joined first: it stays settled")
	_, settled = beat(b)
	assert.False(t, settled, "a's ack is of a list read before b joined")
	beat(a) // acks [a b]
	_, settled = beat(b)
	assert.True(t, settled, "a holds a list naming b")

	// c crashes: its registration runs out with no leave.
	crashCtx, crash := context.WithCancel(ctx)
	c, err := NewMembership(sharedClient(t), MemberConfig{Prefix: p, Pool: "default", Self: "c", Heartbeat: 20 * time.Millisecond, TTL: 60 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, c.Start(crashCtx))
	time.Sleep(50 * time.Millisecond)
	crash()
	time.Sleep(150 * time.Millisecond)
	view, _ = beat(a)
	live, _ := a.LastKnown()
	assert.Equal(t, []string{"a", "b"}, live, "c lapsed")
	assert.Equal(t, []string{"a", "b", "c"}, view, "a lapsed member stays in the fallback view")

	d := newMember(t, sharedClient(t), slow("d"))
	for range 3 {
		beat(a)
		beat(b)
		view, settled = beat(d)
	}
	assert.Equal(t, []string{"a", "b", "c", "d"}, view)
	assert.False(t, settled, "c, lapsed, never saw d")

	// e leaves cleanly: not in the view.
	e := newMember(t, sharedClient(t), slow("e"))
	view, _ = beat(a)
	assert.Contains(t, view, "e")
	require.NoError(t, e.Stop(ctx))
	view, _ = beat(a)
	assert.NotContains(t, view, "e")
}

// A list read in the very millisecond a member joined may be from before
// the join (Redis orders scripts, not their times): an ack equal to the
// join time does not settle the newcomer. Set by hand, as the clock cannot
// be made to tick on cue.
func TestMembershipAckInTheJoinMillisecond(t *testing.T) {
	ctx := context.Background()
	rdb := sharedClient(t)
	ca := MemberConfig{Prefix: testPrefix(), Pool: "default", Self: "a", Heartbeat: time.Hour, TTL: 2 * time.Hour}
	cb := ca
	cb.Self = "b"
	a := newMember(t, rdb, ca)
	b := newMember(t, rdb, cb)
	require.NoError(t, a.beat(ctx))
	time.Sleep(2 * time.Millisecond)
	require.NoError(t, b.beat(ctx))
	joined, err := rdb.HGet(ctx, b.keys[2], "b").Int64()
	require.NoError(t, err)

	for ack, want := range map[int64]bool{joined - 1: false, joined: false, joined + 1: true} {
		require.NoError(t, rdb.HSet(ctx, b.keys[3], "a", ack).Err())
		require.NoError(t, b.beat(ctx))
		_, settled := b.FallbackView()
		assert.Equal(t, want, settled, "a's ack %+d ms from b's join", ack-joined)
	}
}
