package proxyswitch

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/proxyswitch/proxyswitch/ban"
)

// A backend is a place leases come from. Leases come from two engines, one
// pool in Redis and this server's share of a pool in memory
// (internal/localpool), and reach a request through three backends; nothing
// outside their files asks which one it talks to:
//
//	redisPool  one pool in Redis: the lease scripts (redispool.go)
//	fbPool     a Redis pool with its local shard (a localpool.Pool) behind
//	           it, for WithFallback and WithSharding: it serves from one or
//	           the other by the fallback's mode, and trips to the shard when
//	           a Redis call finds Redis gone (fallbacklease.go)
//	router     several pools in order, for WithRoute, WithSpread and
//	           UsePools (this file)
//
// A Lease remembers the backend that granted it: its release, extension and
// quarantine go back there, whichever route led to it.
type backend interface {
	// pool names the pool for errors, logs and the observer.
	pool() string
	// tryLease makes one lease attempt for site on scope, preferring proxy
	// ID prefer: a lease, or how long until a proxy may free (no lease, no
	// error), or an error wrapping ErrNoProxy.
	tryLease(ctx context.Context, site, scope, prefer string) (*Lease, time.Duration, error)
	// release ends l, owner-checked (ErrLeaseLost when another holder has
	// its slot now).
	release(ctx context.Context, l *Lease) error
	// extend pushes l's expiry to now + ttl, owner-checked.
	extend(ctx context.Context, l *Lease, ttl time.Duration) error
	// penalize quarantines p on site after a ban.Ban or ban.ProxyFailure verdict,
	// ending l with it when l is p's lease there.
	penalize(ctx context.Context, site string, p *Proxy, l *Lease, v ban.Verdict) (penalty, error)
	// broker returns the Redis pool for a request that only Redis can
	// serve (a sticky session), or an error wrapping ErrNoProxy while the
	// backend leases from elsewhere.
	broker() (*redisPool, error)
	// redis returns the Redis pool behind the backend, whatever it leases
	// from now: where sessions and the pool's records live.
	redis() *redisPool
}

// penalty is what a quarantine did.
type penalty struct {
	quarantine time.Duration
	until      time.Time // Redis clock
	strikes    int       // bans (or failures) in a row, this one included
	dead       bool
	ended      bool       // it ended the lease it was given
	first      bool       // a ban that got the first quarantine: a strike awaiting evidence (Bans.EvidenceFirst)
	healthy    bool       // the proxy had a healthy answer on the scope, and no strike, before this ban; for a failure: since its last failure there that stands (it worked: storm.go)
	witness    bool       // healthy by an answer (no lift) since the site's last verdict on a proxy: healthy on its other pages
	unproven   bool       // a first strike of a proxy lifted before without ever being healthy on the site (lift.lua): no fresh one
	lifted     time.Time  // healthy by a lift (a page's verdict) since that verdict: when (zero: not so; Redis clock)
	at         time.Time  // when this ban was judged (Redis clock)
	kept       bool       // a soft refusal a task's session survived: no quarantine, no retry (sessionscore.go)
	paced      bool       // a rate-limit refusal under learned pacing: the site's pace, not the proxy's health
	hold       bool       // paced, of a proxy that had not rested: the pace's refusal, held out for the cooldown, no strike
	tired      bool       // a hold of a proxy rested past the site's accepted rest, if not twice over: a storm's sign
	rotated    bool       // a gateway's virtual proxy replaced by a new session, not quarantined (gateway.go)
	local      *localPool // the local shard the strike lives in (fallbacklease.go); nil: Redis
}

// evidence reports whether a ban's penalty is evidence of a site's trouble
// for its circuit breaker at once: a verdict on the proxy (a repeat, an
// unambiguous refusal), or a rate-limit refusal of a proxy that had rested
// (in a storm even rested proxies are refused: tired, or no hold). A first
// strike is not, until confirmed or left unresolved (transport.go), nor is
// the pace's refusal (hold), nor a refusal the breaker absorbed or a
// session kept.
func (p penalty) evidence() bool {
	return !p.kept && (p.tired || !p.hold && (!p.first || p.paced))
}

// backendFor returns the backend of pool name: the Switch's own, or one
// made on first use with the Switch's options (WithRoute, UsePools,
// Sessions.Pool), behind the Switch's fallback when it has one.
func (s *Switch) backendFor(name string) (backend, error) {
	if name == s.cfg.pool {
		return s.own, nil
	}
	if v, ok := s.pools.Load(name); ok {
		return v.(backend), nil
	}
	rp, err := newRedisPool(s, name)
	if err != nil {
		return nil, err
	}
	v, _ := s.pools.LoadOrStore(name, s.fb.wrap(rp))
	return v.(backend), nil
}

// source returns the backend a lease for site comes from: a route over
// several pools, or the Switch's own pool.
func (s *Switch) source(ctx context.Context, site string) (backend, error) {
	r := s.routeFor(ctx, site)
	if r == nil {
		return s.withSelector(ctx, s.own)
	}
	rt := &router{spread: r.spread, pools: make([]backend, len(r.pools))}
	for i, name := range r.pools {
		be, err := s.backendFor(name)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrNoProxy, err)
		}
		rt.pools[i] = be
	}
	if len(rt.pools) == 1 {
		return s.withSelector(ctx, rt.pools[0])
	}
	return s.withSelector(ctx, rt)
}

// router leases from several pools in order: a later pool only while every
// proxy of the earlier ones is busy, quarantined or gone (WithRoute), or
// starting at another pool each lease (WithSpread).
type router struct {
	pools  []backend
	spread bool
}

// spreadNext picks the first pool of each lease of a spread route.
var spreadNext atomic.Uint64

func (r *router) pool() string { return r.pools[0].pool() }

// tryLease makes one attempt over the pools: a lease from the first that
// has one, or the shortest wait of them all.
func (r *router) tryLease(ctx context.Context, site, scope, prefer string) (*Lease, time.Duration, error) {
	first := 0
	if r.spread {
		first = int(spreadNext.Add(1) % uint64(len(r.pools)))
	}
	wait := time.Duration(-1)
	var empty error
	for i := range r.pools {
		l, w, err := r.pools[(first+i)%len(r.pools)].tryLease(ctx, site, scope, prefer)
		switch {
		case l != nil:
			return l, 0, nil
		case errors.Is(err, ErrEmptyPool):
			empty = err
			continue
		case err != nil:
			return nil, 0, err
		}
		if wait < 0 || w < wait {
			wait = w
		}
	}
	if wait < 0 {
		return nil, 0, empty
	}
	return nil, wait, nil
}

// A route's leases belong to the pool that granted them.
func (r *router) release(ctx context.Context, l *Lease) error { return l.be.release(ctx, l) }
func (r *router) extend(ctx context.Context, l *Lease, ttl time.Duration) error {
	return l.be.extend(ctx, l, ttl)
}
func (r *router) penalize(ctx context.Context, site string, p *Proxy, l *Lease, v ban.Verdict) (penalty, error) {
	if l != nil {
		return l.be.penalize(ctx, site, p, l, v)
	}
	return r.pools[0].penalize(ctx, site, p, l, v)
}
func (r *router) broker() (*redisPool, error) { return r.pools[0].broker() }
func (r *router) redis() *redisPool           { return r.pools[0].redis() }
