package storage

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/proxyswitch/proxyswitch/internal/reexec"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// shared is the Redis of the tests that need no fault injection, each in
// a namespace of its own: one redis-server, or with
// PROXYSWITCH_TEST_REDIS=cluster a 3-master Redis Cluster (shared.Client
// then a *redis.ClusterClient). Tests that kill, pause or cluster Redis
// start their own servers.
//
// single is a redis-server for the examples, which show a single-node
// client, and the benchmarks: shared.Server, or in cluster mode one of its
// own.
var (
	shared *redistest.Shared
	single *redistest.Server
)

func TestMain(m *testing.M) {
	reexec.Main(workerEnv, workerMain) // a worker process (worker_test.go) exits here
	var err error
	shared, err = redistest.StartSharedFromEnv()
	if err == nil {
		single = shared.Server
		if single == nil {
			single, err = redistest.StartProcess()
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "storage tests:", err)
		os.Exit(2)
	}
	ExampleRedisAddr = single.Addr()
	code := m.Run()
	_ = shared.Close()
	if single != shared.Server {
		_ = single.Close()
	}
	os.Exit(code)
}

var nsSeq atomic.Int64

// testNS returns a namespace no other test uses.
func testNS() string { return fmt.Sprintf("t%d", nsSeq.Add(1)) }

// newStorage builds and initializes a Storage on rdb in a fresh namespace
// (or the one given with WithNamespace in opts).
func newStorage(t testing.TB, rdb redis.UniversalClient, opts ...Option) *Storage {
	t.Helper()
	s, err := New(rdb, append([]Option{WithNamespace(testNS())}, opts...)...)
	require.NoError(t, err)
	require.NoError(t, s.Init())
	return s
}

// twin returns a Storage on another client in the same namespace with the
// same options as s: another collector, as if in another process.
func twin(t testing.TB, s *Storage, rdb redis.UniversalClient) *Storage {
	t.Helper()
	n, err := New(rdb, WithNamespace(s.cfg.namespace))
	require.NoError(t, err)
	n.cfg = s.cfg
	require.NoError(t, n.Init())
	return n
}

var bg = context.Background()

// ExampleRedisAddr is the Redis address the examples (package storage_test)
// use: the shared test server's.
var ExampleRedisAddr string
