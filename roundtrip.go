package proxyswitch

import (
	"context"
	"fmt"
	"time"
)

// roundTrip runs one Redis call, bounded by timeout whatever the client's
// settings: go-redis honours context deadlines only with
// Options.ContextTimeoutEnabled, and otherwise waits its read timeout, times
// its retries. If the bound passes first, roundTrip returns at once and fn
// goes on in the background; late, if non-nil, then receives fn's result (so
// that a lease granted after its caller gave up is handed back, not leaked).
func roundTrip[T any](ctx context.Context, timeout time.Duration, fn func(context.Context) (T, error), late func(T, error)) (T, error) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := fn(cctx)
		done <- result{v, err}
	}()
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
			return zero, ctx.Err()
		}
		return zero, fmt.Errorf("no reply within %v: %w", timeout, cctx.Err())
	}
}
