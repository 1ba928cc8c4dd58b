package localpool

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// evidenceRules: first 1s, base 10s doubling to 80s, flaky delay 10s.
func evidenceRules(c *Config) {
	c.FirstQuarantine, c.Quarantine, c.MaxQuarantine, c.FlakyDelay = time.Second, 10*time.Second, 80*time.Second, 10*time.Second
}

// The local shard weighs refusals as penalize.lua does: a first strike is
// the short first quarantine, a repeat (no healthy answer between) the
// base, then doubling; a certain one skips the first step; Retry-After is a
// minimum; a healthy answer starts over; a strike met while quarantined is
// the same offence.
func TestStrikeLadder(t *testing.T) {
	p, clock, ps := fakeShard(t, 1, evidenceRules)
	id := ps[0].id
	l, _, err := p.TryLease("shop", "", 0)
	require.NoError(t, err)
	pen := l.Strike(false, 0, 1000)
	assert.Equal(t, Penalty{Quarantine: time.Second, Until: time.UnixMilli(clock.Load() + 1000), InARow: 1, First: true}, pen)
	assert.True(t, l.Released(), "the strike ends the lease")
	again, err := p.Strike(id, "shop", false, 0, 1000)
	require.NoError(t, err)
	assert.Equal(t, pen, again, "met again while quarantined: the same offence")

	clock.Add(1000)
	pen, _ = p.Strike(id, "shop", false, 0, 1000)
	assert.Equal(t, 10*time.Second, pen.Quarantine, "second strike: the base")
	assert.Equal(t, 2, pen.InARow)
	assert.False(t, pen.First)
	clock.Add(10_000)
	pen, _ = p.Strike(id, "shop", false, 0, 1000)
	assert.Equal(t, 20*time.Second, pen.Quarantine, "third: doubled")
	clock.Add(20_000)
	pen, _ = p.Strike(id, "shop", false, 0, 1000)
	pen, _ = p.Strike(id, "shop", false, 0, 1000)
	assert.Equal(t, 40*time.Second, pen.Quarantine)
	clock.Add(40_000)

	// A healthy answer starts over.
	l, _, err = p.TryLease("shop", "", 0)
	require.NoError(t, err)
	require.NotNil(t, l)
	require.NoError(t, l.ReleaseHealthy())
	pen, _ = p.Strike(id, "shop", false, 0, 1000)
	assert.True(t, pen.First)
	assert.True(t, pen.Healthy, "healthy on the site before")
	clock.Add(1000)
	pen, _ = p.Strike(id, "other", true, 0, 1000)
	assert.Equal(t, 10*time.Second, pen.Quarantine, "certain: no first quarantine")
	clock.Add(10_000)
	pen, _ = p.Strike(id, "third", false, 30*time.Second, 1000)
	assert.Equal(t, 30*time.Second, pen.Quarantine, "Retry-After is a minimum")
	assert.True(t, pen.First)
}

// A first strike confirmed becomes the base quarantine; one lifted is
// taken back (the proxy is free at once, healthy as before), and neither
// touches a strike that is no longer on record.
func TestStrikeConfirmAndLift(t *testing.T) {
	p, clock, ps := fakeShard(t, 2, evidenceRules)
	a, b := ps[0].id, ps[1].id
	for _, id := range []string{a, b} {
		l, _, err := p.TryLease("shop", id, 0)
		require.NoError(t, err)
		require.NoError(t, l.ReleaseHealthy())
	}
	clock.Add(1)
	pa, _ := p.Strike(a, "shop", false, 0, 1000)
	pb, _ := p.Strike(b, "shop", false, 0, 1000)
	require.True(t, pa.First)
	require.True(t, pb.Healthy)

	conf, ok := p.Confirm(a, "shop", pa.Until)
	require.True(t, ok)
	assert.Equal(t, 10*time.Second, conf.Quarantine)
	_, ok = p.Confirm(a, "shop", pa.Until)
	assert.False(t, ok, "confirmed once")
	assert.False(t, p.Lift(a, "shop", pa.Until, true), "a confirmed strike is no first strike")

	assert.True(t, p.Lift(b, "shop", pb.Until, pb.Healthy))
	assert.False(t, p.Lift(b, "shop", pb.Until, pb.Healthy), "lifted once")
	l, wait, err := p.TryLease("shop", "", 0)
	require.NoError(t, err)
	require.NotNil(t, l, "the lifted proxy is free at once (wait %v)", wait)
	assert.Equal(t, b, l.Proxy().id)
	for _, ban := range p.Bans() {
		assert.NotEqual(t, b, ban.ProxyID, "a lifted strike is not written back")
	}
	again, _ := p.Strike(b, "shop", false, 0, 1000)
	assert.True(t, again.First && again.Healthy, "healthy as before the lifted strike")
}

// The failure rate: each verdict raises it, each healthy answer lowers it,
// and a release holds the proxy back by rate x the flaky delay beyond the
// cooldown. A first strike does not count.
func TestFlakyDelay(t *testing.T) {
	p, clock, ps := fakeShard(t, 1, evidenceRules, func(c *Config) { c.Cooldown = 100 * time.Millisecond })
	id := ps[0].id
	_, _ = p.Strike(id, "shop", false, 0, 1000)
	assert.Zero(t, p.FailureRate(id, "shop"), "a first strike is no verdict")
	clock.Add(1000)
	_, _ = p.Strike(id, "shop", false, 0, 1000) // a repeat: a verdict
	assert.InDelta(t, 0.2, p.FailureRate(id, "shop"), 1e-9)
	p.Failed(id, "shop")
	assert.InDelta(t, 0.36, p.FailureRate(id, "shop"), 1e-9)
	clock.Add(10_000)

	l, _, err := p.TryLease("shop", "", 0)
	require.NoError(t, err)
	require.NotNil(t, l)
	require.NoError(t, l.ReleaseHealthy())
	r := p.FailureRate(id, "shop")
	assert.InDelta(t, 0.288, r, 1e-9)
	_, wait, err := p.TryLease("shop", "", 0)
	require.NoError(t, err)
	assert.Equal(t, 100*time.Millisecond+time.Duration(r*10_000)*time.Millisecond, wait, "cooldown + rate x flaky delay")

	off, clock2, ps2 := fakeShard(t, 1, func(c *Config) { c.Quarantine, c.MaxQuarantine = time.Second, time.Minute })
	_, _ = off.Strike(ps2[0].id, "shop", false, 0, 1000)
	assert.Zero(t, off.FailureRate(ps2[0].id, "shop"), "no flaky delay: no rate")
	_ = clock2
}

// Bans tells a strike's quarantine (its run in a row, for the write-back's
// strikes record) from a ban with no strike.
func TestBansCarryTheirStrikes(t *testing.T) {
	p, _, ps := fakeShard(t, 2, evidenceRules)
	a, b := ps[0].ID(), ps[1].ID()
	_, err := p.Strike(a, "shop", true, 0, 1000)
	require.NoError(t, err)
	require.NoError(t, p.Ban(b, "shop", time.Minute))
	got := map[string]int{}
	for _, ban := range p.Bans() {
		got[ban.ProxyID] = ban.Strikes
	}
	assert.Equal(t, map[string]int{a: 1, b: 0}, got)
}
