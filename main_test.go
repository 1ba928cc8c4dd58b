package proxyswitch

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/proxyswitch/proxyswitch/internal/reexec"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// shared is the Redis of the tests that need no fault injection, each
// under a key prefix of its own: one redis-server, or with
// PROXYSWITCH_TEST_REDIS=cluster a 3-master Redis Cluster (shared.Server is
// then nil and shared.Client a *redis.ClusterClient). Tests that kill,
// pause or restart Redis start their own with redistest.Start.
var shared *redistest.Shared

func TestMain(m *testing.M) {
	reexec.Main(workerEnv, workerMain) // a worker process (worker_test.go) exits here
	var err error
	shared, err = redistest.StartSharedFromEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, "proxyswitch tests:", err)
		os.Exit(2)
	}
	code := m.Run()
	_ = shared.Close()
	os.Exit(code)
}

var prefixSeq atomic.Int64

// testPrefix returns a key prefix no other test uses.
func testPrefix() string { return fmt.Sprintf("t%d", prefixSeq.Add(1)) }

// keysMatching returns the keys matching pattern, on every master in
// cluster mode (KEYS runs on one node).
func keysMatching(t testing.TB, rdb redis.UniversalClient, pattern string) []string {
	t.Helper()
	ctx := context.Background()
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		keys, err := rdb.Keys(ctx, pattern).Result()
		require.NoError(t, err)
		return keys
	}
	var mu sync.Mutex
	var out []string
	require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		keys, err := n.Keys(ctx, pattern).Result()
		mu.Lock()
		out = append(out, keys...)
		mu.Unlock()
		return err
	}))
	return out
}

// newSwitch builds a Switch on rdb under a fresh prefix with opts.
func newSwitch(t testing.TB, rdb redis.Scripter, opts ...Option) *Switch {
	t.Helper()
	s, err := NewSwitch(rdb, append([]Option{WithPrefix(testPrefix())}, opts...)...)
	require.NoError(t, err)
	return s
}

// sibling returns another Switch with the same settings and pool as s,
// through another client: a second worker.
func sibling(t testing.TB, s *Switch, rdb redis.Scripter) *Switch {
	t.Helper()
	n, err := NewSwitch(rdb)
	require.NoError(t, err)
	n.cfg = s.cfg
	require.NoError(t, n.build())
	return n
}

// poolSwitch returns a Switch with s's settings on pool name: how a user
// loads or reads another pool (WithPool).
func (s *Switch) poolSwitch(name string) (*Switch, error) {
	n, err := NewSwitch(s.rdb)
	if err != nil {
		return nil, err
	}
	n.cfg = s.cfg
	n.cfg.pool, n.cfg.fallback, n.cfg.routes = name, fallbackConfig{}, routeConfig{}
	return n, n.build()
}

// sessionSwitch is poolSwitch for the pool sessions lease from.
func (s *Switch) sessionSwitch(t testing.TB) *Switch {
	t.Helper()
	name := s.cfg.session.pool
	if name == "" {
		return s
	}
	n, err := s.poolSwitch(name)
	require.NoError(t, err)
	return n
}

// miniredisClient returns a client of an embedded Redis of the test's own
// (miniredis: its Lua is gopher-lua, not Redis's), closed with the test.
func miniredisClient(t *testing.T) *redis.Client {
	t.Helper()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}
