package proxyswitch

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"

	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/bounded"
	"github.com/proxyswitch/proxyswitch/internal/engine"
	"github.com/proxyswitch/proxyswitch/internal/group"
	"github.com/redis/go-redis/v9"
)

// redisPool is one pool in Redis, the central broker: its keys and the
// scripts of the lease path (lease.lua, release.lua, extend.lua,
// penalize.lua). The Switch's own pool is one; WithRoute, UsePools and
// Sessions.Pool make one per pool they name, with the Switch's options.
// Safe for concurrent use.
type redisPool struct {
	sw      *Switch // the Switch it serves: options, proxy cache, tokens
	rdb     redis.Scripter
	cfg     *config
	name    string
	keys    keyspace
	timeout time.Duration // bounds each call made for a request
	inline  bool          // the client honours context deadlines: the lease path's calls run on the caller's goroutine (bounded.Call)

	calls     group.Group[poolOp, poolResult] // concurrent releases and plain leases share one pool_call.lua call (poolcall.go)
	scopeKeys scopeKeyCache                   // the lease and release keys of each scope, built once
	snap      snapState                       // the copy of the pool, to re-seed a Redis that lost it (snapshot.go)
	labelIdx  labelCache                      // the labels of its proxies, for labelled leases (labels.go)
	flights   sessionFlights                  // the session starts and extensions under way (sessionlease.go)
	flakyMs   int64                           // the flaky delay in ms,
	flakyArg  any                             // and boxed once, for pool_call.lua (poolcall.go)
}

func newRedisPool(s *Switch, name string) (*redisPool, error) {
	keys, err := newKeyspace(s.cfg.prefix, name)
	if err != nil {
		return nil, err
	}
	timeout := s.cfg.redisTimeout
	if s.cfg.fallback.set > 0 {
		timeout = min(timeout, s.cfg.fallback.timeout)
	}
	p := &redisPool{sw: s, rdb: s.rdb, cfg: &s.cfg, name: name, keys: keys, timeout: timeout,
		inline: bounded.HonoursDeadlines(s.rdb), flakyMs: s.cfg.flakyDelay.Milliseconds()}
	p.flakyArg = p.flakyMs
	p.calls = p.newCallGroup()
	return p, nil
}

func (p *redisPool) pool() string                { return p.name }
func (p *redisPool) broker() (*redisPool, error) { return p, nil }
func (p *redisPool) redis() *redisPool           { return p }

// tryLease runs lease.lua once; if it finds the pool lost by Redis, it
// re-seeds the pool from this Switch's copy and runs it once more.
func (p *redisPool) tryLease(ctx context.Context, site, scope, prefer string) (*Lease, time.Duration, error) {
	l, wait, lost, err := p.tryLeaseOnce(ctx, site, scope, prefer, false)
	if !lost {
		return l, wait, err
	}
	again, rerr := p.recoverLost(ctx)
	if rerr != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrNoProxy, rerr)
	}
	if !again {
		return nil, 0, err
	}
	l, wait, _, err = p.tryLeaseOnce(ctx, site, scope, prefer, false)
	return l, wait, err
}

// tryLeaseOnce runs lease.lua once (a plain lease: in its pool's next
// call, poolcall.go). lost reports an empty pool that no
// operator emptied (err is then ErrEmptyPool's). With only, the preferred
// proxy or none (labels.go): errProxyGone if it left the pool.
func (p *redisPool) tryLeaseOnce(ctx context.Context, site, scope, prefer string, only bool) (l *Lease, wait time.Duration, lost bool, err error) {
	token := p.sw.newToken()
	var res []any
	if prefer == "" && !only {
		if err = ctx.Err(); err == nil {
			var r poolResult
			r, err = p.calls.Do(poolOp{site: site, scope: scope, token: token})
			res, err = r.res, cmp.Or(err, r.err)
			if err != nil {
				p.doubt(scope, token, err) // sent, no reply: it may have leased all the same (reclaim.go)
			} else if ctx.Err() != nil {
				// The caller gave up while its batch was in Redis: a lease
				// granted to it goes back at once.
				p.leaseLate(scope, token)(res, nil)
				err = ctx.Err()
			}
		}
	} else {
		ttl := p.cfg.leaseTTL
		firm := ""
		if only {
			firm = "1"
		} else if ctx.Value(namedKey{}) != nil {
			firm = "x" // LeaseProxy's: strict exits do not hold the proxy it names
		}
		res, err = bounded.Call(ctx, p.timeout, p.inline, func(ctx context.Context) ([]any, error) {
			argv := append(make([]any, 0, 10), scope, token, ttl.Milliseconds(), p.cfg.cooldown.Milliseconds(),
				p.cfg.slots, p.cfg.idleTTL.Milliseconds(), prefer, firm)
			return leaseScript.Run(ctx, p.rdb, p.scopeKeys.get(p, scope).lease, append(argv, p.sw.brk.leaseArgs(site)...)...).Slice()
		}, p.leaseLate(scope, token))
		if err != nil {
			p.doubt(scope, token, err) // sent, no reply: it may have leased all the same (reclaim.go)
		}
	}
	if err != nil {
		if err, ok := leaseConfigErr(err); ok {
			return nil, 0, false, err
		}
		return nil, 0, false, fmt.Errorf("%w: %w", ErrNoProxy, redisErr("lease", err))
	}
	status, _ := intAt(res, 0)
	switch {
	case status == -1 && len(res) == 3:
		return nil, 0, p.emptyReply(res), fmt.Errorf("%w: %w: pool %q has no proxies", ErrNoProxy, ErrEmptyPool, p.name)
	case status == -3 && len(res) == 3: // the site's circuit breaker holds it (breaker.go)
		wait, _ := intAt(res, 1)
		until, _ := intAt(res, 2)
		p.sw.brk.gateRefused(p.name, site, until)
		return nil, waitHint(wait), false, nil
	case status == 0 && (len(res) == 2 || only && len(res) == 3):
		wait, _ := intAt(res, 1)
		return nil, waitHint(wait), false, nil
	case status == -2 && only:
		return nil, 0, false, errProxyGone
	case status == 1 && len(res) == 5:
		member, _ := res[1].(string)
		raw, _ := res[2].(string)
		expiry, ok := intAt(res, 3)
		px, err := p.sw.poolEntry(p.keys.proxies(), member, raw)
		if err != nil || !ok || member == "" {
			// Hand the slot back rather than hold a proxy we cannot use
			// (owner-checked: by member and token, as no Lease is made).
			if member != "" {
				p.giveBack(context.WithoutCancel(ctx), scope, member, token)
			}
			if err == nil {
				err = fmt.Errorf("%w: malformed lease reply", ErrCorrupt)
			}
			return nil, 0, false, fmt.Errorf("%w: %w", ErrNoProxy, err)
		}
		l := &Lease{sw: p.sw, be: p, scope: scope, site: site, member: member, memberArg: res[1], token: token, proxy: px,
			granted: time.Now()}
		l.expiry.Store(expiry)
		if v, ok := intAt(res, 4); ok {
			p.noteVersion(v)
		}
		return l, 0, false, nil
	}
	return nil, 0, false, fmt.Errorf("%w: %w: unexpected lease reply of %d items", ErrNoProxy, ErrCorrupt, len(res))
}

// emptyReply reads lease.lua's {-1, lost, version}: it reports whether the
// pool was lost by Redis, and empties the copy of a pool emptied on purpose.
func (p *redisPool) emptyReply(res []any) (lost bool) {
	mark, _ := intAt(res, 1)
	if mark == 1 {
		return true
	}
	v, _ := intAt(res, 2)
	p.emptied(v)
	return false
}

// releaseLate hands back a lease of lease.lua granted (to token, on
// scope) after its caller gave up waiting for the reply: roundTrip's late.
// (A session's: its token is the session's, never in doubt; a plain
// lease's is leaseLate, reclaim.go.)
func (p *redisPool) releaseLate(scope, token string) func([]any, error) {
	return func(res []any, err error) {
		if status, _ := intAt(res, 0); err == nil && status == 1 && len(res) >= 4 {
			if member, ok := res[1].(string); ok {
				_, _ = p.releaseMember(context.Background(), scope, member, token, "")
			}
		}
	}
}

// release runs the owner-checked release script for l, in one
// pool_call.lua call with the releases and leases asked for at the same
// time (poolcall.go).
// If the request made through l got a healthy answer, the proxy's backoff
// starts over.
func (p *redisPool) release(ctx context.Context, l *Lease) error {
	if err := ctx.Err(); err != nil {
		return redisErr("release", err)
	}
	q := p.releaseOp(l, time.Now())
	r, err := p.calls.Do(poolOp{rel: q})
	return p.releaseDone(q, r, err)
}

// releaseOp is l's release as a pool call carries it, asked for at at.
func (p *redisPool) releaseOp(l *Lease, at time.Time) queuedRelease {
	reset, cooldown, flaky, pace := p.releaseArgs(l)
	return queuedRelease{l: l, reset: reset, cooldown: cooldown, flaky: flaky, pace: pace, at: at}
}

// releaseDone is what a release returns once its pool call replied r (or
// failed with err).
func (p *redisPool) releaseDone(q queuedRelease, r poolResult, err error) error {
	if err = cmp.Or(err, r.err); err != nil {
		return redisErr("release", err)
	}
	if r.n == 0 {
		return q.l.lost("expired and leased again")
	}
	if q.cooldown == 0 {
		// Free now (unless a learned pace or a flaky delay holds it: the
		// waiter then gets the script's wait hint): a lease waiting for
		// this scope in this Switch tries at once.
		p.sw.waiters.wake(p.name, q.l.scope)
	}
	return nil
}

// releaseArgs is what release.lua needs of l: the proxy whose backoff starts
// over (a healthy answer) or "", the cooldown, the flaky delay, pacing.
func (p *redisPool) releaseArgs(l *Lease) (reset string, cooldown, flaky time.Duration, pace bool) {
	if l.healthy.Load() {
		reset = l.proxy.id
	}
	cooldown = max(p.cfg.cooldown, time.Duration(l.hold.Load()))
	flaky, pace = p.cfg.flakyDelay, p.cfg.paceMax > 0
	if l.unused.Load() {
		cooldown, flaky, pace = 0, 0, false
	}
	return reset, cooldown, flaky, pace
}

// releaseMember releases one slot if token still owns it: 1 released, 2
// released after expiry, 0 not the owner. A non-empty reset names the proxy
// whose runs of bans (on scope) and failures end.
func (p *redisPool) releaseMember(ctx context.Context, scope, member, token, reset string) (int64, error) {
	return p.releaseMemberFor(ctx, scope, member, token, reset, p.cfg.cooldown, 0, false)
}

// releaseMemberFor is releaseMember with the proxy next free after cooldown
// (at least the learned one with pace), plus its failure rate on scope times
// flaky.
func (p *redisPool) releaseMemberFor(ctx context.Context, scope, member, token, reset string, cooldown, flaky time.Duration, pace bool) (int64, error) {
	keys := []string{p.keys.free(scope), p.keys.leases(scope), p.keys.strikes(scope), p.keys.fails(),
		p.keys.health(scope), p.keys.pace(scope)}
	paced := "0"
	if pace {
		paced = "1"
	}
	n, err := bounded.Call(ctx, p.timeout, p.inline, func(ctx context.Context) (int64, error) {
		return releaseScript.Run(ctx, p.rdb, keys, member, token, cooldown.Milliseconds(), reset,
			flaky.Milliseconds(), paced, p.cfg.idleTTL.Milliseconds()).Int64()
	}, nil)
	if err != nil {
		return 0, redisErr("release", err)
	}
	return n, nil
}

// extend runs the owner-checked extend script for l's slot.
func (p *redisPool) extend(ctx context.Context, l *Lease, ttl time.Duration) error {
	n, err := p.extendMember(ctx, l, ttl)
	if err != nil {
		return err
	}
	if n == 0 {
		return l.lost("expired or taken over")
	}
	l.expiry.Store(n)
	return nil
}

// extendMember runs extend.lua for l's slot and token: the new expiry,
// or 0 when the slot is no longer l's.
func (p *redisPool) extendMember(ctx context.Context, l *Lease, ttl time.Duration) (int64, error) {
	n, err := bounded.Call(ctx, p.timeout, p.inline, func(ctx context.Context) (int64, error) {
		return extendScript.Run(ctx, p.rdb, []string{p.keys.free(l.scope), p.keys.leases(l.scope)},
			l.member, l.token, ttl.Milliseconds()).Int64()
	}, nil)
	if err != nil {
		return 0, redisErr("extend", err)
	}
	return n, nil
}

// penalize runs penalize.lua: p's slots on site's scope (every site with
// Bans.AllSites and a ban.Ban, but a site probe's) wait out the quarantine,
// its run of bans or failures grows, and l ends if it is p's lease on that
// scope.
//
// A ban that rotates (rotates) a gateway's virtual proxy rotates it
// instead. One round trip either way, but for a session newer than the
// pool's copy: when the copy knows px's template, rotate runs at once;
// otherwise penalize.lua checks the pool's gateways hash first and
// quarantines a plain proxy in that one call, while for a gateway's proxy
// it changes nothing and returns the template, which rotate then uses (a
// second round trip).
func (p *redisPool) penalize(ctx context.Context, site string, px *Proxy, l *Lease, v ban.Verdict) (penalty, error) {
	check := false
	if rotates(p.cfg, v) {
		check = true
		if tmpl := p.snapshot().gatewayOf(px.id); tmpl != "" {
			pen, r := p.rotate(ctx, site, px, l, tmpl)
			if r == rotateDone {
				return pen, nil
			}
			check = false // a plain proxy, or Redis failed: quarantine it
		}
	}
	pen, tmpl, err := p.quarantine(ctx, site, px, l, v, check)
	if tmpl == "" {
		return pen, err
	}
	if pen, r := p.rotate(ctx, site, px, l, tmpl); r == rotateDone {
		return pen, nil
	}
	pen, _, err = p.quarantine(ctx, site, px, l, v, false)
	return pen, err
}

// quarantine runs penalize.lua for penalize. With check, a virtual proxy of
// a gateway is left alone and its template returned instead (tmpl != "").
func (p *redisPool) quarantine(ctx context.Context, site string, px *Proxy, l *Lease, v ban.Verdict, check bool) (_ penalty, tmpl string, _ error) {
	c, k := p.cfg, p.keys
	scope := p.sw.scopeOf(site)
	kind, base, maxq, hard, first, certain := "ban", c.quarantine, c.maxQuarantine, "0", c.firstQuarantine, "0"
	if (unambiguous(v) && !challengeStrike(l)) || siteOnly(v) {
		certain = "1" // a site probe's failure is a verdict, no first strike
	}
	if v.Kind == ban.ProxyFailure {
		kind, base, maxq = "fail", c.failQuarantine, c.maxFailQuarantine
		if v.Reason == ban.ReasonProxyConnect || v.Reason == ban.ReasonProxyAuth {
			hard = "1"
		}
	}
	member, token := "", ""
	if l != nil && l.scope == scope && l.released.CompareAndSwap(false, true) {
		member, token = l.member, l.token
	}
	all := "0"
	if banAll(c, v) {
		all = "1"
	}
	keys := []string{k.free(scope), k.leases(scope), k.strikes(scope), k.fails(), k.dead(), k.sites(), k.quarantine(),
		k.health(scope), k.pace(scope), k.gateways()}
	// A rate-limit refusal under learned pacing is the site's pace, not the
	// proxy's health: it lengthens the site's cooldown, not the proxy's hold.
	// An operator's ban (Switch.Ban) says nothing of either.
	flaky, pace := c.flakyDelay, paceRefusal(c, v)
	switch {
	case v.Reason == ReasonOperator || siteOnly(v):
		flaky, pace = 0, ""
	case pace != "":
		flaky = 0
	}
	argv := []any{kind, px.id, member, token, base.Milliseconds(), maxq.Milliseconds(),
		min(v.RetryAfter, maxq).Milliseconds(), 850 + rand.N(301), all, k.base,
		c.idleTTL.Milliseconds(), hard, c.deadAfter, site, v.Reason, c.slots, first.Milliseconds(), certain, 0,
		flaky.Milliseconds(), pace, "0"}
	if check {
		argv[len(argv)-1] = "1"
	}
	reply, err := roundTrip(ctx, p.timeout, func(ctx context.Context) ([]any, error) {
		return penalizeScript.Run(ctx, p.rdb, keys, argv...).Slice()
	}, nil)
	if err == nil && check && len(reply) == 2 && reply[0] == "gateway" {
		if member != "" {
			l.released.Store(false) // untouched: rotate ends it
		}
		if t, ok := reply[1].(string); ok && t != "" {
			return penalty{}, t, nil
		}
		err = fmt.Errorf("%w: quarantine reply with a gateway template of type %T", ErrCorrupt, reply[1])
		return penalty{}, "", err
	}
	if err != nil {
		if member != "" {
			l.released.Store(false) // still held: it expires by its TTL, or Release may retry
		}
		return penalty{}, "", redisErr("quarantine", err)
	}
	if len(reply) != 11 {
		return penalty{ended: member != ""}, "", fmt.Errorf("%w: quarantine reply of %d items", ErrCorrupt, len(reply))
	}
	res := make([]int64, len(reply))
	for i := range reply {
		n, ok := intAt(reply, i)
		if !ok {
			return penalty{ended: member != ""}, "", fmt.Errorf("%w: quarantine reply item %d of type %T", ErrCorrupt, i+1, reply[i])
		}
		res[i] = n
	}
	pen := penalty{quarantine: time.Duration(res[0]) * time.Millisecond, until: time.UnixMilli(res[1]),
		strikes: int(res[2]), dead: res[3] == 1, ended: member != "", first: res[5] == 1, healthy: res[6] == 1,
		witness: res[7] == 1, unproven: res[7] == 2, paced: pace != "", hold: res[8] >= 1, tired: res[8] == 2, at: time.UnixMilli(res[10])}
	if res[9] > 0 {
		pen.lifted = time.UnixMilli(res[9])
	}
	if pen.dead {
		c.logger.Warn("proxyswitch: proxy marked dead: out of every site's rotation until revived",
			"proxy", px.String(), "site", site, "reason", v.Reason, "failures", pen.strikes)
	} else if pen.hold {
		c.logger.Debug("proxyswitch: rate-limited: the proxy waits the site's pace", "proxy", px.String(), "site", site,
			"reason", v.Reason, "for", pen.quarantine)
	} else {
		c.logger.Debug("proxyswitch: proxy quarantined", "proxy", px.String(), "site", site,
			"kind", v.Kind.String(), "reason", v.Reason, "for", pen.quarantine, "in_a_row", pen.strikes)
	}
	return pen, "", nil
}

// paceRefusal is penalize.lua's ARGV[18]: "<floor ms>|<max ms>" when v is a
// rate-limit refusal (a ban for 429, or for another status with a Retry-After) and
// learned pacing is on, else "".
func paceRefusal(c *config, v ban.Verdict) string {
	// A site's answer about the pace: a 429, or a status with Retry-After
	// (a 503 that says when to come back). A verdict of the user's or of a
	// probe with a RetryAfter is a quarantine of that length, not the pace.
	status := strings.HasPrefix(v.Reason, "http_")
	if c.paceMax <= 0 || v.Kind != ban.Ban || (v.Reason != ban.StatusReason(http.StatusTooManyRequests) && (v.RetryAfter <= 0 || !status)) {
		return ""
	}
	return fmt.Sprintf("%d|%d", c.cooldown.Milliseconds(), max(c.paceMax, c.cooldown).Milliseconds())
}

// roundTrip runs one Redis call, bounded by timeout whatever the client's
// settings (see bounded.Call); late, if non-nil, receives the result of a
// call that finished after its caller gave up.
func roundTrip[T any](ctx context.Context, timeout time.Duration, fn func(context.Context) (T, error), late func(T, error)) (T, error) {
	return bounded.Call(ctx, timeout, false, fn, late)
}

// leaseConfigErr turns lease.lua's PSCONFIG error (the pool records
// another concurrency) into an ErrNoProxy and ErrConfig error.
func leaseConfigErr(err error) (error, bool) {
	msg, ok := strings.CutPrefix(err.Error(), "PSCONFIG ")
	if !ok {
		return nil, false
	}
	return fmt.Errorf("%w: %w: %s", ErrNoProxy, ErrConfig, msg), true
}

// maxWaitHint bounds a script's wait hint: with every proxy dead the hint
// is the dead score (1e15 ms) away, which would overflow a Duration.
const maxWaitHint = 24 * time.Hour

// waitHint turns a script's wait hint in milliseconds into a Duration
// between 1ms and maxWaitHint.
func waitHint(ms int64) time.Duration {
	return time.Duration(min(max(ms, 1), maxWaitHint.Milliseconds())) * time.Millisecond
}

// intAt returns element i of a script's reply if it is an integer.
func intAt(res []any, i int) (int64, bool) { return engine.IntAt(res, i) }
