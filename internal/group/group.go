// Package group commits concurrent calls of one kind in one Redis round
// trip (group commit). It is shared by the root package (a pool's releases
// and plain leases) and storage (the queue's adds, pops and acks).
package group

import (
	"fmt"
	"sync"
)

// Group commits concurrent calls of one kind (AddRequest, GetRequest, the
// acknowledgement of a delivery) in one Redis round trip: while one call's
// script runs, the calls that arrive gather in a batch, and when it
// returns, one of their callers runs the whole batch as one script call.
// A lone caller runs at once, alone, so a group adds no wait when there is
// no concurrency; under load (Colly's threads acknowledging pages and
// queueing links) it turns n round trips into one.
//
// Every call still returns only when its own outcome is in Redis (or the
// round trip failed): what a caller sees is what it saw without the group,
// and a batch is one script call, atomic like the single calls it
// replaces. A call waits for at most the round trip in flight when it
// arrived plus its own batch's, each bounded by the Redis timeout (proxyswitch.Timeouts.Redis, storage.WithRedisTimeout).
//
// At most one batch of a group is in Redis at a time; the batch flushed
// next is the oldest waiting one, and at most Max items (and about
// MaxBytes of them, if set) share one.
type Group[T, R any] struct {
	Max      int         // items per batch at most
	MaxBytes int         // bytes per batch at most (as Size counts them), if set
	Size     func(T) int // the bytes an item adds to its batch's script call; nil: not counted
	// Flush runs one batch: it returns one result per item, in order, or
	// an error for all of them.
	Flush func(items []T) ([]R, error)
	// Corrupt is the error a batch fails with when Flush returns a result
	// count other than its item count, or panics (wrapped).
	Corrupt error

	mu    sync.Mutex
	busy  bool           // a batch is being flushed
	queue []*batch[T, R] // the batches gathering or waiting, oldest first
}

type batch[T, R any] struct {
	items []T
	bytes int
	res   []R
	err   error
	done  chan struct{} // closed when res and err are set
	lead  chan struct{} // holds one token when it is this batch's turn: the caller who takes it flushes the batch
}

// Do runs item in the next batch and returns its result. It is safe for
// concurrent use.
func (g *Group[T, R]) Do(item T) (R, error) {
	n := 0
	if g.Size != nil {
		n = g.Size(item)
	}
	g.mu.Lock()
	var b *batch[T, R]
	i := 0
	if !g.busy {
		// Idle: no batch waits (one would have been handed the turn), so
		// this item goes alone, now, in a batch nobody else sees: no
		// channels to wait on.
		g.busy = true
		g.mu.Unlock()
		b = &batch[T, R]{items: []T{item}}
		g.run(b)
	} else {
		if last := len(g.queue) - 1; last >= 0 && len(g.queue[last].items) < g.Max &&
			(g.MaxBytes == 0 || g.queue[last].bytes+n <= g.MaxBytes) {
			b = g.queue[last]
		} else {
			b = &batch[T, R]{done: make(chan struct{}), lead: make(chan struct{}, 1)}
			g.queue = append(g.queue, b)
		}
		i = len(b.items)
		b.items = append(b.items, item)
		b.bytes += n
		g.mu.Unlock()
		select {
		case <-b.done:
		case <-b.lead:
			g.run(b)
		}
	}
	if b.err != nil {
		var zero R
		return zero, b.err
	}
	return b.res[i], nil
}

// Waiting returns how many items wait for a batch after the one in flight.
// It is safe for concurrent use.
func (g *Group[T, R]) Waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, b := range g.queue {
		n += len(b.items)
	}
	return n
}

// run flushes b, which has left the queue, then hands the turn on.
// If flush panics, the waiting batches are still handed on before the
// panic goes up.
func (g *Group[T, R]) run(b *batch[T, R]) {
	defer g.next()
	flushed := false
	defer func() {
		if !flushed {
			b.err = fmt.Errorf("%w: a batched round trip panicked", g.Corrupt)
		}
		if b.done != nil {
			close(b.done)
		}
	}()
	res, err := g.Flush(b.items)
	flushed = true
	if err == nil && len(res) != len(b.items) {
		err = fmt.Errorf("%w: %d results for a batch of %d", g.Corrupt, len(res), len(b.items))
	}
	b.res, b.err = res, err
}

// next hands the turn to the oldest waiting batch, or marks the group idle.
func (g *Group[T, R]) next() {
	g.mu.Lock()
	if len(g.queue) == 0 {
		g.busy = false
		g.mu.Unlock()
		return
	}
	next := g.queue[0]
	g.queue[0] = nil
	g.queue = g.queue[1:]
	g.mu.Unlock()
	next.lead <- struct{}{}
}
