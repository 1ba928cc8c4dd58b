package source_test

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/source"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fixedList is a Source of a fixed list, nil entries included.
type fixedList []*proxyswitch.Proxy

func (l fixedList) Fetch(context.Context) ([]*proxyswitch.Proxy, error) { return l, nil }
func (l fixedList) String() string                                      { return "fixed list" }

// TestSyncerBadInput: a MinFraction of NaN is refused as any value outside
// (0, 1] is (it used to pass the check and switch the shrink guard off),
// and a source whose list holds a nil proxy fails the sync with
// ErrInvalidProxy (it used to panic): the pool is untouched either way.
func TestSyncerBadInput(t *testing.T) {
	ctx := context.Background()
	sw := newSwitch(t)
	var lines []string
	for i := 1; i <= 10; i++ {
		lines = append(lines, fmt.Sprintf("http://127.0.0.1:%d", 10000+i))
	}
	_, err := sw.Replace(ctx, lines)
	require.NoError(t, err)
	one, err := proxyswitch.ParseProxies(lines[:1])
	require.NoError(t, err)

	r, err := (&source.Syncer{Switch: sw, Source: fixedList(one), MinFraction: math.NaN()}).Sync(ctx)
	require.ErrorIs(t, err, proxyswitch.ErrConfig)
	assert.False(t, r.Written)

	r, err = (&source.Syncer{Switch: sw, Source: fixedList{one[0], nil}, NoGuard: true}).Sync(ctx)
	require.ErrorIs(t, err, proxyswitch.ErrInvalidProxy)
	assert.False(t, r.Written)

	list, err := sw.List(ctx)
	require.NoError(t, err)
	assert.Len(t, list, 10, "the pool is untouched")
}
