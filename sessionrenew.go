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
// the hooks, the sweep, Close). A session that is no longer live or intact
// is not renewed (its next use retires it or starts anew); renewals stop
// at Close. One timer per session, however many of its requests run.

// sessionHoldKey names a session of a pool.
type sessionHoldKey struct {
	p        *redisPool
	task, id string
}

// sessionHold is a session with requests under way in this process.
type sessionHold struct {
	n     int         // its requests under way; guarded by sessionHolds.mu
	timer *time.Timer // the next renewal
}

// sessionHolds is the Switch's set of sessions with requests under way.
type sessionHolds struct {
	mu sync.Mutex
	m  map[sessionHoldKey]*sessionHold
}

// holdSession notes one request of session k under way and returns the
// function that notes its end (once; later calls do nothing).
func (s *Switch) holdSession(k sessionHoldKey) func() {
	h := &s.sessHolds
	h.mu.Lock()
	e := h.m[k]
	if e == nil {
		if h.m == nil {
			h.m = make(map[sessionHoldKey]*sessionHold)
		}
		e = &sessionHold{}
		every := k.p.cfg.session.ttl / 4
		e.timer = time.AfterFunc(every, func() { s.renewSession(k, e, every) })
		h.m[k] = e
	}
	e.n++
	h.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			if e.n--; e.n == 0 {
				e.timer.Stop()
				if h.m[k] == e {
					delete(h.m, k)
				}
			}
		})
	}
}

// renewSession renews session k while e is its entry, then arms the next
// renewal; a session found ended, lapsed or not intact is renewed no more.
func (s *Switch) renewSession(k sessionHoldKey, e *sessionHold, every time.Duration) {
	h := &s.sessHolds
	current := func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.m[k] == e && e.n > 0
	}
	if !current() {
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
	res, err := k.p.runUseMode(context.Background(), k.task, globalSite, "renew", k.id)
	if err != nil {
		// Redis unreachable or slow: the next tick tries again, within the TTL.
		s.cfg.logger.Warn("proxyswitch: renewing a session with a request under way failed", "task", k.task, "session", k.id, "err", err)
	} else if st, _ := intAt(res, 0); st != 4 {
		s.cfg.logger.Debug("proxyswitch: a session with a request under way is no longer live; renewed no more", "task", k.task, "session", k.id)
		drop()
		return
	}
	h.mu.Lock()
	if h.m[k] == e && e.n > 0 {
		e.timer.Reset(every)
	}
	h.mu.Unlock()
}
