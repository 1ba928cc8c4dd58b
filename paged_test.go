package proxyswitch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// setPageSize makes every paged or chunked operation use pages of n for
// the rest of the test.
func setPageSize(t *testing.T, n int) {
	old := pageSizeVar.Swap(int64(n))
	t.Cleanup(func() { pageSizeVar.Store(old) })
}

// meteredScripter records the largest script call going through it: its
// ARGV items and its reply's items (what a call of bounded work keeps
// small whatever the pool's size).
type meteredScripter struct {
	redis.Scripter
	maxArgs, maxReply atomic.Int64
	calls             atomic.Int64
}

func (m *meteredScripter) note(cmd *redis.Cmd, args []any) *redis.Cmd {
	m.calls.Add(1)
	for {
		cur := m.maxArgs.Load()
		if int64(len(args)) <= cur || m.maxArgs.CompareAndSwap(cur, int64(len(args))) {
			break
		}
	}
	if v, ok := cmd.Val().([]any); ok {
		for {
			cur := m.maxReply.Load()
			if int64(len(v)) <= cur || m.maxReply.CompareAndSwap(cur, int64(len(v))) {
				break
			}
		}
	}
	return cmd
}

func (m *meteredScripter) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return m.note(m.Scripter.Eval(ctx, script, keys, args...), args)
}

func (m *meteredScripter) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	return m.note(m.Scripter.EvalSha(ctx, sha, keys, args...), args)
}

func (m *meteredScripter) EvalRO(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return m.note(m.Scripter.EvalRO(ctx, script, keys, args...), args)
}

func (m *meteredScripter) EvalShaRO(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	return m.note(m.Scripter.EvalShaRO(ctx, sha, keys, args...), args)
}

// TestAdminCallsBounded (issue 14): with pages forced to 7 entries, every
// admin operation over a pool of 600 proxies (List, Dead, Drain, Revive,
// ProxyStates, a large Replace, the copy of the pool and its re-seed,
// Clear over 20 sites) goes
// in script calls that carry and return a page's worth, never the pool,
// and still gives the whole answer while another worker leases and
// releases on three sites.
func TestAdminCallsBounded(t *testing.T) {
	const n, page = 600, 7 // more than a hash kept as a listpack (512): HSCAN pages it
	setPageSize(t, page)
	ctx := context.Background()
	srv := redistest.Start(t)
	m := &meteredScripter{Scripter: srv.Client(t)}
	s := newSwitch(t, m)
	urls := scaleURLs(0, n)
	ch, err := s.Add(ctx, urls...)
	require.NoError(t, err)
	require.Equal(t, n, ch.Added)

	// Another worker leases and releases meanwhile.
	w := sibling(t, s, srv.Client(t))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var leases atomic.Int64
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				l, err := w.Lease(ctx, fmt.Sprintf("site-%d.example", i))
				if errors.Is(err, ErrEmptyPool) {
					continue
				}
				if !assert.NoError(t, err) {
					return
				}
				leases.Add(1)
				// Replace removes proxies leased meanwhile: their leases are lost.
				if err := l.Release(ctx); !errors.Is(err, ErrLeaseLost) {
					assert.NoError(t, err)
				}
			}
		}()
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	require.Eventually(t, func() bool { return leases.Load() > 30 }, 10*time.Second, time.Millisecond)

	list, err := s.List(ctx)
	require.NoError(t, err)
	assert.Len(t, list, n)

	drain := urls[:520]
	k, err := s.Drain(ctx, "", drain...)
	require.NoError(t, err)
	assert.Equal(t, 520, k)
	dead, err := s.Dead(ctx)
	require.NoError(t, err)
	assert.Len(t, dead, 520)
	states, err := s.ProxyStates(ctx, "site-0.example")
	require.NoError(t, err)
	require.Len(t, states, n)
	drained := 0
	for _, st := range states {
		if st.State == StateDrained {
			drained++
		}
	}
	assert.Equal(t, 520, drained)
	k, err = s.Revive(ctx, "", drain...)
	require.NoError(t, err)
	assert.Equal(t, 520, k)
	dead, err = s.Dead(ctx)
	require.NoError(t, err)
	assert.Empty(t, dead)

	ch, err = s.Replace(ctx, scaleURLs(30, n))
	require.NoError(t, err)
	assert.Equal(t, PoolChange{Added: 30, Removed: 30, Size: n}, ch)
	_, err = s.Drain(ctx, "", urls[40])
	require.NoError(t, err)

	// The copy of the pool, and its re-seed into a Redis that lost it.
	_, err = s.own.redis().refreshSnapshot(ctx)
	require.NoError(t, err)
	require.Equal(t, n, s.own.redis().snapshot().size())
	require.Len(t, s.own.redis().snapshot().dead, 2)
	close(stop)
	wg.Wait()
	stop = make(chan struct{})
	require.NoError(t, srv.Client(t).FlushAll(ctx).Err())
	written, err := s.own.redis().reseed(ctx)
	require.NoError(t, err)
	assert.Equal(t, n, written)
	list, err = s.List(ctx)
	require.NoError(t, err)
	assert.Len(t, list, n)
	dead, err = s.Dead(ctx)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	keys, err := srv.Client(t).Keys(ctx, "*:seed:*").Result()
	require.NoError(t, err)
	assert.Empty(t, keys, "no staged key left")
	assert.EqualValues(t, n, srv.Client(t).ZCard(ctx, s.keys.order()).Val(), "the order came with the pool")

	// Clear, with 20 sites: a site's keys at a time, then the rest.
	rdb := srv.Client(t)
	for i := range 20 {
		site := fmt.Sprintf("gone-%d.example", i)
		require.NoError(t, rdb.ZAdd(ctx, s.keys.sites(), redis.Z{Score: float64(time.Now().UnixMilli()), Member: site}).Err())
		require.NoError(t, rdb.HSet(ctx, s.keys.leases(site), "x:0", "t|1").Err())
		require.NoError(t, rdb.ZAdd(ctx, s.keys.free(site), redis.Z{Score: 1, Member: "x:0"}).Err())
	}
	before := m.calls.Load()
	require.NoError(t, s.Clear(ctx))
	assert.Greater(t, m.calls.Load()-before, int64(10), "Clear of 20 sites in several calls")
	keys, err = rdb.Keys(ctx, "*").Result()
	require.NoError(t, err)
	assert.Equal(t, []string{s.keys.meta()}, keys, "Clear leaves the meta hash alone")

	t.Logf("%d script calls; the largest carried %d ARGV items and returned %d items", m.calls.Load(), m.maxArgs.Load(), m.maxReply.Load())
	// HSCAN's count is a hint: a page may hold a few more entries.
	assert.LessOrEqual(t, m.maxArgs.Load(), int64(5*page+8), "ARGV items of one call")
	assert.LessOrEqual(t, m.maxReply.Load(), int64(13*3*page+8), "reply items of one call")
}
