package proxyswitch

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSites(t *testing.T) {
	ctx := context.Background()
	s := newSwitch(t, shared.Client(t))
	require.NoError(t, allScripts["sites"].Load(ctx, shared.Client(t)).Err())
	none, err := s.Sites(ctx)
	require.NoError(t, err)
	assert.Empty(t, none)
	_, err = s.Add(ctx, proxyURLs(2)...)
	require.NoError(t, err)
	for _, site := range []string{"ozon.example", "avito.example"} {
		l, err := s.Lease(ctx, site)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		time.Sleep(5 * time.Millisecond)
	}
	sites, err := s.Sites(ctx)
	require.NoError(t, err)
	require.Len(t, sites, 2)
	assert.Equal(t, "avito.example", sites[0].Site, "most recent first")
	assert.WithinDuration(t, time.Now(), sites[0].LastLease, 5*time.Second)
}
