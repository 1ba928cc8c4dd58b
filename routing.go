package proxyswitch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/proxyswitch/proxyswitch/shard"
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
// into several pools (SplitPools names them, SplitProxies deals the proxies
// out) and route to all of them with WithSpread, which starts each lease at
// another one.

type routeConfig struct {
	bySite map[string]route // "" = every site without a route of its own
	kids   *sync.Map        // pool name -> *Switch; made by validate, shared by copies of the config
	routed bool             // a pool's Switch made by routing: never routes again
	parent *Switch          // the Switch that routed to it (BanCounts, observer)
}

type route struct {
	pools  []string
	spread bool // start at a pool picked per lease, not at the first
}

// WithRoute makes the requests to site (as the site function names it, ""
// for every site without a route of its own) lease from pools, in order: a
// later pool only while every proxy of the earlier ones is busy,
// quarantined or gone. Name one pool for no fallback. Pool names follow
// WithPool's rules. Every option of the Switch applies to every pool, and
// Start prepares the fallback shard of each. The default is the Switch's
// own pool (WithPool) for every site.
func WithRoute(site string, pools ...string) Option {
	return func(c *config) { c.setRoute(site, route{pools: append([]string(nil), pools...)}) }
}

// WithSpread is WithRoute for pools that split one hot pool (SplitPools):
// each lease starts at another pool, picked round-robin, and goes on to
// the others in order, so the load spreads evenly over them (and over the
// Redis Cluster masters their slots live on). The default is no spread.
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

// UsePools returns a copy of ctx whose requests lease from pools, in the
// order and with the fallback WithRoute describes, whatever their site's
// route: a route by request kind. Give it to a collector that runs one kind
// of task (Collector.Context = proxyswitch.UsePools(ctx, "residential")),
// or to Switch.Lease. No pools means the site's route.
func UsePools(ctx context.Context, pools ...string) context.Context {
	return context.WithValue(ctx, poolsKey{}, route{pools: append([]string(nil), pools...)})
}

// SplitPools names n pools that split the pool name: "name.0" to
// "name.<n-1>". Each has a hash tag of its own, hence a Redis Cluster slot
// of its own.
func SplitPools(name string, n int) []string {
	out := make([]string, max(n, 0))
	for i := range out {
		out[i] = fmt.Sprintf("%s.%d", name, i)
	}
	return out
}

// SplitProxies deals ps out to n pools by proxy ID, evenly and the same way
// on every server: load part i into pool i of SplitPools.
func SplitProxies(ps []*Proxy, n int) [][]*Proxy {
	out := make([][]*Proxy, max(n, 0))
	if n <= 0 {
		return out
	}
	for _, p := range ps {
		i := shard.Hash(p.id) % uint64(n)
		out[i] = append(out[i], p)
	}
	return out
}

func (rc *routeConfig) validate(c *config) error {
	if rc.kids == nil {
		rc.kids = &sync.Map{}
	}
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
	if rc.routed {
		return nil
	}
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

// spreadNext picks the first pool of each lease of a spread route.
var spreadNext atomic.Uint64

// tryRoute runs one lease attempt over the pools of r: a lease from the
// first pool that has one, or the shortest wait of them all.
func (s *Switch) tryRoute(ctx context.Context, r *route, site, scope, prefer string) (*Lease, time.Duration, error) {
	first := 0
	if r.spread {
		first = int(spreadNext.Add(1) % uint64(len(r.pools)))
	}
	wait := time.Duration(-1)
	var empty error
	for i := range r.pools {
		sw, err := s.poolSwitch(r.pools[(first+i)%len(r.pools)])
		if err != nil {
			return nil, 0, fmt.Errorf("%w: %w", ErrNoProxy, err)
		}
		l, w, err := sw.tryLease(ctx, site, scope, prefer)
		switch {
		case l != nil:
			return l, 0, nil
		case errors.Is(err, ErrEmptyPool):
			empty = err
			continue
		case err != nil:
			return nil, 0, err
		}
		if wait < 0 || w < wait {
			wait = w
		}
	}
	if wait < 0 {
		return nil, 0, empty
	}
	return nil, wait, nil
}

// poolSwitch returns the Switch that leases from pool name for s: the
// Switch's options with another pool, sharing s's fallback.
func (s *Switch) poolSwitch(name string) (*Switch, error) {
	kids := s.cfg.routes.kids
	if v, ok := kids.Load(name); ok {
		return v.(*Switch), nil
	}
	keys, err := newKeyspace(s.cfg.prefix, name)
	if err != nil {
		return nil, err
	}
	c, err := NewSwitch(s.rdb)
	if err != nil {
		return nil, err
	}
	c.cfg = s.cfg
	c.cfg.pool, c.cfg.routes.routed, c.cfg.routes.parent = name, true, s
	c.keys, c.fb = keys, s.fb
	v, _ := kids.LoadOrStore(name, c)
	return v.(*Switch), nil
}

// routedPools returns the Switches of every pool a route names (Start
// prepares their fallback shards).
func (s *Switch) routedPools() ([]*Switch, error) {
	var out []*Switch
	seen := map[string]bool{}
	for _, r := range s.cfg.routes.bySite {
		for _, p := range r.pools {
			if seen[p] {
				continue
			}
			seen[p] = true
			sw, err := s.poolSwitch(p)
			if err != nil {
				return nil, err
			}
			out = append(out, sw)
		}
	}
	return out, nil
}
