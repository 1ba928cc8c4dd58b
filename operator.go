package proxyswitch

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/engine"
)

// Operator actions: what an operator (or cmd/proxyswitch) does to one proxy
// by hand. Each is one Lua script and takes effect for every worker from its
// next lease on.

// ReasonOperator is the reason of an operator's Ban. It and ReasonSiteProbe
// are reserved: a Classifier giving either counts as ban.ReasonCustom.
const ReasonOperator = "operator"

// ReasonSiteProbe is the reason of a site probe's ban (package probe): it
// quarantines the proxy on that site only, for its RetryAfter at least, and
// the breaker does not count it. Unban lifts it. Reserved, as ReasonOperator.
const ReasonSiteProbe = "site_probe"

// siteOnly reports whether v quarantines on the site only whatever
// Bans.AllSites: a site probe's verdict.
func siteOnly(v ban.Verdict) bool { return v.Kind == ban.Ban && v.Reason == ReasonSiteProbe }

// banAll reports whether v quarantines the proxy on every site: a ban with
// Bans.AllSites, but a site probe's.
func banAll(c *config, v ban.Verdict) bool {
	return c.banAllSites && v.Kind == ban.Ban && !siteOnly(v)
}

// Ban quarantines proxy (URL or ID) on site for at least d, for every
// worker. site is named as the site function names it (by default the
// lower-case host[:port]); an empty one is an error. It is safe for
// concurrent use.
func (s *Switch) Ban(ctx context.Context, proxy, site string, d time.Duration) error {
	if err := checkSite(site); err != nil {
		return err
	}
	p, err := s.find(ctx, proxy)
	if err != nil {
		return err
	}
	if d <= 0 {
		return fmt.Errorf("%w: ban duration %v must be positive", ErrConfig, d)
	}
	// A quarantine lives in the site's free set, which lease.lua builds
	// on a site's first lease. One lease attempt, preferring the proxy, makes
	// sure the set exists; if it leased the proxy, the ban ends that lease.
	l, _, err := s.own.tryLease(ctx, site, s.scopeOf(site), p.id)
	if err != nil && !errors.Is(err, ErrEmptyPool) {
		return err
	}
	if l != nil && l.proxy.id != p.id {
		l.unused.Store(true) // another proxy, never used: back at once, with no cooldown
		if err := l.Release(ctx); err != nil {
			return err
		}
		l = nil
	}
	_, err = s.penalize(ctx, site, p, l, ban.Verdict{Kind: ban.Ban, Reason: ReasonOperator, RetryAfter: d})
	return err
}

// Unban ends proxy's quarantine on site now and starts its backoff over; it
// does not revive a dead or drained proxy nor lift a ban on every site.
// With exit IPs recorded (package probe), it also lifts the hold on site of
// proxy's exit IP that an entry which left that IP carried over to it
// (not a hold on every site).
func (s *Switch) Unban(ctx context.Context, proxy, site string) error {
	if err := checkSite(site); err != nil {
		return err
	}
	p, err := s.find(ctx, proxy)
	if err != nil {
		return err
	}
	scope := s.scopeOf(site)
	_, err = roundTrip(ctx, s.cfg.redisTimeout, func(ctx context.Context) (int64, error) {
		return engine.Unban{Free: s.keys.free(scope), Lease: s.keys.leases(scope), Strikes: s.keys.strikes(scope),
			Proxy: p.id, Slots: s.cfg.slots}.Run(ctx, s.rdb).Int64()
	}, nil)
	if err != nil {
		return redisErr("unban", err)
	}
	return nil
}

// siteHold runs site_hold.lua on site's scope (hooks.SiteHold, for
// package probe): the quarantines site probes put proxies under there.
// "list" reads the ledger in pages (one HSCAN page per call).
func (s *Switch) siteHold(ctx context.Context, mode, site string, ids []string, ttl time.Duration) ([]string, error) {
	scope := s.scopeOf(site)
	call := func(args []string) ([]string, error) {
		res, err := roundTrip(ctx, s.cfg.redisTimeout, func(ctx context.Context) ([]string, error) {
			return engine.SiteHold{Ledger: s.keys.siteHold(scope), Free: s.keys.free(scope), Lease: s.keys.leases(scope),
				Strikes: s.keys.strikes(scope), Mode: mode, Slots: s.cfg.slots, TTL: ttl, Site: site, IDs: args}.Run(ctx, s.rdb).StringSlice()
		}, nil)
		if err != nil {
			return nil, redisErr("site probe quarantines", err)
		}
		return res, nil
	}
	if mode != "list" {
		return call(ids)
	}
	seen := map[string]bool{}
	var out []string
	for cursor := "0"; ; {
		res, err := call([]string{cursor, strconv.Itoa(pageSize())})
		if err != nil {
			return nil, err
		}
		if len(res) == 0 {
			return nil, fmt.Errorf("%w: site_hold list answered nothing", ErrCorrupt)
		}
		for _, id := range res[1:] {
			if !seen[id] {
				seen[id] = true
				out = append(out, id)
			}
		}
		if cursor = res[0]; cursor == "0" {
			return out, nil
		}
	}
}

// Clear deletes every key of the pool, and nothing of other pools, leaving a
// mark so that no Switch re-seeds it. Running workers get ErrEmptyPool until
// it is loaded again. Sessions lapse with their TTL.
func (s *Switch) Clear(ctx context.Context) error {
	for {
		n, err := roundTrip(ctx, s.cfg.redisTimeout, func(ctx context.Context) (int64, error) {
			return engine.Clear{Sites: s.keys.sites(), Others: []string{s.keys.proxies(), s.keys.meta(), s.keys.fails(),
				s.keys.quarantine(), s.keys.dead(), s.keys.members(), s.keys.memberOwners(), s.keys.modes(), s.keys.liveSessions(), s.keys.breaker(), s.keys.order(), s.keys.cursor(), s.keys.gateways(), s.keys.labels(), s.keys.relabel(), s.keys.sweep(), s.keys.swept()},
				Prefix: s.keys.base, Budget: max(1, pageSize()/5), Entries: pageSize()}.Run(ctx, s.rdb).Int64()
		}, nil)
		if err != nil {
			return redisErr("clear", err)
		}
		if n >= 0 {
			return nil
		}
	}
}

// find resolves a proxy named by URL or ID to the pool's entry.
func (s *Switch) find(ctx context.Context, proxy string) (*Proxy, error) {
	id := proxy
	if !isProxyID(proxy) {
		p, err := ParseProxy(proxy)
		if err != nil {
			return nil, err
		}
		id = p.id
	}
	res, err := roundTrip(ctx, s.cfg.redisTimeout, func(ctx context.Context) ([]string, error) {
		return engine.Find{Pool: s.keys.proxies(), Labels: s.keys.labels(), Proxy: id}.Run(ctx, s.rdb).StringSlice()
	}, nil)
	if err != nil {
		return nil, redisErr("find", err)
	}
	if len(res) == 2 {
		p, err := s.poolEntry(s.keys.proxies(), id, res[0])
		if err != nil {
			return nil, err
		}
		return p.withLabels(res[1]), nil
	}
	if len(res) != 0 {
		return nil, fmt.Errorf("%w: find reply of %d items", ErrCorrupt, len(res))
	}
	return nil, fmt.Errorf("%w: no proxy %s in pool %q", ErrNotInPool, id, s.cfg.pool)
}
