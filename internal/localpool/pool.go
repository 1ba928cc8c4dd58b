// Package localpool is an in-memory lease engine for one process, with the
// rules of the Redis pool: proxies exclusive per site (or overall) with K
// slots, a cooldown between uses, the least recently used first, leases
// that end by themselves, owner tokens and quarantines that end by
// themselves. The root package leases from it while Redis is unreachable
// (its fallback); it knows proxies only by their ID and String.
package localpool

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Item is what a Pool hands out: a proxy (a pointer, whose nil is its zero
// value) with a stable ID, and a String that carries no secret (it goes
// into errors).
type Item interface {
	comparable
	ID() string
	String() string
}

// Config is the rules of a Pool, the Switch's own: the root fills it from
// its options.
type Config struct {
	Pool     string        // the pool's name, for errors
	Global   bool          // one scope ("*") for every site (ScopeGlobal)
	Slots    int           // concurrent leases of one proxy per scope (Rotation.Concurrency), at least 1
	Cooldown time.Duration // pause of a slot between two leases (Rotation.Cooldown)
	LeaseTTL time.Duration // lease time when none is given (Timeouts.LeaseTTL)
	MaxWait  time.Duration // longest wait of Lease (Timeouts.MaxWait)
	IdleTTL  time.Duration // a site nobody leased for that long is forgotten (Timeouts.IdleTTL)

	// The evidence rules of Strike (evidence.go), the Switch's
	// Bans.Quarantine, Bans.EvidenceFirst and Rotation.FlakyDelay.
	Quarantine, MaxQuarantine time.Duration // a ban's base quarantine, doubling per repeat, and its cap
	FirstQuarantine           time.Duration // a first, unconfirmed strike's; 0: every ban is a verdict
	FlakyDelay                time.Duration // a proxy waits its failure rate times this on top of the cooldown; 0: off
}

// Change is what SetProxies did to the share.
type Change struct {
	Added   int // proxies that were not in the share before
	Removed int // proxies taken out of the share
	Size    int // proxies in the share afterwards
}

// Stats is a snapshot of the share as one site sees it (see Pool.Stats).
type Stats struct {
	Proxies      int // proxies in the share
	FreeSlots    int // slots free right now
	Leased       int // live leases
	BusySlots    int // slots not free: leased, cooling down or quarantined
	LeaseRecords int // lease records, live or expired but not yet reclaimed
}

// GlobalSite is the scope of every lease with Config.Global.
const GlobalSite = "*"

// Pool is an in-memory lease engine for one process, with the rules of
// the Redis pool: a proxy is exclusive per site (or overall, Config.Global)
// with Config.Slots slots, Config.Cooldown between uses, the least recently
// used proxy first, leases that end by themselves after their TTL, owner
// tokens (a holder whose lease ran out can neither release nor extend the
// next holder's), and quarantines per proxy and site that end by themselves.
//
// It is what a server leases from while Redis is unreachable, over its own
// share of the pool (shard.Share over the last known member list): shares
// do not overlap, so servers leasing locally still never use one IP at once.
// It keeps the bans it learns (Bans) for writing back to Redis later.
//
// A Pool is safe for concurrent use by multiple goroutines. Its
// guarantees hold within one process only. It starts no goroutine and holds
// no resource: it needs no Close.
type Pool[P Item] struct {
	cfg         Config
	tokenPrefix string
	tokenSeq    atomic.Uint64
	clock       func() int64 // unix ms, never going back; tests replace it

	mu        sync.Mutex
	proxies   map[string]P // the share, by ID
	ids       []string     // the share's IDs, in the order given
	sites     map[string]*scopeState
	bans      map[banKey]int64   // (scope, ID) -> end, unix ms; scope "" = every site
	reserved  map[banKey]int64   // (scope, ID) -> end of a lease taken elsewhere (Reserve)
	strikes   map[banKey]strike  // (scope, ID) -> its run of bans there (evidence.go)
	health    map[banKey]float64 // (scope, ID) -> its recent failure rate there (evidence.go)
	holdUntil int64              // no lease of any proxy before this (Hold)
	lastSweep int64
	seq       uint64        // change counter: LRU order among equal times
	changed   chan struct{} // closed (and replaced) when a slot frees early
}

type banKey struct{ scope, id string }

// sweepEvery is how often, at most, a Pool forgets idle sites and ended
// bans.
const sweepEvery = time.Second

// New returns an empty Pool that follows cfg; Slots below 1 count as 1.
func New[P Item](cfg Config) *Pool[P] {
	cfg.Slots = max(cfg.Slots, 1)
	var b [6]byte
	_, _ = rand.Read(b[:])
	epoch := time.Now()
	return &Pool[P]{
		cfg:         cfg,
		tokenPrefix: "L" + hex.EncodeToString(b[:]) + "-",
		clock:       func() int64 { return epoch.UnixMilli() + time.Since(epoch).Milliseconds() },
		proxies:     map[string]P{},
		sites:       map[string]*scopeState{},
		bans:        map[banKey]int64{},
		reserved:    map[banKey]int64{},
		strikes:     map[banKey]strike{},
		health:      map[banKey]float64{},
		changed:     make(chan struct{}),
	}
}

// SetProxies makes ps the pool's share, as a Switch's Replace does for the
// Redis pool: proxies kept keep their state (leases, cooldowns,
// quarantines), added ones are free at once (unless held or banned),
// removed ones are never handed out again, and a lease on one of them ends
// quietly (its Release returns nil). Duplicates are ignored; a nil (zero)
// proxy rejects the whole call (ErrInvalid) and changes nothing.
func (p *Pool[P]) SetProxies(ps []P) (Change, error) {
	next := make(map[string]P, len(ps))
	ids := make([]string, 0, len(ps))
	var zero P
	for i, px := range ps {
		if px == zero {
			return Change{}, fail(ErrInvalid, fmt.Sprintf("nil proxy #%d", i+1))
		}
		id := px.ID()
		if _, dup := next[id]; !dup {
			next[id] = px
			ids = append(ids, id)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock()
	var ch Change
	for _, id := range p.ids {
		if _, keep := next[id]; !keep {
			ch.Removed++
			for _, st := range p.sites {
				st.remove(id)
			}
		}
	}
	for _, id := range ids {
		if _, had := p.proxies[id]; !had {
			ch.Added++
			for scope, st := range p.sites {
				st.add(id, p.cfg.Slots, p.startLocked(scope, id, now), p.nextSeq)
			}
		}
	}
	p.proxies, p.ids = next, ids
	ch.Size = len(ids)
	p.signalLocked()
	return ch, nil
}

// Len returns the number of proxies in the share.
func (p *Pool[P]) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ids)
}

// TryLease leases the least recently used free proxy for site without
// waiting, preferring the proxy with ID prefer when it is free (a redirect
// chain or a session keeping its IP; "" for none). ttl <= 0 means the lease
// TTL. With every proxy busy it returns no lease, no error and how long
// until the next one frees; with an empty share, an error wrapping
// ErrNoProxy and ErrEmptyPool.
func (p *Pool[P]) TryLease(site, prefer string, ttl time.Duration) (*Lease[P], time.Duration, error) {
	l, wait, _, err := p.tryLease(site, prefer, ttl, nil)
	return l, wait, err
}

// TryLeaseWhere is TryLease over the proxies of the share for which match
// returns true, and never another (the root's selection by label): prefer
// if it matches and is free, else the least recently used of them that is
// free, else the wait until the first of them frees. With none in the
// share it fails with ErrNoMatch (and ErrNoProxy). match is called under
// the Pool's lock: it must not call the Pool. It costs a scan of the
// site's slots.
func (p *Pool[P]) TryLeaseWhere(site, prefer string, match func(P) bool, ttl time.Duration) (*Lease[P], time.Duration, error) {
	if match == nil {
		return nil, 0, fail(ErrInvalid, "TryLeaseWhere without a filter")
	}
	l, wait, _, err := p.tryLease(site, prefer, ttl, match)
	return l, wait, err
}

func (p *Pool[P]) tryLease(site, prefer string, ttl time.Duration, match func(P) bool) (*Lease[P], time.Duration, <-chan struct{}, error) {
	if site == "" {
		return nil, 0, nil, fail(ErrNoProxy, "empty site")
	}
	if ttl <= 0 {
		ttl = p.cfg.LeaseTTL
	}
	scope := p.scopeOf(site)
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock()
	p.sweepLocked(now)
	if len(p.ids) == 0 {
		return nil, 0, nil, fail(ErrEmptyPool, fmt.Sprintf("the local share of pool %q has no proxies", p.cfg.Pool))
	}
	st := p.siteLocked(scope, now)
	st.lastUse = now
	var slot *slotState
	if px, ok := p.proxies[prefer]; ok && match != nil && !match(px) {
		prefer = "" // never a proxy the filter refuses
	}
	for _, s := range st.slots[prefer] {
		if s.next <= now {
			slot = s
			break
		}
	}
	if slot == nil && match != nil {
		for _, s := range st.free {
			if (slot == nil || st.free.lessSlots(s, slot)) && match(p.proxies[s.id]) {
				slot = s
			}
		}
		if slot == nil {
			return nil, 0, nil, fail(ErrNoMatch, fmt.Sprintf("no proxy of the local share of pool %q (%d) matches", p.cfg.Pool, len(p.ids)))
		}
		if slot.next > now {
			return nil, time.Duration(slot.next-now) * time.Millisecond, p.changed, nil
		}
	}
	if slot == nil {
		slot = st.free[0]
		if slot.next > now {
			return nil, time.Duration(slot.next-now) * time.Millisecond, p.changed, nil
		}
	}
	token := p.tokenPrefix + strconv.FormatUint(p.tokenSeq.Add(1), 36)
	slot.token, slot.expiry = token, now+ttl.Milliseconds()
	st.setNext(slot, slot.expiry, p.nextSeq())
	if p.cfg.Cooldown > 0 && p.cfg.Slots > 1 {
		// Pacing with K > 1: no other slot of this proxy starts before the cooldown.
		for _, s := range st.slots[slot.id] {
			if s != slot && s.next < now+p.cfg.Cooldown.Milliseconds() {
				st.setNext(s, now+p.cfg.Cooldown.Milliseconds(), p.nextSeq())
			}
		}
	}
	l := &Lease[P]{pool: p, scope: scope, proxy: p.proxies[slot.id], slot: slot.n, token: token}
	l.expiry.Store(slot.expiry)
	return l, 0, nil, nil
}

// Lease waits for a free proxy for site and leases it for the lease TTL. It
// waits at most the max wait, or until ctx ends, and then fails with an
// error wrapping ErrNoProxy (and ctx's error). A release wakes a waiter at
// once.
func (p *Pool[P]) Lease(ctx context.Context, site string) (*Lease[P], error) {
	deadline := time.Now().Add(p.cfg.MaxWait)
	for {
		l, wait, changed, err := p.tryLease(site, "", 0, nil)
		if l != nil || err != nil {
			return l, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, fail(ErrNoProxy, fmt.Sprintf("every proxy of the local share stayed busy for site %s for %v", site, p.cfg.MaxWait))
		}
		t := time.NewTimer(min(wait, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, errors.Join(fail(ErrNoProxy, "gave up waiting for site "+site), ctx.Err())
		case <-changed:
			t.Stop()
		case <-t.C:
		}
	}
}

// Ban quarantines the proxy with ID id on site for d: no lease of it for
// that site before d has passed (leases for other sites go on). A ban never
// shortens a longer one. It is recorded for Bans even if the proxy is not in
// the share. It fails with ErrInvalid on an empty ID or site or d <= 0.
func (p *Pool[P]) Ban(id, site string, d time.Duration) error {
	if site == "" {
		return fail(ErrInvalid, "ban without a site")
	}
	return p.ban(id, p.scopeOf(site), d, nil)
}

// BanAllSites quarantines the proxy with ID id on every site for d, as Ban
// does for one.
func (p *Pool[P]) BanAllSites(id string, d time.Duration) error {
	return p.ban(id, "", d, nil)
}

// ban records and applies a quarantine; scope "" means every site. If l is
// a live lease of the proxy on that scope, its lease record ends with it.
func (p *Pool[P]) ban(id, scope string, d time.Duration, l *Lease[P]) error {
	if id == "" || d <= 0 {
		return fail(ErrInvalid, fmt.Sprintf("ban of proxy %q for %v: want an ID and a positive duration", id, d))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.banLocked(id, scope, p.clock()+d.Milliseconds(), l)
	return nil
}

// banLocked applies a quarantine until the given time (unix ms, the
// pool's clock); p.mu is held.
func (p *Pool[P]) banLocked(id, scope string, until int64, l *Lease[P]) {
	now := p.clock()
	k := banKey{scope, id}
	p.bans[k] = max(p.bans[k], until)
	if l != nil {
		// The lease ends now: its slot is free when the longest ban on it ends,
		// not when the lease would have.
		if st, s := p.slotLocked(l); s != nil && s.token == l.token {
			s.token, s.expiry = "", 0
			st.setNext(s, p.startLocked(l.scope, id, now), p.nextSeq())
		}
	}
	for sc, st := range p.sites {
		if scope == "" || scope == sc {
			st.raise(id, until, p.nextSeq) // other holders keep their leases
		}
	}
}

// Ban is a quarantine a Pool learnt, to be written back to Redis
// when it is reachable again.
type Ban struct {
	ProxyID string
	Site    string    // the scope banned on ("*" with Config.Global); "" for every site
	Until   time.Time // the end, by this process's clock: write back time.Until(Until)
	// Strikes is the run of strikes in a row on Site that the quarantine
	// is part of (Strike, Lease.Strike), 0 for a ban with no strike
	// running (Ban, BanAllSites, a proxy failure's).
	Strikes int
}

// Bans returns the quarantines recorded by Ban, BanAllSites and
// Lease.Ban that have not ended yet, ordered by site then proxy ID.
func (p *Pool[P]) Bans() []Ban {
	p.mu.Lock()
	defer p.mu.Unlock()
	now, wall := p.clock(), time.Now()
	out := make([]Ban, 0, len(p.bans))
	for k, until := range p.bans {
		if until > now {
			b := Ban{ProxyID: k.id, Site: k.scope, Until: wall.Add(time.Duration(until-now) * time.Millisecond)}
			if s, ok := p.strikes[k]; ok && s.n > 0 && s.till > now {
				b.Strikes = s.n
			}
			out = append(out, b)
		}
	}
	slices.SortFunc(out, func(a, b Ban) int {
		if c := strings.Compare(a.Site, b.Site); c != 0 {
			return c
		}
		return strings.Compare(a.ProxyID, b.ProxyID)
	})
	return out
}

// Reserve keeps the proxy with ID id busy on site until the given time,
// without counting it as a ban (Bans does not list it): for a lease taken
// elsewhere that may still be in use. A server that falls back from Redis
// reserves the proxies of its own Redis leases still running, so that its
// local leases do not hand them out a second time. It fails with ErrInvalid
// on an empty ID or site; a time already past does nothing.
func (p *Pool[P]) Reserve(id, site string, until time.Time) error {
	if id == "" || site == "" {
		return fail(ErrInvalid, fmt.Sprintf("reserve of proxy %q on site %q: want an ID and a site", id, site))
	}
	p.reserve(id, p.scopeOf(site), until)
	return nil
}

// reserve records a reservation of the proxy with ID id on scope ("" for
// every site) until the given time, and applies it; a time already past
// does nothing.
func (p *Pool[P]) reserve(id, scope string, until time.Time) {
	d := time.Until(until)
	if d <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	end := p.clock() + d.Milliseconds()
	k := banKey{scope, id}
	p.reserved[k] = max(p.reserved[k], end)
	if scope != "" {
		if st := p.sites[scope]; st != nil {
			st.raise(id, end, p.nextSeq)
		}
		return
	}
	for _, st := range p.sites {
		st.raise(id, end, p.nextSeq)
	}
}

// Hold makes every proxy of the share, on every site, wait at least d from
// now before its next lease, including proxies and sites that come later.
// A server that falls back from Redis calls it with the longest time a
// lease taken from Redis by another server may still be in use, so that
// such a lease on a proxy of this share ends before the proxy is used here.
func (p *Pool[P]) Hold(d time.Duration) {
	if d <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holdUntil = max(p.holdUntil, p.clock()+d.Milliseconds())
	for _, st := range p.sites {
		for _, id := range p.ids {
			st.raise(id, p.holdUntil, p.nextSeq)
		}
	}
}

// Stats returns a snapshot of the share as site sees it, with the meaning
// Switch.Stats gives each field.
func (p *Pool[P]) Stats(site string) Stats {
	scope := p.scopeOf(site)
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock()
	st := Stats{Proxies: len(p.ids)}
	s, ok := p.sites[scope]
	if !ok {
		for _, id := range p.ids {
			if p.startLocked(scope, id, now) <= now {
				st.FreeSlots += p.cfg.Slots
			}
		}
		st.BusySlots = len(p.ids)*p.cfg.Slots - st.FreeSlots
		return st
	}
	for _, sl := range s.free {
		if sl.next <= now {
			st.FreeSlots++
		} else {
			st.BusySlots++
		}
		if sl.token != "" {
			st.LeaseRecords++
			if sl.live(now) {
				st.Leased++
			}
		}
	}
	return st
}

func (p *Pool[P]) scopeOf(site string) string {
	if p.cfg.Global {
		return GlobalSite
	}
	return site
}

func (p *Pool[P]) nextSeq() uint64 {
	p.seq++
	return p.seq
}

// signalLocked wakes the waiters of Lease.
func (p *Pool[P]) signalLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// startLocked is when a proxy new to a scope is first free: now, or later
// if it is held, reserved or banned there.
func (p *Pool[P]) startLocked(scope, id string, now int64) int64 {
	k := banKey{scope, id}
	return max(now, p.holdUntil, p.bans[k], p.bans[banKey{"", id}], p.reserved[k], p.reserved[banKey{"", id}])
}

// ReserveAll keeps the proxy with ID id busy on every site until the given
// time, without counting it as a ban: a proxy that joins the share while its
// former owner may still use it (sharding).
func (p *Pool[P]) ReserveAll(id string, until time.Time) {
	if id != "" {
		p.reserve(id, "", until)
	}
}

// Unreserve ends a reservation made by Reserve for the proxy with ID id on
// scope (its lease elsewhere was released): the proxy is free there after
// the cooldown, unless a ban, a hold or another reservation keeps it longer.
func (p *Pool[P]) Unreserve(id, scope string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := banKey{scope, id}
	if _, ok := p.reserved[k]; !ok {
		return
	}
	delete(p.reserved, k)
	st := p.sites[scope]
	if st == nil {
		return
	}
	now := p.clock()
	next := max(p.startLocked(scope, id, now), now+p.cfg.Cooldown.Milliseconds())
	for _, s := range st.slots[id] {
		if !s.live(now) && s.next > next {
			st.setNext(s, next, p.nextSeq())
		}
	}
	p.signalLocked()
}

// siteLocked returns the state of scope, building it on its first lease:
// every proxy of the share free, in the order given, unless held or banned.
func (p *Pool[P]) siteLocked(scope string, now int64) *scopeState {
	st := p.sites[scope]
	if st == nil {
		st = &scopeState{slots: make(map[string][]*slotState, len(p.ids)), free: make(slotHeap, 0, len(p.ids)*p.cfg.Slots)}
		for _, id := range p.ids {
			st.add(id, p.cfg.Slots, p.startLocked(scope, id, now), p.nextSeq)
		}
		p.sites[scope] = st
	}
	return st
}

// slotLocked finds the site and slot of lease l; nil if its proxy or its
// site is gone.
func (p *Pool[P]) slotLocked(l *Lease[P]) (*scopeState, *slotState) {
	st := p.sites[l.scope]
	if st == nil {
		return nil, nil
	}
	ss := st.slots[l.proxy.ID()]
	if l.slot >= len(ss) {
		return nil, nil
	}
	return st, ss[l.slot]
}

// sweepLocked, at most once per sweepEvery, forgets ended bans and
// reservations, and the sites nobody leased for the idle TTL that hold no
// live lease.
func (p *Pool[P]) sweepLocked(now int64) {
	if now-p.lastSweep < sweepEvery.Milliseconds() {
		return
	}
	p.lastSweep = now
	for _, m := range []map[banKey]int64{p.bans, p.reserved} {
		for k, until := range m {
			if until <= now {
				delete(m, k)
			}
		}
	}
	p.sweepEvidenceLocked(now)
	for scope, st := range p.sites {
		if now-st.lastUse < p.cfg.IdleTTL.Milliseconds() {
			continue
		}
		if !slices.ContainsFunc(st.free, func(s *slotState) bool { return s.live(now) || s.next > now }) {
			delete(p.sites, scope)
			p.forgetScopeLocked(scope)
		}
	}
}
