package proxyswitch

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The Membership itself is tested in package shard; these tests cover the
// Switch's side: its options, the keys, and Members.

// WithMembership's heartbeat, TTL and member-change function given to NewSwitch are
// checked there and configure the Membership Start registers for
// WithFallback, on the pool's keys (keys.go).
func TestMembershipTakesSwitchOptions(t *testing.T) {
	for name, opts := range map[string][]Option{
		"negative heartbeat": {WithMembership(shard.MemberConfig{Heartbeat: -time.Second})},
		"TTL below 2 beats":  {WithMembership(shard.MemberConfig{Heartbeat: time.Second, TTL: 1500 * time.Millisecond})},
		"TTL below defaults": {WithMembership(shard.MemberConfig{TTL: time.Second})},
	} {
		_, err := NewSwitch(shared.Client(t), opts...)
		assert.ErrorIs(t, err, ErrConfig, name)
	}

	ctx := context.Background()
	rdb := shared.Client(t)
	var mu sync.Mutex
	var calls [][]string
	s := newSwitch(t, rdb, WithFallback("a", nil), WithMembership(shard.MemberConfig{Heartbeat: 50 * time.Millisecond, TTL: 600 * time.Millisecond,
		Changed: func(l []string) {
			mu.Lock()
			calls = append(calls, l)
			mu.Unlock()
		}}))
	_, err := s.Add(ctx, proxyURLs(2)...)
	require.NoError(t, err)
	startSwitch(t, s)
	mu.Lock()
	assert.Equal(t, [][]string{{"a"}}, calls, "the Switch's callback is told the first list")
	mu.Unlock()
	owner, err := rdb.HGet(ctx, s.keys.memberOwners(), "a").Result()
	require.NoError(t, err, "registered on the pool's keys")
	assert.NotEmpty(t, owner)
	end, err := rdb.ZScore(ctx, s.keys.members(), "a").Result()
	require.NoError(t, err, "registered on the pool's keys")
	now, err := rdb.Time(ctx).Result()
	require.NoError(t, err)
	left := time.UnixMilli(int64(end)).Sub(now)
	assert.Greater(t, left, time.Duration(0))
	assert.LessOrEqual(t, left, 600*time.Millisecond, "registered with the Switch's member TTL")

	got, err := s.Members(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"a"}, got)
	mu.Lock()
	assert.Len(t, calls, 1, "Members calls no member-change function")
	mu.Unlock()
}

// Members reads the live list of the Switch's own pool, whoever registered
// in it, and registers nothing.
func TestMembersOfSwitch(t *testing.T) {
	ctx := context.Background()
	s := newSwitch(t, shared.Client(t), WithPool("datacenter"))
	got, err := s.Members(ctx)
	require.NoError(t, err)
	assert.Empty(t, got)

	m, err := shard.NewMembership(shared.Client(t), shard.MemberConfig{Prefix: s.cfg.prefix, Pool: "datacenter", Self: "crawler-1"})
	require.NoError(t, err)
	require.NoError(t, m.Start(ctx))
	t.Cleanup(func() { _ = m.Stop(ctx) })
	got, err = s.Members(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"crawler-1"}, got)

	other := newSwitch(t, shared.Client(t), WithPrefix(s.cfg.prefix))
	got, err = other.Members(ctx)
	require.NoError(t, err)
	assert.Empty(t, got, "another pool")
}
