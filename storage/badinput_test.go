package storage

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// A nil Option and a nil client of any kind are configuration errors, not
// panics.
func TestNewNilInput(t *testing.T) {
	rdb := shared.Client(t)
	_, err := New(rdb, nil)
	require.ErrorIs(t, err, ErrConfig)
	_, err = New(rdb, WithNamespace(testNS()), nil)
	require.ErrorIs(t, err, ErrConfig)
	require.Contains(t, err.Error(), "option 2 is nil")
	for _, c := range []redis.UniversalClient{nil, (*redis.Client)(nil), (*redis.ClusterClient)(nil), (*redis.Ring)(nil)} {
		_, err := New(c)
		require.ErrorIs(t, err, ErrConfig, "%T", c)
	}
}

// DeadLetters with a count up to math.MaxInt returns every dead letter
// past offset (offset+count used to overflow).
func TestDeadLettersHugeCount(t *testing.T) {
	rdb := shared.Client(t)
	s := newStorage(t, rdb, WithMaxDeliveries(1))
	const n = 8
	for i := range n {
		_, err := s.AddURLs(bg, fmt.Sprintf("http://example.com/%d", i))
		require.NoError(t, err)
		b, err := s.GetRequest()
		require.NoError(t, err)
		require.NoError(t, s.Nack(requestOf(t, b), fmt.Errorf("fail %d", i)))
	}
	for _, c := range []struct{ offset, count, want int }{
		{0, math.MaxInt, n}, {5, math.MaxInt, n - 5}, {5, math.MaxInt - 4, n - 5},
		{5, 100, n - 5}, {5, 2, 2}, {math.MaxInt, math.MaxInt, 0}, {n, 1, 0},
	} {
		d, err := s.DeadLetters(bg, c.offset, c.count)
		require.NoError(t, err, "%+v", c)
		require.Len(t, d, c.want, "%+v", c)
		if c.want > 0 {
			require.Equal(t, fmt.Sprint("fail ", c.offset), d[0].Reason, "%+v", c)
		}
	}
}

// A nil context is ErrConfig, not a panic.
func TestNilContext(t *testing.T) {
	s := newStorage(t, shared.Client(t))
	var nilCtx context.Context
	_, err := s.AddURLs(nilCtx, "http://example.com/x")
	require.ErrorIs(t, err, ErrConfig)
	_, err = s.Stats(nilCtx)
	require.ErrorIs(t, err, ErrConfig)
	_, err = s.DeadLetters(nilCtx, 0, 1)
	require.ErrorIs(t, err, ErrConfig)
	require.ErrorIs(t, s.Requeue(nilCtx, "1"), ErrConfig)
	require.ErrorIs(t, s.Clear(nilCtx), ErrConfig)
	st, err := s.Stats(bg)
	require.NoError(t, err)
	require.Zero(t, st.Ready, "AddURLs queued with a nil context")
}

// An error about a URL quotes at most its first 64 bytes.
func TestAddURLsErrorClipsURL(t *testing.T) {
	s := newStorage(t, shared.Client(t))
	_, err := s.AddURLs(bg, "http://example.com/"+strings.Repeat("a", 2<<20))
	require.ErrorIs(t, err, ErrInvalidRequest)
	require.Less(t, len(err.Error()), 300, "%.300s", err)
}
