// Package bounded runs one Redis round trip within a bound of its own,
// whatever the go-redis client's settings. It is shared by the root package
// and storage.
package bounded

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Call runs fn with a context bounded by timeout. go-redis honours context
// deadlines only with Options.ContextTimeoutEnabled and otherwise waits its
// read timeout, times its retries; so unless inline says the client honours
// them, fn runs on another goroutine (a worker, reused from call to call:
// spawn) and Call returns as soon as the bound passes, leaving fn to finish
// in the background. late, if non-nil,
// then receives fn's result (so that, say, a lease granted after its caller
// gave up is handed back, not leaked).
//
// On the bound it returns the caller's own context error if that context
// ended, else "no reply within <timeout>" wrapping context.DeadlineExceeded;
// either is marked ErrAbandoned.
func Call[T any](ctx context.Context, timeout time.Duration, inline bool, fn func(context.Context) (T, error), late func(T, error)) (T, error) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	if inline {
		defer cancel()
		return fn(cctx)
	}
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	spawn(func() {
		v, err := fn(cctx)
		done <- result{v, err}
	})
	select {
	case r := <-done:
		cancel()
		return r.v, r.err
	case <-cctx.Done():
		go func() {
			r := <-done
			cancel()
			if late != nil {
				late(r.v, r.err)
			}
		}()
		var zero T
		if ctx.Err() != nil {
			return zero, abandoned{ctx.Err()}
		}
		return zero, abandoned{fmt.Errorf("no reply within %v: %w", timeout, cctx.Err())}
	}
}

// ErrAbandoned marks the error of a Call that returned on its bound while
// fn still ran (never an inline one): late, if set, gets fn's result, the
// call's real outcome. The error is still the one Call always returned
// (the caller's context error, or "no reply within"): errors.Is finds
// both.
var ErrAbandoned = errors.New("call abandoned on its bound")

// abandoned is Call's error on its bound: err, marked ErrAbandoned.
type abandoned struct{ err error }

func (a abandoned) Error() string   { return a.err.Error() }
func (a abandoned) Unwrap() []error { return []error{a.err, ErrAbandoned} }

// HonoursDeadlines reports whether rdb bounds its own round trips by the
// context's deadline (Options.ContextTimeoutEnabled), so that Call needs no
// watchdog goroutine.
func HonoursDeadlines(rdb any) bool {
	switch c := rdb.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// Workers. A call that is not inline runs on a worker: a goroutine that,
// its call done, stays parked for the next one (workerIdle at most) instead
// of exiting. Starting a goroutine per call, then growing its stack to the
// depth of a go-redis round trip, cost more CPU than the round trip's own
// client work on a crawler's hot path; a parked worker keeps its stack.
// There are as many workers as calls ran at once lately: a call finds a
// parked one or starts one, and a worker left idle for workerIdle exits.

// workerIdle is how long a worker stays parked without a call before it exits.
const workerIdle = 10 * time.Second

// idle hands a call to a parked worker: unbuffered, so a send succeeds
// only when one is waiting for it.
var idle = make(chan func())

// spawn runs f on a parked worker, or on a new one if none is parked.
func spawn(f func()) {
	select {
	case idle <- f:
	default:
		go work(f)
	}
}

// work runs f, then the calls handed to it, until none comes for workerIdle.
func work(f func()) {
	f()
	t := time.NewTimer(workerIdle)
	defer t.Stop()
	for {
		select {
		case f = <-idle:
			f()
			t.Reset(workerIdle)
		case <-t.C:
			return
		}
	}
}
