package proxyswitch

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/proxyswitch/proxyswitch/internal/engine"
	"github.com/proxyswitch/proxyswitch/internal/hooks"
	"github.com/redis/go-redis/v9"
)

// The few calls a health checker needs (package probe is one): lease one
// given proxy, mark proxies dead with a reason of its own (Drain), and
// revive only what it marked (Revive). Each is one Lua script.

// LeaseProxy leases that proxy (URL or ID) for site from the Switch's own
// pool if a slot is free now, without waiting: otherwise ErrNoProxy (or
// ErrEmptyPool). The lease is not renewed. It is safe for concurrent use.
func (s *Switch) LeaseProxy(ctx context.Context, site, proxy string) (*Lease, error) {
	if s.renew.isClosed() {
		return nil, errClosed
	}
	if site == "" {
		return nil, fmt.Errorf("%w: empty site", ErrConfig)
	}
	ids, err := proxyIDs([]string{proxy})
	if err != nil {
		return nil, err
	}
	id := ids[0].(string)
	scope := s.scopeOf(site)
	l, _, err := s.own.tryLease(context.WithValue(ctx, namedKey{}, true), site, scope, id)
	if err != nil {
		return nil, err
	}
	busy := fmt.Errorf("%w: proxy %s is not free for site %s", ErrNoProxy, id, scope)
	if l == nil {
		return nil, busy
	}
	if l.proxy.id != id {
		l.unused.Store(true) // another proxy, never used: back at once, with no cooldown
		if err := l.Release(ctx); err != nil {
			return nil, err
		}
		return nil, busy
	}
	if err := s.renew.track(l, false); err != nil {
		_ = l.Release(context.WithoutCancel(ctx)) // closed meanwhile
		return nil, err
	}
	return l, nil
}

// Drain takes proxies (URLs or IDs) out of every site's rotation until
// Revive: requests using them finish, none starts. It returns how many it
// marked; a Drain of many is not atomic. With reason "" it is an operator's
// drain: every proxy must be in the pool (else ErrNotInPool, nothing
// drained), and it overrides other marks. Another reason (at most 64
// printable characters, no spaces or '|') is a health checker's mark, such as
// package probe's "probe", set only on live proxies of the pool. It is safe
// for concurrent use.
func (s *Switch) Drain(ctx context.Context, reason string, proxies ...string) (int, error) {
	var strs []string
	if reason == "" {
		for _, proxy := range proxies {
			p, err := s.find(ctx, proxy)
			if err != nil {
				return 0, err
			}
			strs = append(strs, p.id)
		}
		reason = "drained"
	} else {
		if err := checkReason(reason); err != nil {
			return 0, err
		}
		ids, err := proxyIDs(proxies)
		if err != nil {
			return 0, err
		}
		for _, id := range ids {
			strs = append(strs, id.(string))
		}
	}
	if len(strs) == 0 {
		return 0, nil
	}
	n := 0
	for rest := strs; len(rest) > 0; {
		part := rest[:min(len(rest), pageSize())]
		marked, done, err := chunkCall(ctx, s.cfg.redisTimeout, func(ctx context.Context) ([]int64, error) {
			return engine.Drain{Dead: s.keys.dead(), Sites: s.keys.sites(), Pool: s.keys.proxies(),
				Prefix: s.keys.base, Slots: s.cfg.slots, Reason: reason, Budget: pageSize(), Proxies: part}.Run(ctx, s.rdb).Int64Slice()
		}, len(part))
		if err != nil {
			return n, redisErr("drain", err)
		}
		for _, id := range rest[:done] {
			s.clients.closeProxy(id, "")
		}
		n += marked
		rest = rest[done:]
	}
	return n, nil
}

func checkReason(reason string) error {
	ok := reason != "" && len(reason) <= 64 && reason != "drained" && !strings.ContainsRune(reason, '|') &&
		strings.IndexFunc(reason, func(r rune) bool { return !unicode.IsPrint(r) || unicode.IsSpace(r) }) < 0
	if !ok {
		return fmt.Errorf("%w: dead reason %q: want 1 to 64 printable characters without spaces or '|', not \"drained\"", ErrConfig, reason)
	}
	return nil
}

func init() {
	hooks.Prefix = func(sw any) string { return sw.(*Switch).cfg.prefix }
	hooks.Redis = func(sw any) redis.Scripter { return sw.(*Switch).rdb }
	hooks.Observers = func(sw any) []any { return sw.(*Switch).observerList() }
	hooks.Diff = func(ctx context.Context, sw any, ps any) (hooks.PoolDiff, error) {
		return sw.(*Switch).diff(ctx, ps.([]*Proxy))
	}
	hooks.SiteHold = func(ctx context.Context, sw any, mode, site string, ids []string, ttl time.Duration) ([]string, error) {
		return sw.(*Switch).siteHold(ctx, mode, site, ids, ttl)
	}
}

// namedKey marks LeaseProxy's context: its lease names the proxy (lease.lua's
// ARGV[8] "x", redisPool.tryLeaseOnce).
type namedKey struct{}
