package proxyswitch

import (
	"context"
	"slices"
	"testing"

	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLargeGatewayInBoundedCalls: a gateway larger than one pool_update.lua
// call (1200 sessions, 500 entries a call) goes in over several calls and
// keeps exactly its N sessions; a large Replace (paged, not atomic) keeps
// the sessions it has as the atomic one does; a rotated-in session gets its
// place in the rotation order and the old one leaves the order, the busy
// set, the labels and the gateways; Remove of the template takes its
// members out over several calls. The order, gateways and labels keys stay
// in step with the pool throughout.
func TestLargeGatewayInBoundedCalls(t *testing.T) {
	ctx := context.Background()
	const site = "shop.example"
	rdb := shared.Client(t)
	s := newSwitch(t, rdb, WithTimeouts(Timeouts{MaxWait: Off}))
	gw := func(n string) string { return "http://user-session-{session:" + n + "}:pw@gw.example:7000 country=ru" }
	inStep := func(size, sessions int) {
		t.Helper()
		assert.EqualValues(t, size, rdb.HLen(ctx, s.keys.proxies()).Val(), "pool")
		assert.EqualValues(t, size, rdb.ZCard(ctx, s.keys.order()).Val(), "every proxy has its place in the order")
		assert.EqualValues(t, sessions, rdb.HLen(ctx, s.keys.gateways()).Val(), "gateways hash")
		assert.EqualValues(t, sessions, rdb.HLen(ctx, s.keys.labels()).Val(), "labels hash (only the gateway's are labelled)")
	}

	ch, err := s.Add(ctx, append([]string{gw("1200")}, scaleURLs(0, 700)...)...)
	require.NoError(t, err)
	assert.Equal(t, PoolChange{Added: 1900, Size: 1900}, ch, "the gateway's 1200 candidates span three calls")
	inStep(1900, 1200)
	ch, err = s.Add(ctx, gw("1200"))
	require.NoError(t, err)
	assert.Equal(t, PoolChange{Size: 1900}, ch, "the gateway has its sessions")
	sessions := func() []string {
		var out []string
		for id := range rdb.HGetAll(ctx, s.keys.gateways()).Val() {
			out = append(out, id)
		}
		slices.Sort(out)
		return out
	}
	before := sessions()

	ch, err = s.Replace(ctx, append([]string{gw("1000")}, scaleURLs(0, 600)...))
	require.NoError(t, err)
	assert.Equal(t, PoolChange{Removed: 300, Size: 1600}, ch, "a large Replace keeps 1000 of the 1200 sessions and 600 plain proxies")
	inStep(1600, 1000)
	kept := sessions()
	assert.True(t, slices.Equal(before[:1000], kept), "the sessions kept are the first 1000 by ID, as the atomic Replace keeps them")

	// A ban of a session rotates it: the new one takes a place in the order.
	l, err := s.Lease(UseLabels(ctx, "country=ru"), site)
	require.NoError(t, err)
	old := l.Proxy().ID()
	require.Contains(t, kept, old)
	require.NoError(t, l.Report(ctx, ban.Verdict{Kind: ban.Ban, Reason: "http_403"}))
	inStep(1600, 1000)
	now := sessions()
	assert.NotContains(t, now, old)
	assert.Len(t, slices.DeleteFunc(slices.Clone(now), func(id string) bool { return slices.Contains(kept, id) }), 1, "one new session")
	assert.ErrorIs(t, rdb.ZScore(ctx, s.keys.order(), old).Err(), redis.Nil, "the old session left the order")
	assert.Zero(t, rdb.ZCard(ctx, s.keys.free(site)).Val(), "the banned lease ended: nothing out on the site")
	for _, id := range now {
		assert.Equal(t, "country=ru", rdb.HGet(ctx, s.keys.labels(), id).Val(), "the new session keeps the labels")
	}

	ch, err = s.Remove(ctx, "http://user-session-{session}:pw@gw.example:7000")
	require.NoError(t, err)
	assert.Equal(t, PoolChange{Removed: 1000, Size: 600}, ch, "the template's 1000 members, over several calls")
	inStep(600, 0)
}
