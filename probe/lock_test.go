package probe_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/internal/testlog"
	"github.com/proxyswitch/proxyswitch/probe"
	"github.com/proxyswitch/proxyswitch/proxyswitchtest"
	"github.com/stretchr/testify/require"
)

// TestCheckerLockHeld: LockHeld is false while no Run holds the pool's
// lock, true (for any Checker of the pool) while one does, false again
// once it gave the lock up; it takes nothing itself, and without Redis it
// is a configuration error.
func TestCheckerLockHeld(t *testing.T) {
	ctx := context.Background()
	prefix := testPrefix()
	farm := proxyswitchtest.NewFarm(t, 2)
	ec := newEcho(t, 0)
	runner := &probe.Checker{Switch: newSwitch(t, prefix), Redis: shared.Client(t), EchoURL: ec.site.URL(),
		Every: time.Hour, Logger: slog.New(slog.NewTextHandler(&testlog.Buffer{}, nil))}
	_, err := runner.Switch.Add(ctx, farm.URLs()...)
	require.NoError(t, err)
	other := &probe.Checker{Switch: newSwitch(t, prefix), Redis: shared.Client(t), EchoURL: ec.site.URL()}

	for _, c := range []*probe.Checker{runner, other} {
		held, err := c.LockHeld(ctx)
		require.NoError(t, err)
		require.False(t, held)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- runner.Run(rctx) }()
	require.Eventually(t, runner.Leader, 5*time.Second, 5*time.Millisecond)
	for _, c := range []*probe.Checker{runner, other} {
		held, err := c.LockHeld(ctx)
		require.NoError(t, err)
		require.True(t, held)
	}
	require.True(t, runner.Leader(), "LockHeld took the lock over")
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	held, err := other.LockHeld(ctx)
	require.NoError(t, err)
	require.False(t, held, "Run gave the lock up")

	_, err = (&probe.Checker{Switch: other.Switch, EchoURL: ec.site.URL()}).LockHeld(ctx)
	require.ErrorIs(t, err, proxyswitch.ErrConfig)
	_, err = (&probe.Checker{Redis: shared.Client(t)}).LockHeld(ctx)
	require.ErrorIs(t, err, proxyswitch.ErrConfig)
}
