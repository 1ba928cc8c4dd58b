package proxyswitch

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// newMember is a started Membership for server id of s's pool, through a
// Redis client of its own; it is stopped with the test.
func newMember(t *testing.T, s *Switch, rdb redis.Scripter, id string, opts ...Option) *Membership {
	t.Helper()
	m, err := NewMembership(sibling(t, s, rdb), id, opts...)
	require.NoError(t, err)
	require.NoError(t, m.Start(context.Background()))
	t.Cleanup(func() { _ = m.Stop(context.Background()) })
	return m
}

// fastBeat: 50ms heartbeats; a TTL with room for a loaded test machine.
var fastBeat = []Option{WithHeartbeat(50 * time.Millisecond), WithMemberTTL(600 * time.Millisecond)}

// Several servers, each with its own client, see one sorted live list.
func TestMembershipLiveList(t *testing.T) {
	ctx := context.Background()
	s := newSwitch(t, shared.Client(t))
	ms := []*Membership{
		newMember(t, s, shared.Client(t), "crawler-b", fastBeat...),
		newMember(t, s, shared.Client(t), "crawler-c", fastBeat...),
		newMember(t, s, shared.Client(t), "crawler-a", fastBeat...),
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

	// Another pool has its own list.
	other, err := NewMembership(newSwitch(t, shared.Client(t)), "crawler-a")
	require.NoError(t, err)
	got, err := other.Members(ctx)
	require.NoError(t, err)
	assert.Empty(t, got)
	list, at := other.LastKnown()
	assert.Empty(t, list)
	assert.False(t, at.IsZero())
}

// A server that stops heartbeating (crashed: no goodbye) drops out of the
// others' lists after the TTL; one that stops cleanly drops out at once.
func TestMembershipDropsSilentMember(t *testing.T) {
	s := newSwitch(t, shared.Client(t))
	var mu sync.Mutex
	var seen [][]string
	a := newMember(t, s, shared.Client(t), "a", append(fastBeat, WithMembersChanged(func(l []string) {
		mu.Lock()
		seen = append(seen, l)
		mu.Unlock()
	}))...)

	crashCtx, crash := context.WithCancel(context.Background())
	b, err := NewMembership(sibling(t, s, shared.Client(t)), "b", fastBeat...)
	require.NoError(t, err)
	require.NoError(t, b.Start(crashCtx))
	c := newMember(t, s, shared.Client(t), "c", fastBeat...)
	require.Eventually(t, func() bool { l, _ := a.LastKnown(); return len(l) == 3 }, time.Second, 5*time.Millisecond)

	crash()
	start := time.Now()
	require.Eventually(t, func() bool { l, _ := a.LastKnown(); return !contains(l, "b") }, 3*time.Second, 5*time.Millisecond)
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

func contains(l []string, s string) bool {
	for _, v := range l {
		if v == s {
			return true
		}
	}
	return false
}

// Two live processes can never hold one ID: they would use one share.
func TestMembershipIDTaken(t *testing.T) {
	ctx := context.Background()
	s := newSwitch(t, shared.Client(t))
	first := newMember(t, s, shared.Client(t), "crawler-1", fastBeat...)
	second, err := NewMembership(sibling(t, s, shared.Client(t)), "crawler-1", fastBeat...)
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
	s := newSwitch(t, srv.Client(t), WithRedisTimeout(300*time.Millisecond))
	a := newMember(t, s, srv.Client(t), "a", fastBeat...)
	newMember(t, s, srv.Client(t), "b", fastBeat...)
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

// The membership keys live in the pool's slot and expire with the last
// registration.
func TestMembershipKeys(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	s := newSwitch(t, rdb)
	m := newMember(t, s, shared.Client(t), "a", WithHeartbeat(time.Second), WithMemberTTL(3*time.Second))
	for _, k := range m.keys {
		assert.True(t, strings.HasPrefix(k, s.keys.base+":"), k)
		ttl, err := rdb.PTTL(ctx, k).Result()
		require.NoError(t, err)
		assert.Greater(t, ttl, 2*time.Second, k)
		assert.LessOrEqual(t, ttl, 4*time.Second, k)
	}
	require.NoError(t, m.Stop(ctx))
	n, err := rdb.Exists(ctx, m.keys...).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "nothing left once the last server left")
}

func TestMembershipOnCluster(t *testing.T) {
	ctx := context.Background()
	cl := redistest.StartCluster(t, 3)
	s := newSwitch(t, cl.Client(t))
	a := newMember(t, s, cl.Client(t), "a", fastBeat...)
	newMember(t, s, cl.Client(t), "b", fastBeat...)
	got, err := a.Members(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b"}, got)
}

func TestMembershipBadInput(t *testing.T) {
	s := newSwitch(t, shared.Client(t))
	for name, tc := range map[string]struct {
		sw   *Switch
		id   string
		opts []Option
	}{
		"nil switch":         {nil, "a", nil},
		"empty ID":           {s, "", nil},
		"space in ID":        {s, "crawler 1", nil},
		"newline in ID":      {s, "crawler\n1", nil},
		"invalid UTF-8":      {s, "crawler\xff", nil},
		"long ID":            {s, strings.Repeat("x", 201), nil},
		"zero heartbeat":     {s, "a", []Option{WithHeartbeat(0)}},
		"TTL below 2 beats":  {s, "a", []Option{WithHeartbeat(time.Second), WithMemberTTL(1500 * time.Millisecond)}},
		"TTL below defaults": {s, "a", []Option{WithMemberTTL(time.Second)}},
	} {
		_, err := NewMembership(tc.sw, tc.id, tc.opts...)
		assert.ErrorIs(t, err, ErrConfig, name)
	}
	m, err := NewMembership(s, "crawler-1.example.com", nil)
	require.NoError(t, err, "a nil option is skipped")
	assert.Equal(t, "crawler-1.example.com", m.Self())
	require.NoError(t, m.Stop(context.Background()), "Stop before Start does nothing")
}

// WithHeartbeat, WithMemberTTL and WithMembersChanged given to NewSwitch are
// checked there and configure every Membership of the Switch;
// NewMembership's own options override them for that Membership alone.
func TestMembershipTakesSwitchOptions(t *testing.T) {
	for name, opts := range map[string][]Option{
		"zero heartbeat":     {WithHeartbeat(0)},
		"TTL below 2 beats":  {WithHeartbeat(time.Second), WithMemberTTL(1500 * time.Millisecond)},
		"TTL below defaults": {WithMemberTTL(time.Second)},
	} {
		_, err := NewSwitch(shared.Client(t), opts...)
		assert.ErrorIs(t, err, ErrConfig, name)
	}

	var calls [][]string
	s := newSwitch(t, shared.Client(t), WithHeartbeat(50*time.Millisecond), WithMemberTTL(600*time.Millisecond),
		WithMembersChanged(func(l []string) { calls = append(calls, l) }))
	m, err := NewMembership(s, "a")
	require.NoError(t, err)
	assert.Equal(t, 50*time.Millisecond, m.cfg.interval)
	assert.Equal(t, 600*time.Millisecond, m.cfg.ttl)
	_, err = m.Members(context.Background())
	require.NoError(t, err)
	assert.Equal(t, [][]string{{}}, calls, "the Switch's callback is told the first list")

	quiet, err := NewMembership(s, "b", WithHeartbeat(100*time.Millisecond), WithMembersChanged(nil))
	require.NoError(t, err)
	assert.Equal(t, 100*time.Millisecond, quiet.cfg.interval)
	assert.Equal(t, 600*time.Millisecond, quiet.cfg.ttl, "the Switch's TTL")
	_, err = quiet.Members(context.Background())
	require.NoError(t, err)
	assert.Len(t, calls, 1, "WithMembersChanged(nil) turned it off for this Membership")
	assert.Equal(t, 50*time.Millisecond, s.cfg.member.interval, "the Switch keeps its own settings")

	_, err = NewMembership(s, "c", WithMemberTTL(60*time.Millisecond))
	assert.ErrorIs(t, err, ErrConfig, "an override is checked against the Switch's heartbeat")
}
