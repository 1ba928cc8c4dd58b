package group

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var errCorrupt = errors.New("corrupt")

// TestGroupUnit: each caller gets its own item's result, batches respect
// their bounds, a failed flush fails only its batch, and a panicking flush
// still hands the turn on.
func TestGroupUnit(t *testing.T) {
	var flushes atomic.Int64
	var failNext, panicNext atomic.Bool
	g := &Group[int, int]{Max: 8, MaxBytes: 100, Size: func(i int) int { return i % 50 }, Corrupt: errCorrupt,
		Flush: func(items []int) ([]int, error) {
			flushes.Add(1)
			if panicNext.Swap(false) {
				panic("boom")
			}
			if failNext.Swap(false) {
				return nil, errors.New("down")
			}
			if len(items) > 8 {
				return nil, fmt.Errorf("batch of %d", len(items))
			}
			sum := 0
			for _, it := range items {
				sum += it % 50
			}
			if sum > 100 && len(items) > 1 {
				return nil, fmt.Errorf("batch of %d bytes", sum)
			}
			time.Sleep(time.Millisecond)
			out := make([]int, len(items))
			for i, it := range items {
				out[i] = it * 2
			}
			return out, nil
		}}
	var wg sync.WaitGroup
	var failed atomic.Int64
	for w := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 60 {
				v := w*1000 + i
				if i == 30 && w == 0 {
					failNext.Store(true)
				}
				got, err := g.Do(v)
				if err != nil {
					failed.Add(1)
					continue
				}
				assert.Equal(t, 2*v, got)
			}
		}()
	}
	wg.Wait()
	require.LessOrEqual(t, failed.Load(), int64(8)) // one batch failed, no more
	require.Less(t, flushes.Load(), int64(64*60))

	panicNext.Store(true)
	var panicked atomic.Int64
	var errs atomic.Int64
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				if recover() != nil {
					panicked.Add(1)
				}
			}()
			if _, err := g.Do(1); err != nil {
				assert.ErrorIs(t, err, errCorrupt)
				errs.Add(1)
			}
		}()
	}
	wg.Wait()
	require.Equal(t, int64(1), panicked.Load())
	got, err := g.Do(3) // the group still works
	require.NoError(t, err)
	require.Equal(t, 6, got)
}

// TestGroupWaiting: the items queued behind the batch in flight are
// counted until their batch is flushed.
func TestGroupWaiting(t *testing.T) {
	hold, held := make(chan struct{}), make(chan struct{})
	var once sync.Once
	g := &Group[int, int]{Max: 2, Corrupt: errCorrupt, Flush: func(items []int) ([]int, error) {
		once.Do(func() { close(held); <-hold })
		return items, nil
	}}
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := g.Do(i)
			assert.NoError(t, err)
			assert.Equal(t, i, got)
		}()
		if i == 0 {
			<-held
		}
	}
	require.Eventually(t, func() bool { return g.Waiting() == 3 }, 5*time.Second, time.Millisecond)
	close(hold)
	wg.Wait()
	assert.Zero(t, g.Waiting())
}
