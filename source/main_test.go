package source_test

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"github.com/proxyswitch/proxyswitch/internal/redistest"
)

// shared is the tests' Redis (a private redis-server on a free loopback
// port, or a cluster with PROXYSWITCH_TEST_REDIS=cluster), each test under
// a key prefix of its own.
var shared *redistest.Shared

func TestMain(m *testing.M) {
	var err error
	shared, err = redistest.StartSharedFromEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, "source tests:", err)
		os.Exit(2)
	}
	code := m.Run()
	_ = shared.Close()
	os.Exit(code)
}

var prefixSeq atomic.Int64

func testPrefix() string { return fmt.Sprintf("src%d", prefixSeq.Add(1)) }
