package proxyswitch

import (
	"context"
	"fmt"
	"strings"
	"unicode"

	"github.com/proxyswitch/proxyswitch/internal/engine"
)

// The few calls a health checker needs (package probe is one): lease one
// given proxy, mark proxies dead with a reason of its own, and revive only
// what it marked. Each is one Lua script.

// LeaseProxy leases proxy (a URL or an ID, as List shows it) for site now,
// if one of its slots is free there: unlike Lease it does not wait and
// takes no other proxy; a proxy busy, cooling, quarantined or dead there
// (or not in the pool) fails with ErrNoProxy, an empty pool with
// ErrEmptyPool. It leases from the Switch's own
// pool (WithPool), whatever WithRoute says of site. The lease is not
// renewed (Extend it while you need it longer than the lease TTL); Close
// releases it if it is still held. It is safe for concurrent use.
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
	l, _, err := s.own.tryLease(ctx, site, scope, id)
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

// MarkDead takes proxies (URLs or IDs) out of every site's rotation as
// Drain does, marked with reason: Dead lists them as StateDead with that
// Reason, and Revive or ReviveMarked(reason) brings them back. A proxy
// already dead or drained keeps its mark (an operator's drain is never
// turned into a probe's mark), and one not in the pool is skipped. reason
// is a short name of the caller ("probe"): not empty, at most 64 printable
// characters, no '|', not "drained". It returns how many proxies it
// marked. It is safe for concurrent use.
func (s *Switch) MarkDead(ctx context.Context, reason string, proxies ...string) (int, error) {
	if err := checkReason(reason); err != nil {
		return 0, err
	}
	ids, err := proxyIDs(proxies)
	if err != nil || len(ids) == 0 {
		return 0, err
	}
	strs := make([]string, len(ids))
	for i, id := range ids {
		strs[i] = id.(string)
	}
	n, err := roundTrip(ctx, s.cfg.redisTimeout, func(ctx context.Context) (int64, error) {
		return engine.Drain{Dead: s.keys.dead(), Sites: s.keys.sites(), Pool: s.keys.proxies(),
			Prefix: s.keys.base, Slots: s.cfg.slots, Reason: reason, Proxies: strs}.Run(ctx, s.rdb).Int64()
	}, nil)
	if err != nil {
		return 0, redisErr("mark dead", err)
	}
	for _, id := range strs {
		s.clients.closeProxy(id, "")
	}
	return int(n), nil
}

// ReviveMarked is Revive for the proxies among proxies (URLs or IDs) whose
// dead mark is reason's, as MarkDead set it: a proxy drained, or dead of
// its failures, or marked by another reason, stays out. It returns how many
// it revived. It is safe for concurrent use.
func (s *Switch) ReviveMarked(ctx context.Context, reason string, proxies ...string) (int, error) {
	if err := checkReason(reason); err != nil {
		return 0, err
	}
	ids, err := proxyIDs(proxies)
	if err != nil || len(ids) == 0 {
		return 0, err
	}
	return s.revive(ctx, reason, ids)
}

func checkReason(reason string) error {
	ok := reason != "" && len(reason) <= 64 && reason != "drained" && !strings.ContainsRune(reason, '|') &&
		strings.IndexFunc(reason, func(r rune) bool { return !unicode.IsPrint(r) || unicode.IsSpace(r) }) < 0
	if !ok {
		return fmt.Errorf("%w: dead reason %q: want 1 to 64 printable characters without spaces or '|', not \"drained\"", ErrConfig, reason)
	}
	return nil
}

// Prefix returns the key prefix of the Switch's pool (WithPrefix; default
// "proxyswitch"), for tools that keep keys of their own beside the pool's.
func (s *Switch) Prefix() string { return s.cfg.prefix }
