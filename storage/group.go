package storage

import (
	"fmt"
	"sync"
)

// group commits concurrent calls of one kind (AddRequest, GetRequest, the
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
// arrived plus its own batch's, each bounded by WithRedisTimeout.
//
// At most one batch of a group is in Redis at a time; the batch flushed
// next is the oldest waiting one, and at most max items (and about
// maxBytes of them, if set) share one.
type group[T, R any] struct {
	max      int
	maxBytes int
	size     func(T) int // the bytes an item adds to its batch's script call; nil: not counted
	// flush runs one batch: it returns one result per item, in order, or
	// an error for all of them.
	flush func(items []T) ([]R, error)

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

// do runs item in the next batch and returns its result.
func (g *group[T, R]) do(item T) (R, error) {
	n := 0
	if g.size != nil {
		n = g.size(item)
	}
	g.mu.Lock()
	var b *batch[T, R]
	if last := len(g.queue) - 1; last >= 0 && len(g.queue[last].items) < g.max &&
		(g.maxBytes == 0 || g.queue[last].bytes+n <= g.maxBytes) {
		b = g.queue[last]
	} else {
		b = &batch[T, R]{done: make(chan struct{}), lead: make(chan struct{}, 1)}
		g.queue = append(g.queue, b)
	}
	i := len(b.items)
	b.items = append(b.items, item)
	b.bytes += n
	if !g.busy {
		// Idle: no batch waits (one would have been handed the turn),
		// so b is the only one: flush it now.
		g.busy = true
		g.queue = g.queue[:0]
		g.mu.Unlock()
		g.run(b)
	} else {
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

// run flushes b, which has left the queue, then hands the turn on.
// If flush panics, the waiting batches are still handed on before the
// panic goes up.
func (g *group[T, R]) run(b *batch[T, R]) {
	defer g.next()
	b.err = errBatchPanicked // until flush returns
	defer close(b.done)
	res, err := g.flush(b.items)
	if err == nil && len(res) != len(b.items) {
		err = fmt.Errorf("%w: %d results for a batch of %d", ErrCorrupt, len(res), len(b.items))
	}
	b.res, b.err = res, err
}

var errBatchPanicked = fmt.Errorf("%w: a batched round trip panicked", ErrCorrupt)

// next hands the turn to the oldest waiting batch, or marks the group idle.
func (g *group[T, R]) next() {
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
