package storage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// crawlTogether runs one queue-driven collector per Storage, each with
// threads Colly threads, until the namespace's queue is drained. setup, if
// not nil, is called on each collector after Attach.
func crawlTogether(t *testing.T, stores []*Storage, threads int, setup func(*colly.Collector)) {
	t.Helper()
	errs := make(chan error, len(stores))
	var wg sync.WaitGroup
	for _, s := range stores {
		c, q := queueCollector(t, s, threads, setup)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- q.Run(c)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// Three collectors on three Redis clients share one queue whose visibility
// timeout (300ms) is far shorter than a fetch (1s): the running fetches are
// kept invisible, so every URL is fetched exactly once, though each
// collector holds more requests than it has threads (the one Colly's queue
// takes ahead waits for a free thread, past the visibility timeout).
func TestSlowFetchesFetchedOnce(t *testing.T) {
	const urls, collectors, threads = 12, 3, 2
	site := newCountingSite(t, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(time.Second)
		fmt.Fprint(w, "<html><body>slow</body></html>")
	})
	base := newStorage(t, shared.Client(t), WithVisibilityTimeout(300*time.Millisecond),
		WithPollInterval(10*time.Millisecond), WithMaxDeliveries(10))
	stores := []*Storage{base}
	for range collectors - 1 {
		stores = append(stores, twin(t, base, shared.Client(t)))
	}
	for i := range urls {
		require.NoError(t, base.AddRequest(marshal(t, fmt.Sprintf("%s/p/%d", site.URL, i))))
	}

	start := time.Now()
	crawlTogether(t, stores, threads, nil)
	hits, distinct := site.total()
	t.Logf("%d URLs, %d collectors x %d threads: %d fetches in %v", urls, collectors, threads, hits, time.Since(start).Round(time.Millisecond))
	for i := range urls {
		require.Equal(t, 1, site.count(fmt.Sprintf("/p/%d", i)), "/p/%d", i)
	}
	require.Equal(t, urls, distinct)
	st, err := base.Stats(bg)
	require.NoError(t, err)
	require.Equal(t, Stats{}, st)
	for _, s := range stores {
		require.Zero(t, s.pending.n.Load(), "pending deliveries left behind")
	}
}

// logRecorder is a slog.Handler that keeps the messages logged through it.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecorder) WithGroup(string) slog.Handler            { return l }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	var sb strings.Builder
	sb.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&sb, " %s=%v", a.Key, a.Value)
		return true
	})
	l.mu.Lock()
	l.msgs = append(l.msgs, sb.String())
	l.mu.Unlock()
	return nil
}

// count returns how many messages contain sub.
func (l *logRecorder) count(sub string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if strings.Contains(m, sub) {
			n++
		}
	}
	return n
}

// gate is a site whose pages answer only once release is called.
type gate struct {
	*countingSite
	open chan struct{}
	once sync.Once
}

func newGate(t *testing.T) *gate {
	g := &gate{open: make(chan struct{})}
	g.countingSite = newCountingSite(t, func(w http.ResponseWriter, r *http.Request) {
		<-g.open
		fmt.Fprint(w, "<html><body>ok</body></html>")
	})
	t.Cleanup(g.release)
	return g
}

func (g *gate) release() { g.once.Do(func() { close(g.open) }) }

// fetchAsync runs the serialized delivered request b on a fresh collector
// with Attach, in the background; the returned channel closes when it ends.
func fetchAsync(t *testing.T, s *Storage, b []byte) <-chan struct{} {
	t.Helper()
	c := colly.NewCollector()
	require.NoError(t, c.SetStorage(s))
	s.Attach(c)
	r, err := c.UnmarshalRequest(b)
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Do()
	}()
	return done
}

// waitFor polls cond every 5ms for up to d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, d, 5*time.Millisecond, what)
}

// The renewer starts with the first running fetch, serves every running
// fetch of the Storage, keeps them invisible for many visibility timeouts,
// and exits when none runs; the next fetch starts a new one.
func TestRenewerLifecycle(t *testing.T) {
	const vis = 150 * time.Millisecond
	first, second := newGate(t), newGate(t)
	s := newStorage(t, shared.Client(t), WithVisibilityTimeout(vis), WithPollInterval(5*time.Millisecond), WithRetryDelay(0))
	other := twin(t, s, shared.Client(t))
	renewers := func() int32 { return s.pending.renewers.Load() }
	for _, u := range []string{first.URL + "/a", first.URL + "/b", second.URL + "/c"} {
		require.NoError(t, s.AddRequest(marshal(t, u)))
	}
	b1, err := s.GetRequest()
	require.NoError(t, err)
	b2, err := s.GetRequest()
	require.NoError(t, err)
	time.Sleep(vis / 4)
	require.Zero(t, renewers(), "a renewer started before any fetch")

	done1, done2 := fetchAsync(t, s, b1), fetchAsync(t, s, b2)
	waitFor(t, time.Second, "both fetches running", func() bool {
		hits, _ := first.total()
		return hits == 2
	})
	require.EqualValues(t, 1, renewers(), "one renewer for all running fetches")
	time.Sleep(4 * vis)
	b3, err := other.GetRequest() // the running two stay invisible
	require.NoError(t, err)
	require.Contains(t, string(b3), "/c")
	_, err = other.GetRequest()
	require.ErrorIs(t, err, ErrQueueEmpty)
	require.EqualValues(t, 1, renewers())

	first.release()
	<-done1
	<-done2
	waitFor(t, 2*vis, "the renewer to exit", func() bool { return renewers() == 0 })
	s.pending.mu.Lock()
	require.False(t, s.pending.renewing)
	require.Empty(t, s.pending.running)
	s.pending.mu.Unlock()
	require.Zero(t, s.pending.n.Load())

	// The next fetch, handed over through the queue, starts a new renewer.
	require.NoError(t, other.Nack(requestOf(t, b3), errors.New("handed back")))
	waitFor(t, time.Second, "the handed-back request", func() bool {
		b3, err = s.GetRequest()
		return err == nil
	})
	done3 := fetchAsync(t, s, b3)
	waitFor(t, time.Second, "the third fetch running", func() bool { return second.count("/c") == 1 })
	require.EqualValues(t, 1, renewers())
	second.release()
	<-done3
	waitFor(t, 2*vis, "the new renewer to exit", func() bool { return renewers() == 0 })
	require.Zero(t, other.pending.renewers.Load(), "a Storage without a running fetch has no renewer")
	st, err := s.Stats(bg)
	require.NoError(t, err)
	require.Equal(t, Stats{}, st)
}

// requestOf is the Colly request serialized in b.
func requestOf(t *testing.T, b []byte) *colly.Request {
	t.Helper()
	r, err := colly.NewCollector().UnmarshalRequest(b)
	require.NoError(t, err)
	return r
}

// A delivery whose fetch the user's own OnRequest callback aborts after
// Attach's hook marked it running never settles: it is kept invisible up to
// the max fetch time, not forever, and delivered again within the
// visibility timeout after that.
func TestAbortedFetchComesBackAfterMaxFetchTime(t *testing.T) {
	const vis, maxFetch = 300 * time.Millisecond, time.Second
	site := newCountingSite(t, nil)
	logs := &logRecorder{}
	s := newStorage(t, shared.Client(t), WithVisibilityTimeout(vis), WithMaxFetchTime(maxFetch),
		WithPollInterval(10*time.Millisecond), WithLogger(slog.New(logs)))
	require.NoError(t, s.AddRequest(marshal(t, site.URL+"/aborted-once")))
	var mu sync.Mutex
	started := map[string]time.Time{}
	start := time.Now()
	runQueue(t, s, 2, func(c *colly.Collector) {
		c.OnRequest(func(r *colly.Request) {
			tok, _ := deliveryToken(r)
			mu.Lock()
			started[delivered(tok)] = time.Now()
			mu.Unlock()
			if delivered(tok) == "1:1" {
				r.Abort()
			}
		})
	})
	t.Logf("queue drained after %v", time.Since(start).Round(time.Millisecond))
	require.Len(t, started, 2)
	again := started["1:2"].Sub(started["1:1"])
	t.Logf("delivered again %v after the aborted fetch started (max fetch time %v, visibility %v)", again, maxFetch, vis)
	require.GreaterOrEqual(t, again, maxFetch, "delivered again before the max fetch time")
	require.Less(t, again, maxFetch+vis+700*time.Millisecond, "kept invisible past the max fetch time")
	require.Equal(t, 1, site.count("/aborted-once"))
	require.Equal(t, 1, logs.count("ran past the max fetch time"))
	st, err := s.Stats(bg)
	require.NoError(t, err)
	require.Equal(t, Stats{}, st)
	require.Zero(t, s.pending.n.Load(), "the capped delivery was not forgotten")
}

// A request whose fetch starts after it waited past the visibility timeout
// is checked with Redis: if another worker took it meanwhile, it is not
// fetched here; if not, it is extended at once and fetched.
func TestLateStart(t *testing.T) {
	const vis = 150 * time.Millisecond
	site := newCountingSite(t, nil)
	s := newStorage(t, shared.Client(t), WithVisibilityTimeout(vis), WithPollInterval(5*time.Millisecond))
	other := twin(t, s, shared.Client(t))
	require.NoError(t, s.AddRequest(marshal(t, site.URL+"/taken")))
	require.NoError(t, s.AddRequest(marshal(t, site.URL+"/kept")))

	taken, err := s.GetRequest()
	require.NoError(t, err)
	time.Sleep(vis + 50*time.Millisecond)
	takenAgain, err := other.GetRequest() // the other worker takes it over
	require.NoError(t, err)
	require.Contains(t, string(takenAgain), "/taken")
	<-fetchAsync(t, s, taken)
	require.Zero(t, site.count("/taken"), "fetched although another worker took it")
	require.Zero(t, s.pending.n.Load())
	<-fetchAsync(t, other, takenAgain)
	require.Equal(t, 1, site.count("/taken"))

	kept, err := s.GetRequest()
	require.NoError(t, err)
	time.Sleep(vis + 50*time.Millisecond) // past its deadline, but nobody took it
	<-fetchAsync(t, s, kept)
	require.Equal(t, 1, site.count("/kept"))
	st, err := s.Stats(bg)
	require.NoError(t, err)
	require.Equal(t, Stats{}, st)
}

// A Redis that stops answering while fetches run: the renewer logs the
// failure once, retries at each tick, and says when it works again; the
// fetch is still kept invisible afterwards.
func TestRenewerRedisErrors(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and pauses a redis-server")
	}
	const vis = 300 * time.Millisecond
	srv := redistest.Start(t)
	site := newGate(t)
	logs := &logRecorder{}
	s := newStorage(t, srv.Client(t), WithVisibilityTimeout(vis), WithRedisTimeout(50*time.Millisecond),
		WithPollInterval(5*time.Millisecond), WithLogger(slog.New(logs)))
	other := twin(t, s, srv.Client(t))
	require.NoError(t, s.AddRequest(marshal(t, site.URL+"/slow")))
	b, err := s.GetRequest()
	require.NoError(t, err)
	done := fetchAsync(t, s, b)
	waitFor(t, time.Second, "the fetch running", func() bool { return site.count("/slow") == 1 })

	require.NoError(t, srv.Pause())
	time.Sleep(vis) // three ticks fail
	require.NoError(t, srv.Resume())
	waitFor(t, 2*vis, "the renewer to recover", func() bool { return logs.count("works again") == 1 })
	require.Equal(t, 1, logs.count("extending running queued requests failed"), "logged once per failure streak")
	time.Sleep(2 * vis)
	_, err = other.GetRequest()
	require.ErrorIs(t, err, ErrQueueEmpty, "the running fetch became visible")

	site.release()
	<-done
	require.Equal(t, 1, site.count("/slow"))
	st, err := s.Stats(bg)
	require.NoError(t, err)
	require.Equal(t, Stats{}, st)
}

// q_extend pushes only the deliveries still in flight under their own
// number, never moves a deadline earlier, and tells dead ones apart.
func TestExtendScript(t *testing.T) {
	rdb := shared.Client(t)
	s := newStorage(t, rdb, WithVisibilityTimeout(time.Second), WithMaxDeliveries(1), WithRetryDelay(time.Hour))
	for _, p := range []string{"/a", "/b", "/c", "/d"} {
		require.NoError(t, s.AddRequest(marshal(t, "http://a.example"+p)))
	}
	toks := map[string]string{}
	for range 4 {
		tok, _ := pop(t, s)
		id, _, err := splitToken(tok)
		require.NoError(t, err)
		toks[id] = tok
	}
	require.NoError(t, s.settle(toks["2"], nil))                  // acknowledged
	require.NoError(t, s.settle(toks["3"], errors.New("failed"))) // last delivery: dead
	require.NoError(t, s.settle(toks["4"], nil))
	of := func(id string) string { _, _, p, err := parseToken(toks[id]); require.NoError(t, err); return p }
	score := func(id string) float64 {
		v, err := rdb.ZScore(bg, s.q.inflight, id).Result()
		require.NoError(t, err)
		return v
	}
	before := score("1")
	time.Sleep(20 * time.Millisecond)
	ds := []*delivery{{id: "1", number: 1, pop: of("1")}, {id: "1", number: 2, pop: of("1")}, {id: "2", number: 1, pop: of("2")},
		{id: "3", number: 1, pop: of("3")}, {id: "1", number: 1, pop: "other"}, {id: "1", number: 1}}
	codes, err := s.extend(bg, ds)
	require.NoError(t, err)
	require.Equal(t, []int64{extendExtended, extendGone, extendGone, extendDead, extendGone, extendGone}, codes)
	require.Greater(t, score("1"), before)

	far := score("1") + float64(time.Hour.Milliseconds())
	require.NoError(t, rdb.ZAdd(bg, s.q.inflight, redis.Z{Score: far, Member: "1"}).Err())
	codes, err = s.extend(bg, ds[:1])
	require.NoError(t, err)
	require.Equal(t, []int64{extendExtended}, codes)
	require.Equal(t, far, score("1"), "a deadline was moved earlier")
}

func TestMaxFetchTimeOption(t *testing.T) {
	rdb := shared.Client(t)
	for _, opts := range [][]Option{
		{WithMaxFetchTime(0)},
		{WithMaxFetchTime(-time.Second)},
		{WithMaxFetchTime(time.Minute - time.Millisecond)}, // below the default visibility
		{WithVisibilityTimeout(time.Hour), WithMaxFetchTime(30 * time.Minute)},
	} {
		_, err := New(rdb, opts...)
		require.ErrorIs(t, err, ErrConfig)
	}
	for _, c := range []struct {
		opts []Option
		want time.Duration
	}{
		{nil, 10 * time.Minute},
		{[]Option{WithVisibilityTimeout(time.Hour)}, time.Hour},
		{[]Option{WithMaxFetchTime(time.Minute)}, time.Minute},
		{[]Option{WithVisibilityTimeout(time.Second), WithMaxFetchTime(2 * time.Hour)}, 2 * time.Hour},
	} {
		s, err := New(rdb, c.opts...)
		require.NoError(t, err)
		require.Equal(t, c.want, s.cfg.maxFetch)
		require.Equal(t, c.want, s.pending.maxFetch)
	}
}

// Two deliveries of one request in one process: the visited check granted
// the earlier (superseded) one on behalf of the later, which is claimed.
// When the earlier one is dropped, reopen makes the later one unclaimed
// again, so its own visited check lets it through; nothing else changes.
func TestReopenLaterDelivery(t *testing.T) {
	var p pending
	p.init(time.Second, time.Minute)
	now := time.Now()
	later := &delivery{id: "7", number: 2, hash: 0xabc, at: now}
	require.True(t, p.add(later))
	p.claim(later) // granted when the earlier delivery asked
	require.Nil(t, p.unclaimed(0xabc))
	p.reopen("8", 1) // another request: nothing
	assert.Nil(t, p.unclaimed(0xabc))
	p.reopen("7", 2) // not earlier than the one held: nothing
	assert.Nil(t, p.unclaimed(0xabc))
	p.reopen("7", 1)
	assert.Same(t, later, p.unclaimed(0xabc))
	other := &delivery{id: "9", number: 1, hash: 0xabc, at: now}
	p.claim(later)
	p.byHash[0xabc] = other // the hash taken meanwhile: left alone
	p.reopen("7", 1)
	assert.Same(t, other, p.unclaimed(0xabc))
}

// Only the token form this package writes is a delivery token: another
// spelling of the same number would be filed under one key and removed
// under another, and never leave pending.
func TestSplitTokenCanonical(t *testing.T) {
	id, n, err := splitToken("5:12")
	require.NoError(t, err)
	assert.Equal(t, "5", id)
	assert.Equal(t, 12, n)
	id, n, pop, err := parseToken("5:12:abc123")
	require.NoError(t, err)
	assert.Equal(t, "5", id)
	assert.Equal(t, 12, n)
	assert.Equal(t, "abc123", pop)
	assert.Equal(t, "5:12:abc123", (&delivery{id: id, number: n, pop: pop}).token())
	for _, bad := range []string{"5:01", "5:+1", "5:0", ":1", "5", "5:x", "5: 1", "5:1:", "5:1:AB", "5:1:a:b", "5:1:a-b", "5:1:12345678901234"} {
		_, _, err := splitToken(bad)
		assert.ErrorIs(t, err, ErrNotQueued, bad)
	}
}
