package proxyswitch

import (
	"context"
	"fmt"
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

// pageSize is the HSCAN count of one page. A variable so that tests read
// small pools in many pages.
var pageSize = 500

// scanHash reads every entry of hash key (a hash of the pool keyed by proxy
// ID) with list.lua, page by page, and calls each for every id once, in no
// order, with its values: the hash's value, and with join not empty the
// value of the id in join (ids join lacks are left out). It stops at each's
// first error.
func scanHash(ctx context.Context, rdb redis.Scripter, timeout time.Duration, key, join string,
	each func(id string, vals []string) error) error {
	width := 2
	if join != "" {
		width = 3
	}
	seen := map[string]bool{}
	cursor := "0"
	for first := true; first || cursor != "0"; first = false {
		call := engine.List{Hash: key, Join: join, Cursor: cursor, Count: pageSize}
		res, err := roundTrip(ctx, timeout, func(ctx context.Context) ([]string, error) {
			return call.Run(ctx, rdb).StringSlice()
		}, nil)
		if err != nil {
			return redisErr("read "+key, err)
		}
		if len(res) < 1 || (len(res)-1)%width != 0 {
			return fmt.Errorf("%w: page of %s: reply of %d items", ErrCorrupt, key, len(res))
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
