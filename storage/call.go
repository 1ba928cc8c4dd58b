package storage

import (
	"context"
	"fmt"
	"time"

	"github.com/proxyswitch/proxyswitch/internal/bounded"
	"github.com/redis/go-redis/v9"
)

// call runs one Redis round trip bounded by the storage's timeout, whatever
// the client's settings: go-redis honours context deadlines only with
// Options.ContextTimeoutEnabled and otherwise waits its own read timeout and
// retries. Unless the client honours them (inline), fn runs on a goroutine
// of its own, and if the bound passes first, call returns at once and
// leaves the command to finish in the background. Every write this package
// makes is safe to abandon that way: a claim or a delivery that lands after
// its caller gave up is either harmless or comes back through the
// visibility timeout, and a late extension touches only a delivery still in
// flight under its own number.
//
// A nil ctx (passed to AddURLs, Stats, DeadLetters, Requeue or Clear) is
// ErrConfig, not a panic.
func call[T any](ctx context.Context, timeout time.Duration, inline bool, op string, fn func(context.Context) (T, error)) (T, error) {
	if ctx == nil {
		var zero T
		return zero, fmt.Errorf("%w: %s: nil context", ErrConfig, op)
	}
	v, err := bounded.Call(ctx, timeout, inline, fn, nil)
	if err != nil && err != redis.Nil {
		return v, redisErr(op, err)
	}
	return v, err
}

// run runs a script through call.
func (s *Storage) run(ctx context.Context, op string, sc *redis.Script, keys []string, args ...any) (any, error) {
	return call(ctx, s.cfg.redisTimeout, s.inline, op, func(ctx context.Context) (any, error) {
		return sc.Run(ctx, s.rdb, keys, args...).Result()
	})
}
