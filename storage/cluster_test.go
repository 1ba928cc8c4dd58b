package storage

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/gocolly/colly/v2/queue"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// On a three-master Redis Cluster: every script runs (one slot each), the
// visited set spreads over all masters, a queue crawl works end to end,
// and Clear empties the namespace on every node and nothing else.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3)
	rdb := cl.Client(t)
	s := newStorage(t, rdb, WithVisitedBuckets(256), WithPollInterval(5*time.Millisecond))
	other := newStorage(t, rdb)
	for i := range 2000 {
		require.NoError(t, s.Visited(uint64(i)*0x9e3779b97f4a7c15))
	}
	require.NoError(t, other.Visited(1))
	perNode := dbSizes(t, rdb)
	require.Len(t, perNode, 3)
	for addr, n := range perNode {
		require.Greater(t, n, int64(20), "master %s holds %d keys: the visited set does not spread", addr, n)
	}

	site := newCountingSite(t, nil)
	q, err := queue.New(1, s)
	require.NoError(t, err)
	for i := range 50 {
		require.NoError(t, q.AddURL(fmt.Sprintf("%s/c/%d", site.URL, i)))
	}
	require.NoError(t, q.AddURL(site.URL+"/c/3"))
	runQueue(t, s, 4, nil)
	hits, distinct := site.total()
	require.Equal(t, 50, hits)
	require.Equal(t, 50, distinct)
	st, err := s.Stats(bg)
	require.NoError(t, err)
	require.Equal(t, Stats{}, st)
	u, _ := url.Parse(site.URL)
	s.SetCookies(u, "k=v; Path=/")
	require.Equal(t, "k=v; Path=/", s.Cookies(u))

	require.NoError(t, s.Clear(bg))
	var left int64
	for _, n := range dbSizes(t, rdb) {
		left += n
	}
	require.EqualValues(t, 2, left, "Clear left keys of its namespace, or took another's") // other's bucket and meta
	v, err := other.IsVisited(1)
	require.NoError(t, err)
	require.True(t, v)
}

// dbSizes returns the number of keys on each master.
func dbSizes(t testing.TB, rdb *redis.ClusterClient) map[string]int64 {
	t.Helper()
	var mu sync.Mutex
	out := map[string]int64{}
	require.NoError(t, rdb.ForEachMaster(bg, func(ctx context.Context, n *redis.Client) error {
		c, err := n.DBSize(ctx).Result()
		mu.Lock()
		out[n.Options().Addr] = c
		mu.Unlock()
		return err
	}))
	return out
}

// TestClusterVisitedPipelines: on a Redis Cluster, the pipelines that
// concurrent IsVisited and Visited calls share hold commands for buckets
// in many slots on every master (the ClusterClient splits them by node),
// and every caller still gets its own answer.
func TestClusterVisitedPipelines(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3)
	for _, ttl := range []time.Duration{0, time.Minute} {
		rdb := cl.Client(t)
		h := &visitedTrips{delay: 10 * time.Millisecond}
		rdb.AddHook(h)
		s := newStorage(t, rdb, WithVisitedBuckets(256), WithVisitedTTL(ttl))
		other := twin(t, s, rdb) // claims: it never told a caller "visited" (a revisit)
		const n = 90
		id := func(i int) uint64 { return uint64(i+1) * 0x9e3779b97f4a7c15 }
		for i := 0; i < n; i += 3 {
			require.NoError(t, s.Visited(id(i)))
		}
		h.pipelines.Store(0)
		onAll([]*Storage{s}, n, func(s *Storage, i int) {
			v, err := s.IsVisited(id(i))
			if assert.NoError(t, err) {
				assert.Equal(t, i%3 == 0, v, "IsVisited of ID %d", i)
			}
			err = other.Visited(id(i))
			if i%3 == 0 {
				assert.ErrorIs(t, err, ErrAlreadyVisited, "Visited of ID %d", i)
			} else {
				assert.NoError(t, err, "Visited of ID %d", i)
			}
		})
		require.Greater(t, h.pipelines.Load(), int64(0), "no pipeline shared")
		require.Greater(t, h.maxKeys.Load(), int64(10), "no pipeline spanned buckets")
		for addr, keys := range dbSizes(t, rdb) {
			require.Greater(t, keys, int64(5), "master %s holds %d keys", addr, keys)
		}
		for i := range n {
			v, err := s.IsVisited(id(i))
			require.NoError(t, err)
			require.True(t, v, "ID %d", i)
		}
	}
}
