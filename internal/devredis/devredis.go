// Package devredis gives example programs and demos a Redis to talk to: the
// one at a URL when the user names one, or else an embedded, in-process
// Redis-compatible server (miniredis, which runs the same Lua scripts), so
// that a demo needs nothing but Go installed.
package devredis

import (
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Open returns a client for url, or for a fresh embedded server when url is
// empty, and a function that closes both. It does not check that a remote
// server answers; the first command will.
func Open(url string) (rdb *redis.Client, desc string, closeFn func(), err error) {
	if url != "" {
		opt, err := redis.ParseURL(url)
		if err != nil {
			// go-redis quotes no password in its parse errors, but keep it
			// out of ours entirely.
			return nil, "", nil, fmt.Errorf("invalid Redis URL (want redis://[user:password@]host:port/db)")
		}
		rdb := redis.NewClient(opt)
		return rdb, "Redis at " + opt.Addr, func() { _ = rdb.Close() }, nil
	}
	mr, err := miniredis.Run()
	if err != nil {
		return nil, "", nil, fmt.Errorf("start embedded Redis: %w", err)
	}
	rdb = redis.NewClient(&redis.Options{Addr: mr.Addr()})
	return rdb, "embedded in-process Redis (miniredis) at " + mr.Addr(), func() { _ = rdb.Close(); mr.Close() }, nil
}
