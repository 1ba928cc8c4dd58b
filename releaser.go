package proxyswitch

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/proxyswitch/proxyswitch/internal/bounded"
)

// Releases in batches.
//
// Every release of a lease from Redis (a request's end, Lease.Release,
// Close) goes through its pool's release group (internal/group): while one
// release_many.lua call is in Redis, the releases that arrive gather, and
// when it returns one of their callers sends them all in the next call
// (release.lua once per lease, owner-checked exactly as a single release;
// every key of a pool shares its hash tag, so one call covers all its sites,
// in Redis Cluster too). A lone release goes at once, alone: nothing waits
// on a timer. Under load (many collectors' requests ending at once) n
// releases cost one round trip and one script call instead of n. Leases
// are grouped the same way, per site (leasegroup.go), so a busy crawler
// makes less than one Redis round trip per page.
//
// Each release still returns only when its outcome is in Redis, so
// everything a caller saw of a release before holds: Close and Collector.Wait
// return with the leases given back, a process that exits right after loses
// nothing, and the cooldown runs from when the request ended (a release that
// waited for its batch has its cooldown shortened by the wait). A quarantine
// decided meanwhile is never overtaken: release.lua keeps a score something
// pushed past the lease's expiry.
//
// The releases of the hooks run in Colly's OnResponse and OnError, after
// LimitRule's parallelism slot is freed: they hold no request's slot.

// releaseBatch bounds the leases one release_many.lua call releases.
const releaseBatch = 256

// queuedRelease is one release waiting for its batch, with what release.lua
// needs of it.
type queuedRelease struct {
	l        *Lease
	reset    string        // the proxy whose backoff starts over, or ""
	cooldown time.Duration // from at
	flaky    time.Duration
	pace     bool
	at       time.Time // when the release was asked for
}

// releaseMany runs release_many.lua for qs (leases of this pool):
// release.lua's reply for each, in order. It is the release group's flush,
// bounded by the pool's timeout.
func (p *redisPool) releaseMany(qs []queuedRelease) ([]int64, error) {
	keys := make([]string, 1, 6)
	keys[0] = p.keys.fails()
	var scopes map[string]int
	first := "" // the first scope: most batches have no other, and need no map
	argv := make([]any, 1, 1+7*len(qs))
	argv[0] = p.cfg.idleTTL.Milliseconds()
	now := time.Now()
	for _, q := range qs {
		l := q.l
		i := 1
		switch {
		case len(keys) == 1:
			first = l.scope
			keys = p.appendReleaseKeys(keys, l.scope)
		case l.scope == first:
		default:
			if scopes == nil {
				scopes = map[string]int{}
			}
			var ok bool
			if i, ok = scopes[l.scope]; !ok {
				keys = p.appendReleaseKeys(keys, l.scope)
				i = (len(keys) - 1) / 5
				scopes[l.scope] = i
			}
		}
		cooldown := q.cooldown
		if cooldown > 0 {
			cooldown = max(cooldown-now.Sub(q.at), 0) // from when the release was asked for
		}
		// The values every release sends alike go boxed as they were
		// boxed once (an interface of a string or of a number above 255
		// is an allocation each time).
		member, flaky, paced := l.memberArg, any(nil), flagArgs[0]
		if member == nil {
			member = l.member
		}
		if ms := q.flaky.Milliseconds(); ms == p.flakyMs {
			flaky = p.flakyArg
		} else {
			flaky = ms
		}
		if q.pace {
			paced = flagArgs[1]
		}
		argv = append(argv, i, member, l.token, cooldown.Milliseconds(), q.reset, flaky, paced)
	}
	res, err := bounded.Call(context.Background(), p.timeout, p.inline, func(ctx context.Context) ([]int64, error) {
		return releaseManyScript.Run(ctx, p.rdb, keys, argv...).Int64Slice()
	}, nil)
	if err != nil {
		return nil, redisErr("release", err)
	}
	if len(res) != len(qs) {
		return nil, fmt.Errorf("%w: release reply of %d items for %d leases", ErrCorrupt, len(res), len(qs))
	}
	return res, nil
}

// flagArgs are a script's "0" and "1" flags, boxed once.
var flagArgs = [2]any{"0", "1"}

// appendReleaseKeys appends release_many.lua's five keys of scope.
func (p *redisPool) appendReleaseKeys(keys []string, scope string) []string {
	return append(keys, p.scopeKeys.get(p, scope).release...)
}

// maxCachedScopes bounds the scopes whose keys a pool keeps built: past
// it, the keys of new scopes are built on each call.
const maxCachedScopes = 10_000

// scopeKeys are the keys of one scope that every lease and release sends.
type scopeKeys struct {
	lease   []string // lease.lua's KEYS
	release []string // release_many.lua's five keys of the scope
}

// scopeKeyCache keeps each scope's keys built (the key names of a scope
// never change), so that a lease or a release does not concatenate them
// again. Safe for concurrent use; the slices it returns are shared: read
// only.
type scopeKeyCache struct {
	m sync.Map     // scope -> *scopeKeys
	n atomic.Int64 // scopes stored
}

func (c *scopeKeyCache) get(p *redisPool, scope string) *scopeKeys {
	if v, ok := c.m.Load(scope); ok {
		return v.(*scopeKeys)
	}
	k := &scopeKeys{lease: p.keys.lease(scope), release: []string{p.keys.free(scope), p.keys.leases(scope),
		p.keys.strikes(scope), p.keys.health(scope), p.keys.pace(scope)}}
	if c.n.Add(1) <= maxCachedScopes {
		c.m.Store(scope, k)
	}
	return k
}

// waiters are the leases of a Switch waiting for a proxy of a busy scope
// (acquire, between two tries). A release of that scope that frees its
// proxy at once (no cooldown) wakes the oldest of them, which tries again
// at once instead of sleeping out its backoff: with a pool smaller than the
// collectors' parallelism, a freed proxy is taken within a round trip rather
// than after up to WithBackoff's max, and the waiters poll Redis less.
// Waiters of other processes still poll: they are not woken. Safe for
// concurrent use.
type waiters struct {
	mu sync.Mutex
	m  map[waitKey][]chan struct{}
}

type waitKey struct{ pool, scope string }

// pause sleeps like pause (d jittered down to d/2) unless a release of
// scope on pool wakes it first; false if ctx ended first.
func (w *waiters) pause(ctx context.Context, pool, scope string, d time.Duration) bool {
	k := waitKey{pool, scope}
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	if w.m == nil {
		w.m = map[waitKey][]chan struct{}{}
	}
	w.m[k] = append(w.m[k], ch)
	w.mu.Unlock()
	defer w.leave(k, ch)
	t := time.NewTimer(d/2 + rand.N(d/2+1))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	case <-ch:
	}
	return true
}

// leave takes ch out of k's waiters (a no-op once wake took it).
func (w *waiters) leave(k waitKey, ch chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	q := w.m[k]
	for i, c := range q {
		if c == ch {
			q = append(q[:i:i], q[i+1:]...)
			break
		}
	}
	if len(q) == 0 {
		delete(w.m, k)
	} else {
		w.m[k] = q
	}
}

// wake wakes the oldest waiter of scope on pool, if any.
func (w *waiters) wake(pool, scope string) {
	k := waitKey{pool, scope}
	w.mu.Lock()
	q := w.m[k]
	if len(q) == 0 {
		w.mu.Unlock()
		return
	}
	ch := q[0]
	if len(q) == 1 {
		delete(w.m, k)
	} else {
		w.m[k] = q[1:]
	}
	w.mu.Unlock()
	ch <- struct{}{} // buffered, and only wake sends: never blocks
}
