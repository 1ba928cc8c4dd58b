package proxyswitch

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestConfigStructs: a zero field of Rotation, Timeouts, Bans or Sessions
// keeps the value (the default, or an earlier option's), Off sets a field
// to zero, and another negative value is an ErrConfig naming the field.
func TestConfigStructs(t *testing.T) {
	def, err := newConfig(nil)
	require.NoError(t, err)

	cfg, err := newConfig([]Option{WithTimeouts(Timeouts{}), WithBans(Bans{}), WithRotation(Rotation{}), WithSessions(Sessions{})})
	require.NoError(t, err)
	assert.Equal(t, def.maxWait, cfg.maxWait, "empty structs change nothing")
	assert.Equal(t, def.deadAfter, cfg.deadAfter)
	assert.Equal(t, def.flakyDelay, cfg.flakyDelay)
	assert.Equal(t, def.session.errorDecay, cfg.session.errorDecay)

	// Zero keeps an earlier option's value; Off sets zero where zero means off.
	cfg, err = newConfig([]Option{
		WithTimeouts(Timeouts{MaxWait: time.Second, Attempt: 3 * time.Second}),
		WithTimeouts(Timeouts{LeaseTTL: 10 * time.Second}),
		WithTimeouts(Timeouts{Attempt: Off}),
		WithBans(Bans{DeadAfter: 9, Retries: 4, AllSites: true}),
		WithBans(Bans{DeadAfter: Off, EvidenceFirst: Off, PageProxies: Off}),
		WithRotation(Rotation{Concurrency: 3, Cooldown: time.Second, FlakyDelay: Off, LearnedPacing: Off}),
		WithSessions(Sessions{MaxRequests: 5, ErrorDecay: Off, Pool: "residential"}),
		WithSessions(Sessions{MaxAge: time.Hour}),
	})
	require.NoError(t, err)
	assert.Equal(t, time.Second, cfg.maxWait, "kept by a later WithTimeouts")
	assert.Equal(t, 10*time.Second, cfg.leaseTTL)
	assert.Zero(t, cfg.attemptTimeout, "Off")
	assert.Zero(t, cfg.deadAfter, "Off")
	assert.Equal(t, 4, cfg.retries)
	assert.True(t, cfg.banAllSites, "false keeps it")
	assert.Zero(t, cfg.firstQuarantine)
	assert.Zero(t, cfg.pageProxies)
	assert.Equal(t, def.quarantine, cfg.quarantine)
	assert.Equal(t, 3, cfg.slots)
	assert.Equal(t, time.Second, cfg.cooldown)
	assert.Zero(t, cfg.flakyDelay)
	assert.Zero(t, cfg.paceMax)
	assert.Equal(t, 5, cfg.session.maxRequests)
	assert.Equal(t, time.Hour, cfg.session.maxAge)
	assert.Equal(t, "residential", cfg.session.pool)
	assert.Zero(t, cfg.session.errorDecay)
	assert.Equal(t, DefaultSessionMaxErrorScore, cfg.session.maxErrors)

	cfg, err = newConfig([]Option{WithTimeouts(Timeouts{MaxWait: Off})})
	require.NoError(t, err)
	assert.Zero(t, cfg.maxWait, "Off: do not wait")

	for says, opt := range map[string]Option{
		"Timeouts.MaxWait -1s":         WithTimeouts(Timeouts{MaxWait: -time.Second}),
		"Timeouts.Redis 0s":            WithTimeouts(Timeouts{Redis: Off}),
		"Rotation.Concurrency 0":       WithRotation(Rotation{Concurrency: Off}),
		"Rotation.FlakyDelay -2ns":     WithRotation(Rotation{FlakyDelay: -2}),
		"Bans.PageProxies 1":           WithBans(Bans{PageProxies: 1}),
		"Bans.Quarantine 0s":           WithBans(Bans{Quarantine: Off}),
		"Sessions.MaxRequests -3":      WithSessions(Sessions{MaxRequests: -3}),
		"Sessions.MaxErrorScore 0.5":   WithSessions(Sessions{MaxErrorScore: 0.5}),
		"Timeouts.Fallback 1ms":        WithTimeouts(Timeouts{Fallback: time.Millisecond}),
		"Sessions.TTL 10ms":            WithSessions(Sessions{TTL: 10 * time.Millisecond}),
		"Rotation.LearnedPacing 48h0m": WithRotation(Rotation{LearnedPacing: 48 * time.Hour}),
	} {
		opts := []Option{opt}
		if says == "Timeouts.Fallback 1ms" {
			opts = append(opts, WithFallback("a", nil))
		}
		_, err := newConfig(opts)
		assert.ErrorIs(t, err, ErrConfig, says)
		assert.ErrorContains(t, err, says)
	}
}
