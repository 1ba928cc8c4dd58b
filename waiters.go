package proxyswitch

import (
	"context"
	"sync"
	"time"
)

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

// pause sleeps d jittered down to d/2 (as pause does) unless a release of
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
	t := time.NewTimer(jittered(d))
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
