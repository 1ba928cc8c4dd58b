package proxyswitch

import (
	"context"
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
// under way in this process is renewed every quarter of the session TTL
// (session_use.lua's "renew": every lease it holds and its record pushed to
// now + TTL, owner-checked, nothing counted), from the request's first
// attempt through its session until the request ends (its binding does:
// the hooks, the sweep, Close). Renewals stop at Close. One timer per
// session, however many of its requests run.
//
// A session that is no longer live or intact (a sibling request retired it
// for MaxRequests, MaxAge or a ban, here or in another process; it was
// ended or replaced) is not renewed: its end put its proxy back after the
// lease TTL, for the requests still under way (session_lib.lua's
// end_session), and a request may run longer. So the same tick keeps the
// slots this process's requests of it go through out of rotation for
// another lease TTL (session_use.lua's afterlife), until the last of them
// ends. The tick comes every quarter of the session TTL or of the lease
// TTL, whichever is shorter, counted from the last use of the session in
// this process (which found it live): a retirement after that use puts the
// proxy back no sooner than a lease TTL later, and the tick comes first.

// sessionHoldKey names a session of a pool.
type sessionHoldKey struct {
	p        *redisPool
	task, id string
}

// heldSlot is a slot a session's request goes through.
type heldSlot struct{ scope, member string }

// sessionHold is a session with requests under way in this process.
type sessionHold struct {
	n     int              // its requests under way; guarded by sessionHolds.mu
	slots map[heldSlot]int // the slots they go through, with their count; guarded too
	timer *time.Timer      // the next renewal
}

// sessionHolds is the Switch's set of sessions with requests under way.
type sessionHolds struct {
	mu sync.Mutex
	m  map[sessionHoldKey]*sessionHold
}

// holdSession notes one request of session k under way through slot, its
// use having just found the session live, and returns the function that
// notes its end (once; later calls do nothing).
func (s *Switch) holdSession(k sessionHoldKey, slot heldSlot) func() {
	h := &s.sessHolds
	every := min(k.p.cfg.session.ttl, k.p.cfg.leaseTTL) / 4
	h.mu.Lock()
	e := h.m[k]
	if e == nil {
		if h.m == nil {
			h.m = make(map[sessionHoldKey]*sessionHold)
		}
		e = &sessionHold{slots: make(map[heldSlot]int)}
		e.timer = time.AfterFunc(every, func() { s.renewSession(k, e, every) })
		h.m[k] = e
	} else {
		e.timer.Reset(every) // the use renewed the session: the next tick can wait
	}
	e.n++
	e.slots[slot]++
	h.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			if e.slots[slot]--; e.slots[slot] == 0 {
				delete(e.slots, slot)
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
	var slots []any // scope, member, ...: the slots of its requests under way
	h.mu.Lock()
	if h.m[k] == e && e.n > 0 {
		for sl := range e.slots {
			slots = append(slots, sl.scope, sl.member)
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
	case st == 7:
		if taken, _ := intAt(res, 2); taken > 0 {
			s.cfg.logger.Warn("proxyswitch: a request of a session that is over still runs, and another holder leased its proxy meanwhile",
				"task", k.task, "session", k.id, "slots", taken)
		} else {
			s.cfg.logger.Debug("proxyswitch: a session with a request under way is over; its proxy is kept out until the request ends", "task", k.task, "session", k.id)
		}
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
