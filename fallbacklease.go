package proxyswitch

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/proxyswitch/proxyswitch/ban"
)

// Leasing through the fallback (see fallback.go): the hooks lease.go and
// ban.go call, and the Lease methods of leases taken from the local shard.

// tryLease serves a lease attempt from the local shard when the Switch is
// not on the broker; done is false when the caller should lease from Redis.
func (f *fallback) tryLease(ctx context.Context, sw *Switch, site, scope, prefer string) (l *Lease, wait time.Duration, err error, done bool) {
	if f.cfg.sharded {
		f.pool(sw) // a pool first named by UsePools: read at the next probe
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	if err := f.ready(); err != nil {
		return nil, 0, err, true
	}
	switch Mode(f.mode.Load()) {
	case ModeBroker:
		return nil, 0, nil, false
	case ModeResuming:
		return nil, resumeWait, nil, true
	}
	fp := f.pools[sw.cfg.pool]
	if fp == nil {
		return nil, 0, fmt.Errorf("%w: no local share of pool %q: it was never read from Redis", ErrNoProxy, sw.cfg.pool), true
	}
	fp.mu.Lock()
	defer fp.mu.Unlock()
	if fp.local == nil {
		if f.cfg.sharded {
			select {
			case f.kick <- struct{}{}:
			default:
			}
			return nil, f.every, nil, true // its share comes with the next probe
		}
		return nil, 0, fmt.Errorf("%w: no local share of pool %q: it was never read from Redis", ErrNoProxy, sw.cfg.pool), true
	}
	ll, wait, _, err := fp.local.tryLease(site, prefer, sw.leaseTTL(ctx))
	if ll == nil {
		if err != nil && fp.shareErr != nil {
			err = fmt.Errorf("%w (%w)", err, fp.shareErr)
		}
		return nil, wait, err, true
	}
	l = &Lease{sw: sw, scope: ll.scope, site: site, proxy: ll.proxy, member: ll.proxy.id + ":" + strconv.Itoa(ll.slot),
		token: ll.token, local: ll}
	l.expiry.Store(ll.expiry.Load())
	fp.locals[l] = false
	return l, 0, nil, true
}

// leased records a lease taken from Redis; if the Switch went local
// meanwhile, its proxy is reserved in the local shard.
func (f *fallback) leased(l *Lease) {
	fp := f.pool(l.sw)
	f.mu.RLock()
	defer f.mu.RUnlock()
	fp.mu.Lock()
	defer fp.mu.Unlock()
	fp.redis[l] = struct{}{}
	if fp.local != nil {
		_ = fp.local.Reserve(l.proxy.id, l.site, l.Expiry())
	}
}

// release handles a lease the fallback knows: one from the local shard, or
// one from Redis while the Switch is off the broker (released in Redis on
// resume). handled is false when the caller should release in Redis.
func (f *fallback) release(ctx context.Context, l *Lease) (err error, handled bool) {
	fp := f.pool(l.sw)
	if l.local != nil {
		err = l.local.Release()
		fp.mu.Lock()
		adopted := fp.locals[l]
		delete(fp.locals, l)
		fp.mu.Unlock()
		if adopted {
			// Handed over to Redis on resume: its record there ends too.
			_, _ = l.sw.releaseMember(ctx, l.scope, l.member, l.token, "")
		}
		return err, true
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	fp.mu.Lock()
	defer fp.mu.Unlock()
	if Mode(f.mode.Load()) == ModeBroker {
		delete(fp.redis, l)
		return nil, false
	}
	fp.deferRelease(l)
	return nil, true
}

// deferRelease ends a Redis lease while the Switch is off the broker: its
// proxy is free in the local shard (after the cooldown) and the lease is
// released in Redis on resume. The caller holds fp.mu.
func (fp *fbPool) deferRelease(l *Lease) {
	delete(fp.redis, l)
	fp.deferred = append(fp.deferred, l)
	if fp.local != nil {
		fp.local.unreserve(l.proxy.id, l.scope)
	}
}

// released forgets a Redis lease ended in Redis (released or banned).
func (f *fallback) released(l *Lease) {
	fp := f.pool(l.sw)
	fp.mu.Lock()
	delete(fp.redis, l)
	fp.mu.Unlock()
}

// failedRelease handles a Redis release that failed: if Redis is out of
// reach the Switch goes local and the release is deferred.
func (f *fallback) failedRelease(ctx context.Context, l *Lease, err error) bool {
	if !f.trip(ctx, err) {
		return false
	}
	_, handled := f.release(ctx, l)
	return handled
}

// extend extends a lease from the local shard (and its record in Redis if
// it was handed over).
func (f *fallback) extend(ctx context.Context, l *Lease, ttl time.Duration) error {
	if err := l.local.Extend(ttl); err != nil {
		return err
	}
	l.expiry.Store(l.local.expiry.Load())
	fp := f.pool(l.sw)
	fp.mu.Lock()
	adopted := fp.locals[l]
	fp.mu.Unlock()
	if adopted {
		s := l.sw
		_, _ = roundTrip(ctx, s.callTimeout(), func(ctx context.Context) (int64, error) {
			return extendScript.Run(ctx, s.rdb, []string{s.keys.free(l.scope), s.keys.leases(l.scope)},
				l.member, l.token, ttl.Milliseconds()).Int64()
		}, nil)
	}
	return nil
}

// penalize quarantines p on site in the local shard when the Switch is off
// the broker or l came from the local shard. handled is false when the
// caller should quarantine in Redis.
func (f *fallback) penalize(sw *Switch, site string, p *Proxy, l *Lease, v ban.Verdict) (pen penalty, handled bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	fp := f.pools[sw.cfg.pool]
	if fp == nil {
		return penalty{}, false
	}
	fp.mu.Lock()
	defer fp.mu.Unlock()
	onBroker := Mode(f.mode.Load()) == ModeBroker
	if onBroker && (l == nil || l.local == nil || fp.locals[l]) {
		// On the broker, and a Redis lease or one handed over: Redis acts.
		if l != nil && l.local != nil {
			_ = l.local.Release()
			delete(fp.locals, l)
		}
		return penalty{}, false
	}
	lp := fp.local
	if lp == nil {
		if l == nil || l.local == nil {
			return penalty{}, false
		}
		lp = l.local.pool // back on the broker: a local lease from before
	}
	c := sw.cfg
	d, maxq := c.quarantine, c.maxQuarantine
	if v.Kind == ban.ProxyFailure {
		d, maxq = c.failQuarantine, c.maxFailQuarantine
	}
	d = max(d, min(v.RetryAfter, maxq))
	scope := sw.scopeOf(site)
	switch {
	case l != nil && l.local != nil && l.scope == scope && l.released.CompareAndSwap(false, true):
		_ = l.local.Ban(d)
		delete(fp.locals, l)
	case l != nil && l.local == nil && l.scope == scope && l.released.CompareAndSwap(false, true):
		fp.deferRelease(l)
		fallthrough
	default:
		_ = lp.Ban(p.id, site, d)
	}
	if c.banAllSites && v.Kind == ban.Ban {
		_ = lp.BanAllSites(p.id, d)
	}
	until := time.Now().Add(d)
	sw.cfg.logger.Debug("proxyswitch: proxy quarantined in the local shard", "proxy", p.String(), "site", site,
		"kind", v.Kind.String(), "reason", v.Reason, "for", d)
	return penalty{quarantine: d, until: until, strikes: 1}, true
}
