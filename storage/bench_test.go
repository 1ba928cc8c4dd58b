package storage

import (
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/gocolly/colly/v2/queue"
	"github.com/redis/go-redis/v9"
)

// The benchmarks compare this package with redisStorageBaseline (the
// approach of gocolly/redisstorage) on the shared local redis-server, with
// 50 goroutines (like 50 Colly workers) on one client. Run them together:
//
//	go test -run '^$' -bench . -benchmem -count 6 ./storage/

// visitedAPI is what Colly's requestCheck uses.
type visitedAPI interface {
	IsVisited(uint64) (bool, error)
	Visited(uint64) error
}

func benchClient(b *testing.B) *redis.Client {
	return single.Client(b, func(o *redis.Options) { o.PoolSize = 64 })
}

// benchStore is one contender.
type benchStore struct {
	name string
	s    interface {
		visitedAPI
		benchQueueStore
	}
}

// benchQueueStore is the part of a queue BenchmarkQueue uses.
type benchQueueStore interface {
	AddRequest([]byte) error
	GetRequest() ([]byte, error)
}

// benchStores returns this package on a default client ("proxyswitch",
// round trips on watchdog goroutines), on a client with
// ContextTimeoutEnabled ("proxyswitch-ctx", inline), and the baseline on
// the default client.
func benchStores(b *testing.B) []benchStore {
	rdb := benchClient(b)
	ctxClient := single.Client(b, func(o *redis.Options) { o.PoolSize = 64; o.ContextTimeoutEnabled = true })
	baseline := &redisStorageBaseline{Client: rdb, Prefix: testNS()}
	if err := baseline.Init(); err != nil {
		b.Fatal(err)
	}
	return []benchStore{
		{"proxyswitch", newStorage(b, rdb)},
		{"proxyswitch-ctx", newStorage(b, ctxClient)},
		{"redisstorage", baseline},
	}
}

func reportRate(b *testing.B, start time.Time, unit string) {
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), unit)
}

// redisCPU returns the CPU time the benchmarks' redis-server has used so
// far (INFO cpu: user + system), 0 if it cannot tell.
func redisCPU(b *testing.B, rdb *redis.Client) time.Duration {
	info, err := rdb.Info(bg, "cpu").Result()
	if err != nil {
		b.Logf("INFO cpu: %v", err)
		return 0
	}
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		k, v, _ := strings.Cut(line, ":")
		if k == "used_cpu_sys" || k == "used_cpu_user" {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

// reportRedisCPU reports the redis-server's CPU time per op since before
// (what redisCPU returned at the start): the server's share of the cost,
// which the 2-core machine's noise hardly moves.
func reportRedisCPU(b *testing.B, rdb *redis.Client, before time.Duration) {
	if before > 0 {
		b.ReportMetric(float64(redisCPU(b, rdb)-before)/float64(time.Microsecond)/float64(b.N), "redis-µs/op")
	}
}

// BenchmarkVisitedNew is Colly's check of a URL not seen before:
// IsVisited, then Visited (ours: a read, then the atomic claim).
func BenchmarkVisitedNew(b *testing.B) {
	info := single.Client(b)
	for _, bc := range benchStores(b) {
		b.Run(bc.name, func(b *testing.B) {
			var next atomic.Uint64
			next.Store(uint64(time.Now().UnixNano()))
			b.ReportAllocs()
			b.SetParallelism(25) // 50 goroutines on 2 cores
			cpu := redisCPU(b, info)
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					id := next.Add(0x9e3779b97f4a7c15)
					v, err := bc.s.IsVisited(id)
					if err != nil || v {
						b.Errorf("IsVisited(%d) = %v, %v", id, v, err)
						return
					}
					if err := bc.s.Visited(id); err != nil {
						b.Error(err)
						return
					}
				}
			})
			reportRate(b, start, "checks/s")
			reportRedisCPU(b, info, cpu)
		})
	}
}

// BenchmarkVisitedSeen is Colly's check of a URL already visited (most
// links of a crawl): one IsVisited.
func BenchmarkVisitedSeen(b *testing.B) {
	const seen = 4096
	info := single.Client(b)
	for _, bc := range benchStores(b) {
		for i := range seen {
			if err := bc.s.Visited(uint64(i)); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(bc.name, func(b *testing.B) {
			var next atomic.Uint64
			b.ReportAllocs()
			b.SetParallelism(25)
			cpu := redisCPU(b, info)
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					id := next.Add(1) % seen
					if v, err := bc.s.IsVisited(id); err != nil || !v {
						b.Errorf("IsVisited(%d) = %v, %v", id, v, err)
						return
					}
				}
			})
			reportRate(b, start, "checks/s")
			reportRedisCPU(b, info, cpu)
		})
	}
}

// BenchmarkQueue is one request through the queue: push, pop and (ours
// only; the references have no such step) acknowledge, from 50 goroutines
// (so concurrent calls share round trips: see internal/group). Colly's own
// queue.Run pops from one goroutine per process; its threads add and
// acknowledge concurrently.
//
// Two references run beside it: the redisstorage port (RPUSH, LPOP) and a
// plain list, LPUSH and BRPOP (1s timeout), on the default client.
func BenchmarkQueue(b *testing.B) {
	for _, bc := range benchStores(b) {
		b.Run(bc.name, func(b *testing.B) { benchQueue(b, bc.s, nil) })
	}
	list := &listQueue{rdb: benchClient(b), key: testNS() + ":list"}
	b.Run("list-brpop", func(b *testing.B) { benchQueue(b, list, nil) })
}

// listQueue is the plainest Redis queue: LPUSH, BRPOP. A popped request is
// gone (nothing to acknowledge, lost if its worker dies).
type listQueue struct {
	rdb *redis.Client
	key string
}

func (q *listQueue) AddRequest(r []byte) error { return q.rdb.LPush(bg, q.key, r).Err() }

func (q *listQueue) GetRequest() ([]byte, error) {
	kv, err := q.rdb.BRPop(bg, time.Second, q.key).Result()
	if err != nil {
		return nil, err
	}
	return []byte(kv[1]), nil
}

// BenchmarkQueueRunning is BenchmarkQueue on the default client with what
// Attach's OnRequest hook adds between pop and acknowledge: marking the
// delivery as running (the renewer it starts ticks every 20s, so never
// within a run). Compare it with BenchmarkQueue/proxyswitch.
func BenchmarkQueueRunning(b *testing.B) {
	s := newStorage(b, benchClient(b))
	b.Run("proxyswitch", func(b *testing.B) {
		benchQueue(b, s, func(tok string) { s.begin(&colly.Request{Ctx: colly.NewContext()}, tok) })
	})
}

var benchSeq atomic.Int64

// benchQueue runs push, pop and (for this package) mark, if not nil, and
// acknowledge, from 50 goroutines.
func benchQueue(b *testing.B, bs benchQueueStore, mark func(tok string)) {
	next := func() []byte { // distinct requests, serialized as Colly's queue.AddURL does
		u, err := url.Parse(fmt.Sprintf("https://shop.example/catalog/item?id=%d&ref=list", benchSeq.Add(1)))
		if err != nil {
			b.Fatal(err)
		}
		r, err := (&colly.Request{URL: u, Method: "GET"}).Marshal()
		if err != nil {
			b.Fatal(err)
		}
		return r
	}
	ours, _ := bs.(*Storage)
	info := single.Client(b)
	b.ReportAllocs()
	b.SetParallelism(25)
	cpu := redisCPU(b, info)
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := bs.AddRequest(next()); err != nil {
				b.Error(err)
				return
			}
			got, err := bs.GetRequest()
			if errors.Is(err, ErrQueueEmpty) || err == redis.Nil {
				continue // another goroutine took it
			}
			if err != nil {
				b.Error(err)
				return
			}
			if ours == nil {
				continue // LPOP: nothing to acknowledge
			}
			// The delivery token, as Attach's hooks find it in the request's
			// context after Colly decoded it (which it does for every
			// backend; the references' requests are not decoded either).
			tok := benchToken(got)
			if tok == "" {
				b.Errorf("no delivery token in %s", got)
				return
			}
			if mark != nil {
				mark(tok)
			}
			if err := ours.settle(tok, nil); err != nil {
				b.Error(err)
				return
			}
		}
	})
	reportRate(b, start, "requests/s")
	reportRedisCPU(b, info, cpu)
}

// benchToken is the delivery token in a request GetRequest returned, or "".
func benchToken(b []byte) string {
	key := []byte(`"` + ctxDelivery + `":"`)
	i := bytes.Index(b, key)
	if i < 0 {
		return ""
	}
	rest := b[i+len(key):]
	j := bytes.IndexByte(rest, '"')
	if j < 0 {
		return ""
	}
	return string(rest[:j])
}

// BenchmarkSeed queues 1,000 URLs: one by one through Colly's
// queue.AddURL (one round trip each), or with AddURLs (two script calls).
// One op is one URL.
func BenchmarkSeed(b *testing.B) {
	const batch = 1000
	urls := make([]string, batch)
	for i := range urls {
		urls[i] = fmt.Sprintf("https://shop.example/catalog/item?id=%d&ref=list", i)
	}
	b.Run("queue.AddURL", func(b *testing.B) {
		s := newStorage(b, benchClient(b))
		q, err := queue.New(1, s)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		start := time.Now()
		for i := 0; i < b.N; i++ {
			if err := q.AddURL(urls[i%batch]); err != nil {
				b.Fatal(err)
			}
		}
		reportRate(b, start, "urls/s")
	})
	b.Run("AddURLs", func(b *testing.B) {
		s := newStorage(b, benchClient(b))
		b.ReportAllocs()
		start := time.Now()
		for done := 0; done < b.N; done += batch {
			if _, err := s.AddURLs(bg, urls[:min(batch, b.N-done)]...); err != nil {
				b.Fatal(err)
			}
		}
		reportRate(b, start, "urls/s")
	})
}
