package proxyswitch

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/proxyswitch/proxyswitch/internal/engine"
	"github.com/proxyswitch/proxyswitch/internal/hooks"
)

// Pool administration. Every change takes effect on the next lease of every
// worker: no restart. A change of at most 500 proxies (pageSize) is one Lua
// script, atomic across the cluster; a larger one is several, each of
// bounded work (no script blocks Redis for long at any pool size).

// PoolChange reports what a pool update did.
type PoolChange struct {
	Added   int // proxies that were not in the pool before
	Removed int // proxies taken out of the pool
	Size    int // proxies in the pool afterwards
}

// Add validates every URL (one invalid rejects all) and adds the proxies not
// yet in the pool. It is safe to call while workers lease.
func (s *Switch) Add(ctx context.Context, urls ...string) (PoolChange, error) {
	ps, err := ParseProxies(urls)
	if err != nil {
		return PoolChange{}, err
	}
	return s.update(ctx, "add", entries(ps))
}

// Remove takes proxies (URLs or IDs) out of the pool: one in use stays with
// its holder until released and is never leased again. Unknown proxies are
// ignored.
func (s *Switch) Remove(ctx context.Context, proxies ...string) (PoolChange, error) {
	ids, err := proxyIDs(proxies)
	if err != nil {
		return PoolChange{}, err
	}
	change, err := s.update(ctx, "remove", ids)
	if err == nil {
		for _, id := range ids {
			s.clients.closeProxy(id.(string), "")
		}
	}
	return change, err
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

// Replace makes the pool exactly urls, all validated first (an invalid one
// changes nothing); proxies kept keep their state. Up to 500 proxies it is
// atomic; a larger one may show workers the old set shrinking (even to
// ErrEmptyPool) then growing. Run large Replaces one at a time.
func (s *Switch) Replace(ctx context.Context, urls []string) (PoolChange, error) {
	ps, err := ParseProxies(urls)
	if err != nil {
		return PoolChange{}, err
	}
	return s.ReplaceProxies(ctx, ps)
}

// ReplaceProxies is Replace for parsed proxies; a nil or zero Proxy fails
// with ErrInvalidProxy and changes nothing.
func (s *Switch) ReplaceProxies(ctx context.Context, ps []*Proxy) (PoolChange, error) {
	if err := parsed(ps); err != nil {
		return PoolChange{}, err
	}
	return s.update(ctx, "replace", entries(ps))
}

// parsed fails for a nil entry of ps, or one not made by ParseProxy.
func parsed(ps []*Proxy) error {
	for i, p := range ps {
		if p == nil || p.url == nil {
			return fmt.Errorf("%w: entry %d is nil or a zero Proxy (make proxies with ParseProxy)", ErrInvalidProxy, i)
		}
	}
	return nil
}

// diff compares ps (as ParseProxies or ReadProxies return them) with the
// pool: what ReplaceProxies(ctx, ps) would change, without writing. A
// gateway template is compared as ReplaceProxies applies it, by template,
// session count N and labels, never by its sessions: every parse draws new
// session ids, but a pool that holds N sessions of the template with its
// labels needs no change (ReplaceProxies would keep them). It reads the
// pool and its gateways in pages as List does, so it is not one instant:
// a change made meanwhile may count or not. It writes nothing and is safe
// for concurrent use. Package source's Syncer calls it (hooks.Diff).
func (s *Switch) diff(ctx context.Context, ps []*Proxy) (hooks.PoolDiff, error) {
	if err := parsed(ps); err != nil {
		return hooks.PoolDiff{}, err
	}
	cur, err := s.own.redis().list(ctx)
	if err != nil {
		return hooks.PoolDiff{}, err
	}
	gws, err := s.hashKeys(ctx, s.keys.gateways())
	if err != nil {
		return hooks.PoolDiff{}, err
	}
	gwOf := make(map[string]string, len(gws)) // member ID -> its template
	for _, kv := range gws {
		id, t, _ := strings.Cut(kv, "\x00")
		gwOf[id] = t
	}
	type gateway struct {
		n      int
		labels string
	}
	want := map[string]gateway{}              // template -> its N and labels in ps
	plain := make(map[string]string, len(ps)) // plain proxy ID -> its labels in ps
	for _, p := range ps {
		if p.gw != "" {
			want[p.gw] = gateway{n: want[p.gw].n + 1, labels: p.labels}
		} else {
			plain[p.id] = p.labels
		}
	}
	d := hooks.PoolDiff{Size: len(cur)}
	have := map[string]int{}    // template -> its members in the pool
	relabel := map[string]int{} // template -> those of them with other labels than in ps
	inPool := make(map[string]bool, len(cur))
	for _, p := range cur {
		inPool[p.id] = true
		if t, ok := gwOf[p.id]; ok {
			have[t]++
			if g, ok := want[t]; ok && g.labels != p.labels {
				relabel[t]++
			}
			continue
		}
		switch l, ok := plain[p.id]; {
		case !ok:
			d.Removed++
		case l != p.labels:
			d.Relabelled++
		}
	}
	for id := range plain {
		if !inPool[id] {
			d.Added++
		}
	}
	for t, g := range want {
		d.Added += max(0, g.n-have[t])
		d.Removed += max(0, have[t]-g.n)
		d.Relabelled += min(relabel[t], g.n) // at most N members stay
	}
	for t, n := range have {
		if _, ok := want[t]; !ok {
			d.Removed += n
		}
	}
	return d, nil
}

// List returns the proxies of the pool, ordered by redacted URL, read in
// pages. It is safe for concurrent use.
func (s *Switch) List(ctx context.Context) ([]*Proxy, error) { return s.own.redis().list(ctx) }

func (rp *redisPool) list(ctx context.Context) ([]*Proxy, error) {
	var out []*Proxy
	err := scanHash(ctx, rp.rdb, rp.cfg.redisTimeout, "list", rp.keys.proxies(), "", func(id string, v []string) error {
		p, err := rp.sw.poolEntry(rp.keys.proxies(), id, v[0])
		if err == nil {
			out = append(out, p)
		}
		return err
	})
	if err != nil {
		return nil, err
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
	// Concurrency is the Rotation.Concurrency the pool records (its first
	// lease fixes it), or 0 when nothing leased from it yet.
	Concurrency int
}

// Stats returns a snapshot of the pool for site (ignored with ScopeGlobal);
// on a busy site Leased is counted over several calls, not at one instant.
// It is safe for concurrent use.
func (s *Switch) Stats(ctx context.Context, site string) (SiteStats, error) {
	scope := s.scopeOf(site)
	call := engine.Stats{Pool: s.keys.proxies(), Free: s.keys.free(scope), Lease: s.keys.leases(scope), Meta: s.keys.meta(),
		Cursor: "0", Count: pageSize()}
	var st SiteStats
	live := map[string]bool{}
	for first := true; first || call.Cursor != "0"; first = false {
		res, err := roundTrip(ctx, s.cfg.redisTimeout, func(ctx context.Context) ([]any, error) {
			return call.Run(ctx, s.rdb).Slice()
		}, nil)
		if err != nil {
			return SiteStats{}, redisErr("stats", err)
		}
		if len(res) < 7 {
			return SiteStats{}, fmt.Errorf("%w: stats reply of %d items", ErrCorrupt, len(res))
		}
		var n [6]int64
		for i := range n {
			v, ok := engine.IntAt(res, i)
			if !ok {
				return SiteStats{}, fmt.Errorf("%w: stats reply item %d: %.100v", ErrCorrupt, i, res[i])
			}
			n[i] = v
		}
		cursor, ok := res[6].(string)
		if !ok {
			return SiteStats{}, fmt.Errorf("%w: stats reply cursor %.100v", ErrCorrupt, res[6])
		}
		for _, v := range res[7:] {
			m, ok := v.(string)
			if !ok {
				return SiteStats{}, fmt.Errorf("%w: stats reply lease %.100v", ErrCorrupt, v)
			}
			live[m] = true
		}
		call.Cursor = cursor
		if !first {
			continue
		}
		st = SiteStats{Proxies: int(n[0]), FreeSlots: int(n[1]), BusySlots: int(n[3]), LeaseRecords: int(n[4])}
		if n[2] < 0 { // site never leased: everything is free
			st.FreeSlots = st.Proxies * s.cfg.slots
		}
		if n[5] < 0 {
			return SiteStats{}, fmt.Errorf("%w: pool %q records a concurrency that is not a positive integer (key %s, field slots)",
				ErrCorrupt, s.cfg.pool, s.keys.meta())
		}
		st.Concurrency = int(n[5])
	}
	st.Leased = len(live)
	return st, nil
}

// The most entries (proxies, or ids to remove) one pool_update.lua call
// carries is pageSize (500; paged.go); the script may consume fewer (its
// own work bound) and the rest is sent again. A Replace of at most 500
// proxies, of a pool of at most as many, is one atomic call.

// entryItems is the number of pool_update.lua's ARGV items per add or
// replace entry (entries).
const entryItems = 5

func (s *Switch) update(ctx context.Context, mode string, args []any) (PoolChange, error) {
	if mode == "replace" {
		return s.replace(ctx, args)
	}
	return s.updateChunked(ctx, mode, args, false)
}

// poolUpdate is the pool_update.lua call of mode on the pool of k.
func (k keyspace) poolUpdate(mode string, idle time.Duration, changed bool, entries []any) engine.PoolUpdate {
	return engine.PoolUpdate{
		Pool: k.proxies(), Sites: k.sites(), Meta: k.meta(),
		Dead: k.dead(), Fails: k.fails(), Quarantine: k.quarantine(),
		Order: k.order(), Cursor: k.cursor(), Gateways: k.gateways(), Labels: k.labels(),
		GatewayIndex: k.gatewayIndex(), Relabel: k.relabel(),
		Mode: mode, Prefix: k.base, IdleTTL: idle, Changed: changed, Entries: entries,
	}
}

// updateCall runs one pool_update.lua call: the change so far (PoolChange),
// the entries it consumed, and whether the pool's gateway index is still
// being built or a gateway relabelled (finishIndex completes that). A
// call that needs the index while it is being built (a pool written
// before it existed, or re-seeded) finishes the build first and runs again.
func (s *Switch) updateCall(ctx context.Context, mode string, args []any, changed bool) (PoolChange, int, bool, error) {
	pc, done, pending, err := s.updateOnce(ctx, mode, args, changed)
	if err != nil && strings.Contains(err.Error(), "PSINDEX ") {
		if err := s.finishIndex(ctx); err != nil {
			return PoolChange{}, 0, false, err
		}
		pc, done, pending, err = s.updateOnce(ctx, mode, args, changed)
	}
	return pc, done, pending, err
}

// updateOnce is one pool_update.lua call (see updateCall).
func (s *Switch) updateOnce(ctx context.Context, mode string, args []any, changed bool) (PoolChange, int, bool, error) {
	call := s.keys.poolUpdate(mode, s.cfg.idleTTL, changed, args)
	res, err := roundTrip(ctx, s.cfg.redisTimeout, func(ctx context.Context) ([]int64, error) {
		return call.Run(ctx, s.rdb).Int64Slice()
	}, nil)
	if err != nil {
		return PoolChange{}, 0, false, redisErr("pool "+mode, err)
	}
	if len(res) != 5 {
		return PoolChange{}, 0, false, fmt.Errorf("%w: pool update reply of %d items", ErrCorrupt, len(res))
	}
	return PoolChange{Added: int(res[0]), Removed: int(res[1]), Size: int(res[2])}, int(res[3]), res[4] == 1, nil
}

// finishIndex runs pool_update.lua's "index" calls, each of bounded work,
// until the pool's gateway index is built and no gateway is being
// relabelled.
func (s *Switch) finishIndex(ctx context.Context) error {
	for {
		_, _, pending, err := s.updateOnce(ctx, "index", nil, false)
		if err != nil || !pending {
			return err
		}
	}
}

// updateChunked applies mode ("add": entries; "remove": ids) in calls
// of bounded work. The pool's generation moves with each call once the
// change so far changed the pool (pool_update.lua moves it when a call
// consumed all the entries sent, and each call is sent only its chunk).
// changed: an earlier part of the same change (Replace's removals) changed
// the pool.
func (s *Switch) updateChunked(ctx context.Context, mode string, args []any, changed bool) (PoolChange, error) {
	per, chunk := 1, pageSize()
	if mode == "add" {
		// An added proxy costs a few writes (its place in the order): 8.7 ms
		// of Redis CPU per call of 500 at 1M proxies, half of that at 250.
		per, chunk = entryItems, max(1, pageSize()/2)
	}
	var total PoolChange
	for first := true; first || len(args) > 0; first = false {
		n := min(len(args)/per, chunk)
		pc, done, pending, err := s.updateCall(ctx, mode, args[:n*per], changed)
		if err != nil {
			return total, err
		}
		if pending && done >= n && n == len(args)/per {
			// The last call: a relabelling it started ends before the
			// change returns (so does an index build).
			if err := s.finishIndex(ctx); err != nil {
				return total, err
			}
		}
		// No entry consumed is progress only while a large gateway's
		// members go (pool_update.lua removes them over several calls).
		if done < 1 && n > 0 && pc.Removed == 0 {
			return total, fmt.Errorf("%w: pool update consumed no entry", ErrCorrupt)
		}
		total.Added += pc.Added
		total.Removed += pc.Removed
		total.Size = pc.Size
		changed = changed || pc.Added+pc.Removed > 0
		args = args[min(done, n)*per:]
	}
	return total, nil
}

// replace makes the pool exactly the entries of args: one atomic call for
// a small pool, else the proxies to remove (found by paging through the
// pool and its gateways) then those to add or update, in calls of bounded
// work. A gateway keeps the members it has, as the atomic call keeps them.
func (s *Switch) replace(ctx context.Context, args []any) (PoolChange, error) {
	ids, err := s.hashKeys(ctx, s.keys.proxies())
	if err != nil {
		return PoolChange{}, err
	}
	if len(args)/entryItems <= pageSize() && len(ids) <= pageSize() {
		pc, _, pending, err := s.updateCall(ctx, "replace", args, false)
		if err == nil && pending {
			err = s.finishIndex(ctx)
		}
		return pc, err
	}
	keep := make(map[string]bool, len(args)/entryItems)
	size := map[string]int{} // gateway template -> its N
	for i := 0; i+entryItems <= len(args); i += entryItems {
		if t, _ := args[i+2].(string); t != "" {
			size[t], _ = strconv.Atoi(fmt.Sprint(args[i+3]))
			continue
		}
		keep[args[i].(string)] = true
	}
	if len(size) > 0 {
		gw, err := s.hashKeys(ctx, s.keys.gateways())
		if err != nil {
			return PoolChange{}, err
		}
		// The members each gateway keeps: its first N, by ID (pool_update.lua's rule).
		slices.Sort(gw)
		kept := map[string]int{}
		inPool := make(map[string]bool, len(ids))
		for _, id := range ids {
			inPool[id] = true
		}
		for _, kv := range gw {
			id, t, _ := strings.Cut(kv, "\x00")
			if n, ok := size[t]; ok && inPool[id] && kept[t] < n {
				kept[t]++
				keep[id] = true
			}
		}
	}
	var drop []any
	for _, id := range ids {
		if !keep[id] {
			drop = append(drop, id)
		}
	}
	var out PoolChange
	if len(drop) > 0 {
		rm, err := s.updateChunked(ctx, "remove", drop, false)
		if err != nil {
			return rm, err
		}
		out.Removed = rm.Removed
	}
	add, err := s.updateChunked(ctx, "add", args, out.Removed > 0)
	out.Added, out.Size = add.Added, add.Size
	return out, err
}

// hashKeys pages through a hash of the pool keyed by proxy ID (the pool
// hash, or the gateways hash) with pool_snapshot.lua (bounded work per
// call) and returns each field once: the ID, and for a hash other than the
// pool hash the ID, a NUL and its value.
func (s *Switch) hashKeys(ctx context.Context, key string) ([]string, error) {
	withValue := key != s.keys.proxies()
	var out []string
	seen := map[string]bool{}
	err := snapshotPages(ctx, s.rdb, s.cfg.redisTimeout, key, s.keys.meta(), func(_, _ int64, _ bool, kv []any) error {
		for i := 0; i+1 < len(kv); i += 2 {
			id, _ := kv[i].(string)
			if id == "" || seen[id] { // HSCAN may return an entry twice
				continue
			}
			seen[id] = true
			if withValue {
				v, _ := kv[i+1].(string)
				id += "\x00" + v
			}
			out = append(out, id)
		}
		return nil
	})
	return out, err
}

// entries are pool_update.lua's entries of ps: id, URL, gateway template,
// gateway size (the number of the template's proxies in ps: ParseProxies
// expands a template once), labels.
func entries(ps []*Proxy) []any {
	size := map[string]int{}
	for _, p := range ps {
		if p.gw != "" {
			size[p.gw]++
		}
	}
	out := make([]any, 0, entryItems*len(ps))
	for _, p := range ps {
		n := ""
		if p.gw != "" {
			n = strconv.Itoa(size[p.gw])
		}
		out = append(out, p.id, p.raw(), p.gw, n, p.labels)
	}
	return out
}

func isProxyID(v string) bool {
	return len(v) == 16 && strings.Trim(v, "0123456789abcdef") == ""
}
