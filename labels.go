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
// ErrNoProxy, never through another proxy. Labelled requests lease from
// Redis only: without Redis (WithFallback's local shard) they fail closed.

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

// Labels returns the proxy's labels (nil for none): those of its line, for
// a proxy ParseProxies or ReadProxies made, or those the pool keeps, for a
// proxy List returns. Each call returns a new map.
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

// UseLabels returns a copy of ctx whose requests lease only proxies that
// carry every one of labels ("key=value": UseLabels(ctx, "country=ru",
// "type=residential")), from the pools of their route. Give it to a
// collector that runs one kind of task (Collector.Context =
// proxyswitch.UseLabels(ctx, "country=ru")), or to Switch.Lease. No labels
// means any proxy. An invalid label fails every lease of ctx with an error
// wrapping ErrNoProxy and ErrInvalidProxy.
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
	refreshing bool // a background read runs (cachedLabels)
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
	m, stale := c.byID, !c.refreshing && (c.byID == nil || time.Since(c.at) > labelMetricsAge)
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
			if err != nil { // keep the copy, and try again after labelMetricsAge
				s.cfg.logger.Debug("proxyswitch: reading the pool's labels failed", "pool", pool, "err", err)
				if c.byID == nil {
					c.byID = map[string]string{}
				}
				c.at = time.Now()
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
	c.byID, c.at = m, time.Now()
	return m, nil
}

// labelled leases, from the Redis pools of a route, only proxies that
// carry the labels asked for.
type labelled struct {
	backend // the route's backend: release, extend, penalize go to the lease's own
	pools   []*redisPool
	want    []string
}

// labelNext starts each labelled lease attempt at another candidate.
var labelNext atomic.Uint64

func (b *labelled) tryLease(ctx context.Context, site, scope, prefer string) (*Lease, time.Duration, error) {
	wait, found := time.Duration(-1), false
	for _, rp := range b.pools {
		byID, err := rp.labelsOf(ctx, false)
		if err != nil {
			return nil, 0, fmt.Errorf("%w: %w", ErrNoProxy, err)
		}
		var ids []string
		for id, l := range byID {
			if matches(l, b.want) {
				ids = append(ids, id)
			}
		}
		if len(ids) == 0 {
			continue
		}
		found = true
		slices.Sort(ids)
		first := int(labelNext.Add(1) % uint64(len(ids)))
		if prefer != "" && slices.Contains(ids, prefer) { // a redirect's hop: the same proxy if free
			ids = append([]string{prefer}, ids...)
			first = 0
		}
		for i := range min(labelTries, len(ids)) {
			l, w, _, err := rp.tryLeaseOnce(ctx, site, scope, ids[(first+i)%len(ids)], true)
			switch {
			case l != nil:
				return l, 0, nil
			case errors.Is(err, errProxyGone): // dead, or left the pool since the copy was read
				continue
			case err != nil:
				return nil, 0, err
			}
			if wait < 0 || w < wait {
				wait = w
			}
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
		for _, p := range rt.pools {
			b.pools = append(b.pools, p.redis())
		}
	} else {
		b.pools = []*redisPool{be.redis()}
	}
	return b, nil
}
