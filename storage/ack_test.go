package storage

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/gocolly/colly/v2"
	"github.com/gocolly/colly/v2/queue"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// unsettled reports whether the delivery r came with is still in the queue
// (not acknowledged): its tries field still holds its delivery number.
func unsettled(t testing.TB, s *Storage, r *colly.Request) bool {
	tok, ok := deliveryToken(r)
	if !ok {
		t.Errorf("%s carries no delivery token", r.URL)
		return false
	}
	id, n, pop, err := parseToken(tok)
	require.NoError(t, err)
	got, err := s.rdb.HGet(bg, s.q.tries, id).Result()
	if err == redis.Nil {
		return false
	}
	require.NoError(t, err)
	return got == fmt.Sprint(n)+"|"+pop
}

// Issue 13, item 5: two collectors on two Redis clients crawl one queue
// (8 threads each); the user's OnScraped and OnError callbacks, registered
// before Attach on one collector and after it on the other, find every
// delivery still unacknowledged, both for pages (OnScraped) and for final
// failures (404, OnError). The queue ends empty: each was acknowledged
// after them. A second run, with one more OnScraped callback registered
// between the runs, finds the same for the new callback.
func TestAckAfterUserCallbacks(t *testing.T) {
	site := newCountingSite(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("missing") != "" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, "<html><body><p>ok</p></body></html>")
	})
	s := newStorage(t, shared.Client(t))
	peers := []*Storage{s, twin(t, s, shared.Client(t))}
	add := func(from, to int) {
		for i := from; i < to; i++ {
			u := fmt.Sprintf("%s/p/%d", site.URL, i)
			if i%10 == 0 {
				u += "?missing=1"
			}
			require.NoError(t, s.AddRequest(marshal(t, u)))
		}
	}
	var early, seen atomic.Int64
	check := func(s *Storage, r *colly.Request) {
		seen.Add(1)
		if !unsettled(t, s, r) {
			early.Add(1)
		}
	}
	cs := make([]*colly.Collector, len(peers))
	for i, p := range peers {
		c := colly.NewCollector()
		require.NoError(t, c.SetStorage(p))
		user := func() {
			c.OnHTML("p", func(e *colly.HTMLElement) { check(p, e.Request) })
			c.OnScraped(func(r *colly.Response) { check(p, r.Request) })
			c.OnError(func(r *colly.Response, _ error) { check(p, r.Request) })
		}
		if i == 0 {
			user()
			p.Attach(c)
		} else {
			p.Attach(c)
			user()
		}
		cs[i] = c
	}
	runAll := func() { // a queue runs once (Colly's queue.Run panics the second time)
		errs := make(chan error, len(cs))
		for i := range cs {
			q, err := queue.New(8, peers[i])
			require.NoError(t, err)
			go func() { errs <- q.Run(cs[i]) }()
		}
		for range cs {
			require.NoError(t, <-errs)
		}
	}

	add(0, 300)
	runAll()
	require.EqualValues(t, 300+270, seen.Load()) // 270 pages are seen twice (OnHTML, OnScraped)
	require.Zero(t, early.Load(), "callbacks that ran after the acknowledgement")
	st, err := s.Stats(bg)
	require.NoError(t, err)
	require.Equal(t, Stats{}, st)

	// Registered between runs: the acknowledgement moves behind it.
	var late atomic.Int64
	for i, c := range cs {
		c.OnScraped(func(r *colly.Response) {
			late.Add(1)
			if !unsettled(t, peers[i], r.Request) {
				early.Add(1)
			}
		})
	}
	add(300, 400)
	runAll()
	require.EqualValues(t, 90, late.Load())
	require.Zero(t, early.Load(), "callbacks that ran after the acknowledgement")
	st, err = s.Stats(bg)
	require.NoError(t, err)
	require.Equal(t, Stats{}, st)
	hits, distinct := site.total()
	require.Equal(t, 400, distinct)
	require.Equal(t, 400, hits)
}

// The acknowledging callbacks find Colly's callback lists by reflection;
// this pins the fields in the Colly version go.mod names, so that an
// upgrade that renames them fails here rather than silently acknowledging
// before the user's callbacks.
func TestCallbackFieldsFound(t *testing.T) {
	require.GreaterOrEqual(t, scrapedField, 0)
	require.GreaterOrEqual(t, errorField, 0)
	c := colly.NewCollector()
	require.Zero(t, callbackCount(c, scrapedField))
	c.OnScraped(func(*colly.Response) {})
	c.OnScraped(func(*colly.Response) {})
	c.OnError(func(*colly.Response, error) {})
	require.Equal(t, 2, callbackCount(c, scrapedField))
	require.Equal(t, 1, callbackCount(c, errorField))
}
