package storage

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocolly/colly/v2/queue"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// popURLs pops every ready request of s and returns their URL and method,
// in delivery order.
func popURLs(t *testing.T, s *Storage) []string {
	t.Helper()
	var out []string
	for {
		b, err := s.GetRequest()
		if err == ErrQueueEmpty {
			return out
		}
		require.NoError(t, err)
		var w struct{ URL, Method string }
		require.NoError(t, json.Unmarshal(b, &w))
		out = append(out, w.Method+" "+w.URL)
	}
}

// AddURLs queues what Colly's queue.AddURL queues, URL for URL, in order,
// over several batches.
func TestAddURLsAsCollyDoes(t *testing.T) {
	urls := []string{"https://www.ozon.example/category/phones?page=2", "http://Shop.Example:8080/a b/../c?x=%zz", "https://wb.example/p/1#reviews"}
	for i := range addBatch*2 + 7 {
		urls = append(urls, fmt.Sprintf("https://avito.example/item/%d", i))
	}
	ours := newStorage(t, shared.Client(t))
	n, err := ours.AddURLs(bg, urls...)
	require.NoError(t, err)
	assert.Equal(t, len(urls), n)
	st, err := ours.Stats(bg)
	require.NoError(t, err)
	assert.Equal(t, Stats{Ready: len(urls)}, st)

	colly := newStorage(t, shared.Client(t))
	q, err := queue.New(1, colly)
	require.NoError(t, err)
	for _, u := range urls {
		require.NoError(t, q.AddURL(u))
	}
	want := popURLs(t, colly)
	require.Len(t, want, len(urls))
	assert.Equal(t, want, popURLs(t, ours), "the same requests, in the same order")
	assert.Equal(t, "GET http://shop.example:8080/c?x=%zz", want[1], "normalized as Colly normalizes")
}

// A bad URL anywhere: nothing is queued, the error names it (password
// masked) and wraps ErrInvalidRequest.
func TestAddURLsRefusesBadInput(t *testing.T) {
	s := newStorage(t, shared.Client(t))
	for _, bad := range []string{"ftp://u:Canary-pw@files.example/x", "https://u:Canary-pw@/nohost", "http://u:Canary-pw@[::1", "/relative/path", ""} {
		n, err := s.AddURLs(bg, "https://ok.example/1", bad, "https://ok.example/2")
		require.ErrorIs(t, err, ErrInvalidRequest, bad)
		assert.Zero(t, n)
		assert.Contains(t, err.Error(), "URL 2 of 3")
		assert.NotContains(t, err.Error(), "Canary-pw")
	}
	small, err := New(shared.Client(t), WithNamespace(s.Namespace()), WithMaxRequestSize(64))
	require.NoError(t, err)
	_, err = small.AddURLs(bg, "https://ok.example/"+strings.Repeat("x", 100))
	assert.ErrorIs(t, err, ErrInvalidRequest, "over the size limit")
	st, err := s.Stats(bg)
	require.NoError(t, err)
	assert.Equal(t, Stats{}, st, "nothing queued")
	n, err := s.AddURLs(bg)
	assert.NoError(t, err)
	assert.Zero(t, n)

	down, err := New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1}), WithRedisTimeout(200*time.Millisecond))
	require.NoError(t, err)
	n, err = down.AddURLs(bg, "https://ok.example/1")
	assert.Error(t, err)
	assert.Zero(t, n)
}

// Several writers with Redis clients of their own: every request queued
// once, under an ID of its own.
func TestAddURLsConcurrent(t *testing.T) {
	base := newStorage(t, shared.Client(t))
	const writers, each = 4, 700
	var wg sync.WaitGroup
	for w := range writers {
		s := twin(t, base, shared.Client(t))
		wg.Add(1)
		go func() {
			defer wg.Done()
			urls := make([]string, each)
			for i := range urls {
				urls[i] = fmt.Sprintf("https://shop.example/w%d/%d", w, i)
			}
			n, err := s.AddURLs(bg, urls...)
			assert.NoError(t, err)
			assert.Equal(t, each, n)
		}()
	}
	wg.Wait()
	got := popURLs(t, base)
	require.Len(t, got, writers*each)
	seen := map[string]bool{}
	last := map[string]int{}
	for _, u := range got {
		require.False(t, seen[u], "queued twice: %s", u)
		seen[u] = true
		var w, i int
		_, err := fmt.Sscanf(u, "GET https://shop.example/w%d/%d", &w, &i)
		require.NoError(t, err)
		k := fmt.Sprint(w)
		if prev, ok := last[k]; ok {
			assert.Greater(t, i, prev, "each writer's URLs stay in order")
		}
		last[k] = i
	}
}

// WithMaxQueued: adding past the limit queues nothing and says so; an
// acknowledged request frees its place, a dead letter takes none.
func TestMaxQueued(t *testing.T) {
	s := newStorage(t, shared.Client(t), WithMaxQueued(5), WithMaxDeliveries(1),
		WithVisibilityTimeout(100*time.Millisecond), WithPollInterval(time.Millisecond))
	n, err := s.AddURLs(bg, "https://shop.example/1", "https://shop.example/2", "https://shop.example/3")
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.NoError(t, s.AddRequest(marshal(t, "https://shop.example/4")))
	n, err = s.AddURLs(bg, "https://shop.example/5", "https://shop.example/6")
	require.ErrorIs(t, err, ErrQueueFull)
	assert.Zero(t, n, "all or none")
	assert.Contains(t, err.Error(), "limit of 5")
	require.NoError(t, s.AddRequest(marshal(t, "https://shop.example/5")))
	require.ErrorIs(t, s.AddRequest(marshal(t, "https://shop.example/6")), ErrQueueFull)

	// In flight counts; acknowledged frees a place.
	b, err := s.GetRequest()
	require.NoError(t, err)
	require.ErrorIs(t, s.AddRequest(marshal(t, "https://shop.example/6")), ErrQueueFull)
	require.NoError(t, s.Ack(requestOf(t, b)))
	require.NoError(t, s.AddRequest(marshal(t, "https://shop.example/6")))

	// A dead letter takes no place.
	_, err = s.GetRequest() // never acknowledged: dead after its one delivery
	require.NoError(t, err)
	time.Sleep(150 * time.Millisecond)
	_, err = s.GetRequest()
	require.NoError(t, err)
	st, err := s.Stats(bg)
	require.NoError(t, err)
	require.Equal(t, 1, st.Dead)
	require.NoError(t, s.AddRequest(marshal(t, "https://shop.example/7")))
	require.ErrorIs(t, s.AddRequest(marshal(t, "https://shop.example/8")), ErrQueueFull)

	// Colly's queue passes the error on.
	q, err := queue.New(1, s)
	require.NoError(t, err)
	assert.ErrorIs(t, q.AddURL("https://shop.example/9"), ErrQueueFull)

	_, err = New(shared.Client(t), WithMaxQueued(-1))
	assert.ErrorIs(t, err, ErrConfig)
}
