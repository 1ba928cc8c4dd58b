package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func mustPing(t *testing.T, c redis.UniversalClient) {
	t.Helper()
	if err := c.Ping(ctxTimeout(t, 5*time.Second)).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
}

func TestStartPing(t *testing.T) {
	t.Parallel()
	s := Start(t, "--maxmemory", "10mb")

	host, port, err := net.SplitHostPort(s.Addr())
	if err != nil || host != "127.0.0.1" || port == "6379" || port == "0" {
		t.Fatalf("Addr() = %q", s.Addr())
	}
	if want := "redis://" + s.Addr() + "/0"; s.URL() != want {
		t.Fatalf("URL() = %q, want %q", s.URL(), want)
	}
	if !s.Running() {
		t.Fatal("Running() = false after Start")
	}

	c := s.Client(t)
	mustPing(t, c)
	ctx := ctxTimeout(t, 5*time.Second)
	if got := c.ConfigGet(ctx, "maxmemory").Val()["maxmemory"]; got != "10485760" {
		t.Fatalf("extraArgs not applied: maxmemory = %q", got)
	}
	if got := c.ConfigGet(ctx, "save").Val()["save"]; got != "" {
		t.Fatalf("save = %q, want empty", got)
	}

	opt, err := redis.ParseURL(s.URL())
	if err != nil {
		t.Fatalf("ParseURL(%q): %v", s.URL(), err)
	}
	c2 := redis.NewClient(opt)
	defer c2.Close()
	mustPing(t, c2)
}

func TestKill(t *testing.T) {
	t.Parallel()
	s := Start(t)
	c := s.Client(t, func(o *redis.Options) {
		o.MaxRetries = -1
		o.DialTimeout = 500 * time.Millisecond
	})
	mustPing(t, c)

	if err := s.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if s.Running() {
		t.Fatal("Running() = true after Kill")
	}
	if err := c.Ping(ctxTimeout(t, 2*time.Second)).Err(); err == nil {
		t.Fatal("PING succeeded after Kill")
	}
	// Nothing listens any more.
	if conn, err := net.DialTimeout("tcp", s.Addr(), time.Second); err == nil {
		conn.Close()
		t.Fatal("dial succeeded after Kill")
	}
	for name, f := range map[string]func() error{"Kill": s.Kill, "Pause": s.Pause, "Resume": s.Resume} {
		if err := f(); !errors.Is(err, ErrNotRunning) {
			t.Errorf("%s on killed server: %v, want ErrNotRunning", name, err)
		}
	}
}

func TestRestart(t *testing.T) {
	t.Parallel()
	s := Start(t)
	addr := s.Addr()
	c := s.Client(t)
	ctx := ctxTimeout(t, 10*time.Second)

	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	// Restart while running.
	if err := s.Restart(); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	if s.Addr() != addr || !s.Running() {
		t.Fatalf("after Restart: Addr %q (was %q), Running %v", s.Addr(), addr, s.Running())
	}
	// The same client reconnects (its pooled connection is dead).
	if err := c.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET k after Restart: %v, want redis.Nil (empty server)", err)
	}

	// Restart after Kill.
	if err := c.Set(ctx, "k2", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	if err := s.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if err := s.Restart(); err != nil {
		t.Fatalf("Restart after Kill: %v", err)
	}
	if n, err := c.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("DBSIZE after Restart = %d, %v; want 0", n, err)
	}
}

func TestRestartWaitsForPort(t *testing.T) {
	t.Parallel()
	s := Start(t)
	if err := s.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	// Someone else holds the port for a while; Restart must retry, not fail.
	l, err := net.Listen("tcp", s.Addr())
	if err != nil {
		t.Fatalf("listen on %s: %v", s.Addr(), err)
	}
	timer := time.AfterFunc(500*time.Millisecond, func() { l.Close() })
	defer timer.Stop()
	start := time.Now()
	if err := s.Restart(); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	if d := time.Since(start); d < 400*time.Millisecond {
		t.Fatalf("Restart returned after %v while the port was still taken", d)
	}
	mustPing(t, s.Client(t))
}

func TestPauseResume(t *testing.T) {
	t.Parallel()
	s := Start(t)
	c := s.Client(t, func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	mustPing(t, c)

	if err := s.Pause(); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if !s.Running() {
		t.Fatal("Running() = false while paused")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	start := time.Now()
	err := c.Ping(ctx).Err()
	cancel()
	var netErr net.Error
	isTimeout := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) ||
		(errors.As(err, &netErr) && netErr.Timeout())
	if !isTimeout {
		t.Fatalf("PING on paused server: %v, want a timeout", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("PING on paused server took %v", d)
	}

	if err := s.Resume(); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	mustPing(t, c)

	// Kill works on a paused server too.
	if err := s.Pause(); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if err := s.Kill(); err != nil {
		t.Fatalf("Kill paused: %v", err)
	}
	if s.Running() {
		t.Fatal("Running() after Kill of paused server")
	}
}

func TestStartProcessClose(t *testing.T) {
	t.Parallel()
	s, err := StartProcess()
	if err != nil {
		t.Fatalf("StartProcess: %v", err)
	}
	dir := s.Dir()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer c.Close()
	mustPing(t, c)

	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if s.Running() {
		t.Fatal("Running() after Close")
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("temp dir %s still exists after Close (%v)", dir, err)
	}
	if err := c.Ping(ctxTimeout(t, 2*time.Second)).Err(); err == nil {
		t.Fatal("PING succeeded after Close")
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := s.Restart(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Restart after Close: %v, want ErrClosed", err)
	}
}

func TestConcurrentStarts(t *testing.T) {
	t.Parallel()
	const n = 4
	servers := make([]*Server, n)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); servers[i], errs[i] = StartProcess() }()
	}
	wg.Wait()
	for i, s := range servers {
		if s != nil {
			t.Cleanup(func() { _ = s.Close() })
		}
		if errs[i] != nil {
			t.Fatalf("StartProcess: %v", errs[i])
		}
	}
	seen := map[string]bool{}
	for _, s := range servers {
		if seen[s.Addr()] {
			t.Fatalf("two servers on %s", s.Addr())
		}
		seen[s.Addr()] = true
		mustPing(t, s.Client(t))
	}
}

func TestCluster(t *testing.T) {
	t.Parallel()
	cl := StartCluster(t, 3)
	if len(cl.Nodes) != 3 || len(cl.Addrs()) != 3 {
		t.Fatalf("got %d nodes, %d addrs", len(cl.Nodes), len(cl.Addrs()))
	}
	c := cl.Client(t)
	ctx := ctxTimeout(t, 10*time.Second)
	mustPing(t, c)

	// Keys spread over different slots and, with 3 masters, different nodes.
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	slots := map[int64]bool{}
	for _, k := range keys {
		if err := c.Set(ctx, k, "v-"+k, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
		slot, err := c.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %s: %v", k, err)
		}
		slots[slot] = true
	}
	if len(slots) < 2 {
		t.Fatalf("keys landed in %d slot(s)", len(slots))
	}
	for _, k := range keys {
		if got, err := c.Get(ctx, k).Result(); err != nil || got != "v-"+k {
			t.Fatalf("GET %s = %q, %v", k, got, err)
		}
	}
	// The keys are spread over at least two masters.
	var mu sync.Mutex
	nonEmpty := 0
	err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		n, err := m.DBSize(ctx).Result()
		if n > 0 {
			mu.Lock()
			nonEmpty++
			mu.Unlock()
		}
		return err
	})
	if err != nil {
		t.Fatalf("ForEachMaster: %v", err)
	}
	if nonEmpty < 2 {
		t.Fatalf("keys landed on %d master(s), want >= 2", nonEmpty)
	}

	// EVAL on hash-tagged keys (same slot).
	script := `redis.call("SET", KEYS[1], ARGV[1]); redis.call("SET", KEYS[2], ARGV[1]); return redis.call("GET", KEYS[2])`
	got, err := c.Eval(ctx, script, []string{"{user1}:a", "{user1}:b"}, "hello").Text()
	if err != nil || got != "hello" {
		t.Fatalf("EVAL = %q, %v", got, err)
	}
	if got := c.Get(ctx, "{user1}:a").Val(); got != "hello" {
		t.Fatalf("GET {user1}:a = %q", got)
	}
	if !strings.HasPrefix(cl.Nodes[0].Addr(), "127.0.0.1:") {
		t.Fatalf("node addr %q", cl.Nodes[0].Addr())
	}
}

// TestChildDiesWithParent runs a child test process that starts a server,
// SIGKILLs the child and checks that redis-server goes away with it.
func TestChildDiesWithParent(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("Pdeathsig is Linux-only")
	}
	if os.Getenv("REDISTEST_CHILD") == "1" {
		s, err := StartProcess()
		if err != nil {
			fmt.Println("ERR", err)
			os.Exit(1)
		}
		fmt.Println("ADDR", s.Addr())
		time.Sleep(time.Minute) // killed by the parent
		os.Exit(1)
	}
	t.Parallel()

	cmd := exec.Command(os.Args[0], "-test.run=^TestChildDiesWithParent$", "-test.count=1")
	// The killed child cannot remove its temp dir; put it under ours.
	cmd.Env = append(os.Environ(), "REDISTEST_CHILD=1", "TMPDIR="+t.TempDir())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	var addr string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if a, ok := strings.CutPrefix(sc.Text(), "ADDR "); ok {
			addr = a
			break
		}
		if strings.HasPrefix(sc.Text(), "ERR ") {
			t.Fatalf("child: %s", sc.Text())
		}
	}
	if addr == "" {
		t.Fatalf("child printed no address (%v)", sc.Err())
	}
	if conn, err := net.DialTimeout("tcp", addr, time.Second); err != nil {
		t.Fatalf("child's server not reachable: %v", err)
	} else {
		conn.Close()
	}

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return // server is gone
		}
		conn.Close()
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s survived its parent", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
