package storage

import (
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// lagProxy forwards TCP connections to a Redis server and holds each reply
// chunk (server to client) back by lag before passing it on, in order: a
// slow network, on which a command reaches Redis and runs but its reply
// comes after the client's timeout.
type lagProxy struct {
	ln  net.Listener
	lag atomic.Int64 // nanoseconds
}

func newLagProxy(t testing.TB, target string) *lagProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &lagProxy{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c, target)
		}
	}()
	t.Cleanup(func() { _ = ln.Close() })
	return p
}

func (p *lagProxy) addr() string { return p.ln.Addr().String() }

func (p *lagProxy) serve(c net.Conn, target string) {
	s, err := net.Dial("tcp", target)
	if err != nil {
		_ = c.Close()
		return
	}
	go func() { _, _ = io.Copy(s, c); _ = s.Close() }()
	type chunk struct {
		at time.Time
		b  []byte
	}
	ch := make(chan chunk, 1024)
	go func() {
		defer c.Close()
		for k := range ch {
			time.Sleep(time.Until(k.at))
			if _, err := c.Write(k.b); err != nil {
				return
			}
		}
	}()
	defer close(ch)
	buf := make([]byte, 64<<10)
	for {
		n, err := s.Read(buf)
		if n > 0 {
			ch <- chunk{time.Now().Add(time.Duration(p.lag.Load())), append([]byte(nil), buf[:n]...)}
		}
		if err != nil {
			return
		}
	}
}

// redisNowMs is Redis's clock in unix ms.
func redisNowMs(t testing.TB, rdb redis.UniversalClient) float64 {
	t.Helper()
	now, err := rdb.Time(bg).Result()
	require.NoError(t, err)
	return float64(now.UnixMilli())
}

// A GetRequest whose reply is lost (the network is slower than the Redis
// timeout) did run its pop in Redis; the Storage's next GetRequest sends
// the same pop ID again and gets the same delivery, which is not counted
// again. Before, each lost reply spent a delivery, and after
// WithMaxDeliveries of them the request went to the dead-letter list
// without ever being fetched (the review's TestSlowNetworkPhantomDeliveries).
//
// Not timing-fragile: replies come 700 ms late against a 100 ms timeout,
// and each round waits until Redis shows the pop ran and its visibility
// timeout passed, however slow the machine.
func TestLostPopRepliesSpendNoDelivery(t *testing.T) {
	// A client without ContextTimeoutEnabled: the call that timed out
	// leaves its command running on its connection (storage's watchdog),
	// so every pop reaches Redis whatever the lag. (With it, go-redis drops
	// the connection and a new one's handshake under the lag outlasts the
	// timeout too, so later pops may never be sent: nothing to test.)
	for _, cte := range []bool{false} {
		t.Run("ContextTimeoutEnabled="+strconv.FormatBool(cte), func(t *testing.T) {
			const vis = 300 * time.Millisecond
			rdb := single.Client(t)
			site := newCountingSite(t, nil)
			opts := []Option{WithVisibilityTimeout(vis), WithMaxDeliveries(2), WithPollInterval(10 * time.Millisecond)}
			s := newStorage(t, rdb, opts...)
			require.NoError(t, s.AddRequest(marshal(t, site.URL+"/only")))
			require.NoError(t, qPopScript.Load(bg, rdb).Err()) // the slow client's EVALSHA finds it

			px := newLagProxy(t, single.Addr())
			slowRdb := single.Client(t, func(o *redis.Options) {
				o.Addr, o.MaxRetries, o.ContextTimeoutEnabled = px.addr(), -1, cte
				o.PoolSize, o.MinIdleConns = 8, 6
			})
			slow, err := New(slowRdb, append([]Option{WithNamespace(s.cfg.namespace), WithRedisTimeout(100 * time.Millisecond)}, opts...)...)
			require.NoError(t, err)
			require.NoError(t, slow.Init())
			// Connections made before the lag: a connection's handshake
			// under it would outlast the timeout, and a client that honours
			// deadlines drops the connection of each call that timed out.
			require.Eventually(t, func() bool { return slowRdb.PoolStats().IdleConns >= 6 }, 10*time.Second, 10*time.Millisecond)
			px.lag.Store(int64(700 * time.Millisecond))

			deadline := func() (float64, bool) {
				v, err := rdb.ZScore(bg, s.q.inflight, "1").Result()
				if err == redis.Nil {
					return 0, false
				}
				require.NoError(t, err)
				return v, true
			}
			prev, prevOK := deadline()
			for round := 1; round <= 3; round++ {
				if prevOK { // wait out the visibility timeout of the last pop
					require.Eventually(t, func() bool { return redisNowMs(t, rdb) > prev }, 10*time.Second, 20*time.Millisecond)
				}
				_, err := slow.GetRequest()
				require.ErrorIs(t, err, ErrRedis, "round %d: the reply came in time", round)
				// Wait until the pop has run in Redis: the deadline moved (or
				// the request left the in-flight set: dead-lettered).
				require.Eventually(t, func() bool {
					v, ok := deadline()
					return ok != prevOK || v != prev
				}, 10*time.Second, 10*time.Millisecond, "round %d: the pop never ran", round)
				prev, prevOK = deadline()
				tries, _ := rdb.HGet(bg, s.q.tries, "1").Result()
				t.Logf("round %d: lost reply; in flight %v, tries %q", round, prevOK, tries)
			}
			tries, err := rdb.HGet(bg, s.q.tries, "1").Result()
			require.NoError(t, err)
			n, _, _ := strings.Cut(tries, "|")
			require.Equal(t, "1", n, "lost replies counted as deliveries (tries %q)", tries)
			st, err := s.Stats(bg)
			require.NoError(t, err)
			require.Equal(t, Stats{InFlight: 1}, st)

			// A healthy worker gets it once the last lost delivery's
			// visibility timeout passes, and fetches it.
			runQueue(t, s, 2, nil)
			require.Equal(t, 1, site.count("/only"))
			st, err = s.Stats(bg)
			require.NoError(t, err)
			require.Equal(t, Stats{}, st)
		})
	}
}

// A URL queued twice: a worker takes the first entry and dies before its
// fetch starts; another worker fetches the second entry; when the first
// comes back (delivery 2) it finds the mark the second set and is
// acknowledged as a duplicate, not fetched again. The same when the URL
// was fetched by a direct Visit. Before, any delivery numbered above 1 was
// let through the mark. A delivery whose own request set the mark (its
// worker died after the claim) is still fetched again: see
// TestOwnMarkLetsRedeliveryThrough.
func TestNoRefetchAfterCrashBeforeFetch(t *testing.T) {
	for _, variant := range []string{"queued twice", "direct Visit"} {
		t.Run(variant, func(t *testing.T) {
			const vis = 300 * time.Millisecond
			site := newCountingSite(t, nil)
			live := newStorage(t, shared.Client(t), WithVisibilityTimeout(vis), WithPollInterval(10*time.Millisecond))
			dead := twin(t, live, shared.Client(t))
			x := site.URL + "/x"
			n := 1
			if variant == "queued twice" {
				n = 2
			}
			for range n {
				require.NoError(t, live.AddRequest(marshal(t, x)))
			}
			_, err := dead.GetRequest() // and its worker dies before Colly starts it
			require.NoError(t, err)
			if variant == "direct Visit" {
				c := colly.NewCollector()
				require.NoError(t, c.SetStorage(live))
				require.NoError(t, c.Visit(x))
			}
			runQueue(t, live, 2, nil)
			require.Equal(t, 1, site.count("/x"), "fetched again")
			st, err := live.Stats(bg)
			require.NoError(t, err)
			require.Equal(t, Stats{}, st)
		})
	}
}

// A delivery whose own request's earlier delivery claimed the URL and died
// before its fetch (or failed) is let through the mark and fetched, and a
// requeued dead letter whose URL its own earlier delivery claimed is
// fetched again rather than dropped as visited.
func TestOwnMarkLetsRedeliveryThrough(t *testing.T) {
	const vis = 300 * time.Millisecond
	site := newCountingSite(t, nil)
	s := newStorage(t, shared.Client(t), WithVisibilityTimeout(vis), WithPollInterval(10*time.Millisecond),
		WithMaxDeliveries(1))
	other := twin(t, s, shared.Client(t))
	x := site.URL + "/own"
	require.NoError(t, s.AddRequest(marshal(t, x)))
	_, err := other.GetRequest()
	require.NoError(t, err)
	// The other worker's Colly claims the URL for the delivery, as it does
	// before a fetch, and the worker dies.
	h, ok := requestHash(wireRequest{URL: x})
	require.True(t, ok)
	visited, err := other.IsVisited(h)
	require.NoError(t, err)
	require.False(t, visited)
	require.NoError(t, other.Visited(h))
	// Its last delivery times out: dead-lettered; the operator requeues it.
	require.Eventually(t, func() bool {
		_, err := s.GetRequest()
		require.ErrorIs(t, err, ErrQueueEmpty)
		st, err := s.Stats(bg)
		require.NoError(t, err)
		return st.Dead == 1
	}, 10*time.Second, 20*time.Millisecond)
	require.NoError(t, s.Requeue(bg, "1"))
	runQueue(t, s, 2, nil)
	require.Equal(t, 1, site.count("/own"), "its own mark refused it")
	st, err := s.Stats(bg)
	require.NoError(t, err)
	require.Equal(t, Stats{}, st)
}

// After Requeue the request's next delivery is again its first, but its
// token differs from the earlier deliveries': a stuck worker's late Ack of
// an earlier delivery does not settle the requeued one. Before, both were
// "1:1", and the late Ack took the requeued request out of the queue while
// it ran; its failure was then ignored and the URL lost.
func TestStaleAckAfterRequeue(t *testing.T) {
	s := newStorage(t, shared.Client(t), WithVisibilityTimeout(200*time.Millisecond), WithMaxDeliveries(1),
		WithRetryDelay(time.Hour), WithPollInterval(10*time.Millisecond))
	other := twin(t, s, shared.Client(t))
	require.NoError(t, s.AddRequest(marshal(t, "http://a.example/1")))
	stuck, _ := pop(t, s)
	require.Eventually(t, func() bool {
		_, err := other.GetRequest()
		require.ErrorIs(t, err, ErrQueueEmpty)
		st, err := other.Stats(bg)
		require.NoError(t, err)
		return st.Dead == 1
	}, 10*time.Second, 20*time.Millisecond)
	require.NoError(t, other.Requeue(bg, "1"))
	fresh, _ := pop(t, other)
	require.Equal(t, delivered(stuck), delivered(fresh))

	require.NoError(t, s.settle(stuck, nil)) // late: stale
	st, err := other.Stats(bg)
	require.NoError(t, err)
	require.Equal(t, Stats{InFlight: 1}, st, "the late Ack settled the requeued delivery")
	require.NoError(t, other.settle(fresh, errors.New("503")))
	st, err = other.Stats(bg)
	require.NoError(t, err)
	require.Equal(t, Stats{Dead: 1}, st, "the requeued delivery's failure was lost")
	require.NotEqual(t, stuck, fresh)
}

// A Redis that restarts empty hands out request IDs from 1 again. A worker
// still holding a delivery of the old queue must not settle the new
// queue's request 1 with its late Ack.
func TestStaleAckAfterEmptyRestart(t *testing.T) {
	s := newStorage(t, shared.Client(t), WithRetryDelay(time.Millisecond), WithPollInterval(10*time.Millisecond))
	other := twin(t, s, shared.Client(t))
	require.NoError(t, s.AddRequest(marshal(t, "http://old.example/1")))
	old, _ := pop(t, s)
	require.NoError(t, other.Clear(bg)) // the namespace's data is gone, as after an empty restart
	require.NoError(t, other.Init())
	require.NoError(t, other.AddRequest(marshal(t, "http://new.example/1")))
	fresh, u := pop(t, other)
	require.Equal(t, "http://new.example/1", u)
	require.Equal(t, delivered(old), delivered(fresh))

	require.NoError(t, s.settle(old, nil)) // late: stale
	st, err := other.Stats(bg)
	require.NoError(t, err)
	require.Equal(t, Stats{InFlight: 1}, st, "the old worker's Ack settled the new request")
	require.NoError(t, other.settle(fresh, errors.New("503"))) // retried
	require.Eventually(t, func() bool {
		_, u, ok := tryPop(t, other)
		return ok && u == "http://new.example/1"
	}, 10*time.Second, 10*time.Millisecond)
}

// tryPop is pop that reports an empty queue instead of failing.
func tryPop(t testing.TB, s *Storage) (token, url string, ok bool) {
	t.Helper()
	if st, err := s.Stats(bg); err != nil || st.Ready == 0 && st.InFlight == 0 {
		return "", "", false
	}
	b, err := s.GetRequest()
	if errors.Is(err, ErrQueueEmpty) {
		return "", "", false
	}
	require.NoError(t, err)
	r, err := colly.NewCollector().UnmarshalRequest(b)
	require.NoError(t, err)
	tok, _ := deliveryToken(r)
	return tok, r.URL.String(), true
}

// A delivery whose visited check fails on a Redis error (no reply within
// the timeout) is dropped by Colly with no callback; it is handed back at
// once, not counted, instead of coming back after the visibility timeout
// as one more delivery (on a slow network, a request could reach the
// dead-letter list without a fetch that way too).
func TestFailedVisitedCheckHandsDeliveryBack(t *testing.T) {
	for _, op := range []string{"IsVisited", "Visited"} {
		t.Run(op, func(t *testing.T) {
			rdb := single.Client(t)
			opts := []Option{WithVisibilityTimeout(time.Minute), WithPollInterval(10 * time.Millisecond)}
			s := newStorage(t, rdb, opts...)
			x := "http://a.example/" + op
			require.NoError(t, s.AddRequest(marshal(t, x)))
			require.NoError(t, qReleaseScript.Load(bg, rdb).Err()) // the slow client's EVALSHA finds it
			px := newLagProxy(t, single.Addr())
			slowRdb := single.Client(t, func(o *redis.Options) {
				o.Addr, o.MaxRetries, o.PoolSize, o.MinIdleConns = px.addr(), -1, 8, 6
			})
			slow, err := New(slowRdb, append([]Option{WithNamespace(s.cfg.namespace), WithRedisTimeout(100 * time.Millisecond)}, opts...)...)
			require.NoError(t, err)
			require.NoError(t, slow.Init())
			// Connections made before the lag (a handshake under it would
			// outlast the timeout).
			require.Eventually(t, func() bool { return slowRdb.PoolStats().IdleConns >= 6 }, 10*time.Second, 10*time.Millisecond)
			_, err = slow.GetRequest()
			require.NoError(t, err)
			h, ok := requestHash(wireRequest{URL: x})
			require.True(t, ok)

			px.lag.Store(int64(700 * time.Millisecond))
			if op == "IsVisited" {
				_, err = slow.IsVisited(h)
			} else {
				err = slow.Visited(h)
			}
			require.ErrorIs(t, err, ErrRedis)
			// Back in the ready list, its delivery not counted, long before
			// the visibility timeout.
			require.Eventually(t, func() bool {
				st, err := s.Stats(bg)
				require.NoError(t, err)
				return st == Stats{Ready: 1}
			}, 10*time.Second, 10*time.Millisecond)
			_, err = rdb.HGet(bg, s.q.tries, "1").Result()
			require.ErrorIs(t, err, redis.Nil, "the dropped delivery was counted")

			// Its next delivery passes the visited check, whether or not
			// the failed claim reached Redis (the mark names the request).
			tok, _ := pop(t, s)
			require.Equal(t, "1:1", delivered(tok))
			visited, err := s.IsVisited(h)
			require.NoError(t, err)
			require.False(t, visited)
			require.NoError(t, s.Visited(h))
		})
	}
}

// A dead-lettered delivery is not handed out again, so its pop record goes
// with it: failed for good (q_nack), timed out on its last delivery (q_pop),
// and a record planted for a delivery no longer the latest is dropped when
// its pop ID comes back.
func TestDeadLettersLeaveNoPops(t *testing.T) {
	rdb := shared.Client(t)
	s := newStorage(t, rdb, WithMaxDeliveries(1), WithVisibilityTimeout(100*time.Millisecond), WithPollInterval(10*time.Millisecond))
	pops := func() int64 {
		n, err := rdb.HLen(bg, s.q.pops).Result()
		require.NoError(t, err)
		return n
	}

	for _, u := range []string{"http://a.example/1", "http://a.example/2"} {
		require.NoError(t, s.AddRequest(marshal(t, u)))
		tok, _ := pop(t, s)
		require.NoError(t, s.settle(tok, errors.New("503")))
	}
	require.Zero(t, pops(), "failed for good")

	require.NoError(t, s.AddRequest(marshal(t, "http://a.example/3")))
	pop(t, s)
	require.Equal(t, int64(1), pops())
	time.Sleep(250 * time.Millisecond)
	_, err := s.flushPops([]string{newPopID()})
	require.NoError(t, err)
	st, err := s.Stats(bg)
	require.NoError(t, err)
	require.Equal(t, Stats{Dead: 3}, st)
	require.Zero(t, pops(), "timed out on its last delivery")

	require.NoError(t, s.AddRequest(marshal(t, "http://a.example/4")))
	tok, _ := pop(t, s)
	id, _, err := splitToken(tok)
	require.NoError(t, err)
	require.NoError(t, rdb.HSet(bg, s.q.pops, "stale", id).Err())
	got, err := s.flushPops([]string{"stale"})
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Empty(t, got[0].id)
	ok, err := rdb.HExists(bg, s.q.pops, "stale").Result()
	require.NoError(t, err)
	require.False(t, ok, "record of a pop whose delivery is not the latest")
	require.Equal(t, int64(1), pops(), "the latest delivery's record stays")
}
