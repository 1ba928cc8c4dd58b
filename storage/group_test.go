package storage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// slowScripts counts a client's script calls and delays each, so that
// concurrent callers pile up behind the one in flight.
type slowScripts struct {
	n     atomic.Int64
	delay time.Duration
}

func (h *slowScripts) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *slowScripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *slowScripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := strings.ToLower(cmd.Name()); name == "evalsha" || name == "eval" {
			h.n.Add(1)
			time.Sleep(h.delay)
		}
		return next(ctx, cmd)
	}
}

// TestQueueCallsShareRoundTrips: AddRequest, GetRequest and Ack calls made
// at the same time by many goroutines share script round trips (group
// commit), on two Storages of one namespace on clients of their own, and
// every request is still delivered exactly once and acknowledged.
func TestQueueCallsShareRoundTrips(t *testing.T) {
	const perStore, stores = 40, 2
	hooks := make([]*slowScripts, stores)
	ss := make([]*Storage, stores)
	for i := range ss {
		rdb := shared.Client(t)
		hooks[i] = &slowScripts{delay: 20 * time.Millisecond}
		rdb.AddHook(hooks[i])
		if i == 0 {
			ss[i] = newStorage(t, rdb, WithPollInterval(time.Millisecond))
		} else {
			ss[i] = twin(t, ss[0], rdb)
		}
	}
	calls := func() int64 {
		var n int64
		for _, h := range hooks {
			n += h.n.Swap(0)
		}
		return n
	}
	// all runs f(store, i) on perStore goroutines per Storage at once.
	all := func(f func(s *Storage, i int)) { onAll(ss, perStore, f) }
	const total = perStore * stores

	calls()
	all(func(s *Storage, i int) {
		assert.NoError(t, s.AddRequest(marshal(t, fmt.Sprintf("https://a.example/%d", i))))
	})
	adds := calls()

	var mu sync.Mutex
	urls := map[string]int{}
	toks := make([]string, total)
	all(func(s *Storage, i int) {
		for {
			b, err := s.GetRequest()
			if errors.Is(err, ErrQueueEmpty) {
				continue // empty for a moment: another batch took the rest
			}
			if !assert.NoError(t, err) {
				return
			}
			var m struct {
				URL string
				Ctx map[string]any
			}
			assert.NoError(t, json.Unmarshal(b, &m))
			tok, _ := m.Ctx[ctxDelivery].(string)
			u := m.URL
			mu.Lock()
			urls[u]++
			toks[i] = tok
			mu.Unlock()
			return
		}
	})
	pops := calls()
	require.Len(t, urls, total)
	for u, n := range urls {
		require.Equal(t, 1, n, u)
	}

	all(func(s *Storage, i int) {
		ctx := colly.NewContext()
		ctx.Put(ctxDelivery, toks[i])
		assert.NoError(t, s.Ack(&colly.Request{Ctx: ctx}))
	})
	acks := calls()
	st, err := ss[0].Stats(bg)
	require.NoError(t, err)
	require.Equal(t, Stats{}, st)

	t.Logf("%d requests: the hook saw %d add, %d pop, %d ack script commands", total, adds, pops, acks)
	// Unbatched, the hook sees at least total of each (160 of 80 before
	// group commit); batched, each Storage needs about two
	// per kind (the first caller alone, then everyone who arrived).
	require.Less(t, adds, int64(total/4))
	require.Less(t, pops, int64(total/4))
	require.Less(t, acks, int64(total/4))
}

// stackHook records whether each command ran on the goroutine of a
// function named caller (inline) or on another one (a watchdog's).
type stackHook struct {
	caller          string
	inline, spawned atomic.Int64
}

func (h *stackHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *stackHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *stackHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		buf := make([]byte, 1<<16)
		if strings.Contains(string(buf[:runtime.Stack(buf, false)]), h.caller) {
			h.inline.Add(1)
		} else {
			h.spawned.Add(1)
		}
		return next(ctx, cmd)
	}
}

// TestRoundTripsInline: on a client that honours context deadlines
// (ContextTimeoutEnabled) every round trip of the visited check and the
// queue runs on the caller's goroutine, none on a goroutine of its own; on
// a default client each runs on a watchdog goroutine (go-redis would
// ignore the deadline).
func TestRoundTripsInline(t *testing.T) {
	for _, ctxTimeout := range []bool{true, false} {
		rdb := shared.Client(t)
		if ctxTimeout {
			if c, ok := rdb.(*redis.Client); ok {
				o := c.Options()
				o.ContextTimeoutEnabled = true
				rdb = redis.NewClient(o)
				t.Cleanup(func() { _ = rdb.Close() })
			} else {
				t.Skip("a cluster client: the check is the same code")
			}
		}
		h := &stackHook{caller: "storage.TestRoundTripsInline"}
		rdb.AddHook(h)
		s := newStorage(t, rdb)
		h.inline.Store(0)
		h.spawned.Store(0)
		v, err := s.IsVisited(7)
		require.NoError(t, err)
		require.False(t, v)
		require.NoError(t, s.Visited(7))
		require.NoError(t, s.AddRequest(marshal(t, "https://a.example/")))
		tok, _ := pop(t, s)
		ctx := colly.NewContext()
		ctx.Put(ctxDelivery, tok)
		require.NoError(t, s.Ack(&colly.Request{Ctx: ctx}))
		// At least five commands (an EVALSHA of a script Redis has not
		// loaded yet is followed by an EVAL).
		if ctxTimeout {
			require.GreaterOrEqual(t, h.inline.Load(), int64(5))
			require.Zero(t, h.spawned.Load())
		} else {
			require.Zero(t, h.inline.Load())
			require.GreaterOrEqual(t, h.spawned.Load(), int64(5))
		}
	}
}
