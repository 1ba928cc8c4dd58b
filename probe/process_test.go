package probe_test

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/proxyswitch/proxyswitch/internal/reexec"
	"github.com/proxyswitch/proxyswitch/probe"
	"github.com/proxyswitch/proxyswitch/proxyswitchtest"
	"github.com/stretchr/testify/require"
)

const workerEnv = "PROXYSWITCH_PROBE_WORKER"

// workerSpec is what a checker process runs: Checker.Run on the pool for
// RunFor, printing "round START END PROBED" (Unix ns) after each round.
type workerSpec struct {
	Redis, Prefix, Echo string
	RunFor, LockTTL     time.Duration
	Concurrency         int
}

func workerMain(spec workerSpec) int {
	rdb := redistest.NewClient(spec.Redis)
	defer rdb.Close()
	sw, err := proxyswitch.NewSwitch(rdb, proxyswitch.WithPrefix(spec.Prefix), proxyswitch.WithTimeouts(proxyswitch.Timeouts{Redis: 10 * time.Second}))
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	defer sw.Close(context.Background())
	var mu sync.Mutex
	c := &probe.Checker{Switch: sw, Redis: rdb, EchoURL: spec.Echo, Every: 20 * time.Millisecond, LockTTL: spec.LockTTL,
		Concurrency: spec.Concurrency, Timeout: 5 * time.Second, Logger: slog.New(slog.DiscardHandler),
		OnReport: func(r probe.Report) {
			mu.Lock()
			defer mu.Unlock()
			fmt.Printf("round %d %d %d\n", r.Start.UnixNano(), r.End.UnixNano(), r.Probed)
		}}
	ctx, cancel := context.WithTimeout(context.Background(), spec.RunFor)
	defer cancel()
	if err := c.Run(ctx); err != context.DeadlineExceeded {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	return 0
}

type span struct{ start, end int64 }

// runChecker starts a checker process; rounds gets its rounds, first is
// closed at its first round.
func runChecker(t *testing.T, spec workerSpec) (wait func() []span, first chan struct{}) {
	cmd := reexec.Command(t, workerEnv, spec)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	first = make(chan struct{})
	var rounds []span
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) != 4 || f[0] != "round" {
				continue
			}
			s, _ := strconv.ParseInt(f[1], 10, 64)
			e, _ := strconv.ParseInt(f[2], 10, 64)
			if len(rounds) == 0 {
				close(first)
			}
			rounds = append(rounds, span{s, e})
		}
	}()
	return func() []span {
		<-done
		require.NoError(t, cmd.Wait())
		return rounds
	}, first
}

// TestCheckerProcesses: two checker processes run Run on one pool: only
// one probes at a time (their rounds never overlap), the second takes over
// when the first exits, and the echo site never sees more probes at once
// than one checker's Concurrency.
func TestCheckerProcesses(t *testing.T) {
	farm := proxyswitchtest.NewFarm(t, 30)
	prefix := testPrefix()
	sw := newSwitch(t, prefix)
	_, err := sw.Add(context.Background(), farm.URLs()...)
	require.NoError(t, err)
	ec := newEcho(t, 5*time.Millisecond)
	spec := workerSpec{Redis: shared.Addr(), Prefix: prefix, Echo: ec.site.URL(), LockTTL: time.Second, Concurrency: 4}
	a := spec
	a.RunFor = 2 * time.Second
	waitA, firstA := runChecker(t, a)
	select {
	case <-firstA:
	case <-time.After(20 * time.Second):
		t.Fatal("the first checker never probed")
	}
	b := spec
	b.RunFor = 4 * time.Second
	waitB, _ := runChecker(t, b)
	ra, rb := waitA(), waitB()
	require.NotEmpty(t, ra)
	require.NotEmpty(t, rb, "the second checker never took over")
	for _, x := range ra {
		for _, y := range rb {
			require.True(t, x.end <= y.start || y.end <= x.start, "rounds of two processes overlap: %v and %v", x, y)
		}
	}
	require.LessOrEqual(t, ec.max.Load(), int64(4), "more probes at once than one checker's Concurrency")
	t.Logf("rounds: first process %d, second %d; most probes at once at the echo site %d", len(ra), len(rb), ec.max.Load())
}
