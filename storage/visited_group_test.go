package storage

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// visitedTrips counts a client's round trips of the visited check (a lone
// HMGET, HSETNX or script call, or a pipeline) and the commands they carry,
// and delays each, so that concurrent callers pile up behind the one in
// flight.
type visitedTrips struct {
	trips, cmds, pipelines atomic.Int64
	maxKeys                atomic.Int64 // the most distinct keys one pipeline touched
	delay                  time.Duration
}

// visitedKeyOf is the key a command of the visited check touches.
func visitedKeyOf(cmd redis.Cmder) any {
	args, i := cmd.Args(), 1
	if name := strings.ToLower(cmd.Name()); name == "evalsha" || name == "eval" {
		i = 3 // EVALSHA sha 1 key field ...
	}
	if len(args) <= i {
		return nil
	}
	return args[i]
}

func (h *visitedTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func visitedCmd(cmd redis.Cmder) bool {
	switch strings.ToLower(cmd.Name()) {
	case "hmget", "hsetnx", "evalsha", "eval":
		return true
	}
	return false
}

func (h *visitedTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if visitedCmd(cmd) {
			h.trips.Add(1)
			h.cmds.Add(1)
			time.Sleep(h.delay)
		}
		return next(ctx, cmd)
	}
}

func (h *visitedTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		n, keys := 0, map[any]bool{}
		for _, c := range cmds {
			if visitedCmd(c) {
				n++
				keys[visitedKeyOf(c)] = true
			}
		}
		for m := h.maxKeys.Load(); int64(len(keys)) > m && !h.maxKeys.CompareAndSwap(m, int64(len(keys))); {
			m = h.maxKeys.Load()
		}
		if n > 0 {
			h.trips.Add(1)
			h.pipelines.Add(1)
			h.cmds.Add(int64(n))
			time.Sleep(h.delay)
		}
		return next(ctx, cmds)
	}
}

// onAll runs f(store, i) for i in [0, n) on n goroutines per Storage, all
// released at once (store k's goroutines get k*n+i).
func onAll(ss []*Storage, n int, f func(s *Storage, i int)) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for k, s := range ss {
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				f(s, k*n+i)
			}()
		}
	}
	close(start)
	wg.Wait()
}

// TestVisitedCallsShareRoundTrips: IsVisited and Visited calls made at the
// same time by many goroutines share round trips (pipelines), on two
// Storages of one namespace on clients of their own, and each caller still
// gets its own answer: "visited" for the IDs marked before, "not visited"
// for the others, and of the callers racing to claim one ID exactly one
// wins, with and without a TTL.
func TestVisitedCallsShareRoundTrips(t *testing.T) {
	for _, ttl := range []time.Duration{0, time.Minute} {
		t.Run("ttl="+ttl.String(), func(t *testing.T) {
			const perStore, stores = 40, 2
			const total = perStore * stores
			hooks := make([]*visitedTrips, stores)
			ss := make([]*Storage, stores)
			for i := range ss {
				rdb := shared.Client(t)
				hooks[i] = &visitedTrips{delay: 20 * time.Millisecond}
				rdb.AddHook(hooks[i])
				if i == 0 {
					ss[i] = newStorage(t, rdb, WithVisitedTTL(ttl), WithVisitedBuckets(64))
				} else {
					ss[i] = twin(t, ss[0], rdb)
				}
			}
			count := func() (trips, cmds, pipelines int64) {
				for _, h := range hooks {
					trips += h.trips.Swap(0)
					cmds += h.cmds.Swap(0)
					pipelines += h.pipelines.Swap(0)
				}
				return
			}
			// IDs spread over the buckets; the even ones marked beforehand.
			id := func(i int) uint64 { return uint64(i+1) * 0x9e3779b97f4a7c15 }
			for i := 0; i < total; i += 2 {
				require.NoError(t, ss[i%stores].Visited(id(i)))
			}

			count()
			onAll(ss, perStore, func(s *Storage, i int) {
				v, err := s.IsVisited(id(i))
				assert.NoError(t, err)
				assert.Equal(t, i%2 == 0, v, "IsVisited of ID %d", i)
			})
			reads, readCmds, readPipes := count()

			// Each odd ID is claimed by two goroutines of each Storage.
			var won, lost sync.Map
			onAll(ss, perStore, func(s *Storage, i int) {
				k := 2*(i%perStore/2) + 1 // 4 callers per odd ID, 2 on each Storage
				err := s.Visited(id(k))
				switch {
				case err == nil:
					if _, dup := won.LoadOrStore(k, i); dup {
						t.Errorf("ID %d claimed twice", k)
					}
				case errors.Is(err, ErrAlreadyVisited):
					n, _ := lost.LoadOrStore(k, new(atomic.Int64))
					n.(*atomic.Int64).Add(1)
				default:
					t.Error(err)
				}
			})
			claims, claimCmds, claimPipes := count()
			for k := 1; k < total/2; k += 2 {
				_, ok := won.Load(k)
				assert.True(t, ok, "no caller claimed ID %d", k)
				n, ok := lost.Load(k)
				if assert.True(t, ok, "no caller lost ID %d", k) {
					assert.EqualValues(t, 3, n.(*atomic.Int64).Load(), "callers refused ID %d", k)
				}
			}
			for i := range total {
				v, err := ss[i%stores].IsVisited(id(i))
				require.NoError(t, err)
				require.Equal(t, i%2 == 0 || i < total/2, v, "IsVisited of ID %d after the claims", i)
			}

			t.Logf("%d reads: %d round trips (%d pipelines) carrying %d commands; %d claims: %d round trips (%d pipelines), %d commands",
				total, reads, readPipes, readCmds, total, claims, claimPipes, claimCmds)
			// Unbatched, each call is at least one round trip; batched, each
			// Storage needs about two (the first caller alone, then everyone
			// who arrived meanwhile). A script a caller runs alone (a read
			// that found a mark with an expiry, a claim without a TTL that
			// found the mark present) is one round trip of one command, so
			// only the round trips beyond them count.
			batched := func(trips, cmds int64) int64 { return trips - (cmds - total) }
			require.Less(t, batched(reads, readCmds), int64(total/4))
			require.Less(t, batched(claims, claimCmds), int64(total/4))
			require.Greater(t, readPipes, int64(0))
			require.Greater(t, claimPipes, int64(0))
			if ttl > 0 {
				require.Less(t, claims, int64(total/4)) // every claim is the pipelined script
			} else {
				require.EqualValues(t, total, readCmds) // no mark with an expiry
			}
		})
	}
}

// TestVisitedBatchErrors: a damaged bucket fails, with ErrCorrupt naming
// it, only the callers of a shared pipeline whose IDs live there; the
// others get their answers. A batch whose round trip fails (Redis gone)
// fails each of its callers with ErrRedis.
func TestVisitedBatchErrors(t *testing.T) {
	rdb := shared.Client(t)
	rdb.AddHook(&visitedTrips{delay: 20 * time.Millisecond})
	s := newStorage(t, rdb, WithVisitedBuckets(2))
	bad := s.keys.bucket(0)
	require.NoError(t, rdb.Set(bg, bad, "x", 0).Err())
	const n = 40
	check := func(err error, i int) {
		t.Helper()
		if i%2 == 1 {
			assert.NoError(t, err, "ID %d", i)
			return
		}
		if assert.ErrorIs(t, err, ErrCorrupt, "ID %d", i) {
			assert.Contains(t, err.Error(), bad)
		}
	}
	onAll([]*Storage{s}, n, func(s *Storage, i int) {
		v, err := s.IsVisited(uint64(i))
		check(err, i)
		assert.False(t, v)
	})
	onAll([]*Storage{s}, n, func(s *Storage, i int) { check(s.Visited(uint64(i)), i) })

	// A client of a server that is gone: every caller fails with ErrRedis.
	gone := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = gone.Close() })
	g, err := New(gone, WithNamespace(s.cfg.namespace), WithRedisTimeout(time.Second))
	require.NoError(t, err)
	onAll([]*Storage{g}, n, func(g *Storage, i int) {
		_, err := g.IsVisited(uint64(i))
		assert.ErrorIs(t, err, ErrRedis)
		assert.ErrorIs(t, g.Visited(uint64(i)), ErrRedis)
	})
}

// TestVisitedBatchOneShardDown: on a Ring (or Cluster) client a pipeline
// spans nodes, and a node that fails takes only its own commands down.
// With one of two shards unreachable, every ID whose bucket lives on the
// live shard answers in a batch as it does alone, and a claim made there
// is reported made (not failed while its mark is set: Colly would drop the
// request, and a retry would find the URL visited); IDs of the dead shard
// fail with ErrRedis.
func TestVisitedBatchOneShardDown(t *testing.T) {
	for _, ttl := range []time.Duration{0, time.Hour} {
		t.Run("ttl="+ttl.String(), func(t *testing.T) {
			newRing := func() *redis.Ring {
				ring := redis.NewRing(&redis.RingOptions{
					Addrs:              map[string]string{"live": single.Addr(), "dead": "127.0.0.1:1"},
					HeartbeatFrequency: time.Hour, // both shards stay in the ring
					MaxRetries:         -1,
					DialTimeout:        50 * time.Millisecond,
					DialerRetries:      1, // the dead shard refuses at once
					DialerRetryTimeout: time.Millisecond,
				})
				t.Cleanup(func() { _ = ring.Close() })
				return ring
			}
			ns := testNS()
			// Which IDs work alone (their bucket on the live shard): asked
			// one by one on a ring of the same shards, without the delay.
			alone, err := New(newRing(), WithNamespace(ns), WithVisitedBuckets(64), WithVisitedTTL(ttl))
			require.NoError(t, err)
			const n = 60
			live := map[int]bool{}
			for i := range n {
				if _, err := alone.IsVisited(uint64(i)); err == nil {
					live[i] = true
				} else {
					require.ErrorIs(t, err, ErrRedis)
				}
			}
			ring := newRing()
			trips := &visitedTrips{delay: 20 * time.Millisecond}
			ring.AddHook(trips)
			s, err := New(ring, WithNamespace(ns), WithVisitedBuckets(64), WithVisitedTTL(ttl))
			require.NoError(t, err)
			require.NotEmpty(t, live)
			require.Less(t, len(live), n)

			pipes := trips.pipelines.Load()
			var wrong atomic.Int64
			onAll([]*Storage{s}, n, func(s *Storage, i int) {
				v, err := s.IsVisited(uint64(i))
				if live[i] != (err == nil) || v || (err != nil && !errors.Is(err, ErrRedis)) {
					wrong.Add(1)
					t.Errorf("IsVisited(%d) in a batch = %v, %v (live shard: %v)", i, v, err, live[i])
				}
			})
			onAll([]*Storage{s}, n, func(s *Storage, i int) {
				err := s.Visited(uint64(i))
				if live[i] != (err == nil) || (err != nil && !errors.Is(err, ErrRedis)) {
					wrong.Add(1)
					t.Errorf("Visited(%d) in a batch = %v (live shard: %v)", i, err, live[i])
				}
			})
			assert.Greater(t, trips.pipelines.Load(), pipes, "the calls shared pipelines")
			assert.Zero(t, wrong.Load())
			for i := range live {
				v, err := s.IsVisited(uint64(i))
				require.NoError(t, err)
				require.True(t, v, "ID %d claimed in a batch", i)
			}
		})
	}
}
