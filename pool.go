package proxyswitch

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/proxyswitch/proxyswitch/internal/engine"
)

// Pool administration. Every change is one Lua script, atomic across the
// cluster, and takes effect on the next lease of every worker: no restart.

// PoolChange reports what a pool update did.
type PoolChange struct {
	Added   int // proxies that were not in the pool before
	Removed int // proxies taken out of the pool
	Size    int // proxies in the pool afterwards
}

// Add validates every URL (all or nothing: one invalid URL rejects the whole
// call) and adds the proxies not yet in the pool. Adding a proxy twice is a
// no-op. It is safe to call while workers lease.
func (s *Switch) Add(ctx context.Context, urls ...string) (PoolChange, error) {
	ps, err := ParseProxies(urls)
	if err != nil {
		return PoolChange{}, err
	}
	return s.update(ctx, "add", entries(ps))
}

// Remove takes proxies out of the pool, named by URL or by ID (Proxy.ID, as
// List shows it). A proxy in use stays with its current holder until released;
// it is never leased again. Unknown proxies are ignored.
func (s *Switch) Remove(ctx context.Context, proxies ...string) (PoolChange, error) {
	ids, err := proxyIDs(proxies)
	if err != nil {
		return PoolChange{}, err
	}
	return s.update(ctx, "remove", ids)
}

// proxyIDs maps proxies named by URL or by ID to their IDs, and a gateway
// template to "gw:<template>" (pool_update.lua's name of all its members).
func proxyIDs(proxies []string) ([]any, error) {
	ids := make([]any, 0, len(proxies))
	for i, v := range proxies {
		v, _, _ = splitLabels(v) // a pool line names its proxy; labels do not matter here
		if isProxyID(v) {
			ids = append(ids, v)
			continue
		}
		if isTemplate(v) {
			t, _, err := parseGateway(v)
			if err != nil {
				return nil, fmt.Errorf("proxy #%d: %w", i+1, err)
			}
			ids = append(ids, "gw:"+t)
			continue
		}
		p, err := ParseProxy(v)
		if err != nil {
			return nil, fmt.Errorf("proxy #%d: %w", i+1, err)
		}
		ids = append(ids, p.id)
	}
	return ids, nil
}

// Replace makes the pool exactly urls, atomically: workers see either the old
// set or the new one, never a mix. Use it to reload a list from a file
// (ReadProxies) or a provider's API at run time. Proxies kept keep their
// state (leases, cooldowns). All URLs are validated first; on any error the
// pool is unchanged.
func (s *Switch) Replace(ctx context.Context, urls []string) (PoolChange, error) {
	ps, err := ParseProxies(urls)
	if err != nil {
		return PoolChange{}, err
	}
	return s.ReplaceProxies(ctx, ps)
}

// ReplaceProxies is Replace for proxies already parsed (by ReadProxies, say).
func (s *Switch) ReplaceProxies(ctx context.Context, ps []*Proxy) (PoolChange, error) {
	return s.update(ctx, "replace", entries(ps))
}

// List returns the proxies of the pool, ordered by their redacted URL.
func (s *Switch) List(ctx context.Context) ([]*Proxy, error) { return s.own.redis().list(ctx) }

func (rp *redisPool) list(ctx context.Context) ([]*Proxy, error) {
	res, err := roundTrip(ctx, rp.cfg.redisTimeout, func(ctx context.Context) ([]string, error) {
		return engine.List{Pool: rp.keys.proxies()}.Run(ctx, rp.rdb).StringSlice()
	}, nil)
	if err != nil {
		return nil, redisErr("list", err)
	}
	out := make([]*Proxy, 0, len(res)/2)
	for i := 0; i+1 < len(res); i += 2 {
		p, err := rp.sw.poolEntry(rp.keys.proxies(), res[i], res[i+1])
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	labels, err := rp.labelsOf(ctx, true)
	if err != nil {
		return nil, err
	}
	for i, p := range out {
		out[i] = p.withLabels(labels[p.id])
	}
	sortProxies(out, func(p *Proxy) *Proxy { return p })
	return out, nil
}

// sortProxies orders s by the redacted URL of each element's proxy, then by
// its ID (two proxies differing only in their passwords look the same).
func sortProxies[T any](s []T, proxy func(T) *Proxy) {
	slices.SortFunc(s, func(a, b T) int {
		pa, pb := proxy(a), proxy(b)
		return cmp.Or(strings.Compare(pa.String(), pb.String()), strings.Compare(pa.id, pb.id))
	})
}

// SiteStats is a snapshot of a pool as one site sees it.
type SiteStats struct {
	Proxies      int // proxies in the pool
	FreeSlots    int // lease slots free right now (proxies x concurrency when idle)
	Leased       int // live leases
	BusySlots    int // slots not free: leased, cooling down or quarantined
	LeaseRecords int // lease records in Redis, live or expired but not yet reclaimed
	// Concurrency is the concurrency the pool records: the WithConcurrency
	// of the Switches that lease from it (the first lease records it; a
	// Switch asking for another one gets ErrConfig), or 0 when nothing
	// leased from it yet. Tools that act on a pool they did not configure
	// (the proxyswitch command) read it to match.
	Concurrency int
}

// Stats returns a snapshot of the pool for site (ignored with ScopeGlobal):
// one round trip, safe for concurrent use.
func (s *Switch) Stats(ctx context.Context, site string) (SiteStats, error) {
	scope := s.scopeOf(site)
	res, err := roundTrip(ctx, s.cfg.redisTimeout, func(ctx context.Context) ([]int64, error) {
		return engine.Stats{Pool: s.keys.proxies(), Free: s.keys.free(scope), Lease: s.keys.leases(scope), Meta: s.keys.meta()}.Run(ctx, s.rdb).Int64Slice()
	}, nil)
	if err != nil {
		return SiteStats{}, redisErr("stats", err)
	}
	if len(res) != 7 {
		return SiteStats{}, fmt.Errorf("%w: stats reply of %d items", ErrCorrupt, len(res))
	}
	st := SiteStats{Proxies: int(res[0]), FreeSlots: int(res[1]), Leased: int(res[2]), BusySlots: int(res[4]), LeaseRecords: int(res[5])}
	if res[3] < 0 { // site never leased: everything is free
		st.FreeSlots = st.Proxies * s.cfg.slots
	}
	if res[6] < 0 {
		return SiteStats{}, fmt.Errorf("%w: pool %q records a concurrency that is not a positive integer (key %s, field slots)",
			ErrCorrupt, s.cfg.pool, s.keys.meta())
	}
	st.Concurrency = int(res[6])
	return st, nil
}

func (s *Switch) update(ctx context.Context, mode string, args []any) (PoolChange, error) {
	call := engine.PoolUpdate{
		Pool: s.keys.proxies(), Sites: s.keys.sites(), Meta: s.keys.meta(),
		Dead: s.keys.dead(), Fails: s.keys.fails(), Quarantine: s.keys.quarantine(), Gateways: s.keys.gateways(),
		Labels: s.keys.labels(),
		Mode:   mode, Prefix: s.keys.base, IdleTTL: s.cfg.idleTTL, Entries: args,
	}
	res, err := roundTrip(ctx, s.cfg.redisTimeout, func(ctx context.Context) ([]int64, error) {
		return call.Run(ctx, s.rdb).Int64Slice()
	}, nil)
	if err != nil {
		return PoolChange{}, redisErr("pool "+mode, err)
	}
	if len(res) != 3 {
		return PoolChange{}, fmt.Errorf("%w: pool update reply of %d items", ErrCorrupt, len(res))
	}
	return PoolChange{Added: int(res[0]), Removed: int(res[1]), Size: int(res[2])}, nil
}

// entries are pool_update.lua's entries of ps: id, URL, gateway template,
// labels.
func entries(ps []*Proxy) []any {
	out := make([]any, 0, 4*len(ps))
	for _, p := range ps {
		out = append(out, p.id, p.raw(), p.gw, p.labels)
	}
	return out
}

func isProxyID(v string) bool {
	return len(v) == 16 && strings.Trim(v, "0123456789abcdef") == ""
}
