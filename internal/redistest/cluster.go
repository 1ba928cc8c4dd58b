package redistest

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// clusterCreateTimeout bounds `redis-cli --cluster create`.
	clusterCreateTimeout = 30 * time.Second
	// clusterReadyTimeout bounds the wait for cluster_state:ok everywhere.
	clusterReadyTimeout = 20 * time.Second
)

// Cluster is a Redis Cluster of n masters (no replicas) on loopback, created
// with `redis-server --cluster-enabled yes` and
// `redis-cli --cluster create ... --cluster-yes`.
//
// Each node is a Server with its own cluster bus port (--cluster-port), so
// nodes can be killed, paused and restarted individually; a restarted node
// keeps its nodes.conf and rejoins with its slots, but its data is gone.
type Cluster struct {
	// Nodes are the master nodes, in the order given to redis-cli.
	Nodes []*Server
}

// StartCluster starts masters (at least 3, as redis-cli requires) cluster
// nodes, joins them with redis-cli --cluster create, and waits until
// CLUSTER INFO reports cluster_state:ok on every node. Nodes are killed and
// their temp dirs removed at tb cleanup. Calls tb.Fatal on failure.
func StartCluster(tb testing.TB, masters int) *Cluster {
	tb.Helper()
	c, err := startCluster(masters, func(s *Server) { registerCleanup(tb, s) })
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	return c
}

// StartClusterProcess is StartCluster without testing.TB (for a TestMain):
// the caller must call Close.
func StartClusterProcess(masters int) (*Cluster, error) {
	c, err := startCluster(masters, nil)
	if err != nil && c != nil {
		_ = c.Close()
	}
	return c, err
}

// Close kills every node and removes their temp dirs.
func (c *Cluster) Close() error {
	var errs []error
	for _, n := range c.Nodes {
		errs = append(errs, n.Close())
	}
	return errors.Join(errs...)
}

func startCluster(masters int, started func(*Server)) (*Cluster, error) {
	if masters < 3 {
		return nil, fmt.Errorf("StartCluster needs at least 3 masters (redis-cli --cluster create), got %d", masters)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return nil, errors.New("redis-cli not found on PATH; install it (apt-get install redis-server / redis-tools)")
	}
	c := &Cluster{}
	for range masters {
		s, err := startServer(true, nil)
		if err != nil {
			return c, fmt.Errorf("start cluster node: %w", err)
		}
		if started != nil {
			started(s)
		}
		c.Nodes = append(c.Nodes, s)
	}

	ctx, cancel := context.WithTimeout(context.Background(), clusterCreateTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		return c, fmt.Errorf("redis-cli %s: %w\n%s", strings.Join(args, " "), err, out)
	}

	if err := c.waitReady(clusterReadyTimeout); err != nil {
		return c, fmt.Errorf("%w\nredis-cli output:\n%s", err, out)
	}
	return c, nil
}

// waitReady waits until every node reports cluster_state:ok, all 16384 slots
// ok and knows every other node.
func (c *Cluster) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := c.checkReady()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster not ready after %v: %w", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *Cluster) checkReady() error {
	want := map[string]string{
		"cluster_state":       "ok",
		"cluster_slots_ok":    "16384",
		"cluster_known_nodes": strconv.Itoa(len(c.Nodes)),
	}
	for _, n := range c.Nodes {
		info, err := command(n.Addr(), time.Second, "CLUSTER", "INFO")
		if err != nil {
			return fmt.Errorf("%s: CLUSTER INFO: %w", n.Addr(), err)
		}
		for k, v := range want {
			if got, _ := infoField(info, k); got != v {
				return fmt.Errorf("%s: %s is %q, want %q", n.Addr(), k, got, v)
			}
		}
	}
	return nil
}

// Addrs returns the nodes' addresses ("127.0.0.1:PORT"), in Nodes order.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Client returns a new go-redis cluster client seeded with all node
// addresses, closed at tb cleanup.
func (c *Cluster) Client(tb testing.TB) *redis.ClusterClient {
	tb.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	tb.Cleanup(func() { _ = cc.Close() })
	return cc
}
