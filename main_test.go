package proxyswitch

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// shared is one redis-server for the tests that need no fault injection;
// each test works under a key prefix of its own. Tests that kill, pause or
// restart Redis start their own with redistest.Start.
var shared *redistest.Server

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) != "" {
		os.Exit(workerMain())
	}
	var err error
	shared, err = redistest.StartProcess()
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

// sharedClient is a new client of the shared server, closed with the test.
func sharedClient(t testing.TB) *redis.Client { return shared.Client(t) }

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
