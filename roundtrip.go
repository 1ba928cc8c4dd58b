package proxyswitch

import (
	"context"
	"time"

	"github.com/proxyswitch/proxyswitch/internal/bounded"
)

// roundTrip runs one Redis call, bounded by timeout whatever the client's
// settings (see bounded.Call); late, if non-nil, receives the result of a
// call that finished after its caller gave up.
func roundTrip[T any](ctx context.Context, timeout time.Duration, fn func(context.Context) (T, error), late func(T, error)) (T, error) {
	return bounded.Call(ctx, timeout, false, fn, late)
}
