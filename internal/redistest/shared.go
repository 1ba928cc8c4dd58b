package redistest

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// SharedEnv picks the Redis that StartSharedFromEnv starts: "" or "single"
// for one redis-server, "cluster" for a 3-master Redis Cluster. .ci/run
// runs the root package and storage both ways.
const SharedEnv = "PROXYSWITCH_TEST_REDIS"

// Shared is the Redis a test package starts in its TestMain for the tests
// that need no fault injection, each working under keys of its own: one
// redis-server, or a Redis Cluster when SharedEnv says so. Tests that kill,
// pause or restart Redis start their own with Start.
type Shared struct {
	// Server is the redis-server; nil when the shared Redis is a cluster.
	Server *Server
	// Cluster is the Redis Cluster; nil unless SharedEnv is "cluster".
	Cluster *Cluster
}

// StartSharedFromEnv starts the shared Redis SharedEnv asks for. It is for
// a TestMain: the caller must call Close.
func StartSharedFromEnv() (*Shared, error) {
	switch mode := os.Getenv(SharedEnv); mode {
	case "", "single":
		s, err := StartProcess()
		if err != nil {
			return nil, err
		}
		return &Shared{Server: s}, nil
	case "cluster":
		c, err := StartClusterProcess(3)
		if err != nil {
			return nil, err
		}
		return &Shared{Cluster: c}, nil
	default:
		return nil, fmt.Errorf("%s=%q: want single or cluster", SharedEnv, mode)
	}
}

// Addr is the shared Redis for another process (see NewClient): the
// server's address, or the cluster's addresses separated by commas.
func (s *Shared) Addr() string {
	if s.Cluster != nil {
		return strings.Join(s.Cluster.Addrs(), ",")
	}
	return s.Server.Addr()
}

// Client returns a new client of the shared Redis, a *redis.Client or, for
// a cluster, a *redis.ClusterClient; it is closed at tb cleanup.
func (s *Shared) Client(tb testing.TB) redis.UniversalClient {
	tb.Helper()
	if s.Cluster != nil {
		return s.Cluster.Client(tb)
	}
	return s.Server.Client(tb)
}

// Close stops the shared Redis.
func (s *Shared) Close() error {
	if s.Cluster != nil {
		return s.Cluster.Close()
	}
	return s.Server.Close()
}

// NewClient returns a client of the Redis at addr as Shared.Addr gives it:
// one address, or a cluster's separated by commas. It is for a worker
// process; the caller must close it.
func NewClient(addr string) redis.UniversalClient {
	return redis.NewUniversalClient(&redis.UniversalOptions{Addrs: strings.Split(addr, ",")}) // 2+ addresses: a cluster
}
