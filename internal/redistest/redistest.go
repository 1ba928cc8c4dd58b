// Package redistest runs real redis-server child processes on free loopback
// ports for tests that need to kill, pause or restart Redis.
//
// Servers are started with persistence disabled (--save "" --appendonly no),
// bound to 127.0.0.1 only and never on port 6379. On Linux each child gets
// SIGKILL when the test process dies (Pdeathsig), so no redis-server
// outlives the test binary.
package redistest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNotRunning is returned by Kill, Pause and Resume when the server process
// is not running (never started, killed, crashed or closed).
var ErrNotRunning = errors.New("redistest: redis-server is not running")

// ErrClosed is returned by Restart after Close.
var ErrClosed = errors.New("redistest: server is closed")

// errAddrInUse marks a start attempt that failed because a port was taken.
var errAddrInUse = errors.New("address already in use")

const (
	// readyTimeout bounds how long one start waits for the server to answer.
	readyTimeout = 10 * time.Second
	// startAttempts is how many fresh ports Start tries on bind failures.
	startAttempts = 5
	// restartBindWindow is how long Restart retries binding the same port.
	restartBindWindow = 5 * time.Second
	// killTimeout bounds the wait for a SIGKILLed child to be reaped.
	killTimeout = 10 * time.Second
	// forbiddenPort is the shared Redis server's port; never use it.
	forbiddenPort = 6379
)

// Server is one redis-server child process on 127.0.0.1.
//
// All methods are safe for concurrent use. A paused (SIGSTOPped) server still
// counts as running.
type Server struct {
	// Immutable after construction.
	port        int
	clusterPort int // cluster bus port; 0 unless this is a cluster node
	dir         string
	extraArgs   []string

	mu     sync.Mutex
	proc   *process // current (or last) child; nil before the first start
	closed bool
}

// process is one incarnation of redis-server.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the child has been reaped
	err  error         // cmd.Wait result; read only after done is closed
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Start starts redis-server on a free loopback port, waits until it answers
// PING (timeout ~10s), and registers tb.Cleanup to kill it and remove its
// temp dir. Calls tb.Fatal on failure. extraArgs are appended to the command
// line (e.g. "--maxmemory", "10mb").
func Start(tb testing.TB, extraArgs ...string) *Server {
	tb.Helper()
	s, err := startServer(false, extraArgs)
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	registerCleanup(tb, s)
	return s
}

// StartProcess is the same as Start without testing.TB (for example
// programs, benchmarks' TestMain, child processes); the caller must call
// Close.
func StartProcess(extraArgs ...string) (*Server, error) {
	return startServer(false, extraArgs)
}

func registerCleanup(tb testing.TB, s *Server) {
	tb.Cleanup(func() {
		if tb.Failed() {
			if tail := s.logTail(30); tail != "" {
				tb.Logf("redistest: tail of %s (redis-server %s):\n%s",
					filepath.Join(s.dir, "redis.log"), s.Addr(), tail)
			}
		}
		if err := s.Close(); err != nil {
			tb.Errorf("redistest: close %s: %v", s.Addr(), err)
		}
	})
}

// startServer picks free ports and starts a server, retrying with new ports
// when the chosen port got taken by someone else in the meantime.
func startServer(cluster bool, extraArgs []string) (*Server, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, errors.New("redis-server not found on PATH; install it (apt-get install redis-server)")
	}
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, fmt.Errorf("create temp dir: %w", err)
	}
	var lastErr error
	for range startAttempts {
		s := &Server{dir: dir, extraArgs: append([]string(nil), extraArgs...)}
		if s.port, err = freePort(); err != nil {
			lastErr = err
			break
		}
		if cluster {
			if s.clusterPort, err = freePort(); err != nil {
				lastErr = err
				break
			}
			if s.clusterPort == s.port {
				lastErr = fmt.Errorf("got the same free port %d twice", s.port)
				continue
			}
		}
		p, err := s.spawn()
		if err == nil {
			s.proc = p
			return s, nil
		}
		lastErr = err
		if !errors.Is(err, errAddrInUse) {
			break
		}
	}
	_ = os.RemoveAll(dir)
	return nil, lastErr
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	for range 10 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("pick free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if port != forbiddenPort {
			return port, nil
		}
	}
	return 0, errors.New("pick free port: kernel keeps returning 6379")
}

// args returns the redis-server command line (without argv[0]).
func (s *Server) args() []string {
	a := []string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--daemonize", "no",
		"--protected-mode", "no",
		"--logfile", filepath.Join(s.dir, "redis.log"),
	}
	if s.clusterPort != 0 {
		a = append(a,
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(s.dir, "nodes.conf"),
			"--cluster-node-timeout", "2000",
			"--cluster-port", strconv.Itoa(s.clusterPort),
		)
	}
	return append(a, s.extraArgs...)
}

// spawn starts one redis-server process and waits until it answers. On
// failure the process is gone and the error wraps errAddrInUse if the
// server could not bind its port(s).
func (s *Server) spawn() (*process, error) {
	logPath := filepath.Join(s.dir, "redis.log")
	logOffset := int64(0)
	if fi, err := os.Stat(logPath); err == nil {
		logOffset = fi.Size()
	}
	stderrPath := filepath.Join(s.dir, "stderr.log")
	out, err := os.Create(stderrPath) // truncated for each incarnation
	if err != nil {
		return nil, err
	}
	defer out.Close() // the child keeps its own descriptor

	cmd := exec.Command("redis-server", s.args()...)
	cmd.Dir = s.dir
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.SysProcAttr = sysProcAttr()
	if err := startCmd(cmd); err != nil {
		return nil, fmt.Errorf("start redis-server: %w", err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()

	addr := s.Addr()
	pid := cmd.Process.Pid
	deadline := time.Now().Add(readyTimeout)
	for {
		select {
		case <-p.done:
			msg := readFrom(stderrPath, 0) + readFrom(logPath, logOffset)
			err := fmt.Errorf("redis-server on %s exited during startup (%v): %s",
				addr, p.err, strings.TrimSpace(lastLines(msg, 10)))
			if strings.Contains(msg, "Address already in use") {
				err = fmt.Errorf("%w: %w", errAddrInUse, err)
			}
			return nil, err
		default:
		}
		// Check the process id, not just PONG: another server may own the port
		// if ours failed to bind it.
		if gotPID, err := serverPID(addr, s.password(), 500*time.Millisecond); err == nil && gotPID == pid {
			return p, nil
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-p.done
			return nil, fmt.Errorf("redis-server on %s did not answer within %v: %s",
				addr, readyTimeout, strings.TrimSpace(lastLines(readFrom(logPath, logOffset), 10)))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// serverPID asks the server at addr for its process_id (INFO server).
func serverPID(addr, password string, timeout time.Duration) (int, error) {
	info, err := commandAuth(addr, password, timeout, "INFO", "server")
	if err != nil {
		return 0, err
	}
	v, ok := infoField(info, "process_id")
	if !ok {
		return 0, errors.New("no process_id in INFO")
	}
	return strconv.Atoi(v)
}

// command sends one command over a fresh connection and returns a simple
// string or bulk string reply.
func command(addr string, timeout time.Duration, args ...string) (string, error) {
	return commandAuth(addr, "", timeout, args...)
}

// commandAuth is command on a server started with --requirepass password
// ("" for none): it authenticates first.
func commandAuth(addr, password string, timeout time.Duration, args ...string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return "", err
	}
	r := bufio.NewReader(conn)
	if password != "" {
		if _, err := roundTripRESP(conn, r, "AUTH", password); err != nil {
			return "", err
		}
	}
	return roundTripRESP(conn, r, args...)
}

// roundTripRESP writes one command and reads a simple string or bulk string reply.
func roundTripRESP(conn net.Conn, r *bufio.Reader, args ...string) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(conn, b.String()); err != nil {
		return "", err
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply")
	}
	switch line[0] {
	case '+':
		return line[1:], nil
	case '-':
		return "", errors.New(line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", fmt.Errorf("bad bulk reply %q", line)
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	default:
		return "", fmt.Errorf("unexpected reply %q", line)
	}
}

// infoField extracts "key:value" from an INFO-style reply.
func infoField(info, key string) (string, bool) {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), key+":"); ok {
			return v, true
		}
	}
	return "", false
}

func readFrom(path string, offset int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return ""
	}
	b, _ := io.ReadAll(io.LimitReader(f, 1<<20))
	return string(b)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// logTail returns the last n lines of the server's log file, if any.
func (s *Server) logTail(n int) string {
	b, err := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	if err != nil || len(bytes.TrimSpace(b)) == 0 {
		return ""
	}
	return lastLines(string(b), n)
}

// Addr returns the server address, "127.0.0.1:PORT". It does not change
// across Restart.
func (s *Server) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// URL returns the server URL, "redis://127.0.0.1:PORT/0".
func (s *Server) URL() string {
	return "redis://" + s.Addr() + "/0"
}

// Port returns the server's TCP port.
func (s *Server) Port() int {
	return s.port
}

// Dir returns the server's temp dir (working dir, redis.log, nodes.conf).
func (s *Server) Dir() string {
	return s.dir
}

// Client returns a new go-redis client to this server, closed at tb cleanup.
// opts may tweak the options (timeouts etc.) before the client is created.
func (s *Server) Client(tb testing.TB, opts ...func(*redis.Options)) *redis.Client {
	tb.Helper()
	o := &redis.Options{Addr: s.Addr(), Password: s.password()}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewClient(o)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// password is the --requirepass value among the extra arguments, if any.
func (s *Server) password() string {
	for i, a := range s.extraArgs {
		if a == "--requirepass" && i+1 < len(s.extraArgs) {
			return s.extraArgs[i+1]
		}
	}
	return ""
}

// Running reports whether the redis-server process is alive (a paused
// server is running).
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runningLocked()
}

func (s *Server) runningLocked() bool {
	return s.proc != nil && !s.proc.exited()
}

// Kill sends SIGKILL and waits for the process to exit; all data is lost
// (the server runs with --save "" --appendonly no). It returns ErrNotRunning
// if the server is not running.
func (s *Server) Kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.killLocked()
}

func (s *Server) killLocked() error {
	if !s.runningLocked() {
		return ErrNotRunning
	}
	p := s.proc
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("redistest: kill redis-server %s: %w", s.Addr(), err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(killTimeout):
		return fmt.Errorf("redistest: redis-server %s (pid %d) did not exit after SIGKILL", s.Addr(), p.cmd.Process.Pid)
	}
}

// Pause sends SIGSTOP: the server hangs (the kernel still accepts
// connections, but nothing is answered) until Resume. It returns
// ErrNotRunning if the server is not running.
func (s *Server) Pause() error {
	return s.signal(syscall.SIGSTOP)
}

// Resume sends SIGCONT to a paused server. It returns ErrNotRunning if the
// server is not running.
func (s *Server) Resume() error {
	return s.signal(syscall.SIGCONT)
}

func (s *Server) signal(sig os.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.runningLocked() {
		return ErrNotRunning
	}
	if err := s.proc.cmd.Process.Signal(sig); err != nil {
		if errors.Is(err, os.ErrProcessDone) {
			return ErrNotRunning
		}
		return fmt.Errorf("redistest: signal %v to redis-server %s: %w", sig, s.Addr(), err)
	}
	return nil
}

// Restart kills the server if it is running, then starts a fresh, empty
// redis-server on the same port and waits until it answers PING. It retries
// for a few seconds while the port cannot be bound yet (e.g. TIME_WAIT).
// Cluster nodes keep their nodes.conf, so they rejoin the cluster with the
// same node id and slots (but without data).
func (s *Server) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if s.runningLocked() {
		if err := s.killLocked(); err != nil {
			return err
		}
	}
	// Guarantee an empty dataset even if extraArgs enabled persistence.
	for _, name := range []string{"dump.rdb", "appendonly.aof", "appendonlydir"} {
		_ = os.RemoveAll(filepath.Join(s.dir, name))
	}
	deadline := time.Now().Add(restartBindWindow)
	for {
		p, err := s.spawn()
		if err == nil {
			s.proc = p
			return nil
		}
		if !errors.Is(err, errAddrInUse) || time.Now().After(deadline) {
			return fmt.Errorf("redistest: restart: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Close kills the server if it is running and removes its temp dir. It is
// idempotent; Start registers it as a test cleanup.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	var err error
	if s.runningLocked() {
		err = s.killLocked()
	}
	if rmErr := os.RemoveAll(s.dir); rmErr != nil && err == nil {
		err = rmErr
	}
	return err
}
