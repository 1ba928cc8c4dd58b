package proxyswitch

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// shared is one redis-server for the tests that need no fault injection;
// each test works under a key prefix of its own. Tests that kill, pause or
// restart Redis start their own with redistest.Start.
//
// With PROXYSWITCH_TEST_REDIS=cluster the shared Redis is a 3-master Redis
// Cluster instead (sharedCluster; shared is nil) and sharedClient a
// *redis.ClusterClient: .ci/run runs the package that way too.
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
		shared, err = redistest.StartProcess()
	case "cluster":
		sharedCluster, err = redistest.StartClusterProcess(3)
	default:
		err = fmt.Errorf("%s=%q: want single or cluster", testRedisEnv, mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "proxyswitch tests:", err)
		os.Exit(2)
	}
	code := m.Run()
	if shared != nil {
		_ = shared.Close()
	}
	if sharedCluster != nil {
		_ = sharedCluster.Close()
	}
	os.Exit(code)
}

// clusterMode reports whether the shared Redis is a Redis Cluster.
func clusterMode() bool { return sharedCluster != nil }

// sharedAddr is the shared Redis for worker processes: its address, or the
// cluster's addresses separated by commas.
func sharedAddr() string {
	if sharedCluster != nil {
		return strings.Join(sharedCluster.Addrs(), ",")
	}
	return shared.Addr()
}

var prefixSeq atomic.Int64

// testPrefix returns a key prefix no other test uses.
func testPrefix() string { return fmt.Sprintf("t%d", prefixSeq.Add(1)) }

// sharedClient is a new client of the shared Redis (a *redis.Client, or a
// *redis.ClusterClient in cluster mode), closed with the test.
func sharedClient(t testing.TB) redis.UniversalClient {
	if sharedCluster != nil {
		return sharedCluster.Client(t)
	}
	return shared.Client(t)
}

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
	n.cfg, n.keys = s.cfg, s.keys
	return n
}
