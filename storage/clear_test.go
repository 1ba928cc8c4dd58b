package storage

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/proxyswitch/proxyswitch/internal/engine"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// fill writes every kind of key a namespace has: visited marks, cookies,
// queued, in-flight and dead requests.
func fill(t testing.TB, s *Storage) {
	t.Helper()
	for i := range 50 {
		require.NoError(t, s.Visited(uint64(i)*7919))
	}
	u, _ := url.Parse("http://shop.example/")
	s.SetCookies(u, "a=1; Path=/")
	for i := range 3 {
		require.NoError(t, s.AddRequest(marshal(t, fmt.Sprintf("http://shop.example/%d", i))))
	}
	tok, _ := pop(t, s)
	_, err := s.nack(bg, tok, "failed", true)
	require.NoError(t, err)
	pop(t, s) // in flight
}

// allKeys lists every key of the server (a test may SCAN everything).
func allKeys(t testing.TB, rdb *redis.Client) []string {
	t.Helper()
	var keys []string
	iter := rdb.Scan(bg, 0, "*", 1000).Iterator()
	for iter.Next(bg) {
		keys = append(keys, iter.Val())
	}
	require.NoError(t, iter.Err())
	slices.Sort(keys)
	return keys
}

// Clearing one namespace removes all of its keys and none of another's,
// even when the namespaces are each other's prefixes or glob patterns.
func TestClearOnlyOwnNamespace(t *testing.T) {
	rdb := redistest.Start(t).Client(t) // a server of its own: every key is ours
	names := []string{"a", "a*", "a?", "[a]", `a\`, "a:v", "a:v:", "a:", "ab", "*"}
	stores := map[string]*Storage{}
	for _, ns := range names {
		s := newStorage(t, rdb, WithNamespace(ns), WithVisitedBuckets(8))
		fill(t, s)
		stores[ns] = s
	}
	owned := func(ns, key string) bool {
		ns = engine.EscapeName(ns) // ':' is "%3A" in the keys
		return strings.HasPrefix(key, "{"+ns+"}:") || strings.HasPrefix(key, ns+":v:{")
	}
	before := allKeys(t, rdb)
	for _, ns := range names {
		n := 0
		for _, k := range before {
			if owned(ns, k) {
				n++
			}
		}
		require.GreaterOrEqual(t, n, 10, "namespace %q wrote %d keys", ns, n)
	}
	for i, ns := range names {
		require.NoError(t, stores[ns].Clear(bg), ns)
		after := allKeys(t, rdb)
		var want []string
		for _, k := range before {
			gone := false
			for _, cleared := range names[:i+1] {
				gone = gone || owned(cleared, k)
			}
			if !gone {
				want = append(want, k)
			}
		}
		require.Equal(t, want, after, "after clearing %q", ns)
	}
	require.Empty(t, allKeys(t, rdb))
}
