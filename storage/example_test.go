package storage_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"

	"github.com/gocolly/colly/v2"
	"github.com/gocolly/colly/v2/queue"
	"github.com/proxyswitch/proxyswitch/storage"
	"github.com/redis/go-redis/v9"
)

// redisAddr returns the address of the Redis the examples use, for
// instance "localhost:6379"; here the tests' own redis-server.
func redisAddr() string {
	if storage.ExampleRedisAddr == "" {
		panic("examples run only under the tests' TestMain")
	}
	return storage.ExampleRedisAddr
}

// site is a small web site for the examples; it counts the requests it gets.
func site() (*httptest.Server, *atomic.Int64) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.URL.Path == "/broken" {
			http.Error(w, "broken", http.StatusInternalServerError)
			return
		}
		fmt.Fprint(w, "<html><body>hello</body></html>")
	}))
	return srv, &hits
}

// Two collectors (on two servers, say) share one visited set: the URL is
// fetched once, and the second collector's Visit says why it was not.
func Example() {
	srv, hits := site()
	defer srv.Close()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer rdb.Close()

	var collectors []*colly.Collector
	for range 2 {
		s, err := storage.New(rdb, storage.WithNamespace("example-visited"))
		if err != nil {
			panic(err)
		}
		c := colly.NewCollector()
		if err := c.SetStorage(s); err != nil {
			panic(err)
		}
		collectors = append(collectors, c)
	}
	defer func() {
		s, _ := storage.New(rdb, storage.WithNamespace("example-visited"))
		_ = s.Clear(context.Background())
	}()

	fmt.Println("first: ", collectors[0].Visit(srv.URL+"/product/1"))
	var av *colly.AlreadyVisitedError
	err := collectors[1].Visit(srv.URL + "/product/1")
	fmt.Println("second:", errors.As(err, &av) || errors.Is(err, storage.ErrAlreadyVisited))
	fmt.Println("fetches:", hits.Load())
	// Output:
	// first:  <nil>
	// second: true
	// fetches: 1
}

// A shared queue: any number of processes run the same code; each request
// is acknowledged when its fetch ends, a failing one is retried and then
// dead-lettered, where it can be inspected and requeued.
func Example_queue() {
	srv, hits := site()
	defer srv.Close()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer rdb.Close()
	s, err := storage.New(rdb,
		storage.WithNamespace("example-queue"),
		storage.WithMaxDeliveries(2),
		storage.WithRetryDelay(0),
	)
	if err != nil {
		panic(err)
	}
	defer s.Clear(context.Background())

	c := colly.NewCollector()
	if err := c.SetStorage(s); err != nil {
		panic(err)
	}
	s.Attach(c) // acknowledges (or fails) each request from the queue
	q, err := queue.New(4, s)
	if err != nil {
		panic(err)
	}
	for _, p := range []string{"/a", "/b", "/c", "/broken"} {
		if err := q.AddURL(srv.URL + p); err != nil {
			panic(err)
		}
	}
	if err := q.Run(c); err != nil {
		panic(err)
	}

	st, _ := s.Stats(context.Background())
	fmt.Printf("fetches: %d, ready: %d, in flight: %d, dead: %d\n", hits.Load(), st.Ready, st.InFlight, st.Dead)
	dead, _ := s.DeadLetters(context.Background(), 0, 10)
	for _, d := range dead {
		fmt.Printf("dead letter: %s after %d deliveries: %s\n", d.URL[len(srv.URL):], d.Deliveries, d.Reason)
		_ = s.Requeue(context.Background(), d.ID) // back into the queue
	}
	st, _ = s.Stats(context.Background())
	fmt.Printf("after requeue: ready %d, dead %d\n", st.Ready, st.Dead)
	// Output:
	// fetches: 5, ready: 0, in flight: 0, dead: 1
	// dead letter: /broken after 2 deliveries: Internal Server Error
	// after requeue: ready 1, dead 0
}

// Seeding the queue with many URLs at once: one round trip per 500, every
// URL checked before any is queued.
func ExampleStorage_AddURLs() {
	srv, hits := site()
	defer srv.Close()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer rdb.Close()
	s, err := storage.New(rdb, storage.WithNamespace("example-seed"))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	defer s.Clear(ctx)

	seeds := make([]string, 1200)
	for i := range seeds {
		seeds[i] = fmt.Sprintf("%s/item/%d", srv.URL, i)
	}
	if _, err := s.AddURLs(ctx, srv.URL+"/item/1", "mailto:someone@example.com"); err != nil {
		fmt.Println("refused:", errors.Is(err, storage.ErrInvalidRequest))
	}
	n, err := s.AddURLs(ctx, seeds...)
	if err != nil {
		panic(err)
	}
	c := colly.NewCollector()
	if err := c.SetStorage(s); err != nil {
		panic(err)
	}
	s.Attach(c)
	q, err := queue.New(8, s)
	if err != nil {
		panic(err)
	}
	if err := q.Run(c); err != nil {
		panic(err)
	}
	fmt.Printf("queued %d, fetched %d\n", n, hits.Load())
	// Output:
	// refused: true
	// queued 1200, fetched 1200
}
