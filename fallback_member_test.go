package proxyswitch

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/proxyswitch/proxyswitch/shard"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// drainLocal leases on site from s until it has none left (each lease
// waits at most MaxWait) and returns the IDs of the proxies it got.
func drainLocal(t *testing.T, s *Switch, site string, most int) (ids []string, last error) {
	t.Helper()
	for range most {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		l, err := s.Lease(ctx, site)
		cancel()
		if err != nil {
			return ids, err
		}
		ids = append(ids, l.Proxy().ID())
	}
	return ids, nil
}

// The reviewer's TestFallbackJoinThenRedisDies: B joins while A's last
// member list is [A] (A shares by it: the whole pool) and Redis dies before
// A reads a list naming B. B must take no share then; once A has seen B
// (A's heartbeat acknowledged a list naming B), both take their halves.
// Whatever the timing, the two local shards never hold one proxy.
func TestFallbackNewcomerWaitsUntilSeen(t *testing.T) {
	for _, tc := range []struct {
		name    string
		settled bool // wait until B is seen before Redis dies
	}{{"unseen", false}, {"seen", true}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			opts := func(self string) []Option {
				return []Option{WithFallback(self, nil),
					WithTimeouts(Timeouts{Fallback: 300 * time.Millisecond, Attempt: 600 * time.Millisecond, MaxWait: 1500 * time.Millisecond}),
					WithMembership(shard.MemberConfig{Heartbeat: 400 * time.Millisecond, TTL: 2 * time.Second})}
			}
			a := newSwitch(t, srv.Client(t), opts("A")...)
			b := newSwitch(t, srv.Client(t), append(opts("B"), WithPrefix(a.cfg.prefix))...)
			_, err := a.Add(context.Background(), proxyURLs(4)...)
			require.NoError(t, err)
			startSwitch(t, a)
			require.Eventually(t, func() bool { return a.FallbackStatus().Share == 4 }, 5*time.Second, 10*time.Millisecond,
				"A alone, seen by itself: the whole pool")
			startSwitch(t, b)
			if tc.settled {
				require.Eventually(t, func() bool { return b.FallbackStatus().Share == 2 && a.FallbackStatus().Share == 2 },
					10*time.Second, 10*time.Millisecond, "B seen by A: the halves")
			} else {
				assert.Zero(t, b.FallbackStatus().Share, "B just joined: A has not seen it")
			}
			t.Logf("before the outage: A %v share %d, B %v share %d", a.FallbackStatus().Members, a.FallbackStatus().Share,
				b.FallbackStatus().Members, b.FallbackStatus().Share)
			require.NoError(t, srv.Kill())

			idsA, errA := drainLocal(t, a, "shop.example", 5)
			idsB, errB := drainLocal(t, b, "shop.example", 5)
			t.Logf("A leased %v (then %v); B leased %v (then %v)", idsA, errA, idsB, errB)
			assert.Equal(t, modeLocal.String(), a.FallbackStatus().Mode)
			assert.Equal(t, modeLocal.String(), b.FallbackStatus().Mode)
			require.ErrorIs(t, errA, ErrNoProxy)
			require.ErrorIs(t, errB, ErrNoProxy)
			for _, id := range idsB {
				assert.NotContains(t, idsA, id, "two servers hold one proxy")
			}
			if tc.settled {
				assert.Len(t, idsA, 2)
				assert.Len(t, idsB, 2)
			} else if len(idsB) == 0 {
				assert.True(t, errors.Is(errB, ErrNoProxy))
				assert.Contains(t, errB.Error(), "not every other server has read a list naming it")
			}
		})
	}
}

// slowRedis delays every command of a client while on is set: Redis slower
// for that server than its fallback timeout, faster than its Redis timeout
// (heartbeats get through, lease calls do not).
type slowRedis struct{ on *atomic.Bool }

func (h slowRedis) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h slowRedis) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.on.Load() {
			select {
			case <-time.After(500 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return next(ctx, cmd)
	}
}
func (h slowRedis) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestFallbackLocalServerPinsItsAck: a server leasing from its local shard
// whose heartbeats still get through (Redis slow for it alone) acknowledges
// no member list later than the one its share was cut from: a newcomer is
// not seen by it, takes no share, and when Redis then dies the two local
// shards never hold one proxy (the reviewer's TestH69LocalServerAcksNewcomer:
// B settled by A's acknowledgements and both leased the same proxies).
func TestFallbackLocalServerPinsItsAck(t *testing.T) {
	srv := redistest.Start(t)
	opts := func(self string) []Option {
		return []Option{WithFallback(self, nil),
			WithTimeouts(Timeouts{Fallback: 300 * time.Millisecond, Attempt: 600 * time.Millisecond, MaxWait: 1500 * time.Millisecond}),
			WithMembership(shard.MemberConfig{Heartbeat: 400 * time.Millisecond, TTL: 2 * time.Second})}
	}
	var slow atomic.Bool
	ca := srv.Client(t)
	ca.AddHook(slowRedis{&slow})
	a := newSwitch(t, ca, opts("A")...)
	b := newSwitch(t, srv.Client(t), append(opts("B"), WithPrefix(a.cfg.prefix))...)
	_, err := a.Add(context.Background(), proxyURLs(4)...)
	require.NoError(t, err)
	startSwitch(t, a)
	require.Eventually(t, func() bool { return a.FallbackStatus().Share == 4 }, 5*time.Second, 10*time.Millisecond)
	slow.Store(true)
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if l, err := a.Lease(ctx, "warm.example"); err == nil {
			_ = l.Release(ctx)
		}
		return a.FallbackStatus().Mode == modeLocal.String()
	}, 10*time.Second, 50*time.Millisecond, "A on its local shard")
	startSwitch(t, b)
	// Several heartbeats of both: A's get through (slowly) all along.
	time.Sleep(2500 * time.Millisecond)
	assert.Zero(t, b.FallbackStatus().Share, "B is not seen by A, whose shard is cut from a list without it")
	t.Logf("before the outage: A %s %v share %d; B %s %v share %d", a.FallbackStatus().Mode, a.FallbackStatus().Members, a.FallbackStatus().Share,
		b.FallbackStatus().Mode, b.FallbackStatus().Members, b.FallbackStatus().Share)
	require.NoError(t, srv.Kill())
	idsA, errA := drainLocal(t, a, "shop.example", 5)
	idsB, errB := drainLocal(t, b, "shop.example", 5)
	t.Logf("A (%s) leased %v (then %v); B (%s) leased %v (then %v)", a.FallbackStatus().Mode, idsA, errA, b.FallbackStatus().Mode, idsB, errB)
	for _, id := range idsB {
		assert.NotContains(t, idsA, id, "two servers hold one proxy")
	}
}
