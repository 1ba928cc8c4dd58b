package storage

import (
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// An earlier version's delivery 1 claimed the URL (a bare mark, "0", naming
// no claimer) and its worker died; that version's q_pop moved the request
// back to the ready list (tries "1"): Stats shows nothing in flight. After
// the upgrade its delivery 2 must still be fetched, as the earlier version
// would have (a redelivery passes a mark that names no claimer).
func TestLegacyMarkRedeliveryFromReady(t *testing.T) {
	for _, ttl := range []time.Duration{0, time.Hour} {
		t.Run("ttl="+ttl.String(), func(t *testing.T) {
			site := newCountingSite(t, nil)
			rdb := shared.Client(t)
			s := newStorage(t, rdb, WithVisibilityTimeout(300*time.Millisecond), WithPollInterval(10*time.Millisecond), WithVisitedTTL(ttl))
			x := site.URL + "/legacy"
			require.NoError(t, s.AddRequest(marshal(t, x)))
			h, ok := requestHash(wireRequest{URL: x})
			require.True(t, ok)
			mark := "0"
			if ttl > 0 {
				mark = strconv.FormatInt(time.Now().Add(ttl).UnixMilli(), 10)
			}
			require.NoError(t, rdb.HSet(bg, s.bucketOf(h), visitedField(h), mark).Err())
			require.NoError(t, rdb.HSet(bg, s.q.tries, "1", "1").Err())
			st, err := s.Stats(bg)
			require.NoError(t, err)
			require.Equal(t, Stats{Ready: 1}, st, "nothing in flight")
			runQueue(t, s, 2, nil)
			require.Equal(t, 1, site.count("/legacy"), "URL lost: dropped as visited by its own earlier-version mark")
			st, err = s.Stats(bg)
			require.NoError(t, err)
			require.Equal(t, Stats{}, st)
		})
	}
}

// A first delivery still finds an earlier version's mark a duplicate (the
// earlier rule): acknowledged, not fetched.
func TestLegacyMarkRefusesFirstDelivery(t *testing.T) {
	site := newCountingSite(t, nil)
	rdb := shared.Client(t)
	s := newStorage(t, rdb, WithPollInterval(10*time.Millisecond))
	x := site.URL + "/dup"
	require.NoError(t, s.AddRequest(marshal(t, x)))
	h, ok := requestHash(wireRequest{URL: x})
	require.True(t, ok)
	require.NoError(t, rdb.HSet(bg, s.bucketOf(h), visitedField(h), "0").Err())
	runQueue(t, s, 2, nil)
	require.Equal(t, 0, site.count("/dup"))
	st, err := s.Stats(bg)
	require.NoError(t, err)
	require.Equal(t, Stats{}, st)
}

// A claim made for no queued delivery writes an empty owner, so that a
// redelivery can tell it from an earlier version's mark (and is refused by
// it), with or without a TTL.
func TestMarkWithoutOwnerIsMarkedNew(t *testing.T) {
	for _, ttl := range []time.Duration{0, time.Hour} {
		t.Run("ttl="+ttl.String(), func(t *testing.T) {
			rdb := shared.Client(t)
			s := newStorage(t, rdb, WithVisitedTTL(ttl))
			require.NoError(t, s.Visited(7))
			v, err := rdb.HGet(bg, s.bucketOf(7), visitedField(7)).Result()
			require.NoError(t, err)
			require.Regexp(t, `^[0-9]+\|$`, v)
			visited, err := s.IsVisited(7)
			require.NoError(t, err)
			require.True(t, visited)
			require.ErrorIs(t, twin(t, s, shared.Client(t)).Visited(7), ErrAlreadyVisited)
		})
	}
}

// A request an earlier version's worker held at the upgrade (in flight,
// tries "1", its bare mark set; the worker is stopped) comes back after its
// visibility timeout and is fetched by this version.
func TestLegacyInFlightAtUpgrade(t *testing.T) {
	site := newCountingSite(t, nil)
	rdb := shared.Client(t)
	s := newStorage(t, rdb, WithVisibilityTimeout(300*time.Millisecond), WithPollInterval(10*time.Millisecond))
	x := site.URL + "/held"
	require.NoError(t, s.AddRequest(marshal(t, x)))
	h, ok := requestHash(wireRequest{URL: x})
	require.True(t, ok)
	require.NoError(t, rdb.LPop(bg, s.q.ready).Err())
	require.NoError(t, rdb.HSet(bg, s.q.tries, "1", "1").Err())
	require.NoError(t, rdb.ZAdd(bg, s.q.inflight, redis.Z{Score: 1, Member: "1"}).Err())
	require.NoError(t, rdb.HSet(bg, s.bucketOf(h), visitedField(h), "0").Err())
	runQueue(t, s, 2, nil)
	require.Equal(t, 1, site.count("/held"))
	st, err := s.Stats(bg)
	require.NoError(t, err)
	require.Equal(t, Stats{}, st)
}
