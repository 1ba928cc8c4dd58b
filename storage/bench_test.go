package storage

import (
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

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
	return shared.Client(b, func(o *redis.Options) { o.PoolSize = 64 })
}

func benchStores(b *testing.B) (ours *Storage, baseline *redisStorageBaseline) {
	rdb := benchClient(b)
	ours = newStorage(b, rdb)
	baseline = &redisStorageBaseline{Client: rdb, Prefix: testNS()}
	if err := baseline.Init(); err != nil {
		b.Fatal(err)
	}
	return ours, baseline
}

func reportRate(b *testing.B, start time.Time, unit string) {
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), unit)
}

// BenchmarkVisitedNew is Colly's check of a URL not seen before:
// IsVisited, then Visited (ours: a read, then the atomic claim).
func BenchmarkVisitedNew(b *testing.B) {
	ours, baseline := benchStores(b)
	for _, bc := range []struct {
		name string
		s    visitedAPI
	}{{"proxyswitch", ours}, {"redisstorage", baseline}} {
		b.Run(bc.name, func(b *testing.B) {
			var next atomic.Uint64
			next.Store(uint64(time.Now().UnixNano()))
			b.ReportAllocs()
			b.SetParallelism(25) // 50 goroutines on 2 cores
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
		})
	}
}

// BenchmarkVisitedSeen is Colly's check of a URL already visited (most
// links of a crawl): one IsVisited.
func BenchmarkVisitedSeen(b *testing.B) {
	ours, baseline := benchStores(b)
	const seen = 4096
	for _, bc := range []struct {
		name string
		s    visitedAPI
	}{{"proxyswitch", ours}, {"redisstorage", baseline}} {
		for i := range seen {
			if err := bc.s.Visited(uint64(i)); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(bc.name, func(b *testing.B) {
			var next atomic.Uint64
			b.ReportAllocs()
			b.SetParallelism(25)
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
		})
	}
}

// BenchmarkQueue is one request through the queue: push, pop and (ours
// only; the baseline has no such step) acknowledge.
func BenchmarkQueue(b *testing.B) {
	ours, baseline := benchStores(b)
	req := marshal(b, "https://shop.example/catalog/item?id=12345&ref=list")
	b.Run("proxyswitch", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(25)
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := ours.AddRequest(req); err != nil {
					b.Error(err)
					return
				}
				got, err := ours.GetRequest()
				if errors.Is(err, ErrQueueEmpty) {
					continue // another goroutine took it; it acks that one
				}
				if err != nil {
					b.Error(err)
					return
				}
				var m struct{ Ctx map[string]any }
				if err := json.Unmarshal(got, &m); err != nil {
					b.Error(err)
					return
				}
				tok, _ := m.Ctx[ctxDelivery].(string)
				if err := ours.settle(tok, nil); err != nil {
					b.Error(err)
					return
				}
			}
		})
		reportRate(b, start, "requests/s")
	})
	b.Run("redisstorage", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(25)
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := baseline.AddRequest(req); err != nil {
					b.Error(err)
					return
				}
				if _, err := baseline.GetRequest(); err != nil && err != redis.Nil {
					b.Error(err)
					return
				}
			}
		})
		reportRate(b, start, "requests/s")
	})
}
