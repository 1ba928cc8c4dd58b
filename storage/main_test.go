package storage

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// shared is one redis-server for the tests that need no fault injection;
// each test works in a namespace of its own. Tests that kill, pause or
// cluster Redis start their own servers.
//
// With PROXYSWITCH_TEST_REDIS=cluster the shared Redis is a 3-master Redis
// Cluster instead (sharedCluster) and client a *redis.ClusterClient; shared
// then serves only the examples, which show a single-node client.
var (
	shared        *redistest.Server
	sharedCluster *redistest.Cluster
)

// testRedisEnv selects the shared test Redis: "" or "single", or "cluster".
const testRedisEnv = "PROXYSWITCH_TEST_REDIS"

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) != "" {
		os.Exit(workerMain())
	}
	var err error
	switch mode := os.Getenv(testRedisEnv); mode {
	case "", "single":
	case "cluster":
		sharedCluster, err = redistest.StartClusterProcess(3)
	default:
		err = fmt.Errorf("%s=%q: want single or cluster", testRedisEnv, mode)
	}
	if err == nil {
		shared, err = redistest.StartProcess()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "storage tests:", err)
		os.Exit(2)
	}
	ExampleRedisAddr = shared.Addr()
	code := m.Run()
	_ = shared.Close()
	if sharedCluster != nil {
		_ = sharedCluster.Close()
	}
	os.Exit(code)
}

// sharedAddr is the shared Redis for worker processes: its address, or the
// cluster's addresses separated by commas.
func sharedAddr() string {
	if sharedCluster != nil {
		return strings.Join(sharedCluster.Addrs(), ",")
	}
	return shared.Addr()
}

var nsSeq atomic.Int64

// testNS returns a namespace no other test uses.
func testNS() string { return fmt.Sprintf("t%d", nsSeq.Add(1)) }

// client is a new client of the shared Redis (a *redis.ClusterClient in
// cluster mode), closed with the test.
func client(t testing.TB) redis.UniversalClient {
	if sharedCluster != nil {
		return sharedCluster.Client(t)
	}
	return shared.Client(t)
}

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
