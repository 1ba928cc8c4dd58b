package proxyswitch

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
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

// TestSitesPaged (issue 14): with pages forced to 7 sites, Sites reads 100
// sites in script calls that return a page's worth each (before, one ZRANGE
// of the whole zset: 100,000 sites blocked Redis for 73 ms, 200 ms with the
// reply), in the order one read gave (most recent first, ties in reverse
// order of name), without the sites idle past the idle TTL; and a site
// leased again during the read (one read already, one not yet, the
// continuation itself) is in the list once, with its new lease.
func TestSitesPaged(t *testing.T) {
	const n, page = 100, 7
	setPageSize(t, page)
	ctx := context.Background()
	rdb := shared.Client(t)
	require.NoError(t, allScripts["sites"].Load(ctx, rdb).Err())
	m := &meteredScripter{Scripter: rdb}
	s := newSwitch(t, m)
	now := time.Now().UnixMilli()
	want := map[string]int64{}
	var zs []redis.Z
	for i := range n {
		site := fmt.Sprintf("site-%03d.example", i)
		ms := now - 3_600_000 + int64(i/5)*1000 // ties of five
		want[site] = ms
		zs = append(zs, redis.Z{Score: float64(ms), Member: site})
	}
	for i := range 10 { // idle past the idle TTL (24 h)
		zs = append(zs, redis.Z{Score: float64(now - 25*3_600_000 + int64(i)), Member: fmt.Sprintf("idle-%d.example", i)})
	}
	require.NoError(t, rdb.ZAdd(ctx, s.keys.sites(), zs...).Err())
	order := func(want map[string]int64) []SiteUse {
		var out []SiteUse
		for site, ms := range want {
			out = append(out, SiteUse{Site: site, LastLease: time.UnixMilli(ms)})
		}
		slices.SortFunc(out, func(a, b SiteUse) int {
			if c := b.LastLease.Compare(a.LastLease); c != 0 {
				return c
			}
			return strings.Compare(b.Site, a.Site)
		})
		return out
	}
	got, err := s.Sites(ctx)
	require.NoError(t, err)
	assert.Equal(t, order(want), got)
	calls := m.calls.Load()
	assert.LessOrEqual(t, m.maxReply.Load(), int64(2*page+2), "one call returned more than a page")

	// Leased again during the read, after the first page: site-002 (read
	// on the first page), site-006 (the first page's last, its
	// continuation) and site-050 (not read yet).
	moved := map[string]int64{"site-002.example": now + 1000, "site-006.example": now + 2000, "site-050.example": now + 3000}
	after := func(k int64) {
		if k == calls+1 {
			for site, ms := range moved {
				require.NoError(t, rdb.ZAdd(ctx, s.keys.sites(), redis.Z{Score: float64(ms), Member: site}).Err())
			}
		}
	}
	m.after.Store(&after)
	got, err = s.Sites(ctx)
	m.after.Store(nil)
	require.NoError(t, err)
	maps.Copy(want, moved)
	assert.Equal(t, order(want), got)
	t.Logf("%d sites in %d calls, most items in one reply %d", len(got), m.calls.Load()-calls, m.maxReply.Load())
}
