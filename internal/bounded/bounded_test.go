package bounded

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// goid is the calling goroutine's number, from its stack header.
func goid() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	f := bytes.Fields(buf)
	if len(f) < 2 {
		return ""
	}
	return string(f[1])
}

// TestCallReusesWorkers: calls that are not inline, one after another, run
// on a worker kept from the call before, not on a new goroutine each.
func TestCallReusesWorkers(t *testing.T) {
	ctx := context.Background()
	seen := map[string]int{}
	for range 200 {
		id, err := Call(ctx, time.Second, false, func(context.Context) (string, error) { return goid(), nil }, nil)
		if err != nil {
			t.Fatal(err)
		}
		seen[id]++
		// The worker parks just after handing its result over; called at
		// once, the next call may find it not parked yet and start another
		// (a CI run under load met that 40 times in 200). A pause lets it
		// park, so that what is measured is reuse, not the scheduler.
		time.Sleep(time.Millisecond)
	}
	// One worker serves them all; a few more at most if the machine
	// stalled one past the pause.
	if len(seen) > 10 {
		t.Fatalf("200 calls ran on %d goroutines", len(seen))
	}
	caller := goid()
	if _, ok := seen[caller]; ok {
		t.Fatal("a call that is not inline ran on its caller's goroutine")
	}
}

// TestCallBoundAndLate: a call that outlives its bound returns at the bound
// with "no reply within", its result goes to late, and its worker serves
// later calls; concurrent calls each get their own result.
func TestCallBoundAndLate(t *testing.T) {
	ctx := context.Background()
	release := make(chan struct{})
	lateGot := make(chan int, 1)
	start := time.Now()
	_, err := Call(ctx, 50*time.Millisecond, false, func(context.Context) (int, error) {
		<-release
		return 7, nil
	}, func(v int, err error) { lateGot <- v })
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*time.Second {
		t.Fatalf("err %v after %v", err, time.Since(start))
	}
	close(release)
	select {
	case v := <-lateGot:
		if v != 7 {
			t.Fatalf("late got %d", v)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("late never called")
	}

	var wg sync.WaitGroup
	var bad atomic.Int64
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 50 {
				want := i*1000 + j
				got, err := Call(ctx, 5*time.Second, false, func(context.Context) (int, error) { return want, nil }, nil)
				if err != nil || got != want {
					bad.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if bad.Load() > 0 {
		t.Fatalf("%d calls got another's result or failed", bad.Load())
	}
}
