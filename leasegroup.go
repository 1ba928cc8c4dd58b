package proxyswitch

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/proxyswitch/proxyswitch/internal/bounded"
	"github.com/proxyswitch/proxyswitch/internal/group"
)

// Leases in batches.
//
// A plain lease attempt (no preferred proxy: Switch.Lease, a request's
// first try) goes through its site's lease group (internal/group), as
// releases go through the release group (releaser.go): while one lease.lua
// call for the site is in Redis, the attempts that arrive for the same site
// gather, and when it returns one of their callers sends them all in the
// next call, each with its own owner token. lease.lua then grants up to one
// lease per token, each the rotation's next free proxy after the one
// before, exactly as that many calls in a row would, but pays its fixed
// costs (TIME, the pool's meta, the site's cursor, the breaker gate, the
// prune) and the round trip once. An attempt that gets no proxy gets the
// script's wait reply as before (or a 1 ms wait when the call granted
// others: it retries). A lone attempt goes at once, alone: nothing waits on
// a timer, and an attempt waits for at most the call in flight plus its own.
//
// Preferred, proxy-only and session leases keep the single call.
//
// The batch's call is bounded by the pool's timeout, not by any caller's
// context: an attempt whose context ends while its batch is in Redis gets
// its lease (if granted) released at once and fails as the single call
// would have (TestLeaseBatchCanceledIsReleased).

// leaseBatch bounds the leases one lease.lua call grants.
const leaseBatch = 64

// leaseGroups are the lease groups of a pool, one per site (the breaker
// gate is per site). Past maxCachedScopes sites the attempts of new sites
// take the single call. Safe for concurrent use.
type leaseGroups struct {
	m sync.Map     // site -> *group.Group[string, []any]
	n atomic.Int64 // groups stored
}

// leaseGroup returns site's lease group, or nil when there are too many.
func (p *redisPool) leaseGroup(site, scope string) *group.Group[string, []any] {
	if v, ok := p.leaseGroups.m.Load(site); ok {
		return v.(*group.Group[string, []any])
	}
	if p.leaseGroups.n.Load() >= maxCachedScopes {
		return nil
	}
	g := &group.Group[string, []any]{Max: leaseBatch, Corrupt: ErrCorrupt,
		Flush: func(tokens []string) ([][]any, error) { return p.leaseMany(site, scope, tokens) }}
	v, loaded := p.leaseGroups.m.LoadOrStore(site, g)
	if !loaded {
		p.leaseGroups.n.Add(1)
	}
	return v.(*group.Group[string, []any])
}

// leaseMany runs lease.lua once for plain leases of site to tokens (the
// lease group's flush) and returns for each token the reply a call of its
// own would have had: {1, member, URL, expiry, version} for a granted lease.
func (p *redisPool) leaseMany(site, scope string, tokens []string) ([][]any, error) {
	argv := make([]any, 0, 9+len(tokens))
	argv = append(argv, scope, tokens[0], p.cfg.leaseTTL.Milliseconds(), p.cfg.cooldown.Milliseconds(),
		p.cfg.slots, p.cfg.idleTTL.Milliseconds(), "", "")
	argv = append(argv, p.sw.brk.leaseArgs(site)...) // ARGV[9], ARGV[10]: the further tokens follow at ARGV[11]
	for _, t := range tokens[1:] {
		argv = append(argv, t)
	}
	keys := p.scopeKeys.get(p, scope).lease
	res, err := bounded.Call(context.Background(), p.timeout, p.inline, func(ctx context.Context) ([]any, error) {
		return leaseScript.Run(ctx, p.rdb, keys, argv...).Slice()
	}, p.releaseLateMany(scope, tokens))
	if err != nil {
		return nil, err
	}
	return splitLeaseReply(res, tokens, func(member, token string) {
		_, _ = p.releaseMember(context.Background(), scope, member, token, "")
	})
}

// splitLeaseReply turns lease.lua's reply to a call for tokens into one
// reply per token. A reply of many grants ({2, version, expiry, wait,
// member, URL, ...}) becomes {1, member, URL, expiry, version} for the
// tokens served and the wait reply {0, wait} for the others (the time until
// a proxy frees, as lease.lua answers a lone token: they pause for it, or
// until a release wakes them, not 1 ms); any other reply is every token's.
// A reply that names more grants than tokens, or is malformed, is
// ErrCorrupt, its grants handed back through release.
func splitLeaseReply(res []any, tokens []string, release func(member, token string)) ([][]any, error) {
	out := make([][]any, len(tokens))
	if status, _ := intAt(res, 0); status != 2 {
		for i := range out {
			out[i] = res
		}
		return out, nil
	}
	version, ok1 := intAt(res, 1)
	expiry, ok2 := intAt(res, 2)
	wait, ok3 := intAt(res, 3)
	pairs := res[min(4, len(res)):]
	if !ok1 || !ok2 || !ok3 || len(pairs)%2 != 0 || len(pairs)/2 > len(tokens) {
		for i := 0; i+1 < len(pairs) && i/2 < len(tokens); i += 2 {
			if m, ok := pairs[i].(string); ok {
				release(m, tokens[i/2])
			}
		}
		return nil, fmt.Errorf("%w: lease reply of %d items for %d leases", ErrCorrupt, len(res), len(tokens))
	}
	for i := range out {
		if 2*i < len(pairs) {
			out[i] = []any{int64(1), pairs[2*i], pairs[2*i+1], expiry, version}
		} else {
			out[i] = []any{int64(0), max(wait, 1)}
		}
	}
	return out, nil
}

// releaseLateMany hands back the leases of a lease.lua call for tokens
// granted after the call's bound passed (roundTrip's late), like
// releaseLate.
func (p *redisPool) releaseLateMany(scope string, tokens []string) func([]any, error) {
	return func(res []any, err error) {
		if err != nil {
			return
		}
		release := func(member, token string) {
			_, _ = p.releaseMember(context.Background(), scope, member, token, "")
		}
		replies, err := splitLeaseReply(res, tokens, release)
		if err != nil {
			return
		}
		for i, r := range replies {
			if status, _ := intAt(r, 0); status == 1 && len(r) >= 4 {
				if member, ok := r[1].(string); ok {
					release(member, tokens[i])
				}
			}
		}
	}
}
