package metrics

import (
	"cmp"
	"math"
	"slices"
	"sync"
	"time"
)

// Per-proxy health: a ring of each proxy's latest attempts (latency in
// microseconds, one bit for "bad": a ban or a proxy failure), with running
// sums, so an attempt costs O(1) and a window of n attempts 4n bytes plus
// n bits. At scrape time the k worst proxies are picked.

// proxyIdle: a proxy with no attempt through this server for this long is
// forgotten (removed from the pool, or not leased here any more).
const proxyIdle = time.Hour

type proxyStats struct {
	window int
	mu     sync.Mutex
	m      map[string]*proxyWindow
}

type proxyWindow struct {
	lat    []uint32 // latency, µs; a ring of up to window entries
	bad    []uint64 // bit i: attempt i was bad
	next   int      // where the next attempt goes
	sumLat uint64
	bads   int
	last   time.Time
}

func (s *proxyStats) add(id string, latency time.Duration, bad bool, now time.Time) {
	us := uint32(min(max(latency.Microseconds(), 0), math.MaxUint32))
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.m[id]
	if w == nil {
		w = &proxyWindow{lat: make([]uint32, 0, s.window), bad: make([]uint64, (s.window+63)/64)}
		s.m[id] = w
	}
	w.add(us, bad, s.window)
	w.last = now
}

func (w *proxyWindow) add(us uint32, bad bool, window int) {
	i := w.next
	if len(w.lat) < window {
		w.lat = append(w.lat, 0)
	} else {
		w.sumLat -= uint64(w.lat[i])
		if w.bad[i/64]&(1<<(i%64)) != 0 {
			w.bads--
		}
	}
	w.lat[i] = us
	w.sumLat += uint64(us)
	if bad {
		w.bad[i/64] |= 1 << (i % 64)
		w.bads++
	} else {
		w.bad[i/64] &^= 1 << (i % 64)
	}
	w.next = (i + 1) % window
}

// proxyHealth is one proxy's window, summed up.
type proxyHealth struct {
	id       string
	success  float64 // share of good attempts
	latency  time.Duration
	attempts int
}

// worst returns the k proxies with the lowest success ratio (ties: the
// slowest first, then by ID) and how many proxies are tracked, after
// forgetting those idle for proxyIdle.
func (s *proxyStats) worst(k int, now time.Time) ([]proxyHealth, int) {
	s.mu.Lock()
	all := make([]proxyHealth, 0, len(s.m))
	for id, w := range s.m {
		if now.Sub(w.last) > proxyIdle {
			delete(s.m, id)
			continue
		}
		n := len(w.lat)
		all = append(all, proxyHealth{
			id:       id,
			success:  float64(n-w.bads) / float64(n),
			latency:  time.Duration(w.sumLat/uint64(n)) * time.Microsecond,
			attempts: n,
		})
	}
	s.mu.Unlock()
	slices.SortFunc(all, func(a, b proxyHealth) int {
		return cmp.Or(cmp.Compare(a.success, b.success), cmp.Compare(b.latency, a.latency), cmp.Compare(a.id, b.id))
	})
	return all[:min(k, len(all))], len(all)
}
