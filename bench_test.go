package proxyswitch

import (
	"context"
	"fmt"
	"math/rand/v2"

	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// BenchmarkLease measures lease+release pairs per second with 50 concurrent
// workers on one site, for several pool sizes, side by side with the broker
// of the reference article (shared/reference): SMEMBERS of the whole pool,
// shuffle, then per candidate EXISTS banned:<p> and SET lock:<p> NX EX 30;
// release is a bare DEL. Run:
//
//	go test -run '^$' -bench 'BenchmarkLease' -benchtime 2s -count 5 . | tee bench.txt
//
// and compare with benchstat. See BENCHMARKS.md for numbers.
func BenchmarkLease(b *testing.B) {
	for _, size := range []int{100, 1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("pool=%d/engine=proxyswitch", size), func(b *testing.B) { benchSwitch(b, size) })
		b.Run(fmt.Sprintf("pool=%d/engine=reference", size), func(b *testing.B) { benchReference(b, size) })
	}
}

const benchWorkers = 50

func benchSwitch(b *testing.B, size int) {
	if shared.Server == nil {
		b.Skip("single-node benchmark; the shared Redis is a cluster")
	}
	ctx := context.Background()
	rdb := shared.Server.Client(b, func(o *redis.Options) { o.PoolSize = benchWorkers })
	s := newSwitch(b, rdb)
	b.Cleanup(func() { _ = s.Close(ctx) }) // before the client closes: its background work is done
	urls := proxyURLs(size)
	for i := 0; i < size; i += 10_000 {
		_, err := s.Add(ctx, urls[i:min(i+10_000, size)]...)
		if err != nil {
			b.Fatal(err)
		}
	}
	// The first lease of a site (its cursor, its bookkeeping): not timed.
	l, err := s.Lease(ctx, "bench.example")
	if err != nil {
		b.Fatal(err)
	}
	_ = l.Release(ctx)
	b.SetParallelism(benchWorkers / max(1, runtimeProcs()))
	b.ReportAllocs()
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			l, err := s.Lease(ctx, "bench.example")
			if err != nil {
				b.Error(err)
				return
			}
			if err := l.Release(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	reportScriptTime(b, rdb)
}

// reportScriptTime reports the Redis server's own time per script call
// (INFO commandstats, evalsha: the lease and release scripts), which the
// load of a shared machine on the client side does not blur as much as
// ns/op.
func reportScriptTime(b *testing.B, rdb *redis.Client) {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:"); ok {
			for _, kv := range strings.Split(rest, ",") {
				if v, ok := strings.CutPrefix(kv, "usec_per_call="); ok {
					if f, err := strconv.ParseFloat(v, 64); err == nil {
						b.ReportMetric(f, "redis-µs/script")
					}
				}
			}
		}
	}
}

// referenceBroker is a faithful port of the reference article's broker.
type referenceBroker struct {
	rdb  *redis.Client
	pool string
}

func (r *referenceBroker) lease(ctx context.Context) (string, error) {
	members, err := r.rdb.SMembers(ctx, r.pool).Result()
	if err != nil {
		return "", err
	}
	rand.Shuffle(len(members), func(i, j int) { members[i], members[j] = members[j], members[i] })
	for _, p := range members {
		banned, err := r.rdb.Exists(ctx, "banned:"+p).Result()
		if err != nil {
			return "", err
		}
		if banned > 0 {
			continue
		}
		ok, err := r.rdb.SetNX(ctx, "lock:"+p, "1", 30e9).Result()
		if err != nil {
			return "", err
		}
		if ok {
			return p, nil
		}
	}
	return "", ErrNoProxy
}

func (r *referenceBroker) release(ctx context.Context, p string) error {
	return r.rdb.Del(ctx, "lock:"+p).Err()
}

func benchReference(b *testing.B, size int) {
	if shared.Server == nil {
		b.Skip("single-node benchmark; the shared Redis is a cluster")
	}
	ctx := context.Background()
	rdb := shared.Server.Client(b, func(o *redis.Options) { o.PoolSize = benchWorkers })
	r := &referenceBroker{rdb: rdb, pool: testPrefix() + ":refpool"}
	urls := proxyURLs(size)
	for i := 0; i < size; i += 10_000 {
		members := make([]any, 0, 10_000)
		for _, u := range urls[i:min(i+10_000, size)] {
			members = append(members, u)
		}
		if err := rdb.SAdd(ctx, r.pool, members...).Err(); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() { rdb.Del(ctx, r.pool) })
	b.SetParallelism(benchWorkers / max(1, runtimeProcs()))
	b.ReportAllocs()
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p, err := r.lease(ctx)
			if err != nil {
				b.Error(err)
				return
			}
			if err := r.release(ctx, p); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }
