package proxyswitch

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	if (v.Kind == ban.Ban && !siteOnly(v)) || s.workedBefore(ctx, site, be, p, v) {
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
	} else if siteFailure(v) {
		// A failure the site may have caused (its 502 through the proxy,
		// its slowness) of a proxy that worked on the site since its last
		// failure there (pen.healthy): evidence for the site's circuit
		// breaker at once, which opens when many distinct proxies fail on
		// the site in a row and lifts their quarantines (storm.go). A
		// proxy that never served the site, or failed there again since
		// (one dead, or answering 502 for everything), or one it made
		// dead, is an attempt only: its failure is its own.
		if pen.dead || !pen.healthy {
			s.brk.tally(be.redis(), site, 1)
		} else {
			s.brk.reportBan(ctx, site, be.redis(), p, 1)
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
	// The request went after the lease was granted; a lease held long
	// (extended) says less: a second before the report at most.
	sent := time.Now().Add(-time.Second)
	if l.granted.After(sent) {
		sent = l.granted
	}
	l.sw.brk.attempt(l, l.site, v, sent) // the site's circuit breaker counts it (breaker.go)
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
// penalize.lua keeps, per site, each proxy's strikes: a first refusal gets
// the short first quarantine; the same proxy refused again, or its refusal
// confirmed, gets the base one. The request's binding keeps the refusals it
// met (refusal), from which the transport tells the page from the IP
// (pageRefused): a URL refused, with the same answer, through enough
// distinct proxies none of which was refused on another URL since its last
// healthy answer is the page refusing everyone, and the strikes it cost are
// lifted (lift.lua). When the URL is then served through another proxy, the
// strikes it cost are confirmed: the refusals were the proxies'. A proxy
// refused on another URL before (its strike there not lifted) is struck
// again here: a repeat, a ban, and no evidence of the page.
//
// A hop redirected to a challenge (captcha, login) page is a strike too,
// awaiting its evidence (challengeStrike): a challenge only some IPs get is
// confirmed, a ban of the base quarantine, as soon as another proxy is
// served the page, which is the ban at once the README promises in all but
// the instant; a challenge every proxy gets for the URL (a login wall on
// some pages, for everyone) is the page's answer like any other.

// refusal is one ban a request met: what is needed to confirm or lift it.
type refusal struct {
	url       string     // the hop's URL
	site      string     // the site the proxy was banned on
	proxy     *Proxy     // the proxy refused
	rp        *redisPool // where the strike lives
	pen       penalty    // what penalize.lua made of it
	status    int        // the site's answer (0: none, a transport error)
	reason    string     // the verdict's reason
	challenge bool       // a redirect to a challenge page (challengeStrike)
}

// unambiguous reports whether a ban verdict is proof by itself: a redirect
// to, or a chain landing on, a challenge page. The transport judges a
// redirect to one as a strike awaiting evidence all the same
// (challengeStrike); a chain landing on one stays a ban at once.
func unambiguous(v ban.Verdict) bool {
	return v.Kind == ban.Ban && v.Reason == ban.ReasonChallenge
}

// challengeStrike reports whether the quarantine through l is that of a
// hop redirected to a challenge page, which the transport weighs as a
// first strike (Lease.challengeStrike) rather than a ban at once.
func challengeStrike(l *Lease) bool { return l != nil && l.challengeStrike.Load() }

// rateLimited reports whether a refusal is about the client's pace (a 429,
// or any refusal with Retry-After): learned pacing and the site's circuit
// breaker answer those. It is never evidence that a page refuses everyone:
// a per-IP rate limit refuses one URL through several healthy proxies in a
// row while the fleet learns the pace.
func rateLimited(x *ban.Exchange, v ban.Verdict) bool {
	return x.StatusCode == http.StatusTooManyRequests || v.RetryAfter > 0
}

// pageRefused reports whether the refusals b met on url (site) make it the
// page's answer rather than the proxies'. last: the request has no retry
// left. Two rules, either of which is enough:
//
//   - witnesses (any attempt): refused through Bans.PageProxies distinct
//     proxies, none by a challenge redirect, each a witness. The first
//     refusal's proxy is one when it had no strike on the site before; a
//     later one only when it is healthy on the site's other pages: a
//     healthy answer there, and no strike since, after the site's last
//     verdict on a proxy (penalize.lua); or a lift of its strike (another
//     page's verdict) after that verdict and after the first refusal. This
//     stops a request early on a warm site.
//   - every try (last): the request was refused through PageProxies+1
//     distinct proxies or more with the same reason, each of them a first
//     strike (no strike on the site since its last healthy answer, or ever:
//     none of them refused on another URL without a lift), and no retry is
//     left. PageProxies of them at least must be fresh; the others may be
//     unproven: proxies whose strike a page verdict lifted while they had
//     never been healthy on the site (lift.lua keeps them marked until a
//     healthy answer there), which are never witnesses nor fresh first
//     strikes; so an IP the site bans is a fresh first strike once, makes
//     up the count of other pages at most, never enough alone, and when a
//     page it refused is then served its strike is confirmed. This needs no healthy answer of anyone, so it holds on a cold
//     site, and on a warm one whose witnesses other refused pages used up;
//     the one more proxy than the witness rule asks for, and every try
//     spent, keep proxies burnt together (a pool's IPs burnt at once) from
//     passing for a page: a request that meets an IP the site serves
//     before its retries run out is served, and confirms the others'
//     strikes. (Default Retries 2: three tries, PageProxies 2: three
//     distinct proxies.) A proxy refused on several URLs is struck again
//     on the second (no lift in between): a repeat, no first strike, so a
//     banned IP is no evidence of the page. The rule needs that many
//     proxies at once per page: on a cold site with more refused pages in
//     flight than a third of the pool, the first strikes of their first
//     tries hold every proxy, a last try waits one of them out, meets a
//     proxy struck on another page, a repeat, and the page ends as a ban
//     (two proxies new to the site refused on one URL cannot be told from
//     two IPs burnt from the start, which TestBurntProxiesCrawl promises
//     to catch on their first refusal).
//
// A page verdict lifts the first strikes the page cost with the verdict's
// reason (the proxies are as they were before; one never healthy on the
// site stays marked, lift.lua), forgets them, and counts in the site's run
// of page verdicts (pageRuns): once that run is long with no page served
// through this Switch in between, the site may refuse everything, a storm
// rather than pages, and this Switch alone pauses the site for itself
// (stormSuspect): a guess of one process is no evidence for the fleet's
// circuit breaker, which every server's own bans and attempts feed.
func (s *Switch) pageRefused(ctx context.Context, b *binding, url, site string, last bool) bool {
	need := s.cfg.pageProxies
	if need == 0 {
		return false
	}
	rs := b.refusalsOf(url, site)
	if len(rs) == 0 {
		return false
	}
	witness := map[string]bool{}
	firsts := map[string]bool{}
	unproven := map[string]bool{}
	reason := rs[len(rs)-1].reason
	for i, r := range rs {
		if r.pen.first && r.reason == reason {
			if r.pen.unproven {
				unproven[r.proxy.id] = true
			} else {
				firsts[r.proxy.id] = true
			}
		}
		if r.challenge || r.pen.unproven {
			continue
		}
		if r.pen.witness || (i == 0 && r.pen.strikes == 1) || r.pen.lifted.After(rs[0].pen.at) {
			witness[r.proxy.id] = true
		}
	}
	if len(witness) < need && !(last && len(firsts) >= need && len(firsts)+len(unproven) > need) {
		return false
	}
	// A run outlives the local pause it caused: the storm's pages asked
	// for after it are judged with it.
	if n := s.pageRuns.add(site, s.cfg.breaker.Window+s.cfg.breaker.Pause); s.stormSuspect(n) {
		s.pageRuns.pause(site, s.cfg.breaker.Pause, func(until time.Time) {
			s.cfg.logger.Warn("proxyswitch: site paused on this Switch alone: page refusals in a row, nothing served",
				"site", site, "refused", n, "until", until)
		})
	}
	// Only the strikes of the verdict's reason were the page's answer: a
	// refusal of another kind met on the way (a challenge redirect among
	// 403s) says nothing the page said to everyone, and stays a first
	// strike, unresolved like those of a request refused through every
	// proxy (unresolvedRefusals).
	for _, r := range b.takeRefusals(url, site) {
		switch {
		case !r.pen.first:
		case r.reason != reason:
			s.brk.reportBan(ctx, r.site, r.rp, r.proxy, 0)
		default:
			if err := r.rp.lift(ctx, r.site, r.proxy, r.pen); err != nil {
				s.cfg.logger.Warn("proxyswitch: lifting a strike the page cost failed; it ends by itself",
					"proxy", r.proxy.String(), "site", r.site, "err", err)
			}
		}
	}
	return true
}

// pageRuns counts, per site, the page verdicts (pageRefused) of this
// Switch since the site last served a page through it: many in a row are
// a storm's sign (stormSuspect), on which this Switch pauses the site for
// itself (pause, paused).
type pageRuns struct {
	n  atomic.Int64 // sites with a run or a pause: the healthy path looks no further while none has
	mu sync.Mutex
	m  map[string]*pageRun
}

type pageRun struct {
	n     int           // page verdicts in a row
	last  time.Time     // the last one's time
	stale time.Duration // how long after last the run is forgotten
	until time.Time     // the local pause's end (zero: none)
	ended chan struct{} // closed when the run ends (served): its waiters go
}

// add counts a page verdict on site and returns the run's length. A run
// whose last verdict is older than stale starts again: verdicts far apart
// (a deleted page now and then on a site this Switch crawls no more) are
// no storm.
func (p *pageRuns) add(site string, stale time.Duration) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[string]*pageRun{}
	}
	r := p.m[site]
	if r == nil {
		r = &pageRun{ended: make(chan struct{})}
		p.m[site] = r
		p.n.Add(1)
	}
	now := time.Now()
	if now.Sub(r.last) > stale {
		r.n = 0
	}
	r.n++
	r.last, r.stale = now, stale
	return r.n
}

// pause pauses site on this Switch for d, unless a pause runs already:
// then (a new pause) news is called with its end.
func (p *pageRuns) pause(site string, d time.Duration, news func(until time.Time)) {
	p.mu.Lock()
	r := p.m[site]
	if r == nil || time.Now().Before(r.until) {
		p.mu.Unlock()
		return
	}
	r.until = time.Now().Add(d)
	until := r.until
	p.mu.Unlock()
	news(until)
}

// paused reports whether site is paused on this Switch, until when, and
// the channel closed when its run ends first. A run gone stale, its pause
// over, is forgotten here (the healthy path then looks no further).
func (p *pageRuns) paused(site string) (time.Time, <-chan struct{}, bool) {
	if p.n.Load() == 0 {
		return time.Time{}, nil, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.m[site]
	if r == nil {
		return time.Time{}, nil, false
	}
	now := time.Now()
	if !now.Before(r.until) {
		if now.Sub(r.last) > r.stale {
			p.end(site, r)
		}
		return time.Time{}, nil, false
	}
	return r.until, r.ended, true
}

// wait waits out site's local pause, if any, as a request waits out a
// breaker's (acquireBy): it fails with a *SitePausedError (Local set) at
// once when the pause outlasts maxWait, or when ctx ends first.
func (p *pageRuns) wait(ctx context.Context, site string, maxWait time.Duration) error {
	deadline := time.Now().Add(maxWait)
	for {
		until, ended, ok := p.paused(site)
		if !ok {
			return nil
		}
		if until.After(deadline) {
			return &SitePausedError{Site: site, Until: until, Local: true}
		}
		t := time.NewTimer(time.Until(until))
		select {
		case <-ctx.Done():
			t.Stop()
			return withCause(&SitePausedError{Site: site, Until: until, Local: true}, ctx.Err())
		case <-ended:
			t.Stop()
		case <-t.C:
		}
	}
}

// served resets site's run, and ends its local pause: a page served
// through a proxy, or an operator's ResumeSite.
func (p *pageRuns) served(site string) {
	if p.n.Load() == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if r := p.m[site]; r != nil {
		p.end(site, r)
	}
}

// end forgets site's run r and lets its waiters go (p.mu held).
func (p *pageRuns) end(site string, r *pageRun) {
	delete(p.m, site)
	p.n.Add(-1)
	close(r.ended)
}

// stormSuspect reports whether a run of n page verdicts in a row on a site,
// with no page served through this Switch in between, is so long that the
// site may be refusing every page (a storm of 403s, challenges, missing
// selectors for everyone): twice the breaker's Burst (16 by default). This
// Switch then pauses the site for itself for Breaker.Pause (its requests
// for the site wait it out, up to Timeouts.MaxWait, else fail with a
// *SitePausedError, Local set; a page served or ResumeSite ends the run,
// and so do Breaker.Window and Pause with no page verdict), and nothing else:
// the judgment goes on as before, no proxy is blamed, and the fleet's
// circuit breaker hears nothing of the guess (other servers may be served
// the site's pages meanwhile; a storm refuses them too, and their own bans
// and attempts open it). A crawl that meets more deleted pages than that in
// a row, and nothing else, pauses itself as a storm would. Without the
// breaker there is nothing to tell: never.
func (s *Switch) stormSuspect(n int) bool {
	return s.brk.on() && n >= 2*s.cfg.breaker.Burst
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
