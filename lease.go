package proxyswitch

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"
)

// Lease is one proxy held exclusively for one site (or for all sites with
// ScopeGlobal) until it is released or its TTL runs out. Its methods are safe
// for concurrent use; Release is idempotent.
type Lease struct {
	sw     *Switch // the Switch it was leased through
	be     backend // the backend that granted it: release, extend and quarantine go there
	scope  string  // the site, or globalSite
	proxy  *Proxy
	member string // "<id>:<slot>" in the free set
	// memberArg is member as lease.lua's reply boxed it, sent again as it
	// is by pool_call.lua's call (poolcall.go); nil: member is boxed.
	memberArg any
	token     string // owner token: only this holder can release or extend

	local *localLease // the local shard's lease, when it granted it (fallbacklease.go)

	site     string       // the site it was leased for (differs from scope with ScopeGlobal)
	granted  time.Time    // when this Switch got it (zero for a session's); Report's send time
	expiry   atomic.Int64 // unix ms, Redis clock
	released atomic.Bool
	healthy  atomic.Bool  // the site answered normally through it: release resets the backoff
	hold     atomic.Int64 // ns: keep the proxy out at least this long after release (an abandoned request)
	unused   atomic.Bool  // no request went through it (Switch.Ban's probe): released with no cooldown
	taken    atomic.Bool  // the renewer found it taken over, or Close released it under its request (renew.go)
	// challengeStrike: the transport quarantines a hop redirected to a
	// challenge page through it (set around that call only): a first strike
	// awaiting its evidence like any refusal, not a ban at once (ban.go,
	// challengeStrike).
	challengeStrike atomic.Bool

	renew   bool // the renewer extends it while it lives (renew.go); guarded by the renewer's mutex
	endSeen bool // the renewer saw it ended at a tick; guarded by the renewer's mutex
}

// Proxy returns the leased proxy.
func (l *Lease) Proxy() *Proxy { return l.proxy }

// Expiry returns when the lease runs out unless extended, by Redis' clock.
func (l *Lease) Expiry() time.Time { return time.UnixMilli(l.expiry.Load()) }

// Release gives the proxy back, owner-checked: a holder whose lease expired
// gets ErrLeaseLost and changes nothing. Releasing twice is a no-op. After a
// Redis error it may be called again.
func (l *Lease) Release(ctx context.Context) error {
	if err := l.made(); err != nil {
		return err
	}
	if !l.released.CompareAndSwap(false, true) {
		return nil
	}
	err := l.be.release(ctx, l)
	if errors.Is(err, ErrRedis) {
		l.released.Store(false)
		return err
	}
	l.sw.renew.drop(l)
	return err
}

// Extend pushes the lease's expiry to now + ttl (ttl <= 0: the lease TTL),
// owner-checked: it fails with ErrLeaseLost once the lease expired or was
// released, never extending the next holder's.
func (l *Lease) Extend(ctx context.Context, ttl time.Duration) error {
	if err := l.made(); err != nil {
		return err
	}
	if ttl <= 0 {
		ttl = l.sw.cfg.leaseTTL
	}
	if l.released.Load() {
		return l.lost("already released")
	}
	return l.be.extend(ctx, l, ttl)
}

// made fails with ErrConfig for a nil Lease or one a Switch did not grant
// (a zero Lease): its methods would have nothing to act on.
func (l *Lease) made() error {
	if l == nil || l.sw == nil || l.be == nil {
		return configErr("a Lease must come from Switch.Lease (nil or zero Lease)")
	}
	return nil
}

func (l *Lease) lost(why string) error {
	return &ProxyError{Proxy: l.proxy.String(), Reason: "lease on " + l.scope + " lost: " + why, Err: ErrLeaseLost}
}

// Lease waits for a free proxy for site, at most Timeouts.MaxWait or until
// ctx ends, then fails with ErrNoProxy (as after Close). The lease is not
// renewed: Extend it. Most users never call Lease. It is safe for concurrent
// use.
func (s *Switch) Lease(ctx context.Context, site string) (*Lease, error) {
	return s.acquire(ctx, site, "", false)
}

// failSite is the site whose proxy failures quarantine on scope (the
// state scripts' argument): scope's own, "" for the global scope, where a
// failure on any site does.
func failSite(scope string) string {
	if scope == globalSite {
		return ""
	}
	return scope
}

// scopeOf maps a site to the scope a lease is exclusive for.
func (s *Switch) scopeOf(site string) string {
	if s.cfg.scope == ScopeGlobal {
		return globalSite
	}
	return site
}

// acquire leases a proxy for site, preferring proxy ID prefer when it is
// free. While every proxy is busy it sleeps (the script's wait hint, capped
// by a jittered exponential backoff, so it never spins on Redis) until a
// proxy frees, the max wait passes or ctx ends. The lease is tracked for
// Close, and renewed while it lives if renew (renew.go). Every lease lives
// for the lease TTL at first, whatever ctx's deadline: a request longer
// than that keeps its proxy by renewal, not by a longer TTL, so that a
// holder that dies frees it within one TTL.
func (s *Switch) acquire(ctx context.Context, site, prefer string, renew bool) (*Lease, error) {
	return s.acquireBy(ctx, site, prefer, renew, time.Time{})
}

// acquireBy is acquire whose wait, if by is set, ends by then exactly as
// it would on ctx with its deadline brought forward to by (leaseEarly) but
// without making that context for every lease: while by is further than
// byNear away, no try can run past it (each is bounded by the Redis
// timeout) and the pauses stop short of byNear, so the tries run on ctx; a
// try made nearer to by runs on a context ending at by, made then.
func (s *Switch) acquireBy(ctx context.Context, site, prefer string, renew bool, by time.Time) (*Lease, error) {
	if s.renew.isClosed() {
		return nil, errClosed
	}
	be, err := s.source(ctx, site)
	if err != nil {
		return nil, err
	}
	near := byNear * s.cfg.redisTimeout
	if _, ok := be.(*router); ok {
		near = maxWaitHint // a try may cross several pools: the context at once
	}
	scope := s.scopeOf(site)
	start := time.Now()
	deadline := start.Add(s.cfg.maxWait)
	backoff := s.cfg.backoffMin
	var next time.Duration // the last wait hint: when the next proxy frees
	for {
		if !by.IsZero() && time.Until(by) < near {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, by)
			defer cancel()
			by = time.Time{}
		}
		l, wait, err := be.tryLease(ctx, site, scope, prefer)
		next = wait
		if l != nil {
			if err := s.renew.track(l, renew); err != nil {
				_ = l.Release(context.WithoutCancel(ctx)) // closed meanwhile
				return nil, err
			}
			return l, nil
		}
		if err != nil {
			return nil, err
		}
		if err := s.brk.pausedErr(site, start, deadline); err != nil {
			return nil, err // the site's circuit breaker holds it past the wait (breaker.go)
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, fmt.Errorf("%w: every proxy of pool %q stayed busy or quarantined for site %s for %v%s%s", ErrNoProxy, be.pool(), scope, s.cfg.maxWait, nextFree(next), s.sessionsHint(ctx, be.pool()))
		}
		d := min(wait, backoff, left)
		if !by.IsZero() {
			d = min(d, max(time.Until(by)-near, time.Millisecond)) // then the context ending at by
		}
		backoff = min(2*backoff, s.cfg.backoffMax)
		if !s.waiters.pause(ctx, be.pool(), scope, d) {
			if err := s.brk.pausedErr(site, start, time.Now()); err != nil {
				return nil, withCause(err, ctx.Err()) // the request ended while its site was paused
			}
			return nil, withCause(fmt.Errorf("%w: gave up waiting for site %s%s", ErrNoProxy, scope, nextFree(next)), ctx.Err())
		}
	}
}

// byNear, times the Redis timeout, is how near its by acquireBy makes the
// context ending then: a try (in a pool call, the call in flight and its
// own; a pool lost and re-seeded, two calls) ends well within it.
const byNear = 4

// nextFree says when the next proxy of a site frees (its lease ends, its
// cooldown or quarantine runs out), from the lease script's last wait hint,
// so that a failed wait names what blocked it: seconds are a busy pool,
// minutes to hours are quarantines, a day or more is a pool whose proxies
// are dead, drained or banned for long.
func nextFree(wait time.Duration) string {
	switch {
	case wait <= 0:
		return ""
	case wait >= maxWaitHint:
		return " (no proxy frees within a day: dead, drained or quarantined)"
	case wait < time.Second:
		return fmt.Sprintf(" (the next proxy frees in %v)", wait)
	default:
		return fmt.Sprintf(" (the next proxy frees in %v)", wait.Round(time.Second))
	}
}

// jittered is d less a random part of up to its half: from d/2 to d.
func jittered(d time.Duration) time.Duration { return d/2 + rand.N(d/2+1) }

// pause sleeps for d jittered down to d/2 to d, so that waiters do not wake
// in lockstep. It reports false if ctx ended first.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(jittered(d))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
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
			return nil, &ProxyError{Proxy: clip(pe.Proxy), Reason: "stored in the pool but " + pe.Reason, Err: ErrCorrupt}
		}
		return nil, err
	}
	s.parsed.Store(raw, p)
	return p, nil
}

// poolEntry is proxyFor for the URL of entry id of the pool hash key, as a
// script that walks the pool returns it; the error names the key and the
// entry.
func (s *Switch) poolEntry(key, id, raw string) (*Proxy, error) {
	p, err := s.proxyFor(raw)
	if err != nil {
		return nil, fmt.Errorf("key %s, entry %s: %w", key, clip(id), err)
	}
	return p, nil
}

func (s *Switch) newToken() string {
	return s.tokenPrefix + strconv.FormatUint(s.tokenSeq.Add(1), 36)
}
