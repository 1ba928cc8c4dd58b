package localpool

import (
	"fmt"
	"time"
)

// Evidence before verdict, in one process: the local shard's twin of
// penalize.lua, lift.lua and the health hash of release.lua (see the root's
// Bans.EvidenceFirst and Rotation.FlakyDelay).
//
// A refusal is a strike against the (proxy, site) pair. The n-th strike in
// a row (no healthy answer in between; a run older than twice the max
// quarantine is forgotten; a refusal met while the last quarantine still
// runs is the same offence) weighs e = n, plus one when it is certain (a
// challenge, or a strike confirmed). Weight 1 is the first quarantine;
// weight e >= 2 is the base quarantine times 2^(e-2); without a first
// quarantine the n-th ban is the base times 2^(n-1). Jittered, capped at
// the max, never below the minimum (Retry-After).
//
// The failure rate of a pair is a moving average over its outcomes (a
// verdict weighs 1, a healthy answer 0, the latest a fifth); a proxy waits
// its rate times Config.FlakyDelay on top of the cooldown after each
// release, and at least that long after a verdict. A first strike is no
// verdict: it does not count.

// healthAlpha and healthForget are lib.lua's HEALTH_ALPHA and HEALTH_FORGET.
const (
	healthAlpha  = 0.2
	healthForget = 0.01
)

// strike is a proxy's run of bans on a scope: n in a row (0: healthy there
// since last), the last at last, its quarantine until till (unix ms).
type strike struct {
	n          int
	last, till int64
}

// Penalty is what Strike or Confirm made of a refusal.
type Penalty struct {
	Quarantine time.Duration
	Until      time.Time // the quarantine's end: give it back to Confirm or Lift
	InARow     int       // strikes in a row, this one included
	First      bool      // a first strike: the first quarantine, awaiting evidence
	Healthy    bool      // the proxy had a healthy answer on the site, and no strike since, before this one
}

// Strike quarantines the proxy with ID id on site after a refusal, by the
// evidence (see above): certain for a refusal that is proof by itself,
// minimum for the site's Retry-After, jitter in permille (850..1150 spreads
// the ends). It fails with ErrInvalid on an empty ID or site.
func (p *Pool[P]) Strike(id, site string, certain bool, minimum time.Duration, jitter int) (Penalty, error) {
	if site == "" || id == "" {
		return Penalty{}, fail(ErrInvalid, fmt.Sprintf("strike of proxy %q on site %q: want an ID and a site", id, site))
	}
	return p.strike(id, p.scopeOf(site), certain, minimum, jitter, nil), nil
}

// Strike is Pool.Strike on the lease's proxy and site: the lease ends
// with it. After the lease ended it still strikes the proxy.
func (l *Lease[P]) Strike(certain bool, minimum time.Duration, jitter int) Penalty {
	var holder *Lease[P]
	if l.released.CompareAndSwap(false, true) {
		holder = l
	}
	return l.pool.strike(l.proxy.ID(), l.scope, certain, minimum, jitter, holder)
}

func (p *Pool[P]) strike(id, scope string, certain bool, minimum time.Duration, jitter int, l *Lease[P]) Penalty {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock()
	k := banKey{scope, id}
	n, healthy, running := 1, false, int64(0)
	if s, ok := p.strikes[k]; ok && now-s.last <= 2*p.cfg.MaxQuarantine.Milliseconds() {
		n = s.n + 1
		healthy = n == 1
		if now < s.till {
			n, running = s.n, s.till
		}
	}
	return p.sentenceLocked(k, n, certain, healthy, minimum, jitter, running, now, l)
}

// sentenceLocked quarantines k's proxy for its n-th strike in a row; p.mu
// is held.
func (p *Pool[P]) sentenceLocked(k banKey, n int, certain, healthy bool, minimum time.Duration, jitter int, running, now int64, l *Lease[P]) Penalty {
	base, maxq := p.cfg.Quarantine.Milliseconds(), p.cfg.MaxQuarantine.Milliseconds()
	e := n
	if certain {
		e++
	}
	q, short := float64(base)*pow2(n-1), false
	if p.cfg.FirstQuarantine > 0 {
		if e <= 1 {
			q, short = float64(p.cfg.FirstQuarantine.Milliseconds()), true
		} else {
			q = float64(base) * pow2(e-2)
		}
	}
	d := int64(min(q, float64(maxq)))
	d = min(d*int64(jitter)/1000, maxq)
	d = max(d, min(minimum.Milliseconds(), maxq), 1)
	until := now + d
	if running > until {
		until, d, short = running, running-now, false
	}
	p.strikes[k] = strike{n: n, last: now, till: until}
	p.banLocked(k.id, k.scope, until, l)
	if !short {
		p.holdLocked(k, p.noteLocked(k, true), now)
	}
	return Penalty{Quarantine: time.Duration(d) * time.Millisecond, Until: time.UnixMilli(until), InARow: n, First: short, Healthy: healthy}
}

// Confirm makes the strike of the proxy with ID id on site that ends at
// until (Penalty.Until) a verdict: the URL it refused was served through
// another proxy. Sentenced as a certain refusal, it counts in the failure
// rate. It reports false when the strike is no longer on record (a healthy
// answer, a lift or a newer strike since): nothing changes then.
func (p *Pool[P]) Confirm(id, site string, until time.Time) (Penalty, bool) {
	k := banKey{p.scopeOf(site), id}
	p.mu.Lock()
	defer p.mu.Unlock()
	s, ok := p.strikes[k]
	if !ok || s.n < 1 || s.till != until.UnixMilli() {
		return Penalty{}, false
	}
	now := p.clock()
	return p.sentenceLocked(k, s.n, true, false, 0, 1000, s.till, now, nil), true
}

// Lift takes back the first strike of the proxy with ID id on site that
// ends at until (Penalty.Until): the page refused everyone. A proxy
// healthy there before is healthy again; one never healthy there keeps the
// strike on record, ended now (an unproven lift: its next refusal there is
// a repeat). Its slots the strike pushed out are free again. It reports
// whether it lifted one.
func (p *Pool[P]) Lift(id, site string, until time.Time, healthy bool) bool {
	k := banKey{p.scopeOf(site), id}
	till := until.UnixMilli()
	p.mu.Lock()
	defer p.mu.Unlock()
	s, ok := p.strikes[k]
	if !ok || s.n != 1 || s.till != till {
		return false
	}
	now := p.clock()
	if healthy {
		p.strikes[k] = strike{last: now}
	} else {
		// An unproven lift (lift.lua): the strike stays on record, ended
		// now, so that the proxy's next refusal there is a repeat, not a
		// fresh first strike, until a healthy answer there.
		p.strikes[k] = strike{n: 1, last: s.last, till: now}
	}
	if p.bans[k] == till {
		delete(p.bans, k)
	}
	if st := p.sites[k.scope]; st != nil {
		free := p.startLocked(k.scope, k.id, now)
		for _, sl := range st.slots[k.id] {
			if sl.next == till && !sl.live(now) {
				st.setNext(sl, free, p.nextSeq())
			}
		}
	}
	p.signalLocked()
	return true
}

// Failed counts a proxy failure of the proxy with ID id on site in its
// failure rate there, holding it back by Config.FlakyDelay accordingly
// (its quarantine is Ban's).
func (p *Pool[P]) Failed(id, site string) {
	k := banKey{p.scopeOf(site), id}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holdLocked(k, p.noteLocked(k, true), p.clock())
}

// FailureRate returns the failure rate of the proxy with ID id on site
// (0 to 1).
func (p *Pool[P]) FailureRate(id, site string) float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.health[banKey{p.scopeOf(site), id}]
}

// outcomeLocked notes a release of id's lease on scope (healthy: after a
// healthy answer) and returns the extra wait its failure rate earns, in
// ms; p.mu is held.
func (p *Pool[P]) outcomeLocked(scope, id string, healthy bool, now int64) int64 {
	k := banKey{scope, id}
	if healthy {
		p.strikes[k] = strike{last: now}
	}
	if p.cfg.FlakyDelay <= 0 {
		return 0
	}
	r := p.health[k]
	if healthy {
		r = p.noteLocked(k, false)
	}
	return int64(r * float64(p.cfg.FlakyDelay.Milliseconds()))
}

// noteLocked records one outcome of k (failed or not) and returns its new
// failure rate; p.mu is held. Off without a flaky delay.
func (p *Pool[P]) noteLocked(k banKey, failed bool) float64 {
	if p.cfg.FlakyDelay <= 0 {
		return 0
	}
	r := p.health[k]
	if !failed && r == 0 {
		return 0
	}
	r *= 1 - healthAlpha
	if failed {
		r += healthAlpha
	}
	if r < healthForget {
		delete(p.health, k)
		return 0
	}
	p.health[k] = r
	return r
}

// holdLocked keeps k's proxy, failure rate r, out of its scope at least
// r times the flaky delay from now: slots not leased are pushed out to it.
func (p *Pool[P]) holdLocked(k banKey, r float64, now int64) {
	until := now + int64(r*float64(p.cfg.FlakyDelay.Milliseconds()))
	st := p.sites[k.scope]
	if until <= now || st == nil {
		return
	}
	for _, s := range st.slots[k.id] {
		if !s.live(now) && s.next < until {
			st.setNext(s, until, p.nextSeq())
		}
	}
}

// sweepEvidenceLocked forgets runs of strikes too old to count; p.mu is
// held.
func (p *Pool[P]) sweepEvidenceLocked(now int64) {
	for k, s := range p.strikes {
		if s.till <= now && now-s.last > 2*p.cfg.MaxQuarantine.Milliseconds() {
			delete(p.strikes, k)
		}
	}
}

// forgetScopeLocked drops the failure rates on a scope the pool forgets
// (idle); p.mu is held.
func (p *Pool[P]) forgetScopeLocked(scope string) {
	for k := range p.health {
		if k.scope == scope {
			delete(p.health, k)
		}
	}
}

func pow2(n int) float64 {
	if n <= 0 {
		return 1
	}
	return float64(uint64(1) << min(n, 62))
}
