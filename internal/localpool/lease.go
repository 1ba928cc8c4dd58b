package localpool

import (
	"sync/atomic"
	"time"
)

// Lease is one proxy held from a Pool, exclusively for one site (or for
// all sites with Config.Global), until it is released, banned or its TTL
// runs out. Its methods are safe for concurrent use; Release is idempotent.
type Lease[P Item] struct {
	pool  *Pool[P]
	scope string
	proxy P
	slot  int
	token string // owner token: only this holder can release or extend

	expiry   atomic.Int64 // unix ms
	released atomic.Bool
}

// Proxy returns the leased proxy.
func (l *Lease[P]) Proxy() P { return l.proxy }

// Site returns the site the lease is exclusive for ("*" with Config.Global).
func (l *Lease[P]) Site() string { return l.scope }

// Slot returns the number of the proxy's slot the lease holds, 0..Slots-1.
func (l *Lease[P]) Slot() int { return l.slot }

// Token returns the lease's owner token, unique in the process.
func (l *Lease[P]) Token() string { return l.token }

// Pool returns the Pool the lease came from.
func (l *Lease[P]) Pool() *Pool[P] { return l.pool }

// Expiry returns when the lease runs out unless extended.
func (l *Lease[P]) Expiry() time.Time { return time.UnixMilli(l.expiry.Load()) }

// Released reports whether Release or Ban was called on the lease.
func (l *Lease[P]) Released() bool { return l.released.Load() }

// Release gives the proxy back, owner-checked: it is free again after the
// cooldown, unless a quarantine keeps it longer. A holder whose lease ran
// out and was taken by someone else gets ErrLeaseLost and changes nothing.
// Releasing twice, or a lease whose proxy left the share, is a no-op.
func (l *Lease[P]) Release() error { return l.release(false) }

// ReleaseHealthy is Release after a healthy answer through the lease: the
// proxy's run of strikes on the site ends and it counts as healthy there
// (Strike's evidence), and its failure rate decays (Config.FlakyDelay).
func (l *Lease[P]) ReleaseHealthy() error { return l.release(true) }

func (l *Lease[P]) release(healthy bool) error {
	if !l.released.CompareAndSwap(false, true) {
		return nil
	}
	p := l.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	st, s := p.slotLocked(l)
	if s == nil {
		return nil
	}
	if s.token != l.token {
		return l.lost("expired and leased again")
	}
	now := p.clock()
	expiry := s.expiry
	s.token, s.expiry = "", 0
	if free := now + p.cfg.Cooldown.Milliseconds() + p.outcomeLocked(l.scope, l.proxy.ID(), healthy, now); s.next == expiry || s.next < free {
		st.setNext(s, free, p.nextSeq())
	}
	p.signalLocked()
	return nil
}

// Extend pushes the lease's expiry to now + ttl; ttl <= 0 means the lease
// TTL. It fails with ErrLeaseLost once the lease has run out or been
// released: an expired holder can never extend the next holder's lease.
func (l *Lease[P]) Extend(ttl time.Duration) error {
	p := l.pool
	if ttl <= 0 {
		ttl = p.cfg.LeaseTTL
	}
	if l.released.Load() {
		return l.lost("already released")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock()
	st, s := p.slotLocked(l)
	if s == nil || s.token != l.token || s.expiry <= now {
		return l.lost("expired or taken over")
	}
	s.expiry = now + ttl.Milliseconds()
	if s.next < s.expiry {
		st.setNext(s, s.expiry, p.nextSeq())
	}
	l.expiry.Store(s.expiry)
	return nil
}

// Ban ends the lease and quarantines its proxy on its site for d, as
// Pool.Ban does. After the lease ended it still quarantines the proxy.
func (l *Lease[P]) Ban(d time.Duration) error {
	var holder *Lease[P]
	if l.released.CompareAndSwap(false, true) {
		holder = l
	}
	err := l.pool.ban(l.proxy.ID(), l.scope, d, holder)
	if err != nil && holder != nil {
		l.released.Store(false)
	}
	return err
}

func (l *Lease[P]) lost(why string) error {
	return &Error{Kind: ErrLeaseLost, Proxy: l.proxy.String(), Msg: "local lease on " + l.scope + " lost: " + why}
}
