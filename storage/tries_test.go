package storage

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// A delivery count that is not a positive integer (set by hand, or damaged)
// dead-letters its own request and no other: the rest of a batch of
// GetRequest calls that shares one q_pop is delivered.
func TestCorruptDeliveryCountAlone(t *testing.T) {
	rdb := shared.Client(t)
	s := newStorage(t, rdb)
	corrupt := map[string]string{"2": "-5", "4": "0", "6": "1.5", "8": "abc", "10": "-0", "12": " 1"}
	plant := func() {
		for i := 1; i <= 12; i++ {
			id := fmt.Sprint(i)
			require.NoError(t, rdb.HSet(bg, s.q.data, id, marshal(t, "http://a.example/"+id)).Err())
			require.NoError(t, rdb.RPush(bg, s.q.ready, id).Err())
			if v, ok := corrupt[id]; ok {
				require.NoError(t, rdb.HSet(bg, s.q.tries, id, v).Err())
			}
		}
	}
	checkDead := func() {
		t.Helper()
		dead, err := s.DeadLetters(bg, 0, 100)
		require.NoError(t, err)
		require.Len(t, dead, len(corrupt))
		for _, d := range dead {
			require.Contains(t, corrupt, d.ID)
			require.Equal(t, "corrupt delivery count", d.Reason, d.ID)
		}
	}

	// One q_pop for twelve calls.
	plant()
	pops := make([]string, 12)
	for i := range pops {
		pops[i] = newPopID()
	}
	got, err := s.flushPops(pops)
	require.NoError(t, err)
	var ids []string
	for _, p := range got {
		if p.id != "" {
			require.Equal(t, 1, p.n, p.id)
			ids = append(ids, p.id)
		}
	}
	require.Equal(t, []string{"1", "3", "5", "7", "9", "11"}, ids)
	checkDead()

	// Through GetRequest, called at once by many goroutines.
	require.NoError(t, s.Clear(bg))
	require.NoError(t, s.Init())
	plant()
	var wg sync.WaitGroup
	var mu sync.Mutex
	delivered := 0
	for range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.GetRequest()
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				delivered++
			} else if !errors.Is(err, ErrQueueEmpty) {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for delivered < 6 {
		_, err := s.GetRequest()
		if errors.Is(err, ErrQueueEmpty) {
			break
		}
		require.NoError(t, err)
		delivered++
	}
	require.Equal(t, 6, delivered)
	checkDead()

	// A count damaged while its request was in flight: dead-lettered when
	// its visibility timeout passes, not delivered again.
	require.NoError(t, s.Clear(bg))
	require.NoError(t, s.Init())
	require.NoError(t, s.AddRequest(marshal(t, "http://a.example/x")))
	tok, _ := pop(t, s)
	id, _, err := splitToken(tok)
	require.NoError(t, err)
	require.NoError(t, rdb.HSet(bg, s.q.tries, id, "-5").Err())
	require.NoError(t, rdb.ZAdd(bg, s.q.inflight, redis.Z{Score: 1, Member: id}).Err())
	_, err = s.GetRequest()
	require.ErrorIs(t, err, ErrQueueEmpty)
	dead, err := s.DeadLetters(bg, 0, 10)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, "corrupt delivery count", dead[0].Reason)
}
