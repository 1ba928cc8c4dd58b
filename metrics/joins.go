package metrics

import (
	"slices"
	"sync"
	"time"
)

// The ban-spike signal. When a server joins, every server's share of the
// pool moves; if two servers' shares overlap for a while (a server still on
// the old member list, a sharder that does not fit the pool), two workers
// use one IP on one site at once and the site bans it. So each server
// compares its own ban share (bans per attempt) in the join window before
// the member list grew with the share in the join window after.
//
// Attempts are counted in joinBuckets buckets spanning one join window, so
// the "before" share covers the last 95 to 100% of a window; the "after"
// share counts every attempt from the join until a window later.

const (
	joinBuckets = 20
	// The spike rule: at least spikeMinAttempts attempts after the join,
	// and an after share at least spikeFactor times the before share and
	// spikeMinExcess (5 percentage points) above it.
	spikeMinAttempts = 20
	spikeFactor      = 2
	spikeMinExcess   = 0.05
	// spikeHold: the signal stays up at most this many join windows after
	// the join, so that an alert on it ends by itself.
	spikeHold = 2
)

type counts struct{ attempts, bans int64 }

func (c counts) ratio() float64 {
	if c.attempts == 0 {
		return 0
	}
	return float64(c.bans) / float64(c.attempts)
}

type joinBucket struct {
	idx int64 // time / step; a bucket of another index is stale
	counts
}

type joinTracker struct {
	window time.Duration

	mu       sync.Mutex
	ring     [joinBuckets]joinBucket
	seen     bool     // a member list was observed
	members  []string // the last one, sorted
	joins    int64
	lastJoin time.Time
	before   counts // frozen at the last join
	after    counts // since the last join, for one window
}

func (j *joinTracker) step() int64 { return max(int64(j.window/joinBuckets), 1) }

func (j *joinTracker) attempt(now time.Time, ban bool) {
	idx := now.UnixNano() / j.step()
	j.mu.Lock()
	defer j.mu.Unlock()
	b := &j.ring[idx%joinBuckets]
	if b.idx != idx {
		*b = joinBucket{idx: idx}
	}
	b.attempts++
	afterJoin := j.joins > 0 && now.Sub(j.lastJoin) < j.window
	if afterJoin {
		j.after.attempts++
	}
	if ban {
		b.bans++
		if afterJoin {
			j.after.bans++
		}
	}
}

func (j *joinTracker) observe(members []string, now time.Time) {
	list := slices.Clone(members)
	slices.Sort(list)
	list = slices.Compact(list)
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.seen {
		joined := 0
		for _, m := range list {
			if _, found := slices.BinarySearch(j.members, m); !found {
				joined++
			}
		}
		if joined > 0 {
			j.joins += int64(joined)
			j.lastJoin = now
			j.before = j.recent(now)
			j.after = counts{}
		}
	}
	j.seen, j.members = true, list
}

// recent sums the buckets of the last window.
func (j *joinTracker) recent(now time.Time) counts {
	cur := now.UnixNano() / j.step()
	var c counts
	for _, b := range j.ring {
		if b.idx > cur-joinBuckets && b.idx <= cur {
			c.attempts += b.attempts
			c.bans += b.bans
		}
	}
	return c
}

type joinSnapshot struct {
	seen          bool
	members       int
	joins         int64
	lastJoin      time.Time
	before, after counts
	spike         bool
}

func (j *joinTracker) snapshot(now time.Time) joinSnapshot {
	j.mu.Lock()
	defer j.mu.Unlock()
	s := joinSnapshot{seen: j.seen, members: len(j.members), joins: j.joins, lastJoin: j.lastJoin,
		before: j.before, after: j.after}
	if j.joins > 0 && now.Sub(j.lastJoin) < spikeHold*j.window {
		rb, ra := s.before.ratio(), s.after.ratio()
		s.spike = s.after.attempts >= spikeMinAttempts && ra >= spikeFactor*rb && ra-rb >= spikeMinExcess
	}
	return s
}
