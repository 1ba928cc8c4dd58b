package storage

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/stretchr/testify/require"
)

// Many goroutines on several clients race Visited on the same IDs: exactly
// one of them wins each ID, the rest get ErrAlreadyVisited.
func TestVisitedClaimsOnce(t *testing.T) {
	const ids, clients, perClient = 500, 4, 8
	base := newStorage(t, shared.Client(t), WithVisitedBuckets(64))
	var wins [ids]atomic.Int32
	var wg sync.WaitGroup
	for c := range clients {
		s := base
		if c > 0 {
			s = twin(t, base, shared.Client(t))
		}
		for g := range perClient {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range ids {
					id := uint64((i + g*7) % ids) // different orders, same IDs
					visited, err := s.IsVisited(id)
					if err != nil {
						t.Error(err)
						return
					}
					if visited {
						continue
					}
					switch err := s.Visited(id); {
					case err == nil:
						wins[id].Add(1)
					case !errors.Is(err, ErrAlreadyVisited):
						t.Error(err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	for i := range ids {
		require.EqualValues(t, 1, wins[i].Load(), "id %d", i)
	}
}

// IsVisited never claims: asking any number of times leaves the ID free.
func TestIsVisitedNeverClaims(t *testing.T) {
	s := newStorage(t, shared.Client(t))
	for range 5 {
		v, err := s.IsVisited(42)
		require.NoError(t, err)
		require.False(t, v)
	}
	require.NoError(t, s.Visited(42))
	v, err := s.IsVisited(42)
	require.NoError(t, err)
	require.True(t, v)
	require.ErrorIs(t, s.Visited(42), ErrAlreadyVisited)
}

// countingSite counts hits per path.
type countingSite struct {
	*httptest.Server
	mu   sync.Mutex
	hits map[string]int
}

func newCountingSite(t testing.TB, h http.HandlerFunc) *countingSite {
	cs := &countingSite{hits: map[string]int{}}
	if h == nil {
		h = func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "<html><body>%s</body></html>", r.URL.Path)
		}
	}
	cs.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cs.mu.Lock()
		cs.hits[r.URL.RequestURI()]++
		cs.mu.Unlock()
		h(w, r)
	}))
	t.Cleanup(cs.Close)
	return cs
}

func (cs *countingSite) count(path string) int {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.hits[path]
}

func (cs *countingSite) total() (hits, distinct int) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for _, n := range cs.hits {
		hits += n
	}
	return hits, len(cs.hits)
}

// Collector.HasVisited (IsVisited alone) must not mark the URL: a Visit
// after it still fetches, and a second collector still sees it unvisited
// until then.
func TestHasVisitedDoesNotMark(t *testing.T) {
	site := newCountingSite(t, nil)
	s := newStorage(t, shared.Client(t))
	c := colly.NewCollector()
	require.NoError(t, c.SetStorage(s))
	u := site.URL + "/page"

	for range 3 {
		v, err := c.HasVisited(u)
		require.NoError(t, err)
		require.False(t, v)
	}
	other := colly.NewCollector()
	require.NoError(t, other.SetStorage(twin(t, s, shared.Client(t))))
	v, err := other.HasVisited(u)
	require.NoError(t, err)
	require.False(t, v, "HasVisited on one collector marked the URL for another")

	require.NoError(t, c.Visit(u))
	require.Equal(t, 1, site.count("/page"))
	v, err = other.HasVisited(u)
	require.NoError(t, err)
	require.True(t, v)
	var av *colly.AlreadyVisitedError
	require.ErrorAs(t, other.Visit(u), &av) // IsVisited already says visited
	require.Equal(t, 1, site.count("/page"))
}

// A redirect target claimed by one collector is not fetched by another
// that gets redirected to it.
func TestVisitedRedirectTarget(t *testing.T) {
	site := newCountingSite(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/go" {
			http.Redirect(w, r, "/target", http.StatusFound)
			return
		}
		fmt.Fprint(w, "ok")
	})
	s := newStorage(t, shared.Client(t))
	a, b := colly.NewCollector(), colly.NewCollector()
	require.NoError(t, a.SetStorage(s))
	require.NoError(t, b.SetStorage(twin(t, s, shared.Client(t))))
	require.NoError(t, a.Visit(site.URL+"/target"))
	var redirectErr error
	b.OnError(func(_ *colly.Response, err error) { redirectErr = err })
	require.Error(t, b.Visit(site.URL+"/go"))
	require.Error(t, redirectErr)
	require.Equal(t, 1, site.count("/target"))
	require.Equal(t, 1, site.count("/go"))
}

// With a TTL the mark expires (Redis's clock) and the URL may be claimed
// again; a writer without TTL respects an expiring mark too.
func TestVisitedTTL(t *testing.T) {
	s := newStorage(t, shared.Client(t), WithVisitedTTL(300*time.Millisecond))
	plain := twin(t, s, shared.Client(t))
	plain.cfg.visitedTTL = 0

	require.NoError(t, s.Visited(7))
	require.ErrorIs(t, plain.Visited(7), ErrAlreadyVisited)
	v, err := plain.IsVisited(7)
	require.NoError(t, err)
	require.True(t, v)
	time.Sleep(400 * time.Millisecond)
	v, err = s.IsVisited(7)
	require.NoError(t, err)
	require.False(t, v)
	require.NoError(t, plain.Visited(7)) // now forever
	time.Sleep(400 * time.Millisecond)
	require.ErrorIs(t, s.Visited(7), ErrAlreadyVisited)
}

// Expired marks are reclaimed by sampling as new marks are written.
func TestVisitedTTLReclaims(t *testing.T) {
	rdb := shared.Client(t)
	s := newStorage(t, rdb, WithVisitedTTL(20*time.Millisecond), WithVisitedBuckets(1))
	for i := range 100 {
		require.NoError(t, s.Visited(uint64(i)))
	}
	time.Sleep(50 * time.Millisecond)
	s.cfg.visitedTTL = time.Hour
	for i := 100; i < 200; i++ {
		require.NoError(t, s.Visited(uint64(i)))
	}
	n, err := rdb.HLen(bg, s.keys.bucket(0)).Result()
	require.NoError(t, err)
	require.Less(t, n, int64(150), "expired marks were not reclaimed")
	require.GreaterOrEqual(t, n, int64(100))
}

// A foreign value in a bucket is an error, not a panic and not a verdict.
func TestVisitedCorrupt(t *testing.T) {
	rdb := shared.Client(t)
	s := newStorage(t, rdb, WithVisitedBuckets(1))
	require.NoError(t, rdb.HSet(bg, s.keys.bucket(0), visitedField(9), "not-a-number").Err())
	_, err := s.IsVisited(9)
	require.ErrorIs(t, err, ErrCorrupt)
	require.ErrorIs(t, s.Visited(9), ErrCorrupt)
	require.NoError(t, rdb.Set(bg, s.keys.bucket(0), "a string", 0).Err())
	_, err = s.IsVisited(10)
	require.ErrorIs(t, err, ErrCorrupt) // WRONGTYPE
	require.Contains(t, err.Error(), s.keys.bucket(0))
	require.ErrorIs(t, s.Visited(10), ErrCorrupt)
}

// All collectors of a namespace must agree on the bucket count.
func TestBucketsMismatch(t *testing.T) {
	s := newStorage(t, shared.Client(t), WithVisitedBuckets(16))
	other, err := New(shared.Client(t), WithNamespace(s.Namespace()), WithVisitedBuckets(32))
	require.NoError(t, err)
	require.ErrorIs(t, other.Init(), ErrConfig)
	require.NoError(t, s.Clear(bg))
	require.NoError(t, other.Init())
}

func TestNamespaceValidation(t *testing.T) {
	for _, ns := range []string{"", "{x}", "a}b", "a b", "tab\t", "nl\n", strings.Repeat("n", 201)} {
		_, err := New(shared.Client(t), WithNamespace(ns))
		require.ErrorIs(t, err, ErrConfig, "%q", ns)
	}
	_, err := New(nil)
	require.ErrorIs(t, err, ErrConfig)
	for _, o := range []Option{
		WithVisitedTTL(-1), WithVisitedBuckets(0), WithVisitedBuckets(maxBuckets + 1),
		WithVisibilityTimeout(time.Millisecond), WithMaxDeliveries(0), WithRetryDelay(-1),
		WithPollInterval(0), WithMaxRequestSize(10), WithRedisTimeout(0),
	} {
		_, err := New(shared.Client(t), o)
		require.ErrorIs(t, err, ErrConfig)
	}
}
