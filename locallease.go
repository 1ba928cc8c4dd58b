package proxyswitch

import (
	"sync/atomic"
	"time"
)

// localLease is one proxy held from a localPool, exclusively for one site
// (or for all sites with ScopeGlobal), until it is released, banned or its
// TTL runs out. Its methods are safe for concurrent use; Release is
// idempotent.
type localLease struct {
	pool  *localPool
	scope string
	proxy *Proxy
	slot  int
	token string // owner token: only this holder can release or extend

	expiry   atomic.Int64 // unix ms
	released atomic.Bool
}

// Proxy returns the leased proxy.
func (l *localLease) Proxy() *Proxy { return l.proxy }

// Site returns the site the lease is exclusive for ("*" with ScopeGlobal).
func (l *localLease) Site() string { return l.scope }

// Expiry returns when the lease runs out unless extended.
func (l *localLease) Expiry() time.Time { return time.UnixMilli(l.expiry.Load()) }

// Release gives the proxy back, owner-checked: it is free again after the
// cooldown, unless a quarantine keeps it longer. A holder whose lease ran
// out and was taken by someone else gets ErrLeaseLost and changes nothing.
// Releasing twice, or a lease whose proxy left the share, is a no-op.
func (l *localLease) Release() error {
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
	if free := now + p.cfg.cooldown.Milliseconds(); s.next == expiry || s.next < free {
		st.setNext(s, free, p.nextSeq())
	}
	p.signalLocked()
	return nil
}

// Extend pushes the lease's expiry to now + ttl; ttl <= 0 means the lease
// TTL. It fails with ErrLeaseLost once the lease has run out or been
// released: an expired holder can never extend the next holder's lease.
func (l *localLease) Extend(ttl time.Duration) error {
	p := l.pool
	if ttl <= 0 {
		ttl = p.cfg.leaseTTL
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
// localPool.Ban does. After the lease ended it still quarantines the proxy.
func (l *localLease) Ban(d time.Duration) error {
	var holder *localLease
	if l.released.CompareAndSwap(false, true) {
		holder = l
	}
	err := l.pool.ban(l.proxy.id, l.scope, d, holder)
	if err != nil && holder != nil {
		l.released.Store(false)
	}
	return err
}

func (l *localLease) lost(why string) error {
	return &ProxyError{Proxy: l.proxy.String(), Reason: "local lease on " + l.scope + " lost: " + why, Err: ErrLeaseLost}
}
