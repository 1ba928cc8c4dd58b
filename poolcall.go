package proxyswitch

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/proxyswitch/proxyswitch/internal/bounded"
	"github.com/proxyswitch/proxyswitch/internal/group"
)

// One round trip for what a pool's requests ask of Redis at once.
//
// Every release of a lease from Redis (a request's end, Lease.Release) and
// every plain lease attempt (no preferred proxy: Switch.Lease, a request's
// first try) goes through its pool's call group
// (internal/group): while one pool_call.lua call is in Redis, the releases
// and attempts that arrive gather, and when it returns one of their
// callers sends them all in the next call. The script gives the leases
// back first, release.lua once per lease, owner-checked exactly as a single
// release; then it runs lease.lua once per site with the owner tokens of
// that site's attempts, which grants up to one lease per token, each the
// rotation's next free proxy after the one before, exactly as that many
// calls in a row would, but pays its fixed costs (TIME, the pool's meta,
// the site's cursor, the breaker gate, the prune) once. Every key of a pool
// shares its hash tag, so one call covers all its sites, in Redis Cluster
// too. A lone caller goes at once, alone: nothing waits on a timer, and a
// caller waits for at most the call in flight plus its own. Under load (many
// collectors' requests starting and ending at once) n leases and releases
// cost one round trip and one script call instead of n, and a busy crawler
// makes well under one Redis round trip per page.
//
// An attempt that gets no proxy gets the script's wait reply as a lone
// token would: the time until a proxy frees (it pauses for that, or until a
// release wakes it), or 1 ms when the call looked at only part of the pool.
// A part of a call that fails (a site's keys corrupt) fails only its own
// callers.
//
// Each release still returns only when its outcome is in Redis, so
// everything a caller saw of a release before holds: Close and
// Collector.Wait return with the leases given back, a process that exits
// right after loses nothing, and the cooldown runs from when the request
// ended (a release that waited for its call has its cooldown shortened by
// the wait). A quarantine decided meanwhile is never overtaken: release.lua
// keeps a score something pushed past the lease's expiry. The releases of
// the hooks run in Colly's OnResponse and OnError, after LimitRule's
// parallelism slot is freed: they hold no request's slot.
//
// The call is bounded by the pool's timeout, not by any caller's context: an
// attempt whose context ends while its call is in Redis gets its lease (if
// granted) released at once and fails as a single call would have
// (TestLeaseBatchCanceledIsReleased). Preferred, proxy-only and session
// leases keep a lease.lua call of their own. Close's releases, all known at
// once, go in pool_call.lua calls of their own, several at a time and
// bounded by Close's context (releaseMany).

// A call carries at most callBatch units: a release is one, a lease attempt
// leaseUnits (lease.lua's work per token is larger), so a call grants at
// most callBatch/leaseUnits leases.
const (
	callBatch  = 256
	leaseUnits = 4
)

// poolOp is one caller's part of a pool call: a release (rel.l set) or a
// plain lease attempt of token on site (scope).
type poolOp struct {
	rel                queuedRelease
	site, scope, token string
}

// queuedRelease is one release waiting for its call, with what release.lua
// needs of it.
type queuedRelease struct {
	l        *Lease
	reset    string        // the proxy whose backoff starts over, or ""
	cooldown time.Duration // from at
	flaky    time.Duration
	pace     bool
	at       time.Time // when the release was asked for
}

// poolResult is one caller's outcome: a release's reply (n), or a lease
// attempt's (res, as lease.lua replies to a lone token); err when its part
// failed.
type poolResult struct {
	n   int64
	res []any
	err error
}

// newCallGroup returns p's call group.
func (p *redisPool) newCallGroup() group.Group[poolOp, poolResult] {
	return group.Group[poolOp, poolResult]{Max: callBatch, MaxBytes: callBatch, Corrupt: ErrCorrupt,
		Size: func(op poolOp) int {
			if op.rel.l != nil {
				return 1
			}
			return leaseUnits
		},
		Flush: p.callMany}
}

// callSite is the attempts of one site in a call.
type callSite struct {
	site, scope string
	tokens      []string
	ops         []int // their index in the call
}

// callMany runs pool_call.lua once for ops (the call group's flush) and
// returns each op's outcome.
func (p *redisPool) callMany(ops []poolOp) ([]poolResult, error) {
	return p.callManyCtx(context.Background(), ops)
}

// callManyCtx is callMany bounded by ctx as well as by the pool's timeout
// (Close's releases, releaseMany: the group's calls are bounded by the
// timeout alone).
func (p *redisPool) callManyCtx(ctx context.Context, ops []poolOp) ([]poolResult, error) {
	var sites []*callSite
	var nrel int
	for i, op := range ops {
		if op.rel.l != nil {
			nrel++
			continue
		}
		var s *callSite
		for _, x := range sites { // few sites per call: a scan beats a map
			if x.site == op.site && x.scope == op.scope {
				s = x
				break
			}
		}
		if s == nil {
			s = &callSite{site: op.site, scope: op.scope}
			sites = append(sites, s)
		}
		s.tokens = append(s.tokens, op.token)
		s.ops = append(s.ops, i)
	}
	keys := make([]string, 1, 1+11*len(sites)+5)
	keys[0] = p.keys.fails()
	argv := make([]any, 3, 3+(12*len(sites))+7*nrel+len(ops))
	argv[0] = p.cfg.idleTTL.Milliseconds()
	argv[1] = len(sites)
	for _, s := range sites {
		k := p.scopeKeys.get(p, s.scope).lease
		keys = append(keys, k...)
		args := p.leaseArgs(s.site, s.scope, s.tokens)
		argv = append(argv, len(k), len(args))
		argv = append(argv, args...)
	}
	var scopes int
	keys, argv, scopes = p.appendReleases(keys, argv, ops)
	argv[2] = scopes

	res, err := bounded.Call(ctx, p.timeout, p.inline, func(ctx context.Context) ([]any, error) {
		return poolCallScript.Run(ctx, p.rdb, keys, argv...).Slice()
	}, func(res []any, err error) {
		if err == nil { // the callers gave up: the leases granted go back
			_, _ = p.splitCall(res, ops, sites, true)
			return
		}
		for _, s := range sites { // the callers left their doubts to this (reclaim.go)
			for _, t := range s.tokens {
				p.doubt(s.scope, t, err)
			}
		}
	})
	if err != nil {
		return nil, err
	}
	return p.splitCall(res, ops, sites, false)
}

// closeCalls bounds the pool_call.lua calls releaseMany has in Redis at
// once.
const closeCalls = 8

// releaseMany releases ls, leases of this pool, each owner-checked exactly
// as release does it, for Close: in pool_call.lua calls of up to callBatch
// releases, at most closeCalls of them in Redis at once. The calls go
// outside the call group (which has one call in Redis at a time, each
// bounded by the timeout alone: with Redis stalled, one timeout per batch
// in turn) and are bounded by ctx as well as by the pool's timeout. Once a
// call fails as a whole (Redis unreachable or stalled) or ctx ends, the
// batches not yet sent fail with that error unsent: a stalled Redis costs
// Close one timeout, or ctx's deadline, whatever the number of leases. It
// returns each lease's error, as release would return it.
func (p *redisPool) releaseMany(ctx context.Context, ls []*Lease) []error {
	errs := make([]error, len(ls))
	now := time.Now()
	ops := make([]poolOp, len(ls))
	for i, l := range ls {
		ops[i] = poolOp{rel: p.releaseOp(l, now)}
	}
	var (
		mu     sync.Mutex
		failed error // the first call's failure: the batches not sent share it
		wg     sync.WaitGroup
		slots  = make(chan struct{}, closeCalls)
	)
	for lo := 0; lo < len(ops); lo += callBatch {
		hi := min(lo+callBatch, len(ops))
		slots <- struct{}{}
		mu.Lock()
		down := failed
		mu.Unlock()
		if down == nil && ctx.Err() != nil {
			down = redisErr("release", ctx.Err())
		}
		if down != nil {
			<-slots
			for i := lo; i < hi; i++ {
				errs[i] = down
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			res, err := p.callManyCtx(ctx, ops[lo:hi])
			if err != nil {
				mu.Lock()
				failed = cmp.Or(failed, redisErr("release", err))
				mu.Unlock()
			}
			for i := lo; i < hi; i++ {
				var r poolResult
				if err == nil {
					r = res[i-lo]
				}
				errs[i] = p.releaseDone(ops[i].rel, r, err)
			}
		}()
	}
	wg.Wait()
	return errs
}

// leaseArgs is lease.lua's ARGV for plain leases of site to tokens.
func (p *redisPool) leaseArgs(site, scope string, tokens []string) []any {
	argv := make([]any, 0, 10+len(tokens))
	argv = append(argv, scope, tokens[0], p.cfg.leaseTTL.Milliseconds(), p.cfg.cooldown.Milliseconds(),
		p.cfg.slots, p.cfg.idleTTL.Milliseconds(), "", "")
	argv = append(argv, p.sw.brk.leaseArgs(site)...) // ARGV[9], ARGV[10]: the further tokens follow at ARGV[11]
	for _, t := range tokens[1:] {
		argv = append(argv, t)
	}
	return argv
}

// appendReleases appends the keys and arguments of the releases among ops
// to a pool_call.lua call, and returns them with the count of release
// scopes.
func (p *redisPool) appendReleases(keys []string, argv []any, ops []poolOp) ([]string, []any, int) {
	first := "" // the first scope: most calls have no other, and need no map
	var scopes map[string]int
	n := 0
	now := time.Now()
	for _, op := range ops {
		q := op.rel
		if q.l == nil {
			continue
		}
		l := q.l
		i := 1
		switch {
		case n == 0:
			first, n = l.scope, 1
			keys = append(keys, p.scopeKeys.get(p, l.scope).release...)
		case l.scope == first:
		default:
			if scopes == nil {
				scopes = map[string]int{}
			}
			var ok bool
			if i, ok = scopes[l.scope]; !ok {
				keys = append(keys, p.scopeKeys.get(p, l.scope).release...)
				n++
				i = n
				scopes[l.scope] = i
			}
		}
		cooldown := q.cooldown
		if cooldown > 0 {
			cooldown = max(cooldown-now.Sub(q.at), 0) // from when the release was asked for
		}
		// The values every release sends alike go boxed as they were
		// boxed once (an interface of a string or of a number above 255
		// is an allocation each time).
		member, flaky, paced := l.memberArg, any(nil), flagArgs[0]
		if member == nil {
			member = l.member
		}
		if ms := q.flaky.Milliseconds(); ms == p.flakyMs {
			flaky = p.flakyArg
		} else {
			flaky = ms
		}
		if q.pace {
			paced = flagArgs[1]
		}
		argv = append(argv, i, member, l.token, cooldown.Milliseconds(), q.reset, flaky, paced)
	}
	return keys, argv, n
}

// flagArgs are a script's "0" and "1" flags, boxed once.
var flagArgs = [2]any{"0", "1"}

// splitCall turns pool_call.lua's reply into each op's outcome. With
// late (the callers gave up), or when the reply is malformed, the leases it
// granted are handed back.
func (p *redisPool) splitCall(res []any, ops []poolOp, sites []*callSite, late bool) ([]poolResult, error) {
	out := make([]poolResult, len(ops))
	var rels []any
	if len(res) == len(sites)+1 {
		rels, _ = res[len(sites)].([]any)
	}
	var bad error
	if len(res) != len(sites)+1 || rels == nil {
		bad = fmt.Errorf("%w: pool call reply of %d items for %d sites", ErrCorrupt, len(res), len(sites))
	}
	// The releases' replies, in order.
	j := 0
	for i, op := range ops {
		if op.rel.l == nil || bad != nil {
			continue
		}
		if j >= len(rels) {
			bad = fmt.Errorf("%w: pool call reply of %d releases for more", ErrCorrupt, len(rels))
			break
		}
		switch v := rels[j].(type) {
		case int64:
			out[i].n = v
		case string:
			out[i].err = partErr(strings.TrimPrefix(v, "e:"))
		default:
			bad = fmt.Errorf("%w: pool call reply holds a release reply of type %T", ErrCorrupt, v)
		}
		j++
	}
	if bad == nil && j != len(rels) {
		bad = fmt.Errorf("%w: pool call reply of %d releases for %d", ErrCorrupt, len(rels), j)
	}
	// Each site's leases.
	for si, s := range sites {
		var part []any
		if si < len(res) {
			part, _ = res[si].([]any)
		}
		if tag, _ := firstString(part); tag == "e" && len(part) == 2 {
			msg, _ := part[1].(string)
			for _, i := range s.ops {
				out[i].err = partErr(msg)
			}
			continue
		}
		replies, err := splitLeaseReply(part, s.tokens, func(member, token string) {
			p.giveBack(context.Background(), s.scope, member, token)
		})
		if err != nil {
			bad = cmp.Or(bad, err)
			continue
		}
		for j, i := range s.ops {
			out[i].res = replies[j]
		}
	}
	if late || bad != nil {
		// Nobody takes the leases granted: they go back.
		for _, s := range sites {
			for j, i := range s.ops {
				if r := out[i].res; len(r) >= 4 {
					if status, _ := intAt(r, 0); status == 1 {
						if member, ok := r[1].(string); ok {
							p.giveBack(context.Background(), s.scope, member, s.tokens[j])
						}
					}
				}
			}
		}
	}
	if bad != nil {
		return nil, bad
	}
	return out, nil
}

// partErr is the error of one part of a pool call (a site's leases, a
// release), as the script caught it: a Redis error, as the call's own
// would have been (redis.Error: an error of Redis, not an outage of it).
type partErr string

func (e partErr) Error() string { return string(e) }
func (e partErr) RedisError()   {}

// firstString returns element 0 of a reply if it is a string.
func firstString(res []any) (string, bool) {
	if len(res) == 0 {
		return "", false
	}
	s, ok := res[0].(string)
	return s, ok
}

// splitLeaseReply turns lease.lua's reply to a call for tokens into one
// reply per token. A reply of many grants ({2, version, expiry, wait,
// member, URL, ...}) becomes {1, member, URL, expiry, version} for the
// tokens served and the wait reply {0, wait} for the others (the time until
// a proxy frees, as lease.lua answers a lone token: they pause for it, or
// until a release wakes them, not 1 ms); a grant {1, ...} is the first
// token's alone (the others get a 1 ms wait); any other reply (a wait, a
// pause, an empty pool) is every token's.
// A reply that names more grants than tokens, or is malformed, is
// ErrCorrupt, its grants handed back through release.
func splitLeaseReply(res []any, tokens []string, release func(member, token string)) ([][]any, error) {
	out := make([][]any, len(tokens))
	switch status, _ := intAt(res, 0); {
	case status == 1 && len(tokens) > 1:
		// One grant (lease.lua answers a call of many in the form of many
		// grants; this is a defence): the first token's, the others retry.
		out[0] = res
		for i := 1; i < len(out); i++ {
			out[i] = []any{int64(0), int64(1)}
		}
		return out, nil
	case status != 2:
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

// maxCachedScopes bounds the scopes whose keys a pool keeps built: past
// it, the keys of new scopes are built on each call.
const maxCachedScopes = 10_000

// scopeKeys are the keys of one scope that every lease and release sends.
type scopeKeys struct {
	lease   []string // lease.lua's KEYS
	release []string // pool_call.lua's five keys of the scope, for a release
}

// scopeKeyCache keeps each scope's keys built (the key names of a scope
// never change), so that a lease or a release does not concatenate them
// again. Safe for concurrent use; the slices it returns are shared: read
// only.
type scopeKeyCache struct {
	m sync.Map     // scope -> *scopeKeys
	n atomic.Int64 // scopes stored
}

func (c *scopeKeyCache) get(p *redisPool, scope string) *scopeKeys {
	if v, ok := c.m.Load(scope); ok {
		return v.(*scopeKeys)
	}
	k := &scopeKeys{lease: p.keys.lease(scope), release: []string{p.keys.free(scope), p.keys.leases(scope),
		p.keys.strikes(scope), p.keys.health(scope), p.keys.pace(scope)}}
	if c.n.Add(1) <= maxCachedScopes {
		c.m.Store(scope, k)
	}
	return k
}
