package proxyswitch

import (
	"context"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The reviewer's TestFallbackRestartEmpty/WithData: a ban learnt on the
// local shard and written back shows in Redis as a live ban does,
// quarantined with its strike on record (not cooling), whether Redis came
// back empty or with its data, so that the proxy's next strike doubles on
// from it.
func TestFallbackWritebackBanIsQuarantine(t *testing.T) {
	for _, restart := range []bool{true, false} {
		name := map[bool]string{true: "restarted_empty", false: "paused"}[restart]
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			srv := redistest.Start(t)
			rdb := srv.Client(t)
			s := newSwitch(t, rdb, fastFallback("A")...)
			_, err := s.Add(ctx, proxyURLs(4)...)
			require.NoError(t, err)
			startSwitch(t, s)
			if restart {
				require.NoError(t, srv.Kill())
			} else {
				require.NoError(t, srv.Pause())
			}
			l, err := s.Lease(ctx, "shop.example")
			require.NoError(t, err)
			require.NotNil(t, l.local)
			banned := l.Proxy().ID()
			require.NoError(t, l.Report(ctx, ban.Verdict{Kind: ban.Ban, Reason: ban.ReasonChallenge}))
			if restart {
				require.NoError(t, srv.Restart())
			} else {
				require.NoError(t, srv.Resume())
			}
			waitMode(t, s, modeBroker, 10*time.Second)
			assert.Equal(t, 1, s.FallbackStatus().BansWritten)

			st, err := s.SiteState(ctx, "shop.example")
			require.NoError(t, err)
			assert.Equal(t, 1, st.Quarantined, "the written-back ban is a quarantine: %+v", st)
			assert.Zero(t, st.Cooling, "%+v", st)
			states, err := s.ProxyStates(ctx, "shop.example")
			require.NoError(t, err)
			var first time.Time
			for _, ps := range states {
				if ps.Proxy.ID() == banned {
					assert.Equal(t, StateQuarantined, ps.State)
					assert.Equal(t, 1, ps.Strikes, "its strike is on record")
					first = ps.Until
				}
			}
			require.False(t, first.IsZero())
			rec, err := rdb.HGet(ctx, s.keys.strikes(s.scopeOf("shop.example")), banned).Result()
			require.NoError(t, err)
			assert.Regexp(t, `^1\|\d+\|\d+$`, rec)

			// A ban while the written-back one runs is the same offence, as
			// for a live ban (penalize.lua): the run stays, the end stays.
			require.NoError(t, s.Ban(ctx, banned, "shop.example", time.Second))
			states, err = s.ProxyStates(ctx, "shop.example")
			require.NoError(t, err)
			for _, ps := range states {
				if ps.Proxy.ID() == banned {
					assert.Equal(t, StateQuarantined, ps.State)
					assert.Equal(t, 1, ps.Strikes)
					assert.False(t, ps.Until.Before(first.Add(-time.Second)), "not shortened: %v, was %v", ps.Until, first)
				}
			}
		})
	}
}
