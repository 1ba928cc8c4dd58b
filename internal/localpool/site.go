package localpool

import "container/heap"

// scopeState is a Pool's state for one scope (a site, or "*" with
// Config.Global): the in-memory twin of the Redis free set and lease hash.
// Guarded by the Pool's mutex.
type scopeState struct {
	free    slotHeap                // every slot, earliest next-free time first
	slots   map[string][]*slotState // proxy ID -> its K slots
	lastUse int64                   // unix ms of the last lease
}

// slotState is one of a proxy's K concurrent uses on one scope.
type slotState struct {
	id     string
	n      int    // slot number, 0..K-1
	next   int64  // unix ms at which it is next free: lease expiry, cooldown or quarantine end
	seq    uint64 // order of the last change of next: among equals, the least recently used first
	token  string // owner of the current lease record; "" for none
	expiry int64  // unix ms at which that lease ends
	index  int    // position in the heap
}

// slotHeap is a min-heap of slots by (next, seq).
type slotHeap []*slotState

func (h slotHeap) Len() int           { return len(h) }
func (h slotHeap) Less(i, j int) bool { return h.lessSlots(h[i], h[j]) }

// lessSlots orders slots as the heap does: earliest next-free time, then
// least recently changed.
func (slotHeap) lessSlots(a, b *slotState) bool {
	if a.next != b.next {
		return a.next < b.next
	}
	return a.seq < b.seq
}
func (h slotHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *slotHeap) Push(x any) {
	s := x.(*slotState)
	s.index = len(*h)
	*h = append(*h, s)
}
func (h *slotHeap) Pop() any {
	old := *h
	s := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	s.index = -1
	return s
}

// add puts a proxy's K slots in, first free at next.
func (st *scopeState) add(id string, k int, next int64, seq func() uint64) {
	ss := make([]*slotState, k)
	for n := range ss {
		ss[n] = &slotState{id: id, n: n, next: next, seq: seq()}
		heap.Push(&st.free, ss[n])
	}
	st.slots[id] = ss
}

// remove takes a proxy's slots out; a lease on them can no longer be
// released or extended, and it is never handed out again.
func (st *scopeState) remove(id string) {
	for _, s := range st.slots[id] {
		heap.Remove(&st.free, s.index)
	}
	delete(st.slots, id)
}

// setNext moves a slot's next-free time to at.
func (st *scopeState) setNext(s *slotState, at int64, seq uint64) {
	s.next, s.seq = at, seq
	heap.Fix(&st.free, s.index)
}

// raise pushes every slot of id to at least at (a quarantine or a hold),
// keeping anything already further out.
func (st *scopeState) raise(id string, at int64, seq func() uint64) {
	for _, s := range st.slots[id] {
		if s.next < at {
			st.setNext(s, at, seq())
		}
	}
}

// live reports whether a slot holds a lease that has not ended by now.
func (s *slotState) live(now int64) bool { return s.token != "" && s.expiry > now }
