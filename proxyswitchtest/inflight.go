package proxyswitchtest

// inflight tracks per-key in-flight counters and derives the maximum
// concurrency and the number of colliding arrivals. It is not synchronised;
// callers hold their own lock.
type inflight struct {
	cur        map[string]int
	maxByKey   map[string]int
	max        int
	collisions int
}

func newInflight() inflight {
	return inflight{cur: make(map[string]int), maxByKey: make(map[string]int)}
}

// begin registers an arrival for key and reports whether another request with
// the same key was already in flight (a collision).
func (f *inflight) begin(key string) (collided bool) {
	n := f.cur[key] + 1
	f.cur[key] = n
	if n > 1 {
		f.collisions++
		collided = true
	}
	if n > f.maxByKey[key] {
		f.maxByKey[key] = n
	}
	if n > f.max {
		f.max = n
	}
	return collided
}

// end ends one in-flight interval for key.
func (f *inflight) end(key string) {
	if n := f.cur[key] - 1; n > 0 {
		f.cur[key] = n
	} else {
		delete(f.cur, key)
	}
}

// inFlight returns the total number of requests in flight.
func (f *inflight) inFlight() int {
	total := 0
	for _, n := range f.cur {
		total += n
	}
	return total
}

// resetStats clears the statistics but keeps the current in-flight counters,
// so that requests in flight during a reset still end correctly.
func (f *inflight) resetStats() {
	f.max = 0
	f.collisions = 0
	clear(f.maxByKey)
	for k, n := range f.cur {
		f.maxByKey[k] = n
		f.max = max(f.max, n)
	}
}

func copyMap(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
