// Package hooks lets the module's own packages reach what the root
// package keeps unexported, so that the root's API stays small.
package hooks

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// Prefix returns the key prefix (WithPrefix) of sw, a *proxyswitch.Switch.
// Package proxyswitch sets it in its init.
var Prefix func(sw any) string

// Redis returns the Redis client of sw, a *proxyswitch.Switch (the one
// given to NewSwitch). Package proxyswitch sets it in its init.
var Redis func(sw any) redis.Scripter

// SiteHold runs site_hold.lua on the scope of site in the pool of sw, a
// *proxyswitch.Switch: mode "note" records the quarantines just put on ids
// by a site probe (the ledger outliving the latest by ttl), "list" returns the ids whose
// quarantine there is still the probe's, "lift" ends those of ids that
// are (as Switch.Unban); the reply is the ids noted, held or lifted.
// Package proxyswitch sets it in its init.
var SiteHold func(ctx context.Context, sw any, mode, site string, ids []string, ttl time.Duration) ([]string, error)

// Observers returns the observers set on sw, a *proxyswitch.Switch, by
// SetObserver, each as it was given (none: nil), so that a package of the
// module can hand them events of an optional interface of its own.
// Package proxyswitch sets it in its init.
var Observers func(sw any) []any

// PoolDiff is how a proxy list differs from a pool (Diff).
type PoolDiff struct {
	Size       int // proxies in the pool
	Added      int // proxies ReplaceProxies with the list would add
	Removed    int // proxies it would remove
	Relabelled int // proxies it would keep, with other labels
}

// Changed reports whether ReplaceProxies with the list would change the pool.
func (d PoolDiff) Changed() bool { return d.Added+d.Removed+d.Relabelled > 0 }

// Diff compares ps, a []*proxyswitch.Proxy, with the pool of sw: what
// sw.ReplaceProxies(ctx, ps) would change, without writing (package
// source's Syncer). Package proxyswitch sets it in its init.
var Diff func(ctx context.Context, sw any, ps any) (PoolDiff, error)
