package proxyswitch

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/localpool"
)

// localPool is a pool's local shard, the in-memory lease engine the
// fallback leases from while Redis is unreachable; localLease is a lease
// from it.
type (
	localPool  = localpool.Pool[*Proxy]
	localLease = localpool.Lease[*Proxy]
)

// newLocalPool returns an empty local shard with the rules of cfg (a
// Switch's validated config).
func newLocalPool(cfg config) *localPool {
	return localpool.New[*Proxy](localpool.Config{
		Pool:     cfg.pool,
		Global:   cfg.scope == ScopeGlobal,
		Slots:    cfg.slots,
		Cooldown: cfg.cooldown,
		LeaseTTL: cfg.leaseTTL,
		MaxWait:  cfg.maxWait,
		IdleTTL:  cfg.idleTTL,

		Quarantine:      cfg.quarantine,
		MaxQuarantine:   cfg.maxQuarantine,
		FirstQuarantine: cfg.firstQuarantine,
		FlakyDelay:      cfg.flakyDelay,
	})
}

// localErr maps an error of the local shard (a *localpool.Error) to the
// package's own: ErrNoProxy, ErrEmptyPool with ErrNoProxy, ErrLeaseLost in
// a *ProxyError with the redacted proxy, ErrConfig. Others pass unchanged.
func localErr(err error) error {
	e, ok := err.(*localpool.Error)
	if !ok {
		return err
	}
	switch e.Kind {
	case localpool.ErrEmptyPool:
		return fmt.Errorf("%w: %w: %s", ErrNoProxy, ErrEmptyPool, e.Msg)
	case localpool.ErrNoProxy, localpool.ErrNoMatch:
		return fmt.Errorf("%w: %s", ErrNoProxy, e.Msg)
	case localpool.ErrLeaseLost:
		return &ProxyError{Proxy: e.Proxy, Reason: e.Msg, Err: ErrLeaseLost}
	case localpool.ErrInvalid:
		return fmt.Errorf("%w: %s", ErrConfig, e.Msg)
	}
	return err
}

// An fbPool is the backend of a pool with a fallback (see fallback.go): it
// leases from Redis (its redisPool) while the fallback is on the broker,
// and from the pool's local shard otherwise; leases of either kind are
// released, extended and quarantined where they came from, and a Redis call
// that finds Redis gone switches the fallback to the local shard at once.

func (fp *fbPool) pool() string      { return fp.rp.name }
func (fp *fbPool) redis() *redisPool { return fp.rp }

// errResuming is broker's error while the Switch resumes: a session
// request waits for the broker (waitBroker).
var errResuming = errors.New("sticky sessions need the central broker, and the Switch is resuming after a Redis outage (writing its state back and waiting for the other servers)")

// broker returns the Redis pool while the fallback is on the broker.
func (fp *fbPool) broker() (*redisPool, error) {
	switch leaseMode(fp.f.mode.Load()) {
	case modeBroker:
		return fp.rp, nil
	case modeResuming:
		return nil, fmt.Errorf("%w: %w", ErrNoProxy, errResuming)
	}
	// The session's state lives in Redis: no other place knows its IP.
	return nil, fmt.Errorf("%w: sticky sessions need the central broker, and the Switch leases from its local shard while Redis is unreachable", ErrNoProxy)
}

// waitBroker is be.broker for a session request: while the Switch resumes
// it waits, as plain requests do, until it is back on the broker, at most
// maxWait (and ctx); at the end of that wait it fails with ErrNoProxy
// saying so.
func waitBroker(ctx context.Context, be backend, maxWait time.Duration) (*redisPool, error) {
	start := time.Now()
	for {
		rp, err := be.broker()
		if !errors.Is(err, errResuming) {
			return rp, err
		}
		waited := time.Since(start)
		if waited >= maxWait {
			return nil, fmt.Errorf("%w (waited %v, MaxWait)", err, waited.Round(time.Millisecond))
		}
		t := time.NewTimer(min(resumeWait, maxWait-waited))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w (waited %v: %w)", err, time.Since(start).Round(time.Millisecond), ctx.Err())
		case <-t.C:
		}
	}
}

// tryLease leases from the local shard off the broker, else from Redis.
func (fp *fbPool) tryLease(ctx context.Context, site, scope, prefer string) (*Lease, time.Duration, error) {
	if l, wait, err, done := fp.tryLocal(ctx, site, prefer, nil); done {
		return l, wait, err
	}
	l, wait, err := fp.rp.tryLease(ctx, site, scope, prefer)
	if err != nil {
		if errors.Is(err, ErrRedis) && fp.f.trip(ctx, err) {
			return fp.tryLease(ctx, site, scope, prefer) // from the local shard now
		}
		return nil, 0, err
	}
	if l != nil {
		l.be = fp
		fp.leased(l)
	}
	return l, wait, nil
}

// release releases l where it came from; a Redis lease released off the
// broker is released in Redis on resume.
func (fp *fbPool) release(ctx context.Context, l *Lease) error {
	if err, handled := fp.releaseLocal(ctx, l); handled {
		return err
	}
	err := fp.rp.release(ctx, l)
	if errors.Is(err, ErrRedis) && fp.f.trip(ctx, err) {
		if _, handled := fp.releaseLocal(ctx, l); handled {
			return nil
		}
	}
	return err
}

// localReleases bounds the local leases releaseMany releases at once: one
// handed over to Redis on resume makes a Redis call of its own.
const localReleases = 64

// releaseMany releases ls, leases of this backend, each as release does
// (Close): the local shard's in memory (those handed over to Redis on
// resume end there too, all at once rather than one after another), the
// Redis leases in the pool's batched calls (redisPool.releaseMany), and a
// Redis lease whose release finds Redis gone is released locally once the
// fallback trips, as release does.
func (fp *fbPool) releaseMany(ctx context.Context, ls []*Lease) []error {
	errs := make([]error, len(ls))
	var wg sync.WaitGroup
	var inRedis []int
	sem := make(chan struct{}, localReleases) // a lease handed over to Redis makes a call of its own
	for i, l := range ls {
		if l.local != nil {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				errs[i], _ = fp.releaseLocal(ctx, l)
			}()
			continue
		}
		if err, handled := fp.releaseLocal(ctx, l); handled {
			errs[i] = err
			continue
		}
		inRedis = append(inRedis, i)
	}
	if len(inRedis) > 0 {
		rls := make([]*Lease, len(inRedis))
		for j, i := range inRedis {
			rls[j] = ls[i]
		}
		for j, err := range fp.rp.releaseMany(ctx, rls) {
			if errors.Is(err, ErrRedis) && fp.f.trip(ctx, err) {
				if _, handled := fp.releaseLocal(ctx, rls[j]); handled {
					err = nil
				}
			}
			errs[inRedis[j]] = err
		}
	}
	wg.Wait()
	return errs
}

// penalize quarantines in the local shard off the broker or for a local
// lease, else in Redis.
func (fp *fbPool) penalize(ctx context.Context, site string, p *Proxy, l *Lease, v ban.Verdict) (penalty, error) {
	if pen, done := fp.penalizeHandedOver(ctx, site, p, l, v); done {
		return pen, nil
	}
	if pen, done := fp.penalizeLocal(site, p, l, v); done {
		return pen, nil
	}
	pen, err := fp.rp.penalize(ctx, site, p, l, v)
	if pen.ended {
		fp.released(l)
	}
	if errors.Is(err, ErrRedis) && fp.f.trip(ctx, err) {
		if pen, done := fp.penalizeLocal(site, p, l, v); done {
			return pen, nil
		}
	}
	return pen, err
}

// penalizeHandedOver quarantines in Redis the proxy of a lease whose
// request ends while the Switch resumes, a local one the write-back handed
// over to Redis (it waits for the write-back, at most the member TTL) or a
// Redis one from before the outage: the local shard is dropped once the
// Switch is back on the broker, so the ban must reach Redis and end the
// lease's record there (owner-checked). The local shard keeps the
// quarantine too, in case Redis fails again. done is false when the caller
// should go on as before: not resuming, a local lease not handed over, or
// Redis failed.
func (fp *fbPool) penalizeHandedOver(ctx context.Context, site string, p *Proxy, l *Lease, v ban.Verdict) (pen penalty, done bool) {
	if l == nil {
		return penalty{}, false
	}
	f := fp.f
	deadline := time.Now().Add(f.memberCfg.ttl)
	for {
		f.mu.RLock()
		mode, written := leaseMode(f.mode.Load()), f.written
		f.mu.RUnlock()
		if mode != modeResuming {
			return penalty{}, false // local: the local shard; broker: penalizeLocal hands it to Redis
		}
		if written {
			break
		}
		if time.Now().After(deadline) {
			return penalty{}, false
		}
		select {
		case <-ctx.Done():
			return penalty{}, false
		case <-time.After(resumeWait):
		}
	}
	fp.mu.Lock()
	adopted := fp.locals[l]
	fp.mu.Unlock()
	if l.local != nil && !adopted {
		return penalty{}, false
	}
	// A handed-over local lease, or a Redis lease from before the outage:
	// its record is in Redis.
	pen, err := fp.rp.penalize(ctx, site, p, l, v)
	if err != nil {
		f.s.cfg.logger.Debug("proxyswitch: quarantining a lease in Redis while resuming failed; in the local shard instead", "proxy", p.String(), "err", err)
		return penalty{}, false
	}
	fp.mu.Lock()
	lp := fp.local
	if l.local != nil {
		delete(fp.locals, l)
	} else {
		delete(fp.fromRedis, l)
		if lp != nil {
			lp.Unreserve(l.proxy.id, l.scope)
		}
	}
	fp.mu.Unlock()
	if l.local != nil {
		l.released.Store(true)
		_ = l.local.Release()
	}
	if lp != nil && pen.quarantine > 0 {
		_ = lp.Ban(p.id, site, pen.quarantine)
	}
	return pen, true
}

// tryLocal serves a lease attempt from the local shard when the fallback
// is not on the broker; done is false when the caller should lease from
// Redis. With match (the selection by label, labels.go), it leases only a
// proxy of the share that match accepts (prefer only if it does), and
// fails with an error wrapping localpool.ErrNoMatch when none does.
func (fp *fbPool) tryLocal(ctx context.Context, site, prefer string, match func(*Proxy) bool) (l *Lease, wait time.Duration, err error, done bool) {
	f := fp.f
	f.mu.RLock()
	defer f.mu.RUnlock()
	if err := f.ready(); err != nil {
		return nil, 0, err, true
	}
	switch leaseMode(f.mode.Load()) {
	case modeBroker:
		return nil, 0, nil, false
	case modeResuming:
		return nil, resumeWait, nil, true
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
		return nil, 0, fmt.Errorf("%w: no local share of pool %q: it was never read from Redis", ErrNoProxy, fp.rp.name), true
	}
	if wait, paused := fp.rp.sw.brk.stillPaused(site); paused {
		return nil, wait, nil, true // the site's breaker as last known: no lease (acquire names the pause)
	}
	var ll *localLease
	if match != nil {
		ll, wait, err = fp.local.TryLeaseWhere(site, prefer, match, fp.rp.cfg.leaseTTL)
		if errors.Is(err, localpool.ErrNoMatch) {
			return nil, 0, fmt.Errorf("%w: %w", localErr(err), localpool.ErrNoMatch), true
		}
	} else {
		ll, wait, err = fp.local.TryLease(site, prefer, fp.rp.cfg.leaseTTL)
	}
	if ll == nil {
		err = localErr(err)
		if err != nil && fp.shareErr != nil {
			err = fmt.Errorf("%w (%w)", err, fp.shareErr)
		}
		return nil, wait, err, true
	}
	px := ll.Proxy()
	l = &Lease{sw: fp.rp.sw, be: fp, scope: ll.Site(), site: site, proxy: px, member: px.id + ":" + strconv.Itoa(ll.Slot()),
		token: ll.Token(), local: ll, granted: time.Now()}
	l.expiry.Store(ll.Expiry().UnixMilli())
	fp.locals[l] = false
	return l, 0, nil, true
}

// leased records a lease taken from Redis; if the Switch went local
// meanwhile, its proxy is reserved in the local shard.
func (fp *fbPool) leased(l *Lease) {
	f := fp.f
	f.mu.RLock()
	defer f.mu.RUnlock()
	fp.mu.Lock()
	defer fp.mu.Unlock()
	fp.fromRedis[l] = struct{}{}
	if fp.local != nil {
		_ = fp.local.Reserve(l.proxy.id, l.site, l.Expiry())
	}
}

// releaseLocal handles a lease the fallback knows: one from the local
// shard, or one from Redis while the Switch is off the broker (released in
// Redis on resume). handled is false when the caller should release in
// Redis.
func (fp *fbPool) releaseLocal(ctx context.Context, l *Lease) (err error, handled bool) {
	f := fp.f
	if l.local != nil {
		if l.healthy.Load() {
			err = localErr(l.local.ReleaseHealthy()) // the proxy is healthy on the site (its strikes end)
		} else {
			err = localErr(l.local.Release())
		}
		fp.mu.Lock()
		adopted := fp.locals[l]
		delete(fp.locals, l)
		fp.mu.Unlock()
		if adopted {
			// Handed over to Redis on resume: its record there ends too.
			_, _ = fp.rp.releaseMember(ctx, l.scope, l.member, l.token, "")
		}
		return err, true
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	fp.mu.Lock()
	defer fp.mu.Unlock()
	if leaseMode(f.mode.Load()) == modeBroker {
		delete(fp.fromRedis, l)
		return nil, false
	}
	fp.deferRelease(l)
	return nil, true
}

// deferRelease ends a Redis lease while the Switch is off the broker: its
// proxy is free in the local shard (after the cooldown) and the lease is
// released in Redis on resume. The caller holds fp.mu.
func (fp *fbPool) deferRelease(l *Lease) {
	delete(fp.fromRedis, l)
	fp.deferred = append(fp.deferred, l)
	if fp.local != nil {
		fp.local.Unreserve(l.proxy.id, l.scope)
	}
}

// released forgets a Redis lease ended in Redis (released or banned).
func (fp *fbPool) released(l *Lease) {
	fp.mu.Lock()
	delete(fp.fromRedis, l)
	fp.mu.Unlock()
}

// extend extends a lease from the local shard (and its record in Redis if
// it was handed over), or a Redis lease in Redis.
func (fp *fbPool) extend(ctx context.Context, l *Lease, ttl time.Duration) error {
	if l.local == nil {
		return fp.rp.extend(ctx, l, ttl)
	}
	if err := l.local.Extend(ttl); err != nil {
		return localErr(err)
	}
	l.expiry.Store(l.local.Expiry().UnixMilli())
	fp.mu.Lock()
	adopted := fp.locals[l]
	fp.mu.Unlock()
	if adopted {
		_, _ = fp.rp.extendMember(ctx, l, ttl)
	}
	return nil
}

// penalizeLocal quarantines p on site in the local shard when the Switch
// is off the broker or l came from the local shard. handled is false when
// the caller should quarantine in Redis.
func (fp *fbPool) penalizeLocal(site string, p *Proxy, l *Lease, v ban.Verdict) (pen penalty, handled bool) {
	f := fp.f
	f.mu.RLock()
	defer f.mu.RUnlock()
	fp.mu.Lock()
	defer fp.mu.Unlock()
	onBroker := leaseMode(f.mode.Load()) == modeBroker
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
		lp = l.local.Pool() // back on the broker: a local lease from before
	}
	c := fp.rp.cfg
	scope := fp.rp.sw.scopeOf(site)
	var holder *localLease // the local lease the quarantine ends
	switch {
	case l != nil && l.local != nil && l.scope == scope && l.released.CompareAndSwap(false, true):
		holder = l.local
		delete(fp.locals, l)
	case l != nil && l.local == nil && l.scope == scope && l.released.CompareAndSwap(false, true):
		fp.deferRelease(l)
	}
	if v.Kind == ban.Ban {
		// A strike, weighed by the evidence as penalize.lua weighs it.
		lpen := localStrike(lp, holder, p.id, site, (unambiguous(v) && !challengeStrike(l)) || siteOnly(v), min(v.RetryAfter, c.maxQuarantine))
		pen = penalty{quarantine: lpen.Quarantine, until: lpen.Until, strikes: lpen.InARow, first: lpen.First,
			healthy: lpen.Healthy, local: lp,
			// The local shard keeps no site verdicts (penalize.lua's "burnt"):
			// healthy there is a witness of a page refusing everyone.
			witness: lpen.Healthy, at: time.Now()}
	} else {
		d := max(c.failQuarantine, min(v.RetryAfter, c.maxFailQuarantine))
		if holder != nil {
			_ = holder.Ban(d)
		} else {
			_ = lp.Ban(p.id, site, d)
		}
		lp.Failed(p.id, site)
		pen = penalty{quarantine: d, until: time.Now().Add(d), strikes: 1}
	}
	pen.ended = true
	if banAll(c, v) {
		_ = lp.BanAllSites(p.id, pen.quarantine)
	}
	c.logger.Debug("proxyswitch: proxy quarantined in the local shard", "proxy", p.String(), "site", site,
		"kind", v.Kind.String(), "reason", v.Reason, "for", pen.quarantine, "first_strike", pen.first)
	return pen, true
}

// localStrike strikes proxy id on site in the local shard lp, ending the
// local lease holder with it when there is one.
func localStrike(lp *localPool, holder *localLease, id, site string, certain bool, minimum time.Duration) localpool.Penalty {
	jitter := 850 + rand.N(301)
	if holder != nil {
		return holder.Strike(certain, minimum, jitter)
	}
	pen, _ := lp.Strike(id, site, certain, minimum, jitter) // id and site are never empty here
	return pen
}
