package storage

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// TestIsVisitedNewAllocs: the visited check of a new URL (Colly's first
// question about every link) reads the mark without go-redis's redis.Nil
// error, whose retry checks alone cost about 16 allocations. Measured on a
// client that bounds round trips by the context (no watchdog goroutine).
func TestIsVisitedNewAllocs(t *testing.T) {
	s := newStorage(t, single.Client(t, func(o *redis.Options) { o.ContextTimeoutEnabled = true }))
	id := uint64(1)
	n := testing.AllocsPerRun(200, func() {
		id++
		if v, err := s.IsVisited(id); err != nil || v {
			t.Fatalf("IsVisited(%d) = %v, %v", id, v, err)
		}
	})
	t.Logf("%.0f allocations per IsVisited of a new URL", n)
	if raceOn {
		t.Skip("the race detector allocates on its own")
	}
	require.LessOrEqual(t, n, 25.0) // 38 before
}
