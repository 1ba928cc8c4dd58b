package redistest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelMaster is the master name StartSentinel monitors.
const SentinelMaster = "mymaster"

// Sentinel is one redis-sentinel process (redis-server --sentinel) on
// 127.0.0.1 monitoring one master as SentinelMaster. It is stopped at test
// cleanup.
type Sentinel struct {
	addr   string
	master *Server
}

// StartSentinel starts a sentinel that monitors master and waits until it
// reports the master's address. Calls tb.Fatal on failure.
func StartSentinel(tb testing.TB, master *Server) *Sentinel {
	tb.Helper()
	dir := tb.TempDir()
	port, err := freePort()
	if err != nil {
		tb.Fatal(err)
	}
	conf := filepath.Join(dir, "sentinel.conf")
	body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor %s 127.0.0.1 %d 1\nsentinel down-after-milliseconds %s 2000\n",
		port, dir, SentinelMaster, master.Port(), SentinelMaster)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command("redis-server", conf, "--sentinel", "--logfile", filepath.Join(dir, "sentinel.log"))
	cmd.SysProcAttr = sysProcAttr()
	if err := startCmd(cmd); err != nil {
		tb.Fatalf("redistest: start sentinel: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	s := &Sentinel{addr: fmt.Sprintf("127.0.0.1:%d", port), master: master}
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.addr})
	defer sc.Close()
	deadline := time.Now().Add(readyTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		out, err := sc.GetMasterAddrByName(ctx, SentinelMaster).Result()
		cancel()
		if err == nil && len(out) == 2 && out[1] == fmt.Sprint(master.Port()) {
			return s
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redistest: sentinel on %s not ready: %v %q", s.addr, err, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Addr returns "127.0.0.1:PORT" of the sentinel.
func (s *Sentinel) Addr() string { return s.addr }

// Client returns a go-redis failover client that finds the master through
// this sentinel; it is closed at test cleanup.
func (s *Sentinel) Client(tb testing.TB) *redis.Client {
	tb.Helper()
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: SentinelMaster, SentinelAddrs: []string{s.addr}})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}
