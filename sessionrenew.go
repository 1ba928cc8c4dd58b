package proxyswitch

import (
	"context"
	"strings"
	"sync"
	"time"
)

// Renewing a session while one of its requests runs.
//
// A session holds its proxy until Sessions.TTL after its last use: each
// request pushes the hold (session_use.lua) when it starts, not while it
// runs. A request that runs longer than the TTL (a 2-second TTL, a slow
// page) would outlive its session's hold, and another task, or a request
// of no task, could lease the IP while it is still under way. So, as the
// renewer does for plain leases (renew.go), every session with a request
// under way in this process is renewed every tick (sessionTick: a quarter
// of the session TTL or of the lease TTL, whichever is shorter, counted
// from the last use of the session in this process, which renewed it too)
// (session_use.lua's "renew": every lease it holds and its record pushed to
// now + TTL, owner-checked, nothing counted), from the request's first
// attempt through its session until the request ends (its binding does:
// the hooks, the sweep, Close). Renewals stop at Close. One timer per
// session, however many of its requests run.
//
// A session that is no longer live or intact (a sibling request retired it
// for MaxRequests, MaxAge or a ban, here or in another process; EndSession
// ended it; it lapsed or was replaced) is not renewed. Each use, start and
// renewal wrote the record's h:<tag> field, now + requestHold (two ticks of
// the Switch tagged <tag>), and the session's end, whatever its reason,
// puts its proxy back no sooner than the latest of those (session_lib.lua's
// end_session; the ending Switch's own field aside when it has none of the
// session's requests under way): the next tick of a Switch with a request
// still under way comes first, finds the session over, and keeps the slots
// its requests go through out of rotation for another lease TTL
// (session_use.lua's afterlife), tick after tick until the last of them
// ends. A slot the afterlife finds another holder's (a tick later than the
// hold: a stalled process), or whose proxy left the pool, is lost: its
// requests fail with ErrLeaseLost when their attempt returns, as a plain
// lease's do (afterlifeLost).

// sessionHoldKey names a session of a pool.
type sessionHoldKey struct {
	p        *redisPool
	task, id string
}

// heldSlot is a slot a session's request goes through.
type heldSlot struct{ scope, member string }

// sessionHold is a session with requests under way in this process.
type sessionHold struct {
	n     int                         // its requests under way; guarded by sessionHolds.mu
	slots map[heldSlot]map[*Lease]int // the slots they go through, with their requests' leases; guarded too
	lost  map[heldSlot]bool           // slots the afterlife found lost: their requests fail; guarded too
	timer *time.Timer                 // the next renewal
}

// sessionTick is how often a session with requests under way is renewed:
// a quarter of the session TTL or of the lease TTL, whichever is shorter.
func sessionTick(c *config) time.Duration { return min(c.session.ttl, c.leaseTTL) / 4 }

// requestHold is how long a session's request keeps its proxy after the
// Switch's last use or renewal of the session (the record's h:<tag>
// field): two ticks, so that the next tick comes first even if late.
func requestHold(c *config) time.Duration { return 2 * sessionTick(c) }

// tag names this Switch in session records (h:<tag>).
func (s *Switch) tag() string { return strings.TrimSuffix(s.tokenPrefix, "-") }

// sessionBusy reports whether this Switch has requests under way of a
// session of task in pool p.
func (s *Switch) sessionBusy(p *redisPool, task string) bool {
	h := &s.sessHolds
	h.mu.Lock()
	defer h.mu.Unlock()
	for k, e := range h.m {
		if k.p == p && k.task == task && e.n > 0 {
			return true
		}
	}
	return false
}

// sessionHolds is the Switch's set of sessions with requests under way.
type sessionHolds struct {
	mu sync.Mutex
	m  map[sessionHoldKey]*sessionHold
}

// holdSession notes one request of session k under way through slot with
// lease l, its use having just found the session live, and returns the
// function that notes its end (once; later calls do nothing).
func (s *Switch) holdSession(k sessionHoldKey, slot heldSlot, l *Lease) func() {
	h := &s.sessHolds
	every := sessionTick(k.p.cfg)
	h.mu.Lock()
	e := h.m[k]
	if e == nil {
		if h.m == nil {
			h.m = make(map[sessionHoldKey]*sessionHold)
		}
		e = &sessionHold{slots: make(map[heldSlot]map[*Lease]int), lost: make(map[heldSlot]bool)}
		e.timer = time.AfterFunc(every, func() { s.renewSession(k, e, every) })
		h.m[k] = e
	} else {
		e.timer.Reset(every) // the use renewed the session: the next tick can wait
	}
	e.n++
	if e.slots[slot] == nil {
		e.slots[slot] = make(map[*Lease]int)
	}
	e.slots[slot][l]++
	h.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			if e.slots[slot][l]--; e.slots[slot][l] == 0 {
				delete(e.slots[slot], l)
				if len(e.slots[slot]) == 0 {
					delete(e.slots, slot)
				}
			}
			if e.n--; e.n == 0 {
				e.timer.Stop()
				if h.m[k] == e {
					delete(h.m, k)
				}
			}
		})
	}
}

// renewSession renews session k while e is its entry, or keeps its
// requests' slots out once it is over, then arms the next tick.
func (s *Switch) renewSession(k sessionHoldKey, e *sessionHold, every time.Duration) {
	h := &s.sessHolds
	var slots []any      // scope, member, ...: the slots of its requests under way
	var order []heldSlot // the same, in that order
	h.mu.Lock()
	if h.m[k] == e && e.n > 0 {
		for sl := range e.slots {
			if !e.lost[sl] {
				slots, order = append(slots, sl.scope, sl.member), append(order, sl)
			}
		}
	}
	h.mu.Unlock()
	if slots == nil {
		return
	}
	drop := func() {
		h.mu.Lock()
		if h.m[k] == e {
			delete(h.m, k)
		}
		h.mu.Unlock()
	}
	if s.renew.isClosed() {
		drop()
		return
	}
	res, err := k.p.runUseMode(context.Background(), k.task, globalSite, "renew", k.id, slots...)
	st, _ := intAt(res, 0)
	switch {
	case err != nil:
		// Redis unreachable or slow: the next tick tries again, within the TTL.
		s.cfg.logger.Warn("proxyswitch: renewing a session with a request under way failed", "task", k.task, "session", k.id, "err", err)
	case st == 7 && len(res) == 3+len(order):
		s.afterlifeLost(k, e, order, res[3:])
	case st != 4:
		s.cfg.logger.Warn("proxyswitch: renewing a session with a request under way: unexpected reply; renewed no more", "task", k.task, "session", k.id, "status", st)
		drop()
		return
	}
	h.mu.Lock()
	if h.m[k] == e && e.n > 0 {
		e.timer.Reset(every)
	}
	h.mu.Unlock()
}

// afterlifeLost marks the requests through the slots the afterlife found
// lost (flags: 1 for lost, in order's order) as taken over: each fails
// with ErrLeaseLost when its attempt returns, rather than pass for
// exclusive (transport.go), as a plain lease's request does.
func (s *Switch) afterlifeLost(k sessionHoldKey, e *sessionHold, order []heldSlot, flags []any) {
	h := &s.sessHolds
	h.mu.Lock()
	defer h.mu.Unlock()
	kept := 0
	for i, sl := range order {
		if f, _ := intAt(flags, i); f != 1 {
			kept++
			continue
		}
		e.lost[sl] = true
		for l := range e.slots[sl] {
			l.taken.Store(true)
		}
		s.cfg.logger.Warn("proxyswitch: a request of a session that is over still ran when another holder leased its proxy, "+
			"or the proxy left the pool; the request fails with ErrLeaseLost", "task", k.task, "session", k.id, "site", sl.scope)
	}
	if kept > 0 {
		s.cfg.logger.Debug("proxyswitch: a session with requests under way is over; its proxy is kept out until they end",
			"task", k.task, "session", k.id)
	}
}
