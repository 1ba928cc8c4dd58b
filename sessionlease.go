package proxyswitch

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// sessionTokenPrefix starts the owner token of every session lease; other
// tokens (newToken) never do.
const sessionTokenPrefix = "s:"

// errProxyGone: the session's proxy left the pool or is dead (lease.lua {-2}).
var errProxyGone = errors.New("proxyswitch: the session's proxy left the pool or is dead")

func (k keyspace) session(task string) string  { return k.base + ":session:" + task }
func (k keyspace) sessionJar(id string) string { return k.base + ":sjar:" + id }

// Statuses of session_use.lua.
const (
	useNone    = 0 // no live session
	useLive    = 1
	useNewSite = 2 // live, not yet on this scope
	useCorrupt = -3
)

// useReply is session_use.lua's reply, parsed.
type useReply struct {
	status  int
	retired *SessionRetirement // useNone: the session this call retired
	info    *SessionInfo       // useLive
	lease   *Lease             // useLive: the session's lease on the scope
	jar     []string           // useLive: the jar's values
	proxyID string             // useNewSite
	id      string             // useNewSite
	scopes  int                // useNewSite: scopes held
}

// runUse runs session_use.lua for task on scope ("use" or "peek").
func (p *redisPool) runUse(ctx context.Context, task, scope, mode string) (*useReply, error) {
	res, err := p.runUseMode(ctx, task, scope, mode, "")
	if err != nil {
		return nil, err
	}
	st, _ := intAt(res, 0)
	rep := &useReply{status: int(st)}
	bad := func(what string) error {
		return fmt.Errorf("%w: session of task %q in pool %q (key %s): %s (EndSession deletes it)", ErrCorrupt, task, p.name, p.keys.session(task), clip(what))
	}
	switch {
	case st == useCorrupt && len(res) == 2:
		what, _ := res[1].(string)
		return nil, bad(what)
	case st == useNone && len(res) == 11:
		if retired, _ := intAt(res, 1); retired == 1 {
			r := p.retirement(task, res[3:11])
			rep.retired = &r
		}
		return rep, nil
	case st == useNewSite && len(res) == 4:
		rep.proxyID, _ = res[1].(string)
		rep.id, _ = res[2].(string)
		n, _ := intAt(res, 3)
		rep.scopes = int(n)
		return rep, nil
	case st == useLive && len(res) >= 16:
		raw, _ := res[1].(string)
		px, err := p.sw.proxyFor(raw)
		if err != nil {
			return nil, fmt.Errorf("session of task %q: %w", task, err)
		}
		id, _ := res[2].(string)
		exp := toInt(res[6])
		info := &SessionInfo{Task: task, ID: id, Generation: int(toInt(res[3])), Pool: p.name, Proxy: px.String(), ProxyID: px.ID(),
			Requests: int(toInt(res[4])), Started: time.UnixMilli(toInt(res[5])), Expires: time.UnixMilli(exp)}
		if prev := p.retirement(task, res[8:16]); prev.ID != "" {
			info.Previous = &prev
		}
		rep.info = info
		for _, v := range res[16:] {
			if line, ok := v.(string); ok {
				rep.jar = append(rep.jar, line)
			}
		}
		member, _ := res[7].(string)
		l := &Lease{sw: p.sw, be: p, scope: scope, site: scope, proxy: px, member: member, token: sessionTokenPrefix + id}
		l.expiry.Store(exp)
		l.released.Store(true) // never released by a request: only with the session
		rep.lease = l
		return rep, nil
	}
	return nil, bad(fmt.Sprintf("unexpected reply of %d items", len(res)))
}

// runUseMode runs session_use.lua for task on scope in any mode, id being
// its ARGV[11] ("renew" and "join"), and returns the raw reply.
func (p *redisPool) runUseMode(ctx context.Context, task, scope, mode, id string, extra ...any) ([]any, error) {
	c := p.cfg
	args := append([]any{p.keys.base, scope, c.session.ttl.Milliseconds(), c.session.maxRequests, c.session.maxAge.Milliseconds(),
		c.cooldown.Milliseconds(), c.slots, c.idleTTL.Milliseconds(), mode, c.leaseTTL.Milliseconds(), id,
		p.sw.tag(), requestHold(c).Milliseconds()}, extra...)
	res, err := roundTrip(ctx, c.redisTimeout, func(ctx context.Context) ([]any, error) {
		return sessionUseScript.Run(ctx, p.rdb, p.keys.sessionKeys(task), args...).Slice()
	}, nil)
	if err != nil {
		return nil, redisErr("session", err)
	}
	return res, nil
}

// retirement reads the 8 items session_lib.lua's previous() returns.
func (p *redisPool) retirement(task string, v []any) SessionRetirement {
	str := func(i int) string { x, _ := v[i].(string); return x }
	r := SessionRetirement{Task: task, ID: str(0), Proxy: str(1), ProxyID: str(1), Reason: str(3), Site: str(4),
		At: time.UnixMilli(toInt(v[5])), Requests: int(toInt(v[6])), Started: time.UnixMilli(toInt(v[7]))}
	if p, err := p.sw.proxyFor(str(2)); err == nil && str(2) != "" {
		r.Proxy = p.String()
	}
	return r
}

// toInt reads an integer reply item, or one sent back as a string.
func toInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

// useSession returns the live session of task on site, holding its proxy
// there: the one there is, continued and renewed, or a new one. It waits
// for a proxy like any lease (Timeouts.MaxWait, the request's context).
func (p *redisPool) useSession(ctx context.Context, task, site string) (*useReply, error) {
	return p.useSessionLabelled(ctx, task, site, nil)
}

// useSessionLabelled is useSession for a request that asks for labels
// (UseLabels; want canonical, nil for none): a new session leases only a
// proxy that carries them (sessionLeaseLabelled), and a live one whose
// proxy does not carry them (its labels changed with a Replace, or the
// task asked for none before) is retired (SessionLabels) and
// replaced by one whose proxy does.
func (p *redisPool) useSessionLabelled(ctx context.Context, task, site string, want []string) (*useReply, error) {
	scope := p.sw.scopeOf(site)
	for range maxSessionRounds {
		rep, err := p.runUse(ctx, task, scope, "use")
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrNoProxy, err)
		}
		switch rep.status {
		case useLive:
			if ok, cerr := p.carries(ctx, rep.info.ProxyID, want); cerr != nil {
				return nil, cerr
			} else if !ok {
				_, _, err = p.endSession(ctx, task, rep.info.ID, SessionLabels, site, true)
				break
			}
			rep.lease.site = site
			return rep, nil
		case useNone:
			if rep.retired != nil {
				p.sw.sessionEnded(p.name, *rep.retired)
			}
			// The task's requests in flight at once in this process to one
			// site: one starts the session, the others wait for it, then
			// join it. (Per site: a failure that is the site's, every proxy
			// quarantined there or its breaker open, is not another site's.)
			err = p.flights.do(ctx, "start\x00"+task+"\x00"+scope+"\x00"+strings.Join(want, ","), func() error {
				return p.startSession(ctx, task, site, scope, want)
			})
		case useNewSite:
			if ok, cerr := p.carries(ctx, rep.proxyID, want); cerr != nil {
				return nil, cerr
			} else if !ok {
				_, _, err = p.endSession(ctx, task, rep.id, SessionLabels, site, true)
				break
			}
			err = p.flights.do(ctx, "add\x00"+task+"\x00"+scope, func() error {
				return p.extendSession(ctx, task, site, scope, rep)
			})
		}
		if err != nil {
			return nil, err
		}
	}
	return nil, fmt.Errorf("%w: the session of task %q kept changing under %d tries", ErrNoProxy, task, maxSessionRounds)
}

// errJoined: while a request waited for a proxy for its task's session, a
// request of the same task (another process's, or one coalescing missed)
// started the session, or gave it the scope: the request looks again and
// joins it (sessionJoin).
var errJoined = errors.New("proxyswitch: the task's session changed while the request waited")

// sessionFlights coalesces, within one process, the concurrent requests of
// a task that find no session (or a session that does not hold their scope
// yet): one starts (or extends) it, the others wait for that, then look
// again and use the session it bound, its IP included. Without it the
// others would lease proxies of their own, and with none left wait the
// whole MaxWait for a proxy they do not need.
type sessionFlights struct {
	mu sync.Mutex
	m  map[string]*sessionFlight
}

// sessionFlight is one start or extension under way.
type sessionFlight struct {
	done  chan struct{}
	err   error
	ended bool // the leader's own request ended: its error is not its followers'
}

// do runs fn unless a call of the same key is under way, in which case it
// waits for that one: nil then means "look again". A follower shares the
// leader's error, unless the leader's own context ended (it was cancelled
// or timed out, not the session).
func (f *sessionFlights) do(ctx context.Context, key string, fn func() error) error {
	f.mu.Lock()
	if fl := f.m[key]; fl != nil {
		f.mu.Unlock()
		select {
		case <-fl.done:
		case <-ctx.Done():
			return withCause(fmt.Errorf("%w: gave up waiting for the task's session", ErrNoProxy), ctx.Err())
		}
		if fl.err != nil && !fl.ended {
			return fl.err
		}
		return nil
	}
	if f.m == nil {
		f.m = make(map[string]*sessionFlight)
	}
	fl := &sessionFlight{done: make(chan struct{}), err: fmt.Errorf("%w: the request starting the task's session failed", ErrNoProxy)}
	f.m[key] = fl
	f.mu.Unlock()
	defer func() {
		fl.ended = ctx.Err() != nil
		f.mu.Lock()
		delete(f.m, key)
		f.mu.Unlock()
		close(fl.done)
	}()
	fl.err = fn()
	return fl.err
}

// sessionJoin returns the check a session's wait for a proxy makes at each
// round (sessionLease): session_use.lua's "join" for task on scope, id being
// the session reaching a new scope ("" for a request starting one). It
// answers 1 when the request should look again (the task has a session now,
// or session id holds the scope), 2 when a lease of session id holds the
// proxy there but is not bound yet (a sibling request is binding it), 0
// otherwise.
func (p *redisPool) sessionJoin(task, scope, id string) func(context.Context) (int64, error) {
	return func(ctx context.Context) (int64, error) {
		res, err := p.runUseMode(ctx, task, scope, "join", id)
		if err != nil {
			return 0, err
		}
		if st, _ := intAt(res, 0); st != 6 {
			return 0, nil
		}
		v, _ := intAt(res, 1)
		return v, nil
	}
}

// startSession leases a proxy for a new session of task and binds it. A
// lost race (another request started the session first) is no error: the
// caller looks again.
func (p *redisPool) startSession(ctx context.Context, task, site, scope string, want []string) error {
	var b [8]byte
	_, _ = crand.Read(b[:])
	id := hex.EncodeToString(b[:])
	var member string
	var expiry int64
	var err error
	join := p.sessionJoin(task, scope, "")
	if len(want) > 0 {
		member, expiry, err = p.sessionLeaseLabelled(ctx, site, scope, sessionTokenPrefix+id, want, join)
	} else {
		member, expiry, err = p.sessionLease(ctx, site, scope, sessionTokenPrefix+id, "", join)
	}
	if errors.Is(err, errJoined) {
		return nil // a sibling request started the session: join it
	}
	if err != nil {
		return err
	}
	bound, err := p.bind(ctx, task, scope, member, id, expiry, "new")
	if bound {
		p.sw.observeSessionStart(p.name, site, member)
	}
	return err
}

// extendSession leases the session's own proxy on a scope it reaches for
// the first time, waiting for it as for any lease. A proxy gone from the
// pool retires the session.
func (p *redisPool) extendSession(ctx context.Context, task, site, scope string, rep *useReply) error {
	if rep.scopes >= maxSessionSites {
		return fmt.Errorf("%w: the session of task %q already holds its proxy on %d sites (at most %d)",
			ErrNoProxy, task, rep.scopes, maxSessionSites)
	}
	member, expiry, err := p.sessionLease(ctx, site, scope, sessionTokenPrefix+rep.id, rep.proxyID, p.sessionJoin(task, scope, rep.id))
	if errors.Is(err, errJoined) {
		return nil // a sibling request gave the session the scope: use it
	}
	if errors.Is(err, errProxyGone) {
		_, _, err = p.endSession(ctx, task, rep.id, SessionProxyRemoved, site, true)
		return err
	}
	if err != nil {
		return err
	}
	_, err = p.bind(ctx, task, scope, member, rep.id, expiry, "add")
	return err
}

// bind runs session_bind.lua, and releases the lease unless it was bound;
// it says whether it was.
func (p *redisPool) bind(ctx context.Context, task, scope, member, id string, expiry int64, mode string) (bool, error) {
	c := p.cfg
	token := sessionTokenPrefix + id
	res, err := roundTrip(ctx, c.redisTimeout, func(ctx context.Context) ([]any, error) {
		return sessionBindScript.Run(ctx, p.rdb, append(p.keys.sessionKeys(task), p.keys.sessionJar(id)),
			p.keys.base, scope, member, id, expiry, c.session.ttl.Milliseconds(), c.slots, c.idleTTL.Milliseconds(),
			mode, maxSessionSites, p.sw.tag(), requestHold(c).Milliseconds()).Slice()
	}, func(res []any, err error) { p.unbind(task, scope, member, id, res, err) })
	if err != nil {
		go p.unbind(task, scope, member, id, nil, err) // both are owner-checked: running twice is harmless
		return false, fmt.Errorf("%w: %w", ErrNoProxy, redisErr("session bind", err))
	}
	st, _ := intAt(res, 0)
	if st == 1 {
		return true, nil
	}
	_, _ = p.releaseMember(context.WithoutCancel(ctx), scope, member, token, "")
	switch {
	case st == -3 && len(res) == 2:
		what, _ := res[1].(string)
		return false, fmt.Errorf("%w: %w: session of task %q in pool %q (key %s): %s (EndSession deletes it)", ErrNoProxy, ErrCorrupt, task, p.name, p.keys.session(task), clip(what))
	case st == -4:
		return false, fmt.Errorf("%w: the session of task %q already holds its proxy on %d sites", ErrNoProxy, task, maxSessionSites)
	case st >= -2 && st <= 0:
		return false, nil // the session changed meanwhile: look again
	}
	return false, fmt.Errorf("%w: %w: unexpected session bind reply", ErrNoProxy, ErrCorrupt)
}

// unbind undoes what bind may have done when its reply is lost or came too
// late: the lease goes back, and so does a session it started (owner-checked:
// nothing else is touched).
func (p *redisPool) unbind(task, scope, member, id string, res []any, err error) {
	ctx := context.Background()
	if st, _ := intAt(res, 0); err == nil && st == 1 {
		return // bound: the task's next request uses the session
	}
	if err != nil {
		// Its start was never observed: neither is this end.
		_, _, _ = p.endSession(ctx, task, id, SessionEnded, "", false)
	}
	_, _ = p.releaseMember(ctx, scope, member, sessionTokenPrefix+id, "")
}

// endSession ends the live session of task (only session id, unless id is
// "") for reason, reports a retirement (any reason but SessionEnded), tells
// the observer if observe, and says whether it ended one.
func (p *redisPool) endSession(ctx context.Context, task, id, reason, site string, observe bool) (SessionRetirement, bool, error) {
	c := p.cfg
	// A retirement holds the proxy a lease TTL: the session's other requests
	// may still be under way. Either way, the requests other Switches, or
	// this one, noted under way keep it out (the record's h:<tag> fields,
	// sessionrenew.go), but this Switch's when it has none.
	hold, skip := c.leaseTTL, ""
	if reason == SessionEnded {
		hold = 0
	}
	if !p.sw.sessionBusy(p, task) {
		skip = p.sw.tag()
	}
	res, err := roundTrip(ctx, c.redisTimeout, func(ctx context.Context) ([]any, error) {
		return sessionEndScript.Run(ctx, p.rdb, p.keys.sessionKeys(task),
			p.keys.base, id, reason, site, c.cooldown.Milliseconds(), c.slots, c.session.ttl.Milliseconds(), hold.Milliseconds(), skip).Slice()
	}, nil)
	if err != nil {
		return SessionRetirement{}, false, redisErr("session end", err)
	}
	st, _ := intAt(res, 0)
	switch {
	case st == 2:
		return SessionRetirement{}, true, nil // a corrupt record, deleted
	case st != 1 || len(res) != 8:
		return SessionRetirement{}, false, nil
	}
	r := p.retirement(task, []any{res[1], res[3], res[4], reason, site, res[7], res[5], res[6]})
	if observe {
		p.sw.sessionEnded(p.name, r)
	}
	return r, true, nil
}

// sessionLease leases a proxy for a session under its token and the
// session TTL with lease.lua: any free proxy, or only proxy ID only. It
// waits as acquire does, but gives up at once when only's soonest slot
// cannot free before the wait would end (another session holds it, or it is
// quarantined there). At each round of its wait it asks join (sessionJoin)
// whether a sibling request of the task has meanwhile done what it waits
// for: it then returns errJoined; a proxy held by the session's own lease,
// not yet bound, is waited for rather than given up on.
func (p *redisPool) sessionLease(ctx context.Context, site, scope, token, only string, join func(context.Context) (int64, error)) (member string, expiry int64, err error) {
	c := p.cfg
	flag := ""
	if only != "" {
		flag = "1"
	}
	keys := p.keys.lease(scope)
	start := time.Now()
	deadline := start.Add(c.maxWait)
	backoff := c.backoffMin
	reseeded := false
	for {
		res, err := roundTrip(ctx, c.redisTimeout, func(ctx context.Context) ([]any, error) {
			return leaseScript.Run(ctx, p.rdb, keys, append([]any{scope, token, c.session.ttl.Milliseconds(), c.cooldown.Milliseconds(),
				c.slots, c.idleTTL.Milliseconds(), only, flag}, p.sw.brk.leaseArgs(site)...)...).Slice()
		}, p.releaseLate(scope, token))
		if err != nil {
			if cerr, ok := leaseConfigErr(err); ok {
				return "", 0, cerr
			}
			return "", 0, fmt.Errorf("%w: %w", ErrNoProxy, redisErr("session lease", err))
		}
		st, _ := intAt(res, 0)
		var wait, firm int64
		switch {
		case st == 1 && len(res) == 5:
			member, _ = res[1].(string)
			expiry, _ = intAt(res, 3)
			if v, ok := intAt(res, 4); ok {
				p.noteVersion(v)
			}
			return member, expiry, nil
		case st == -1 && len(res) == 3:
			if p.emptyReply(res) && !reseeded {
				// Lost by Redis: re-seed from the copy, then lease again.
				again, rerr := p.recoverLost(ctx)
				if rerr != nil {
					return "", 0, fmt.Errorf("%w: %w", ErrNoProxy, rerr)
				}
				if reseeded = true; again {
					continue
				}
			}
			return "", 0, fmt.Errorf("%w: %w: pool %q has no proxies", ErrNoProxy, ErrEmptyPool, p.name)
		case st == -2:
			return "", 0, errProxyGone
		case st == -3 && len(res) == 3: // the site's circuit breaker holds it (breaker.go)
			wait, _ = intAt(res, 1)
			until, _ := intAt(res, 2)
			p.sw.brk.gateRefused(p.name, site, until)
			if err := p.sw.brk.pausedErr(site, start, deadline); err != nil {
				return "", 0, err
			}
		case st == 0 && (len(res) == 2 || len(res) == 3):
			wait, _ = intAt(res, 1)
			firm, _ = intAt(res, 2)
		default:
			return "", 0, fmt.Errorf("%w: %w: unexpected lease reply of %d items", ErrNoProxy, ErrCorrupt, len(res))
		}
		if join != nil {
			switch j, jerr := join(ctx); {
			case jerr != nil:
				return "", 0, fmt.Errorf("%w: %w", ErrNoProxy, jerr)
			case j == 1:
				return "", 0, errJoined
			case j == 2:
				firm = 0 // the session's own lease, being bound by a sibling request
			}
		}
		left := time.Until(deadline)
		d := min(waitHint(wait), backoff, left)
		if left <= 0 || (firm == 1 && waitHint(wait) > left) {
			what, hint := "every proxy of pool "+strconv.Quote(p.name)+" stayed busy or quarantined", ""
			if only != "" {
				what = "the session's proxy is held by another session or quarantined"
			} else {
				hint = p.sw.sessionsHint(ctx, p.name)
			}
			return "", 0, fmt.Errorf("%w: %s on site %s past the %v wait%s%s", ErrNoProxy, what, site, c.maxWait, nextFree(min(time.Duration(wait)*time.Millisecond, maxWaitHint)), hint)
		}
		backoff = min(2*backoff, c.backoffMax)
		if !pause(ctx, d) {
			if err := p.sw.brk.pausedErr(site, start, time.Now()); err != nil {
				return "", 0, withCause(err, ctx.Err()) // the request ended while its site was paused
			}
			return "", 0, withCause(fmt.Errorf("%w: gave up waiting for a session proxy on site %s%s", ErrNoProxy, site, nextFree(min(time.Duration(wait)*time.Millisecond, maxWaitHint))), ctx.Err())
		}
	}
}

// carries reports whether proxy id of the pool carries every label of want
// (true for none), from the Switch's copy of the labels (labelsOf: at most
// labelIndexAge old).
func (p *redisPool) carries(ctx context.Context, id string, want []string) (bool, error) {
	if len(want) == 0 {
		return true, nil
	}
	byID, err := p.labelsOf(ctx, false)
	if err != nil {
		return false, fmt.Errorf("%w: %w", ErrNoProxy, err)
	}
	return matches(byID[id], want), nil
}

// sessionLeaseLabelled is sessionLease for a new session whose request asks
// for labels: it leases, under the session's token, only a proxy that
// carries every label of want, trying up to labelTries of them per round
// (lease.lua's preferred proxy, firm: that proxy or none), and waits as
// sessionLease does when they are busy. Labels no proxy of the pool
// carries fail at once with ErrNoProxy; a pool Redis lost is re-seeded from
// the copy, labels included, once.
func (p *redisPool) sessionLeaseLabelled(ctx context.Context, site, scope, token string, want []string, join func(context.Context) (int64, error)) (member string, expiry int64, err error) {
	c := p.cfg
	keys := p.keys.lease(scope)
	start := time.Now()
	deadline := start.Add(c.maxWait)
	backoff := c.backoffMin
	reseeded := false
	for {
		ids, err := p.matching(ctx, want)
		if err != nil {
			return "", 0, fmt.Errorf("%w: %w", ErrNoProxy, err)
		}
		if len(ids) == 0 {
			if !reseeded && len((&labelled{want: want}).inCopy(p)) > 0 {
				if lost, err := p.lost(ctx); err != nil {
					return "", 0, fmt.Errorf("%w: %w", ErrNoProxy, err)
				} else if lost {
					reseeded = true
					if _, err := p.recoverLost(ctx); err != nil {
						return "", 0, fmt.Errorf("%w: %w", ErrNoProxy, err)
					}
					if _, err := p.labelsOf(ctx, true); err != nil {
						return "", 0, fmt.Errorf("%w: %w", ErrNoProxy, err)
					}
					continue
				}
			}
			return "", 0, fmt.Errorf("%w: no proxy of pool %s carries the labels %s", ErrNoProxy, p.name, strings.Join(want, ","))
		}
		first := int(labelNext.Add(1) % uint64(len(ids)))
		wait := int64(-1)
		lost := false
		for i := range min(labelTries, len(ids)) {
			only := ids[(first+i)%len(ids)]
			res, err := roundTrip(ctx, c.redisTimeout, func(ctx context.Context) ([]any, error) {
				return leaseScript.Run(ctx, p.rdb, keys, append([]any{scope, token, c.session.ttl.Milliseconds(), c.cooldown.Milliseconds(),
					c.slots, c.idleTTL.Milliseconds(), only, "1"}, p.sw.brk.leaseArgs(site)...)...).Slice()
			}, p.releaseLate(scope, token))
			if err != nil {
				if cerr, ok := leaseConfigErr(err); ok {
					return "", 0, cerr
				}
				return "", 0, fmt.Errorf("%w: %w", ErrNoProxy, redisErr("session lease", err))
			}
			st, _ := intAt(res, 0)
			var w int64
			switch {
			case st == 1 && len(res) == 5:
				member, _ = res[1].(string)
				expiry, _ = intAt(res, 3)
				if v, ok := intAt(res, 4); ok {
					p.noteVersion(v)
				}
				return member, expiry, nil
			case st == -1 && len(res) == 3:
				lost = p.emptyReply(res)
				if !lost {
					return "", 0, fmt.Errorf("%w: %w: pool %q has no proxies", ErrNoProxy, ErrEmptyPool, p.name)
				}
			case st == -2: // dead, or gone since the copy of the labels was read
				continue
			case st == -3 && len(res) == 3: // the site's circuit breaker holds it (breaker.go)
				w, _ = intAt(res, 1)
				until, _ := intAt(res, 2)
				p.sw.brk.gateRefused(p.name, site, until)
				if err := p.sw.brk.pausedErr(site, start, deadline); err != nil {
					return "", 0, err
				}
			case st == 0 && (len(res) == 2 || len(res) == 3):
				w, _ = intAt(res, 1)
			default:
				return "", 0, fmt.Errorf("%w: %w: unexpected lease reply of %d items", ErrNoProxy, ErrCorrupt, len(res))
			}
			if lost {
				break
			}
			if wait < 0 || w < wait {
				wait = w
			}
		}
		if !lost && wait < 0 && !reseeded {
			// Every candidate was gone: the pool may be lost (lease.lua answers
			// a firm lease of a proxy it lacks before it looks at the pool).
			if lost, err = p.lost(ctx); err != nil {
				return "", 0, fmt.Errorf("%w: %w", ErrNoProxy, err)
			}
		}
		if lost {
			if reseeded {
				return "", 0, fmt.Errorf("%w: %w: pool %q has no proxies", ErrNoProxy, ErrEmptyPool, p.name)
			}
			reseeded = true
			again, rerr := p.recoverLost(ctx)
			if rerr != nil {
				return "", 0, fmt.Errorf("%w: %w", ErrNoProxy, rerr)
			}
			if !again {
				return "", 0, fmt.Errorf("%w: %w: pool %q has no proxies", ErrNoProxy, ErrEmptyPool, p.name)
			}
			if _, err := p.labelsOf(ctx, true); err != nil {
				return "", 0, fmt.Errorf("%w: %w", ErrNoProxy, err)
			}
			continue
		}
		if wait < 0 {
			wait = 50 // every candidate tried was dead or gone: try others a little later
		}
		if join != nil {
			if j, jerr := join(ctx); jerr != nil {
				return "", 0, fmt.Errorf("%w: %w", ErrNoProxy, jerr)
			} else if j == 1 {
				return "", 0, errJoined
			}
		}
		left := time.Until(deadline)
		d := min(waitHint(wait), backoff, left)
		if left <= 0 {
			return "", 0, fmt.Errorf("%w: every proxy of pool %q carrying the labels %s stayed busy or quarantined on site %s past the %v wait%s%s",
				ErrNoProxy, p.name, strings.Join(want, ","), site, c.maxWait, nextFree(min(time.Duration(wait)*time.Millisecond, maxWaitHint)), p.sw.sessionsHint(ctx, p.name))
		}
		backoff = min(2*backoff, c.backoffMax)
		if !pause(ctx, d) {
			if err := p.sw.brk.pausedErr(site, start, time.Now()); err != nil {
				return "", 0, withCause(err, ctx.Err())
			}
			return "", 0, withCause(fmt.Errorf("%w: gave up waiting for a session proxy carrying the labels %s on site %s%s",
				ErrNoProxy, strings.Join(want, ","), site, nextFree(min(time.Duration(wait)*time.Millisecond, maxWaitHint))), ctx.Err())
		}
	}
}
