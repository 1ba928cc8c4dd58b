package proxyswitch

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/proxyswitch/proxyswitch/ban"
)

// Acting on a verdict: quarantine, backoff, dead proxies, counters.
//
// A ban is one owner-checked script (penalize.lua): it pushes the scores
// of all K slots of the proxy in the site's free set to now + quarantine and
// ends the lease. Every worker of the pool, in any process, skips the proxy
// for that site from its next lease on, and the proxy comes back by itself
// when the score passes. A first refusal is a strike with the short first
// quarantine, a repeated or confirmed one a ban (Bans.EvidenceFirst, and the
// evidence section below). Repeat offenders (bans in a row with no healthy
// answer in between) get a doubled, jittered quarantine; a healthy answer
// starts the backoff over (release.lua). A proxy that keeps failing is
// marked dead: its slots go out of every site's rotation until Revive or
// probe.CheckDead (see Bans.DeadAfter for the rule).

// BanKey names one counter of BanCounts.
type BanKey struct {
	Site   string // the site, as the site function names it
	Reason string // the verdict's reason: "http_429", "missing_selector", "proxy_timeout"...
}

// banCounters counts verdicts acted on, in this process.
type banCounters struct {
	mu sync.Mutex
	m  map[BanKey]int64
}

func (c *banCounters) add(k BanKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[BanKey]int64)
	}
	c.m[k]++
}

// BanCounts returns this process's counts of bans and proxy failures by site
// and reason. It is safe for concurrent use.
func (s *Switch) BanCounts() map[BanKey]int64 {
	s.bans.mu.Lock()
	defer s.bans.mu.Unlock()
	out := make(map[BanKey]int64, len(s.bans.m))
	for k, v := range s.bans.m {
		out[k] = v
	}
	return out
}

// penalize quarantines proxy p on site after a ban.Ban or ban.ProxyFailure verdict,
// counts it and tells the observer. If l is p's lease for site, it ends
// with it (owner-checked); a lease for another scope is left to the caller.
// The quarantine happens where l came from, or in the Switch's own pool.
func (s *Switch) penalize(ctx context.Context, site string, p *Proxy, l *Lease, v ban.Verdict) (penalty, error) {
	s.bans.add(BanKey{Site: site, Reason: v.Reason})
	be := backend(s.own)
	if l != nil {
		be = l.be
	}
	if v.Kind == ban.Ban && !siteOnly(v) {
		if pen, ok := s.brk.absorb(ctx, site, be, l); ok {
			return pen, nil // the site's circuit breaker holds it: the storm is the site's (breaker.go)
		}
	}
	pen, err := be.penalize(ctx, site, p, l, v)
	if pen.ended && l != nil && l.released.Load() {
		s.renew.drop(l)
	}
	if err != nil {
		return pen, err
	}
	if !pen.hold {
		s.observeQuarantine(be.pool(), site, p, v, pen)
		s.clients.closeProxy(p.id, s.quarantineScope(site, v)) // its idle connections there (client.go)
	}
	if v.Kind == ban.Ban && !siteOnly(v) {
		// The site's circuit breaker counts the attempt, and the ban when
		// it is evidence (penalty.evidence): the report may open the
		// breaker, lifting this quarantine. A first strike is reported when
		// confirmed or left unresolved (unresolvedRefusals).
		if pen.evidence() {
			s.brk.reportBan(ctx, site, be.redis(), p, 1)
		} else {
			s.brk.tally(be.redis(), site, 1)
		}
	}
	return pen, nil
}

// quarantineScope is the site a verdict quarantines a proxy on: site for a
// ban, "" (every site) for a proxy failure or with Bans.AllSites.
func (s *Switch) quarantineScope(site string, v ban.Verdict) string {
	if v.Kind == ban.ProxyFailure || banAll(&s.cfg, v) {
		return ""
	}
	return site
}

// Report ends the lease with what the request made through it showed, for
// callers of Lease who make requests themselves (Attach does this for Colly):
// ban.OK or ban.Neutral release the proxy; ban.Ban quarantines it on the
// lease's site (a strike first); ban.ProxyFailure quarantines it and counts
// towards a dead mark; ban.Pass only releases it. Every worker acts on it;
// bans count in BanCounts. A ban or failure reported after the lease ended
// still quarantines the proxy. It is safe for concurrent use.
func (l *Lease) Report(ctx context.Context, v ban.Verdict) error {
	if err := l.made(); err != nil {
		return err
	}
	switch v.Kind {
	case ban.Ban, ban.ProxyFailure:
		if !ban.ValidReason(v.Reason) {
			v.Reason = ban.ReasonCustom
		}
		_, err := l.sw.penalize(ctx, l.site, l.proxy, l, v)
		return err
	case ban.OK, ban.Neutral:
		l.healthy.Store(true)
	}
	l.sw.brk.attempt(l, l.site, v) // the site's circuit breaker counts it (breaker.go)
	return l.Release(ctx)
}

// Dead lists the proxies of the pool marked dead or drained, with State,
// Since and Reason. It is safe for concurrent use.
func (s *Switch) Dead(ctx context.Context) ([]ProxyState, error) { return s.own.redis().dead(ctx) }

func (rp *redisPool) dead(ctx context.Context) ([]ProxyState, error) {
	var out []ProxyState
	err := scanHash(ctx, rp.rdb, rp.cfg.redisTimeout, "dead", rp.keys.dead(), rp.keys.proxies(), func(id string, v []string) error {
		p, err := rp.sw.poolEntry(rp.keys.proxies(), id, v[1])
		if err != nil {
			return err
		}
		ms, reason, _ := strings.Cut(v[0], "|")
		n, _ := strconv.ParseInt(ms, 10, 64)
		state := StateDead
		if reason == "drained" {
			state = StateDrained
		}
		out = append(out, ProxyState{Proxy: p, State: state, Since: time.UnixMilli(n), Reason: reason})
		return nil
	})
	if err != nil {
		return nil, err
	}
	sortProxies(out, func(d ProxyState) *Proxy { return d.Proxy })
	return out, nil
}

// Revive brings dead or drained proxies (URLs or IDs) back into every site's
// rotation and returns how many; with a reason, only those Drain marked with
// it. A Revive of many is not atomic. It is safe for concurrent use.
func (s *Switch) Revive(ctx context.Context, reason string, proxies ...string) (int, error) {
	if reason != "" {
		if err := checkReason(reason); err != nil {
			return 0, err
		}
	}
	ids, err := proxyIDs(proxies)
	if err != nil || len(ids) == 0 {
		return 0, err
	}
	return s.revive(ctx, reason, ids)
}

// revive runs revive.lua for ids, only those marked with reason unless it
// is empty: in calls of a page of proxies each, each proxy's revival
// atomic across the sites, the whole not.
func (s *Switch) revive(ctx context.Context, reason string, ids []any) (int, error) {
	n := 0
	for rest := ids; len(rest) > 0; {
		argv := append([]any{s.keys.base, s.cfg.slots, reason, pageSize()}, rest[:min(len(rest), pageSize())]...)
		revived, done, err := chunkCall(ctx, s.cfg.redisTimeout, func(ctx context.Context) ([]int64, error) {
			return reviveScript.Run(ctx, s.rdb, []string{s.keys.dead(), s.keys.fails(), s.keys.sites()}, argv...).Int64Slice()
		}, len(argv)-4)
		if err != nil {
			return n, redisErr("revive", err)
		}
		n += revived
		rest = rest[done:]
	}
	return n, nil
}

// Evidence before verdict (Bans.EvidenceFirst).
//
// penalize.lua keeps, per site, each proxy's strikes: a first refusal that
// is not unambiguous gets the short first quarantine; the same proxy
// refused again, or its refusal confirmed, gets the base one. The request's
// binding keeps the refusals it met (refusal), from which the transport
// tells the page from the IP: when the same URL is refused through enough
// proxies that were healthy on the site, the page refuses everyone, and
// the strikes it cost are lifted (lift.lua). When the URL is then served
// through another proxy, the strikes it cost are confirmed.

// refusal is one ban a request met: what is needed to confirm or lift it.
type refusal struct {
	url    string     // the hop's URL
	site   string     // the site the proxy was banned on
	proxy  *Proxy     // the proxy refused
	rp     *redisPool // where the strike lives
	pen    penalty    // what penalize.lua made of it
	status int        // the site's answer (0: none, a transport error)
}

// unambiguous reports whether a ban verdict is proof by itself: a redirect
// to, or a chain landing on, a challenge page.
func unambiguous(v ban.Verdict) bool {
	return v.Kind == ban.Ban && v.Reason == ban.ReasonChallenge
}

// rateLimited reports whether a refusal is about the client's pace (a 429,
// or any refusal with Retry-After): learned pacing and the site's circuit
// breaker answer those. It is never evidence that a page refuses everyone:
// a per-IP rate limit refuses one URL through several healthy proxies in a
// row while the fleet learns the pace.
func rateLimited(x *ban.Exchange, v ban.Verdict) bool {
	return x.StatusCode == http.StatusTooManyRequests || v.RetryAfter > 0
}

// pageRefused reports whether the refusals b met on url (site) make it the
// page's answer rather than the proxies': refused through at least
// Bans.EvidenceFirst's pageProxies distinct proxies, none unambiguously, each
// a witness. The first refusal's proxy is one when it had no strike on the
// site before; a later one only when it is healthy on the site's other
// pages: a healthy answer there, and no strike since, after the site's
// last verdict on a proxy (penalize.lua); or a lift of its strike (another
// page's verdict) after that verdict and after the first refusal.
// Proxies burnt from the start never count twice (they never had a
// healthy answer). Proxies burnt together while healthy look like such a
// page to a request that meets two of them in a row, before any of them
// is proven burnt: it fails with ErrPageRefused, and they are lifted as
// unproven, no witnesses of refusals older than the lift (the next request
// that meets them both started after it); once one of them is
// refused on a request that another proxy then serves, its strike is
// confirmed, a verdict, and none of the others is a witness until it is
// healthy again. It then lifts the first strikes the page cost (the
// proxies are as they were before) and forgets them.
func (s *Switch) pageRefused(ctx context.Context, b *binding, url, site string) bool {
	need := s.cfg.pageProxies
	if need == 0 {
		return false
	}
	rs := b.refusalsOf(url, site)
	witness := map[string]bool{}
	for i, r := range rs {
		if r.pen.witness || (i == 0 && r.pen.strikes == 1) || r.pen.lifted.After(rs[0].pen.at) {
			witness[r.proxy.id] = true
		}
	}
	if len(witness) < need {
		return false
	}
	s.settleStrikes(ctx, b, url, site, (*redisPool).lift, "proxyswitch: lifting a strike the page cost failed; it ends by itself")
	return true
}

// confirmRefusals confirms the first strikes b met on url: the URL was
// then served through another proxy, so the refusals were the proxies'.
// Each strike confirmed is a ban for the site's circuit breaker.
func (s *Switch) confirmRefusals(ctx context.Context, b *binding, url, site string) {
	s.settleStrikes(ctx, b, url, site, func(rp *redisPool, ctx context.Context, site string, px *Proxy, pen penalty) error {
		ok, err := rp.confirm(ctx, site, px, pen)
		if ok {
			s.brk.reportBan(ctx, site, rp, px, 0)
		}
		return err
	}, "proxyswitch: confirming a strike failed; it stays a first strike")
}

// unresolvedRefusals reports to the site's circuit breaker the first
// strikes b met on url that nothing settled: the request ends refused
// through every proxy it tried, neither served (confirm) nor the page's
// answer (lift). That is evidence against the site or the proxies (a
// storm refuses every page through every proxy), though not enough to
// sentence any one of them: their strikes stay first strikes.
func (s *Switch) unresolvedRefusals(ctx context.Context, b *binding, url, site string) {
	for _, r := range b.takeRefusals(url, site) {
		if r.pen.first {
			s.brk.reportBan(ctx, r.site, r.rp, r.proxy, 0)
		}
	}
}

// settleStrikes takes the refusals b met on url and applies act (lift or
// confirm) to each first strike among them, logging a failure with msg.
func (s *Switch) settleStrikes(ctx context.Context, b *binding, url, site string,
	act func(*redisPool, context.Context, string, *Proxy, penalty) error, msg string) {
	for _, r := range b.takeRefusals(url, site) {
		if !r.pen.first {
			continue
		}
		if err := act(r.rp, ctx, r.site, r.proxy, r.pen); err != nil {
			s.cfg.logger.Warn(msg, "proxy", r.proxy.String(), "site", r.site, "err", err)
		}
	}
}

// confirm runs penalize.lua's "confirm" on px's strike pen on site: still
// on record, it becomes a ban of the base quarantine (ok). No lease ends.
func (rp *redisPool) confirm(ctx context.Context, site string, px *Proxy, pen penalty) (ok bool, _ error) {
	if pen.local != nil { // a strike of the local shard (fallbacklease.go)
		if _, ok := pen.local.Confirm(px.id, site, pen.until); ok {
			rp.sw.observeEvidence(rp.name, site, px, "confirmed", "")
			return true, nil
		}
		return false, nil
	}
	c, k := rp.cfg, rp.keys
	scope := rp.sw.scopeOf(site)
	all := "0"
	if c.banAllSites {
		all = "1"
	}
	keys := []string{k.free(scope), k.leases(scope), k.strikes(scope), k.fails(), k.dead(), k.sites(), k.quarantine(),
		k.health(scope), k.pace(scope)}
	flaky := c.flakyDelay // a confirmed refusal counts in the proxy's failure rate
	if pen.paced {
		flaky = 0 // ... unless it was the site's pace (learned pacing)
	}
	healthy := "0" // a healthy proxy burnt: the site's burnt mark (penalize.lua)
	if pen.healthy {
		healthy = "1"
	}
	argv := []any{"confirm", px.id, "", "", c.quarantine.Milliseconds(), c.maxQuarantine.Milliseconds(), 0,
		850 + rand.N(301), all, k.base, c.idleTTL.Milliseconds(), "0", c.deadAfter, site, "confirmed", c.slots,
		c.firstQuarantine.Milliseconds(), healthy, pen.until.UnixMilli(), flaky.Milliseconds(), ""}
	res, err := roundTrip(ctx, rp.timeout, func(ctx context.Context) ([]int64, error) {
		return penalizeScript.Run(ctx, rp.rdb, keys, argv...).Int64Slice()
	}, nil)
	if err != nil {
		return false, redisErr("confirm", err)
	}
	if len(res) != 11 {
		return false, fmt.Errorf("%w: confirm reply of %d items", ErrCorrupt, len(res))
	}
	if res[0] > 0 {
		c.logger.Debug("proxyswitch: strike confirmed", "proxy", px.String(), "site", site,
			"for", time.Duration(res[0])*time.Millisecond)
		rp.sw.observeEvidence(rp.name, site, px, "confirmed", "")
	}
	return res[0] > 0, nil
}

// lift runs lift.lua: px's first strike pen on site is taken back.
func (rp *redisPool) lift(ctx context.Context, site string, px *Proxy, pen penalty) error {
	if pen.local != nil { // a strike of the local shard (fallbacklease.go)
		if pen.local.Lift(px.id, site, pen.until, pen.healthy) {
			rp.sw.observeEvidence(rp.name, site, px, "lifted", "")
		}
		return nil
	}
	scope := rp.sw.scopeOf(site)
	healthy := "0"
	if pen.healthy {
		healthy = "1"
	}
	keys := []string{rp.keys.free(scope), rp.keys.strikes(scope)}
	n, err := roundTrip(ctx, rp.timeout, func(ctx context.Context) (int64, error) {
		return liftScript.Run(ctx, rp.rdb, keys, px.id, rp.cfg.slots, pen.until.UnixMilli(), healthy).Int64()
	}, nil)
	if err != nil {
		return redisErr("lift", err)
	}
	if n >= 0 {
		rp.sw.observeEvidence(rp.name, site, px, "lifted", "")
	}
	return nil
}
