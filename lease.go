package proxyswitch

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Lease is one proxy held exclusively for one site (or for all sites with
// ScopeGlobal) until it is released or its TTL runs out. Its methods are safe
// for concurrent use; Release is idempotent.
type Lease struct {
	sw     *Switch
	scope  string // the site, or globalSite
	proxy  *Proxy
	member string // "<id>:<slot>" in the free set
	token  string // owner token: only this holder can release or extend

	local *LocalLease // taken from the local shard (fallback.go); nil for a Redis lease

	site     string       // the site it was leased for (differs from scope with ScopeGlobal)
	expiry   atomic.Int64 // unix ms, Redis clock
	released atomic.Bool
	healthy  atomic.Bool  // the site answered normally through it: release resets the backoff
	hold     atomic.Int64 // ns: keep the proxy out at least this long after release (an abandoned request)
	unused   atomic.Bool  // no request went through it (Switch.Ban's probe): released with no cooldown
}

// Proxy returns the leased proxy.
func (l *Lease) Proxy() *Proxy { return l.proxy }

// Site returns the site the lease is exclusive for ("*" with ScopeGlobal).
func (l *Lease) Site() string { return l.scope }

// Expiry returns when the lease runs out unless extended, by Redis' clock.
func (l *Lease) Expiry() time.Time { return time.UnixMilli(l.expiry.Load()) }

// Release gives the proxy back, owner-checked: a holder whose lease expired
// and was taken by someone else gets ErrLeaseLost and changes nothing.
// Releasing twice is a no-op. On a Redis error the lease stays held (it will
// expire by its TTL) and Release may be called again.
func (l *Lease) Release(ctx context.Context) error {
	if !l.released.CompareAndSwap(false, true) {
		return nil
	}
	err := l.sw.release(ctx, l)
	if errors.Is(err, ErrRedis) {
		l.released.Store(false)
	}
	return err
}

// Extend pushes the lease's expiry to now + ttl (Redis clock); ttl <= 0 means
// the Switch's lease TTL. It fails with ErrLeaseLost once the lease has
// expired or been released: an expired holder can never extend the next
// holder's lease.
func (l *Lease) Extend(ctx context.Context, ttl time.Duration) error {
	if ttl <= 0 {
		ttl = l.sw.cfg.leaseTTL
	}
	if l.released.Load() {
		return l.lost("already released")
	}
	if l.local != nil {
		return l.sw.fb.extend(ctx, l, ttl)
	}
	s := l.sw
	n, err := roundTrip(ctx, s.callTimeout(), func(ctx context.Context) (int64, error) {
		return extendScript.Run(ctx, s.rdb, []string{s.keys.free(l.scope), s.keys.leases(l.scope)},
			l.member, l.token, ttl.Milliseconds()).Int64()
	}, nil)
	if err != nil {
		return redisErr("extend", err)
	}
	if n == 0 {
		return l.lost("expired or taken over")
	}
	l.expiry.Store(n)
	return nil
}

func (l *Lease) lost(why string) error {
	return &ProxyError{Proxy: l.proxy.String(), Reason: "lease on " + l.scope + " lost: " + why, Err: ErrLeaseLost}
}

// Lease waits for a free proxy for site (a host name, or whatever the site
// function returns) and leases it. It waits at most the max-wait option, or
// until ctx ends, and then fails with ErrNoProxy. Most users never call it:
// the ProxyFunc and the hooks installed by Attach do. It is safe for
// concurrent use.
func (s *Switch) Lease(ctx context.Context, site string) (*Lease, error) {
	if s.err != nil {
		return nil, s.err
	}
	return s.acquire(ctx, site, "")
}

// scopeOf maps a site to the scope a lease is exclusive for.
func (s *Switch) scopeOf(site string) string {
	if s.cfg.scope == ScopeGlobal {
		return globalSite
	}
	return site
}

// leaseTTL is the configured TTL, stretched to cover ctx's deadline (plus a
// second) so that a request never outlives its lease, capped at ten TTLs.
func (s *Switch) leaseTTL(ctx context.Context) time.Duration {
	ttl := s.cfg.leaseTTL
	if dl, ok := ctx.Deadline(); ok {
		if need := time.Until(dl) + time.Second; need > ttl {
			ttl = min(need, s.cfg.maxLeaseTTL)
		}
	}
	return ttl
}

// acquire leases a proxy for site, preferring proxy ID prefer when it is
// free. While every proxy is busy it sleeps (the script's wait hint, capped
// by a jittered exponential backoff, so it never spins on Redis) until a
// proxy frees, the max wait passes or ctx ends.
func (s *Switch) acquire(ctx context.Context, site, prefer string) (*Lease, error) {
	scope := s.scopeOf(site)
	deadline := time.Now().Add(s.cfg.maxWait)
	backoff := s.cfg.backoffMin
	for {
		l, wait, err := s.tryLease(ctx, site, scope, prefer)
		if l != nil || err != nil {
			return l, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, fmt.Errorf("%w: every proxy of pool %q stayed busy or quarantined for site %s for %v", ErrNoProxy, s.cfg.pool, scope, s.cfg.maxWait)
		}
		d := min(wait, backoff, left)
		backoff = min(2*backoff, s.cfg.backoffMax)
		if !pause(ctx, d) {
			return nil, errors.Join(fmt.Errorf("%w: gave up waiting for site %s", ErrNoProxy, scope), ctx.Err())
		}
	}
}

// pause sleeps for d jittered down to d/2 to d, so that waiters do not wake
// in lockstep. It reports false if ctx ended first.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d/2 + rand.N(d/2+1))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// tryLease runs one lease attempt: a lease, or how long until a proxy frees,
// or an error (empty pool, Redis failure, corrupt data).
func (s *Switch) tryLease(ctx context.Context, site, scope, prefer string) (*Lease, time.Duration, error) {
	if r := s.routeFor(ctx, site); r != nil {
		return s.tryRoute(ctx, r, site, scope, prefer)
	}
	if s.fb != nil {
		if l, wait, err, done := s.fb.tryLease(ctx, s, site, scope, prefer); done {
			return l, wait, err
		}
	}
	token := s.newToken()
	ttl := s.leaseTTL(ctx)
	res, err := roundTrip(ctx, s.callTimeout(), func(ctx context.Context) ([]any, error) {
		return leaseScript.Run(ctx, s.rdb, s.keys.lease(scope), scope, token, ttl.Milliseconds(), s.cfg.cooldown.Milliseconds(),
			s.cfg.slots, s.cfg.idleTTL.Milliseconds(), prefer).Slice()
	}, s.releaseLate(scope, token))
	if err != nil {
		if err, ok := leaseConfigErr(err); ok {
			return nil, 0, err
		}
		if s.fb != nil && s.fb.trip(ctx, err) {
			return s.tryLease(ctx, site, scope, prefer) // from the local shard now
		}
		return nil, 0, fmt.Errorf("%w: %w", ErrNoProxy, redisErr("lease", err))
	}
	status, _ := intAt(res, 0)
	switch {
	case status == -1 && len(res) == 1:
		return nil, 0, fmt.Errorf("%w: %w: pool %q has no proxies", ErrNoProxy, ErrEmptyPool, s.cfg.pool)
	case status == 0 && len(res) == 2:
		wait, _ := intAt(res, 1)
		return nil, waitHint(wait), nil
	case status == 1 && len(res) == 4:
		member, _ := res[1].(string)
		raw, _ := res[2].(string)
		expiry, ok := intAt(res, 3)
		p, err := s.proxyFor(raw)
		if err != nil || !ok || member == "" {
			// Hand the slot back rather than hold a proxy we cannot use
			// (owner-checked: by member and token, as no Lease is made).
			if member != "" {
				_, _ = s.releaseMember(context.WithoutCancel(ctx), scope, member, token, "")
			}
			if err == nil {
				err = fmt.Errorf("%w: malformed lease reply", ErrCorrupt)
			}
			return nil, 0, fmt.Errorf("%w: %w", ErrNoProxy, err)
		}
		l := &Lease{sw: s, scope: scope, site: site, member: member, token: token, proxy: p}
		l.expiry.Store(expiry)
		if s.fb != nil {
			s.fb.leased(l)
		}
		return l, 0, nil
	}
	return nil, 0, fmt.Errorf("%w: %w: unexpected lease reply of %d items", ErrNoProxy, ErrCorrupt, len(res))
}

// releaseLate hands back a lease of lua/lease.lua granted (to token, on
// scope) after its caller gave up waiting for the reply: roundTrip's late.
func (s *Switch) releaseLate(scope, token string) func([]any, error) {
	return func(res []any, err error) {
		if status, _ := intAt(res, 0); err == nil && status == 1 && len(res) == 4 {
			if member, ok := res[1].(string); ok {
				_, _ = s.releaseMember(context.Background(), scope, member, token, "")
			}
		}
	}
}

// leaseConfigErr turns lua/lease.lua's PSCONFIG error (the pool records
// another concurrency) into an ErrNoProxy and ErrConfig error.
func leaseConfigErr(err error) (error, bool) {
	msg, ok := strings.CutPrefix(err.Error(), "PSCONFIG ")
	if !ok {
		return nil, false
	}
	return fmt.Errorf("%w: %w: %s", ErrNoProxy, ErrConfig, msg), true
}

// release runs the owner-checked release script for l. If the request made
// through l got a healthy answer, the proxy's backoff starts over.
func (s *Switch) release(ctx context.Context, l *Lease) error {
	if s.fb != nil {
		if err, done := s.fb.release(ctx, l); done {
			return err
		}
	}
	reset := ""
	if l.healthy.Load() {
		reset = l.proxy.id
	}
	cooldown := max(s.cfg.cooldown, time.Duration(l.hold.Load()))
	if l.unused.Load() {
		cooldown = 0
	}
	n, err := s.releaseMemberFor(ctx, l.scope, l.member, l.token, reset, cooldown)
	if err != nil {
		if s.fb != nil && s.fb.failedRelease(ctx, l, err) {
			return nil
		}
		return err
	}
	if n == 0 {
		return l.lost("expired and leased again")
	}
	return nil
}

// releaseMember releases one slot if token still owns it: 1 released, 2
// released after expiry, 0 not the owner. A non-empty reset names the proxy
// whose runs of bans (on scope) and failures end.
func (s *Switch) releaseMember(ctx context.Context, scope, member, token, reset string) (int64, error) {
	return s.releaseMemberFor(ctx, scope, member, token, reset, s.cfg.cooldown)
}

// releaseMemberFor is releaseMember with the proxy next free after cooldown.
func (s *Switch) releaseMemberFor(ctx context.Context, scope, member, token, reset string, cooldown time.Duration) (int64, error) {
	keys := []string{s.keys.free(scope), s.keys.leases(scope), s.keys.strikes(scope), s.keys.fails()}
	n, err := roundTrip(ctx, s.callTimeout(), func(ctx context.Context) (int64, error) {
		return releaseScript.Run(ctx, s.rdb, keys, member, token, cooldown.Milliseconds(), reset).Int64()
	}, nil)
	if err != nil {
		return 0, redisErr("release", err)
	}
	return n, nil
}

// proxyFor parses a proxy URL read from Redis, caching the result: an ID's
// URL never changes, so each distinct URL is parsed and validated once.
func (s *Switch) proxyFor(raw string) (*Proxy, error) {
	if p, ok := s.parsed.Load(raw); ok {
		return p.(*Proxy), nil
	}
	p, err := ParseProxy(raw)
	if err != nil {
		var pe *ProxyError
		if errors.As(err, &pe) {
			return nil, &ProxyError{Proxy: pe.Proxy, Reason: "stored in the pool but " + pe.Reason, Err: ErrCorrupt}
		}
		return nil, err
	}
	s.parsed.Store(raw, p)
	return p, nil
}

// poolEntry is proxyFor for the URL of pool entry id, as a script that
// walks the pool returns it; the error names the entry.
func (s *Switch) poolEntry(id, raw string) (*Proxy, error) {
	p, err := s.proxyFor(raw)
	if err != nil {
		return nil, fmt.Errorf("pool entry %s: %w", id, err)
	}
	return p, nil
}

func (s *Switch) newToken() string {
	return s.tokenPrefix + strconv.FormatUint(s.tokenSeq.Add(1), 36)
}

// maxWaitHint bounds a script's wait hint: with every proxy dead the hint
// is the dead score (1e15 ms) away, which would overflow a Duration.
const maxWaitHint = 24 * time.Hour

// waitHint turns a script's wait hint in milliseconds into a Duration
// between 1ms and maxWaitHint.
func waitHint(ms int64) time.Duration {
	return time.Duration(min(max(ms, 1), maxWaitHint.Milliseconds())) * time.Millisecond
}

func intAt(res []any, i int) (int64, bool) {
	if i >= len(res) {
		return 0, false
	}
	v, ok := res[i].(int64)
	return v, ok
}
