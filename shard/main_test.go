package shard

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// The Membership tests share one Redis (a redis-server, or with
// PROXYSWITCH_TEST_REDIS=cluster a 3-master Redis Cluster), started by the
// first test that needs it, each under a key prefix of its own; the
// sharders' tests start none. Tests that kill, pause or restart Redis start
// their own with redistest.Start.
var (
	sharedOnce sync.Once
	shared     *redistest.Shared
	sharedErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if shared != nil {
		_ = shared.Close()
	}
	os.Exit(code)
}

// sharedClient returns a client of its own to the shared Redis.
func sharedClient(t testing.TB) redis.UniversalClient {
	t.Helper()
	sharedOnce.Do(func() { shared, sharedErr = redistest.StartSharedFromEnv() })
	if sharedErr != nil {
		t.Fatalf("starting the shared Redis: %v", sharedErr)
	}
	return shared.Client(t)
}

var prefixSeq atomic.Int64

// testPrefix returns a key prefix no other test uses.
func testPrefix() string { return fmt.Sprintf("t%d", prefixSeq.Add(1)) }
