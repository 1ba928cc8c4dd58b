package storage

import (
	"context"
	"fmt"
	"time"

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
// visibility timeout.
func call[T any](ctx context.Context, timeout time.Duration, inline bool, op string, fn func(context.Context) (T, error)) (T, error) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	if inline {
		defer cancel()
		v, err := fn(cctx)
		if err != nil && err != redis.Nil {
			return v, redisErr(op, err)
		}
		return v, err
	}
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := fn(cctx)
		done <- result{v, err}
	}()
	defer cancel()
	var zero T
	select {
	case r := <-done:
		if r.err != nil && r.err != redis.Nil {
			return zero, redisErr(op, r.err)
		}
		return r.v, r.err
	case <-cctx.Done():
		if err := ctx.Err(); err != nil {
			return zero, redisErr(op, err)
		}
		return zero, redisErr(op, fmt.Errorf("no reply within %v: %w", timeout, cctx.Err()))
	}
}

// run runs a script through call.
func (s *Storage) run(ctx context.Context, op string, sc *redis.Script, keys []string, args ...any) (any, error) {
	return call(ctx, s.cfg.redisTimeout, s.inline, op, func(ctx context.Context) (any, error) {
		return sc.Run(ctx, s.rdb, keys, args...).Result()
	})
}

// honoursDeadlines reports whether rdb bounds its own round trips by the
// context's deadline (Options.ContextTimeoutEnabled), so that call needs no
// watchdog goroutine.
func honoursDeadlines(rdb redis.UniversalClient) bool {
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
