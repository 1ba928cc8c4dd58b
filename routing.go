package proxyswitch

import (
	"context"
	"fmt"
	"slices"
)

// Pools by proxy type: datacenter IPs for bulk catalog scans, residential or
// mobile ones for sessions. Each pool is independent in Redis (its own keys
// under its own hash tag, so pools spread over the masters of a Redis
// Cluster); a route names the pools a request may lease from, in order. A
// request leases from the first pool that has a free proxy for its site and
// falls back to the next one only while every proxy of the earlier ones is
// busy, quarantined or gone (an empty pool). A proxy listed in two pools is
// two proxies: keep the pools disjoint.
//
// A pool too hot for one Redis node is split the same way: load its proxies
// into several pools (shard.PoolNames names them, shard.Split deals the proxies
// out) and route to all of them with WithSpread, which starts each lease at
// another one.

type routeConfig struct {
	bySite map[string]route // "" = every site without a route of its own
}

type route struct {
	pools  []string
	spread bool // start at a pool picked per lease, not at the first
}

// WithRoute makes the requests to site ("" for every site without a route of
// its own) lease from pools in order: a later pool only while every proxy of
// the earlier ones is busy, quarantined or gone. Every option of the Switch
// applies to every pool. The default is the Switch's own pool.
func WithRoute(site string, pools ...string) Option {
	return func(c *config) { c.setRoute(site, route{pools: append([]string(nil), pools...)}) }
}

// WithSpread is WithRoute for the parts of one hot pool (shard.PoolNames):
// each lease starts at another pool, round-robin, so the load spreads evenly.
// The default is no spread.
func WithSpread(site string, pools ...string) Option {
	return func(c *config) { c.setRoute(site, route{pools: append([]string(nil), pools...), spread: true}) }
}

func (c *config) setRoute(site string, r route) {
	if c.routes.bySite == nil {
		c.routes.bySite = map[string]route{}
	}
	c.routes.bySite[site] = r
}

type poolsKey struct{}

// UsePools returns a copy of ctx whose requests lease from pools as
// WithRoute does, whatever their site's route. Give it to a collector
// (Collector.Context) or to Switch.Lease. No pools means the site's route.
func UsePools(ctx context.Context, pools ...string) context.Context {
	return context.WithValue(ctx, poolsKey{}, route{pools: append([]string(nil), pools...)})
}

func (rc *routeConfig) validate(c *config) error {
	for site, r := range rc.bySite {
		if len(r.pools) == 0 {
			return fmt.Errorf("%w: route of site %q names no pool", ErrConfig, site)
		}
		for _, p := range r.pools {
			if _, err := newKeyspace(c.prefix, p); err != nil {
				return err
			}
		}
	}
	return nil
}

// routeFor returns the pools a lease for site leases from, or nil for the
// Switch's own pool alone.
func (s *Switch) routeFor(ctx context.Context, site string) *route {
	rc := &s.cfg.routes
	if r, ok := ctx.Value(poolsKey{}).(route); ok && len(r.pools) > 0 {
		return &r
	}
	if len(rc.bySite) == 0 {
		return nil
	}
	r, ok := rc.bySite[site]
	if !ok {
		r, ok = rc.bySite[""]
	}
	if !ok {
		return nil
	}
	return &r
}

// routedPools names every pool a route names (Start prepares their
// fallback shards).
func (s *Switch) routedPools() []string {
	var out []string
	for _, r := range s.cfg.routes.bySite {
		for _, p := range r.pools {
			if !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	return out
}
