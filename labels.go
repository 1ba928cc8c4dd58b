package proxyswitch

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/proxyswitch/proxyswitch/internal/localpool"
)

// Labels: what a proxy is (type, country, city, provider, price), and
// requests that ask for some of it.
//
// A line given to Add, Replace, ParseProxies or ReadProxies (and so a line
// of package source) may follow the proxy with labels, key=value separated
// by white space:
//
//	gw.example:7000:user-cc-ru-session-{session:20}:pw type=residential country=ru provider=acme price=4.5
//	http://10.0.0.7:3128 type=datacenter country=de
//
// Keys are 1 to 32 of [a-z0-9_.-] starting with a letter, values 1 to 64 of
// [A-Za-z0-9_.+-], at most 16 labels a proxy, each key once. The pool keeps
// each proxy's labels in Redis (its labels hash), in step with Add, Replace
// (the list's labels replace the old ones of every proxy it names) and
// Remove, and a gateway session rotated after a ban keeps the labels of the
// one it replaces. List shows them (Proxy.Labels).
//
// A request asks for labels with UseLabels on its context (the Colly
// collector's Context, or Switch.Lease's): it leases only a proxy that
// carries every label asked for, from the pools of its route. The selection
// runs in the pool itself, with the same exclusivity as any lease: lease.lua
// leases a matching proxy chosen by this Switch as its preferred proxy, and
// nothing else (a few candidates per attempt, starting at another one each
// time). A request whose labels no proxy carries fails at once with
// ErrNoProxy, never through another proxy.
//
// Sticky sessions honour labels: a task's request that asks for labels
// starts its session on a proxy that carries them, and a live session
// whose proxy does not (its labels changed, or the task asked for none
// before) is retired with the reason SessionLabels. Without Redis
// (WithFallback's local shard), a labelled request leases only a proxy of
// the local share that carries its labels (the share keeps the labels of
// the pool's copy), and fails with ErrNoProxy when none does. A pool Redis
// lost is re-seeded with its labels and gateways (snapshot.go).

const (
	maxLabels     = 16
	labelTries    = 8               // candidates tried per lease attempt
	labelIndexAge = 2 * time.Second // how long a Switch trusts its copy of a pool's labels
)

var (
	labelKey   = regexp.MustCompile(`^[a-z][a-z0-9_.-]{0,31}$`)
	labelValue = regexp.MustCompile(`^[A-Za-z0-9_.+-]{1,64}$`)
)

// parseLabels validates "key=value" labels and returns them canonical:
// sorted by key, joined by ','. what names them in errors, which never quote
// them (a mistyped line may put a password there).
func parseLabels(labels []string, what string) (string, error) {
	if len(labels) > maxLabels {
		return "", fmt.Errorf("%w: %d labels, at most %d", ErrInvalidProxy, len(labels), maxLabels)
	}
	kv := make([]string, 0, len(labels))
	seen := map[string]bool{}
	for i, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		switch {
		case !ok || !labelKey.MatchString(k) || !labelValue.MatchString(v):
			return "", fmt.Errorf("%w: %s #%d is not key=value (key: a letter then up to 31 of [a-z0-9_.-]; value: 1 to 64 of [A-Za-z0-9_.+-])",
				ErrInvalidProxy, what, i+1)
		case seen[k]:
			return "", fmt.Errorf("%w: %s #%d repeats its key", ErrInvalidProxy, what, i+1)
		}
		seen[k] = true
		kv = append(kv, k+"="+v)
	}
	slices.Sort(kv)
	return strings.Join(kv, ","), nil
}

// splitLabels splits a pool line into the proxy and its canonical labels.
func splitLabels(line string) (string, string, error) {
	f := strings.Fields(line)
	if len(f) <= 1 {
		return strings.TrimSpace(line), "", nil
	}
	labels, err := parseLabels(f[1:], "label")
	return f[0], labels, err
}

// Labels returns a new map of the proxy's labels (nil for none), from its
// line or, for List's proxies, from the pool.
func (p *Proxy) Labels() map[string]string {
	if p.labels == "" {
		return nil
	}
	out := map[string]string{}
	for _, kv := range strings.Split(p.labels, ",") {
		k, v, _ := strings.Cut(kv, "=")
		out[k] = v
	}
	return out
}

// withLabels returns p carrying labels (a copy: proxies are shared).
func (p *Proxy) withLabels(labels string) *Proxy {
	if labels == p.labels {
		return p
	}
	q := *p
	q.labels = labels
	return &q
}

type labelsKey struct{}

// selector is what UseLabels asks for: canonical "k=v" labels, or err.
type selector struct {
	want []string
	err  error
}

// UseLabels returns a copy of ctx whose requests lease only proxies carrying
// every label ("key=value"). Give it to a collector's Context or to Lease.
// An invalid label fails the leases with ErrNoProxy and ErrInvalidProxy.
func UseLabels(ctx context.Context, labels ...string) context.Context {
	c, err := parseLabels(labels, "asked label")
	sel := selector{err: err}
	if c != "" {
		sel.want = strings.Split(c, ",")
	}
	return context.WithValue(ctx, labelsKey{}, sel)
}

// selectorOf returns the labels ctx asks for, or nil.
func selectorOf(ctx context.Context) *selector {
	if sel, ok := ctx.Value(labelsKey{}).(selector); ok && (sel.err != nil || len(sel.want) > 0) {
		return &sel
	}
	return nil
}

// matches reports whether canonical labels carry every label of want.
func matches(labels string, want []string) bool {
	have := strings.Split(labels, ",")
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

// labelCache is a Switch's copy of one pool's labels.
type labelCache struct {
	mu         sync.Mutex
	at         time.Time
	byID       map[string]string
	refreshing bool                // a background read runs (labelsFor)
	retryAt    time.Time           // labelsFor's next background read after one failed
	sel        map[string][]string // canonical wanted labels -> the IDs of byID carrying them, sorted (matching)
}

// labelMetricsAge is how old the copy of a pool's labels that events
// carry may grow before a background read renews it.
const labelMetricsAge = 10 * time.Second

// labelsFor returns the labels of proxy id of pool for an observer's event,
// from the pool's copy, without waiting: a copy older than labelMetricsAge
// (or none) is read again in the background, one read at a time.
func (s *Switch) labelsFor(pool, id string) string {
	be, err := s.backendFor(pool)
	if err != nil {
		return ""
	}
	p := be.redis()
	c := &p.labelIdx
	c.mu.Lock()
	m, stale := c.byID, !c.refreshing && (c.byID == nil || time.Since(c.at) > labelMetricsAge) && time.Now().After(c.retryAt)
	if stale {
		c.refreshing = true
	}
	c.mu.Unlock()
	if stale {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
			defer cancel()
			_, err := p.labelsOf(ctx, true)
			c.mu.Lock()
			if err != nil { // keep the copy, and try again after labelMetricsAge (a lease reads it when it needs it)
				s.cfg.logger.Debug("proxyswitch: reading the pool's labels failed", "pool", pool, "err", err)
				c.retryAt = time.Now().Add(labelMetricsAge)
			}
			c.refreshing = false
			c.mu.Unlock()
		}()
	}
	return m[id]
}

// labelsOf returns the labels of the pool's proxies by ID, read again when
// fresh or when the copy is older than labelIndexAge.
func (p *redisPool) labelsOf(ctx context.Context, fresh bool) (map[string]string, error) {
	c := &p.labelIdx
	c.mu.Lock()
	defer c.mu.Unlock()
	return p.labelsOfLocked(ctx, fresh)
}

// labelsOfLocked is labelsOf with p.labelIdx.mu held.
func (p *redisPool) labelsOfLocked(ctx context.Context, fresh bool) (map[string]string, error) {
	c := &p.labelIdx
	if !fresh && c.byID != nil && time.Since(c.at) < labelIndexAge {
		return c.byID, nil
	}
	m := map[string]string{}
	err := scanHash(ctx, p.rdb, p.timeout, "labels", p.keys.labels(), "", func(id string, v []string) error {
		m[id] = v[0]
		return nil
	})
	if err != nil {
		return nil, err
	}
	c.byID, c.at, c.sel = m, time.Now(), nil
	return m, nil
}

// matching returns the IDs of the pool's proxies that carry every label of
// want, sorted, from the copy labelsOf keeps (computed once per copy and
// set of labels: a lease does not scan the pool). The caller must not
// change the slice.
func (p *redisPool) matching(ctx context.Context, want []string) ([]string, error) {
	c := &p.labelIdx
	c.mu.Lock()
	defer c.mu.Unlock()
	byID, err := p.labelsOfLocked(ctx, false) // a new copy empties c.sel
	if err != nil {
		return nil, err
	}
	key := strings.Join(want, ",")
	if ids, ok := c.sel[key]; ok {
		return ids, nil
	}
	var ids []string
	for id, l := range byID {
		if matches(l, want) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	if c.sel == nil || len(c.sel) >= 64 { // bounded: a few kinds of task per Switch
		c.sel = map[string][]string{}
	}
	c.sel[key] = ids
	return ids, nil
}

// labelled leases, from the Redis pools of a route, only proxies that
// carry the labels asked for.
type labelled struct {
	backend // the route's backend: release, extend, penalize go to the lease's own
	pools   []*redisPool
	bes     []backend // the backend of each pool: an *fbPool leases from its local shard off the broker
	want    []string
}

// labelNext starts each labelled lease attempt at another candidate.
var labelNext atomic.Uint64

func (b *labelled) tryLease(ctx context.Context, site, scope, prefer string) (*Lease, time.Duration, error) {
	wait, found := time.Duration(-1), false
	for i, rp := range b.pools {
		var l *Lease
		var w time.Duration
		var has bool
		var err error
		if fp, ok := b.bes[i].(*fbPool); ok {
			l, w, has, err = b.tryFallback(ctx, fp, site, scope, prefer)
		} else {
			l, w, has, err = b.tryPool(ctx, rp, site, scope, prefer, true)
		}
		switch {
		case l != nil || err != nil:
			return l, 0, err
		case !has:
			continue
		}
		found = true
		if w >= 0 && (wait < 0 || w < wait) {
			wait = w
		}
	}
	if !found {
		names := make([]string, len(b.pools))
		for i, rp := range b.pools {
			names[i] = rp.name
		}
		return nil, 0, fmt.Errorf("%w: no proxy of pool %s carries the labels %s", ErrNoProxy,
			strings.Join(names, ", "), strings.Join(b.want, ","))
	}
	if wait < 0 { // every candidate tried was dead or gone: try others a little later
		wait = 50 * time.Millisecond
	}
	return nil, wait, nil
}

// tryFallback is tryPool for a pool with a fallback (WithFallback,
// WithSharding): off the broker, the pool's local shard leases a proxy of
// its share that carries the labels (its copy of the pool holds them), and
// never another; on the broker, Redis does, and a Redis call that finds
// Redis gone switches to the local shard.
func (b *labelled) tryFallback(ctx context.Context, fp *fbPool, site, scope, prefer string) (*Lease, time.Duration, bool, error) {
	match := func(p *Proxy) bool { return p.labels != "" && matches(p.labels, b.want) }
	for range 2 {
		l, wait, err, done := fp.tryLocal(ctx, site, prefer, match)
		if done {
			switch {
			case errors.Is(err, localpool.ErrNoMatch):
				return nil, -1, false, nil
			case err != nil:
				return nil, 0, true, err
			case l == nil:
				return nil, wait, true, nil
			}
			return l, 0, true, nil
		}
		l, wait, has, err := b.tryPool(ctx, fp.rp, site, scope, prefer, true)
		if errors.Is(err, ErrRedis) && fp.f.trip(ctx, err) {
			continue // from the local shard now
		}
		if l != nil {
			l.be = fp
			fp.leased(l)
		}
		return l, wait, has, err
	}
	return nil, 0, true, fmt.Errorf("%w: the pool %q switched between Redis and its local shard twice", ErrNoProxy, fp.rp.name)
}

// tryPool tries up to labelTries of rp's proxies that carry the labels.
// has reports whether rp has one; wait is the least wait the pool gave, -1
// for none. A pool Redis lost (its labels with it) is re-seeded from this
// Switch's copy (snapshot.go), labels included, once (recover), and tried
// again with its labels read anew.
func (b *labelled) tryPool(ctx context.Context, rp *redisPool, site, scope, prefer string, recover bool) (l *Lease, wait time.Duration, has bool, err error) {
	wait = -1
	ids, err := rp.matching(ctx, b.want)
	if err != nil {
		return nil, 0, false, fmt.Errorf("%w: %w", ErrNoProxy, err)
	}
	again := func() (*Lease, time.Duration, bool, error) {
		ok, err := rp.recoverLost(ctx)
		if err != nil {
			return nil, 0, false, fmt.Errorf("%w: %w", ErrNoProxy, err)
		}
		if ok {
			if _, err := rp.labelsOf(ctx, true); err != nil {
				return nil, 0, false, fmt.Errorf("%w: %w", ErrNoProxy, err)
			}
		}
		return b.tryPool(ctx, rp, site, scope, prefer, false)
	}
	if len(ids) == 0 {
		// None here, or the pool was lost with its labels: this Switch's copy
		// knows matching proxies while Redis holds no pool.
		if recover && len(b.inCopy(rp)) > 0 {
			return b.ifLost(ctx, rp, again, nil, -1, false)
		}
		return nil, -1, false, nil
	}
	first := int(labelNext.Add(1) % uint64(len(ids)))
	if prefer != "" && slices.Contains(ids, prefer) { // a redirect's hop: the same proxy if free
		ids = append([]string{prefer}, ids...) // a new slice: ids is shared
		first = 0
	}
	for i := range min(labelTries, len(ids)) {
		l, w, lost, err := rp.tryLeaseOnce(ctx, site, scope, ids[(first+i)%len(ids)], true)
		switch {
		case l != nil:
			return l, 0, true, nil
		case lost && recover:
			return again()
		case errors.Is(err, errProxyGone): // dead, or left the pool since the copy was read
			continue
		case err != nil:
			return nil, 0, true, err
		}
		if wait < 0 || w < wait {
			wait = w
		}
	}
	if wait < 0 && recover {
		// Every candidate was gone: the pool may be lost (lease.lua answers
		// a firm lease of a proxy it lacks before it looks at the pool).
		return b.ifLost(ctx, rp, again, nil, -1, true)
	}
	return nil, wait, true, nil
}

// ifLost runs again if Redis lost rp, else returns the rest as tryPool's reply.
func (b *labelled) ifLost(ctx context.Context, rp *redisPool, again func() (*Lease, time.Duration, bool, error),
	l *Lease, wait time.Duration, has bool) (*Lease, time.Duration, bool, error) {
	lost, err := rp.lost(ctx)
	if err != nil {
		return nil, 0, false, fmt.Errorf("%w: %w", ErrNoProxy, err)
	}
	if lost {
		return again()
	}
	return l, wait, has, nil
}

// lost reports whether Redis lost the pool: no proxy, and no operator's
// "emptied" mark (snapshot.go).
func (p *redisPool) lost(ctx context.Context) (bool, error) {
	k := p.keys
	res, err := roundTrip(ctx, p.cfg.redisTimeout, func(ctx context.Context) ([]any, error) {
		return poolSnapshotScript.Run(ctx, p.rdb, []string{k.proxies(), k.meta(), k.dead()}, "0", 1).Slice()
	}, nil)
	if err != nil {
		return false, redisErr("read the pool", err)
	}
	mark, ok1 := intAt(res, 1)
	n, ok2 := intAt(res, 4)
	next, ok3 := "", false
	if len(res) >= 5 {
		next, ok3 = res[3].(string)
	}
	if !ok1 || !ok2 || !ok3 {
		return false, fmt.Errorf("%w: malformed pool snapshot reply", ErrCorrupt)
	}
	return n == 0 && next == "0" && mark == 0, nil // a page may be empty while more follow
}

// inCopy returns the IDs of the proxies of rp's copy (snapshot.go) that
// carry the labels.
func (b *labelled) inCopy(rp *redisPool) []string {
	var ids []string
	for id, l := range rp.snapshot().labelsByID() {
		if matches(l, b.want) {
			ids = append(ids, id)
		}
	}
	return ids
}

// withSelector wraps be for the labels ctx asks for, if any.
func (s *Switch) withSelector(ctx context.Context, be backend) (backend, error) {
	sel := selectorOf(ctx)
	if sel == nil {
		return be, nil
	}
	if sel.err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoProxy, sel.err)
	}
	b := &labelled{backend: be, want: sel.want}
	if rt, ok := be.(*router); ok {
		b.bes = rt.pools
	} else {
		b.bes = []backend{be}
	}
	for _, p := range b.bes {
		b.pools = append(b.pools, p.redis())
	}
	return b, nil
}
