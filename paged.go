package proxyswitch

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/proxyswitch/proxyswitch/internal/engine"
	"github.com/redis/go-redis/v9"
)

// Admin reads of a pool of any size (List, Dead, the labels, ProxyStates,
// the copy of the pool, Replace's look at the pool) go page by page: one
// script call per page, each an HSCAN of pageSize, so that none blocks
// Redis for long whatever the pool's size (issue 14). A paged read is not
// one instant: an entry present from its first page to its last is read
// (once: pages may repeat an entry, the reader keeps the last), one added
// or removed meanwhile may be read or not.

// defaultPageSize is the HSCAN count of one page, and the number of
// entries of one call of the other paged and chunked operations.
const defaultPageSize = 500

// pageSizeVar is the page size in effect: defaultPageSize, or the small one
// a test sets (setPageSize) to read and write small pools in many pages.
var pageSizeVar atomic.Int64

func init() { pageSizeVar.Store(defaultPageSize) }

// pageSize is the page size in effect.
func pageSize() int { return int(pageSizeVar.Load()) }

// scanHash reads (for what: "list", "dead", ... in its errors) every entry of hash key (a hash of the pool keyed by proxy
// ID) with list.lua, page by page, and calls each for every id once, in no
// order, with its values: the hash's value, and with join not empty the
// value of the id in join (ids join lacks are left out). It stops at each's
// first error.
func scanHash(ctx context.Context, rdb redis.Scripter, timeout time.Duration, what, key, join string,
	each func(id string, vals []string) error) error {
	width := 2
	if join != "" {
		width = 3
	}
	seen := map[string]bool{}
	cursor := "0"
	for first := true; first || cursor != "0"; first = false {
		call := engine.List{Hash: key, Join: join, Cursor: cursor, Count: pageSize()}
		res, err := roundTrip(ctx, timeout, func(ctx context.Context) ([]string, error) {
			return call.Run(ctx, rdb).StringSlice()
		}, nil)
		if err != nil {
			return redisErr(what, err)
		}
		if len(res) < 1 || (len(res)-1)%width != 0 {
			return fmt.Errorf("%w: %s: page reply of %d items", ErrCorrupt, what, len(res))
		}
		cursor = res[0]
		for i := 1; i < len(res); i += width {
			id := res[i]
			if seen[id] {
				continue
			}
			seen[id] = true
			if err := each(id, res[i+1:i+width]); err != nil {
				return err
			}
		}
	}
	return nil
}

// chunkCall runs one call of a chunked operation that was sent sent entries, whose
// script replies {count, entries consumed}, and returns both; a call that
// consumed none, or more than it was sent, is ErrCorrupt.
func chunkCall(ctx context.Context, timeout time.Duration, fn func(context.Context) ([]int64, error), sent int) (int, int, error) {
	res, err := roundTrip(ctx, timeout, fn, nil)
	if err != nil {
		return 0, 0, err
	}
	if len(res) != 2 || res[1] < 1 || res[1] > int64(sent) {
		return 0, 0, fmt.Errorf("%w: reply %v to a call of %d entries", ErrCorrupt, res, sent)
	}
	return int(res[0]), int(res[1]), nil
}
