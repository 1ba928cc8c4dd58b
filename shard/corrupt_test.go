package shard

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// A member zset or owner hash that is not what the package writes fails a
// heartbeat and a read with ErrCorrupt naming the key, in a bounded
// message, never a raw Redis or script error (issue 13, item 10).
func TestMembershipCorrupt(t *testing.T) {
	ctx := context.Background()
	huge := strings.Repeat("z", 64<<10)
	for name, spoil := range map[string]func(rdb redis.UniversalClient, members, owners string) error{
		"score +inf": func(rdb redis.UniversalClient, members, _ string) error {
			return rdb.ZAdd(ctx, members, redis.Z{Score: math.Inf(1), Member: "other"}).Err()
		},
		"huge member": func(rdb redis.UniversalClient, members, _ string) error {
			return rdb.ZAdd(ctx, members, redis.Z{Score: math.Inf(1), Member: huge}).Err()
		},
		"members a string": func(rdb redis.UniversalClient, members, _ string) error {
			return rdb.Set(ctx, members, huge, 0).Err()
		},
		"owners a zset": func(rdb redis.UniversalClient, _, owners string) error {
			return rdb.ZAdd(ctx, owners, redis.Z{Score: 1, Member: "x"}).Err()
		},
	} {
		t.Run(name, func(t *testing.T) {
			rdb := sharedClient(t)
			m, err := NewMembership(rdb, fastBeat(testPrefix(), "crawler-a"))
			require.NoError(t, err)
			members, owners := m.keys[0], m.keys[1]
			require.NoError(t, spoil(rdb, members, owners))
			for op, err := range map[string]error{"beat": m.beat(ctx), "members": func() error { _, err := m.Members(ctx); return err }()} {
				if err == nil {
					continue
				}
				require.True(t, errors.Is(err, ErrCorrupt), "%s: %.300s", op, err)
				require.Less(t, len(err.Error()), 512, op)
				require.True(t, strings.Contains(err.Error(), members) || strings.Contains(err.Error(), owners), "%s: names no key: %s", op, err)
			}
		})
	}
}
