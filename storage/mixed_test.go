package storage

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/gocolly/colly/v2/queue"
	"github.com/stretchr/testify/require"
)

// The queue holds /a and /x; /a's page visits /x directly. Colly's queue
// takes /x's delivery from Redis before a thread is free for it, so the
// direct visit's claim in Visited is not that delivery's: /x is fetched
// once (by the direct visit), and the queued copy, which Colly refuses as
// already visited, is acknowledged at once rather than coming back after
// the visibility timeout to be fetched again. With several threads the
// queued copy's own check may also race the direct visit's: whichever wins,
// each URL is fetched once and none is lost (a delivery taken for a
// duplicate while its own Visited was setting the mark used to be
// acknowledged and never fetched).
func TestQueuedURLVisitedDirectlyFetchedOnce(t *testing.T) {
	for _, tc := range []struct{ threads, links int }{{1, 1}, {1, 5}, {4, 20}} {
		t.Run(fmt.Sprintf("threads=%d,links=%d", tc.threads, tc.links), func(t *testing.T) {
			testQueuedURLVisitedDirectly(t, tc.threads, tc.links)
		})
	}
}

func testQueuedURLVisitedDirectly(t *testing.T, threads, links int) {
	var mu sync.Mutex
	hits := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits[r.URL.Path]++
		mu.Unlock()
		if r.URL.Path == "/a" {
			fmt.Fprint(w, `<html><body>`)
			for i := range links {
				fmt.Fprintf(w, `<a href="/x%d">x</a>`, i)
			}
			fmt.Fprint(w, `</body></html>`)
			return
		}
		fmt.Fprint(w, "leaf")
	}))
	defer srv.Close()

	const visibility = 3 * time.Second
	s := newStorage(t, shared.Client(t), WithVisibilityTimeout(visibility), WithPollInterval(10*time.Millisecond))
	c := colly.NewCollector()
	require.NoError(t, c.SetStorage(s))
	s.Attach(c)
	c.OnHTML("a[href]", func(e *colly.HTMLElement) { _ = e.Request.Visit(e.Attr("href")) })
	q, err := queue.New(threads, s)
	require.NoError(t, err)
	require.NoError(t, q.AddURL(srv.URL+"/a"))
	want := map[string]int{"/a": 1}
	for i := range links {
		require.NoError(t, q.AddURL(fmt.Sprintf("%s/x%d", srv.URL, i)))
		want[fmt.Sprintf("/x%d", i)] = 1
	}

	start := time.Now()
	require.NoError(t, q.Run(c))
	took := time.Since(start)

	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, want, hits)
	require.Less(t, took, visibility/2, "the run waited for the visibility timeout")
	st, err := s.Stats(bg)
	require.NoError(t, err)
	require.Equal(t, Stats{}, st)
}
