package proxyswitch

import (
	"context"
	"errors"
	"fmt"

	"github.com/proxyswitch/proxyswitch/ban"
)

// Site storms in proxy failures, and the storm label of a request's error.
//
// A proxy failure is the proxy's when only the proxy can be at fault (it
// could not be reached, it refused its credentials). Others the site may
// cause as well (siteFailure): a plain-HTTP proxy's 502 (it could not get
// the page: the site is down), a CONNECT refused, a broken connection, an
// attempt that outlived Timeouts.Attempt (the site is slow). Such a failure
// still quarantines the proxy on the site (a proxy that is dead, slow or
// answers 502 for every site is out of the site's rotation at once). When
// the proxy worked on the site since its last failure there (a healthy
// answer after it, worked_lib.lua: penalize.lua's healthy before), it is
// also evidence against the site, counted by the site's circuit breaker
// like a ban (breaker.go): many distinct proxies failing on one site in a
// row, with no healthy answer in between (Breaker.Burst; on a pool too
// small for that, every proxy that served the site in the window), or at
// the ban rate, open the breaker, which pauses the site, lifts the quarantines of
// the storm (their proxies still count as having worked) and lets probe
// requests through when the pause ends; while it is open or half-open such
// failures quarantine nothing (each noted as its proxy's last failure: the
// proxy must serve the site again before another failure of its is the
// storm's). A failure of a proxy that has not worked there (never served
// the site, or failed there again with no healthy answer since) is the
// proxy's alone: quarantined even while the breaker holds the site, an
// attempt only for the breaker, never taken back; so a few dead or
// 502-for-everything proxies neither open nor reopen the breaker, nor come
// back into rotation. A few pages that fail for everyone (slow for every
// IP) open no breaker: the site serves its other pages meanwhile. Each is
// judged like a page that refuses everyone: a request whose URL failed so
// through at least two distinct proxies (Bans.PageProxies) that had worked
// on the site, and was served through none, takes back the quarantines
// those failures cost (unfail.lua; only a proxy's first failure in a row
// after a healthy answer, and its failure count never below what its
// failures in a row warrant); one served through another proxy leaves
// them (the proxies failed where another did not).
//
// A request that ends refused or failed while the site's breaker is open
// or half-open fails with a *BlockedError whose Storm is set
// (ErrSiteStorm), never ErrPageRefused: its page may be good. (The first
// requests of a refusal storm, judged before the breaker opens, may still
// end as a page's refusal: see the README's known gaps.)

// ErrSiteStorm means the request ended refused or failed while its site's
// circuit breaker held the site (a storm: refusals or failures of many
// pages through every proxy at once): not the page's answer
// (ErrPageRefused never comes with it), nor the proxies'. It comes in a
// *BlockedError, with ErrBanned or ErrProxyFailed.
var ErrSiteStorm = errors.New("proxyswitch: site storm")

// siteFailure reports whether v is a proxy failure the site may have
// caused (above): any but a proxy that could not be reached or refused
// its credentials.
func siteFailure(v ban.Verdict) bool {
	return v.Kind == ban.ProxyFailure && v.Reason != ban.ReasonProxyConnect && v.Reason != ban.ReasonProxyAuth
}

// failure is one proxy failure of the site's kind a request met: what is
// needed to take its quarantine back.
type failure struct {
	url   string
	site  string
	proxy *Proxy
	rp    *redisPool
	pen   penalty
}

// unresolvedFailures takes the failures b met on url and, when they are
// the page's (through at least Bans.PageProxies distinct proxies, no fewer
// than two: the request ends served through none of them), takes back the
// quarantines they cost. b holds only failures of proxies that worked on
// the site (transport.go records those alone: pen.healthy).
func (s *Switch) unresolvedFailures(ctx context.Context, b *binding, url, site string) {
	fs := b.takeFailures(url, site)
	need := max(s.cfg.pageProxies, 2)
	if s.cfg.pageProxies == 0 {
		return // Bans.PageProxies Off: never the page
	}
	distinct := map[string]bool{}
	for _, f := range fs {
		distinct[f.proxy.id] = true
	}
	if len(distinct) < need {
		return
	}
	for _, f := range fs {
		if err := f.rp.unfail(ctx, f.site, f.proxy, f.pen); err != nil {
			s.cfg.logger.Warn("proxyswitch: taking back a failure's quarantine failed; it ends by itself",
				"proxy", f.proxy.String(), "site", f.site, "err", err)
		}
	}
}

// unfail runs unfail.lua: px's quarantine pen for a failure on site is
// taken back.
func (rp *redisPool) unfail(ctx context.Context, site string, px *Proxy, pen penalty) error {
	scope := rp.sw.scopeOf(site)
	keys := []string{rp.keys.free(scope), rp.keys.fails()}
	n, err := roundTrip(ctx, rp.timeout, func(ctx context.Context) (int64, error) {
		return unfailScript.Run(ctx, rp.rdb, keys, px.id, rp.cfg.slots, pen.until.UnixMilli(), pen.strikes).Int64()
	}, nil)
	if err != nil {
		return redisErr("unfail", err)
	}
	if n > 0 {
		rp.sw.observeEvidence(rp.name, site, px, "lifted", "")
	}
	return nil
}

// worked runs worked.lua: whether px worked on site since its last
// failure there (a healthy answer on the site's scope after it, or with
// none), as penalize.lua judges a failure's healthy before; if so, a
// failure of px now is noted as its last there. A failure of such a proxy
// is evidence of the site's trouble; any other is the proxy's. A Redis
// error answers false: the failure is the proxy's, quarantined (safe).
func (rp *redisPool) worked(ctx context.Context, site string, px *Proxy) bool {
	n, err := roundTrip(ctx, rp.timeout, func(ctx context.Context) (int64, error) {
		return workedScript.Run(ctx, rp.rdb, []string{rp.keys.strikes(rp.sw.scopeOf(site))}, px.id,
			rp.cfg.idleTTL.Milliseconds()).Int64()
	}, nil)
	return err == nil && n == 1
}

// workedBefore reports whether a proxy failure v of p on site, through
// backend be, is one the site's circuit breaker may absorb as its
// storm's: a failure the site may cause (siteFailure) of a proxy that
// worked on the site since its last failure there (worked; the failure is
// then noted as its last). It is asked only while the breaker holds the
// site (one script call then): a proxy that never served the site, or
// failed there again with no healthy answer since, is quarantined as a
// proxy failure even in a storm, and opens or reopens nothing (a few bad
// proxies do not keep a half-open breaker paused).
func (s *Switch) workedBefore(ctx context.Context, site string, be backend, p *Proxy, v ban.Verdict) bool {
	if !siteFailure(v) || !s.storm(site) {
		return false
	}
	rp := be.redis()
	return rp != nil && rp.worked(ctx, site, p)
}

// storm reports whether site's circuit breaker holds it (open or
// half-open), as this Switch last learnt it: a request that ends refused
// or failed then met the site's storm.
func (s *Switch) storm(site string) bool { return s.brk.on() && s.brk.holds(site) }

// stormLabel sets blocked's Storm when the request met a storm of its site.
func (s *Switch) stormLabel(blocked *BlockedError, site string) {
	if s.storm(site) {
		blocked.Storm = true
	}
}

// stormText is the part of a BlockedError's message that names a storm.
func stormText(e *BlockedError) string {
	if !e.Storm {
		return ""
	}
	return fmt.Sprintf(" in a storm of %s (the site, not the page nor the proxies)", e.Site)
}
