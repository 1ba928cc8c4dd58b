package ban

import (
	"slices"
	"sync"
)

// Size baselines: per process, not shared through Redis. A baseline is a
// statistic, not a decision the cluster must agree on: learning it locally
// costs no Redis round trip per response, a few dozen pages warm it up, and a
// baseline skewed in one process (by a wave of placeholders it took for
// pages before it knew better) stays in that process. A baseline learns
// only from pages classified OK, per site and media type (an HTML page is not
// judged by the size of the site's JSON), and judges by the median, which a
// minority of odd pages does not move.
const (
	baselineWindow  = 64   // the latest sizes kept per site and media type
	baselineMinimum = 16   // sizes needed before pages are judged by size
	baselineMaxKeys = 4096 // sites x media types learnt; more are not judged by size
)

// baselines are the rolling size baselines of one Detector.
type baselines struct {
	mu sync.Mutex
	m  map[string]*sizeRing
}

type sizeRing struct {
	sizes [baselineWindow]int
	n     int // sizes recorded, at most baselineWindow
	next  int
}

// median returns the median of the latest sizes under key, once there are
// enough of them.
func (b *baselines) median(key string) (int, bool) {
	b.mu.Lock()
	ring := b.m[key]
	if ring == nil || ring.n < baselineMinimum {
		b.mu.Unlock()
		return 0, false
	}
	var buf [baselineWindow]int
	s := buf[:ring.n]
	copy(s, ring.sizes[:ring.n])
	b.mu.Unlock()
	slices.Sort(s)
	return s[len(s)/2], true
}

func (b *baselines) learn(key string, size int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ring := b.m[key]
	if ring == nil {
		if len(b.m) >= baselineMaxKeys {
			return
		}
		if b.m == nil {
			b.m = make(map[string]*sizeRing)
		}
		ring = &sizeRing{}
		b.m[key] = ring
	}
	ring.sizes[ring.next] = size
	ring.next = (ring.next + 1) % baselineWindow
	ring.n = min(ring.n+1, baselineWindow)
}
