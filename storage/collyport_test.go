package storage

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/gocolly/colly/v2/queue"
	"github.com/stretchr/testify/require"
)

// Facts from Colly v2.3.0's own tests (queue/queue_test.go TestQueue,
// colly_test.go TestRedirectErrorRetry), checked against Colly's in-memory
// storage and against this one (issue 17, item 11).

// queueCrawl is what TestQueue checks of one run.
type queueCrawl struct {
	items, requests, success, failure int64
	refused                           int64 // garbage requests the storage refused at AddRequest
	err                               error
	took                              time.Duration
}

// crawlLikeTestQueue runs TestQueue's crawl on a queue over qs: 10
// threads, revisits allowed, seeds URLs to a page that waits a random few
// microseconds (so many URLs repeat), each seed followed by a request that
// is not a serialized request at all; every response queues another URL
// with probability 1/2. attach, if not nil, prepares the collector.
func crawlLikeTestQueue(t *testing.T, qs queue.Storage, seeds int, attach func(*colly.Collector)) queueCrawl {
	site := newCountingSite(t, func(w http.ResponseWriter, r *http.Request) {
		d, err := time.ParseDuration(r.URL.Query().Get("t"))
		if err != nil {
			http.Error(w, "bad t", http.StatusBadRequest)
			return
		}
		time.Sleep(d)
	})
	rng := rand.New(rand.NewSource(12387123712321232))
	var mu sync.Mutex
	var out queueCrawl
	q, err := queue.New(10, qs)
	require.NoError(t, err)
	put := func() {
		mu.Lock()
		d := time.Duration(rng.Intn(50)) * time.Microsecond
		mu.Unlock()
		atomic.AddInt64(&out.items, 1)
		if err := q.AddURL(site.URL + "/delay?t=" + d.String()); err != nil {
			t.Errorf("add: %v", err) // not require: this also runs in Colly's goroutines
		}
	}
	for range seeds {
		put()
		if err := qs.AddRequest([]byte("error request")); err != nil {
			require.ErrorIs(t, err, ErrInvalidRequest)
			out.refused++
		}
	}
	c := colly.NewCollector(colly.AllowURLRevisit())
	if attach != nil {
		attach(c)
	}
	c.OnRequest(func(*colly.Request) { atomic.AddInt64(&out.requests, 1) })
	c.OnResponse(func(r *colly.Response) {
		if r.StatusCode == http.StatusOK {
			atomic.AddInt64(&out.success, 1)
		} else {
			atomic.AddInt64(&out.failure, 1)
		}
		mu.Lock()
		toss := rng.Intn(2) == 0
		mu.Unlock()
		if toss {
			put()
		}
	})
	c.OnError(func(*colly.Response, error) { atomic.AddInt64(&out.failure, 1) })
	began := time.Now()
	done := make(chan error, 1)
	go func() { done <- q.Run(c) }()
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatalf("queue.Run did not return within a minute (%d of %d items requested)",
			atomic.LoadInt64(&out.requests), atomic.LoadInt64(&out.items))
	}
	// A run that failed may leave a request running in Colly's goroutines:
	// read the counts atomically.
	return queueCrawl{
		items: atomic.LoadInt64(&out.items), requests: atomic.LoadInt64(&out.requests),
		success: atomic.LoadInt64(&out.success), failure: atomic.LoadInt64(&out.failure),
		refused: out.refused, err: err, took: time.Since(began),
	}
}

// TestQueue's facts: Run returns nil, every queued item is requested once,
// every request succeeds, and the garbage is never requested (Colly's queue
// skips what does not unmarshal; this storage refuses it at AddRequest).
func TestQueueLikeColly(t *testing.T) {
	const seeds = 300
	check := func(t *testing.T, got queueCrawl) {
		require.NoError(t, got.err)
		require.Equal(t, got.items, got.requests, "items queued vs requests made")
		require.Equal(t, got.requests, got.success+got.failure)
		require.Zero(t, got.failure)
		t.Logf("%d items in %v", got.items, got.took.Round(time.Millisecond))
	}
	t.Run("colly in-memory", func(t *testing.T) {
		got := crawlLikeTestQueue(t, &queue.InMemoryQueueStorage{MaxSize: 100000}, seeds, nil)
		check(t, got)
		require.Zero(t, got.refused)
	})
	t.Run("redis with Attach", func(t *testing.T) {
		s := newStorage(t, shared.Client(t), WithPollInterval(5*time.Millisecond))
		got := crawlLikeTestQueue(t, s, seeds, s.Attach)
		check(t, got)
		require.EqualValues(t, seeds, got.refused)
		st, err := s.Stats(bg)
		require.NoError(t, err)
		require.Equal(t, Stats{}, st)
	})
}

// TestQueue as written, on this storage without Attach: nothing would
// acknowledge, so the run would never end (QueueSize counts the requests
// in flight, and after the visibility timeout they are fetched again).
// Instead Run returns ErrNotAttached at once, after at most one request,
// and logs why at error level; the request comes back for an attached
// worker.
func TestQueueWithoutAttachSaysSo(t *testing.T) {
	logs := &logRecorder{}
	s := newStorage(t, shared.Client(t), WithPollInterval(5*time.Millisecond), WithVisibilityTimeout(time.Second),
		WithLogger(slog.New(logs)))
	got := crawlLikeTestQueue(t, s, 50, nil)
	require.ErrorIs(t, got.err, ErrNotAttached)
	require.Less(t, got.took, 2*time.Second)
	require.LessOrEqual(t, got.requests, int64(1))
	require.Equal(t, 1, logs.count("without Storage.Attach"))

	// An attached worker then crawls it all.
	again := twin(t, s, shared.Client(t))
	q, err := queue.New(4, again)
	require.NoError(t, err)
	c := colly.NewCollector(colly.AllowURLRevisit())
	again.Attach(c)
	var fetched atomic.Int64
	c.OnScraped(func(*colly.Response) { fetched.Add(1) })
	require.NoError(t, q.Run(c))
	require.GreaterOrEqual(t, fetched.Load(), int64(50)) // the one fetched unattached came back
	st, err := s.Stats(bg)
	require.NoError(t, err)
	require.Equal(t, Stats{}, st)
}

// TestRedirectErrorRetry's facts: a redirect to a URL already visited ends
// in OnError with Colly's *AlreadyVisitedError; a Request.Retry() from
// that OnError follows the redirect this time (Colly's retry skips the
// revisit check) and reaches OnResponse, with no second error.
func TestRetryAfterRedirectLikeColly(t *testing.T) {
	for _, redis := range []bool{false, true} {
		name := "colly in-memory"
		if redis {
			name = "redis"
		}
		t.Run(name, func(t *testing.T) {
			site := newCountingSite(t, func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/redirect" {
					http.Redirect(w, r, "/redirected/", http.StatusSeeOther)
					return
				}
				fmt.Fprint(w, `<a href="test">test</a>`)
			})
			c := colly.NewCollector()
			if redis {
				require.NoError(t, c.SetStorage(newStorage(t, shared.Client(t))))
			}
			var errs []error
			var reached []string
			c.OnError(func(r *colly.Response, err error) {
				errs = append(errs, err)
				if r.Ctx.Get("retried") == "" {
					r.Ctx.Put("retried", "yes")
					retryOrReport(t, r.Request)
				}
			})
			c.OnResponse(func(r *colly.Response) { reached = append(reached, r.Request.URL.Path) })
			require.NoError(t, c.Visit(site.URL+"/redirected/"))
			_ = c.Visit(site.URL + "/redirect")
			require.Len(t, errs, 1, "errors: %v", errs)
			var av *colly.AlreadyVisitedError
			require.ErrorAs(t, errs[0], &av)
			require.Equal(t, []string{"/redirected/", "/redirected/"}, reached)
		})
	}
}

// The same through the queue, with Attach: the retry takes the delivery
// over, reaches OnResponse, and its success acknowledges it.
func TestQueuedRetryAfterRedirect(t *testing.T) {
	site := newCountingSite(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/redirect" {
			http.Redirect(w, r, "/redirected/", http.StatusSeeOther)
			return
		}
		fmt.Fprint(w, "ok")
	})
	s := newStorage(t, shared.Client(t), WithPollInterval(5*time.Millisecond))
	var errs []error
	var reached []string
	c, q := queueCollector(t, s, 1, func(c *colly.Collector) {
		c.OnError(func(r *colly.Response, err error) {
			errs = append(errs, err)
			if r.Ctx.Get("retried") == "" {
				r.Ctx.Put("retried", "yes")
				retryOrReport(t, r.Request)
			}
		})
		c.OnResponse(func(r *colly.Response) { reached = append(reached, r.Request.URL.Path) })
	})
	require.NoError(t, c.Visit(site.URL+"/redirected/"))
	require.NoError(t, q.AddURL(site.URL+"/redirect"))
	require.NoError(t, q.Run(c))
	require.Len(t, errs, 1, "errors: %v", errs)
	var av *colly.AlreadyVisitedError
	require.True(t, errors.As(errs[0], &av), "%v", errs[0])
	require.Equal(t, []string{"/redirected/", "/redirected/"}, reached)
	st, err := s.Stats(bg)
	require.NoError(t, err)
	require.Equal(t, Stats{}, st)
}

// retryOrReport retries r and reports an error without stopping the test:
// it runs in one of Colly's goroutines, where t.FailNow would hang the
// queue.
func retryOrReport(t *testing.T, r *colly.Request) {
	if err := r.Retry(); err != nil {
		t.Errorf("retry: %v", err)
	}
}

// What lets Colly's retry through must not let a race loser through: a
// collector told "not visited" whose Visited finds the URL claimed by
// another collector meanwhile gets ErrAlreadyVisited, even when a
// concurrent check in this process was told "visited" in between; a
// caller told "visited" that calls Visited anyway (Colly's retry after a
// redirect) is let through, once per answer.
func TestVisitedTellsRetryFromRaceLoser(t *testing.T) {
	s := newStorage(t, shared.Client(t))
	other := twin(t, s, shared.Client(t))
	const id = 42

	v, err := s.IsVisited(id) // the loser's check
	require.NoError(t, err)
	require.False(t, v)
	require.NoError(t, other.Visited(id)) // the winner, elsewhere
	v, err = s.IsVisited(id)              // a concurrent check here: visited
	require.NoError(t, err)
	require.True(t, v)
	require.ErrorIs(t, s.Visited(id), ErrAlreadyVisited, "the loser") // answers for the first check
	require.NoError(t, s.Visited(id), "the retry")                    // answers for the second

	require.ErrorIs(t, s.Visited(id), ErrAlreadyVisited, "no answer left to match")
	require.ErrorIs(t, other.Visited(id), ErrAlreadyVisited, "another storage's answers are its own")
}
