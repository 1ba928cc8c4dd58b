package proxyswitch

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/proxyswitch/proxyswitch/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// loadPool fills pool name (under s's prefix) with urls.
func loadPool(t *testing.T, s *Switch, name string, urls []string) {
	t.Helper()
	sw, err := s.poolSwitch(name)
	require.NoError(t, err)
	_, err = sw.Replace(context.Background(), urls)
	require.NoError(t, err)
}

func TestRoutesWithOrderedFallback(t *testing.T) {
	ctx := context.Background()
	all := proxyURLs(6)
	s := newSwitch(t, shared.Client(t), WithPool("datacenter"), WithTimeouts(Timeouts{MaxWait: Off}),
		WithRoute("shop.example", "datacenter", "residential"),
		WithRoute("avito.example", "residential"),
		WithRoute("cheap.example", "nothing-here", "datacenter"))
	loadPool(t, s, "datacenter", all[:2])
	loadPool(t, s, "residential", all[2:4])
	pool := func(l *Lease) string { return l.be.pool() }

	var held []*Lease
	for range 2 {
		l, err := s.Lease(ctx, "shop.example")
		require.NoError(t, err)
		assert.Equal(t, "datacenter", pool(l), "the first pool first")
		held = append(held, l)
	}
	l, err := s.Lease(ctx, "shop.example")
	require.NoError(t, err)
	assert.Equal(t, "residential", pool(l), "the next pool once the first is exhausted")
	held = append(held, l)
	require.NoError(t, held[0].Release(ctx))
	l, err = s.Lease(ctx, "shop.example")
	require.NoError(t, err)
	assert.Equal(t, "datacenter", pool(l), "back to the first pool as soon as it has a proxy")

	// A quarantine through a routed lease lands in its pool.
	require.NoError(t, held[2].Report(ctx, ban.Verdict{Kind: ban.Ban, Reason: "http_403"}))
	res, _ := s.poolSwitch("residential")
	st, err := res.Stats(ctx, "shop.example")
	require.NoError(t, err)
	assert.Equal(t, 1, st.FreeSlots, "one residential proxy quarantined on the site")
	assert.Equal(t, int64(1), s.BanCounts()[BanKey{"shop.example", "http_403"}], "counted by the Switch")
	l, err = s.Lease(ctx, "shop.example")
	require.NoError(t, err)
	assert.Equal(t, "residential", pool(l))
	_, err = s.Lease(ctx, "shop.example")
	require.ErrorIs(t, err, ErrNoProxy, "every pool of the route busy or quarantined")
	assert.NotErrorIs(t, err, ErrEmptyPool)

	// One pool: no fallback.
	for range 2 {
		l, err := s.Lease(ctx, "avito.example")
		require.NoError(t, err)
		assert.Equal(t, "residential", pool(l))
	}
	_, err = s.Lease(ctx, "avito.example")
	require.ErrorIs(t, err, ErrNoProxy)

	// An empty pool is skipped; a site without a route uses the Switch's pool.
	l, err = s.Lease(ctx, "cheap.example")
	require.NoError(t, err)
	assert.Equal(t, "datacenter", pool(l))
	l, err = s.Lease(ctx, "other.example")
	require.NoError(t, err)
	assert.Equal(t, "datacenter", pool(l))
	assert.Equal(t, s, l.sw)

	// The request kind: a context routes whatever the site.
	l, err = s.Lease(UsePools(ctx, "residential"), "other.example")
	require.NoError(t, err)
	assert.Equal(t, "residential", pool(l))
	_, err = s.Lease(UsePools(ctx, "nothing-here"), "other.example")
	require.ErrorIs(t, err, ErrEmptyPool)

	_, err = NewSwitch(shared.Client(t), WithRoute("x.example"))
	require.ErrorIs(t, err, ErrConfig, "a route without pools")
	_, err = NewSwitch(shared.Client(t), WithRoute("x.example", "bad pool"))
	require.ErrorIs(t, err, ErrConfig)
}

// A pool split over three slots: leases spread evenly over the parts.
func TestSpreadOverSplitPools(t *testing.T) {
	ctx := context.Background()
	parts := shard.PoolNames("hot", 3)
	s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: Off}), WithSpread("", parts...))
	ps, err := ParseProxies(proxyURLs(60))
	require.NoError(t, err)
	dealt := shard.Split(ps, 3, (*Proxy).ID)
	slots := map[uint16]bool{}
	for i, part := range parts {
		assert.InDelta(t, 20, len(dealt[i]), 8, part)
		sw, err := s.poolSwitch(part)
		require.NoError(t, err)
		_, err = sw.ReplaceProxies(ctx, dealt[i])
		require.NoError(t, err)
		slots[redisKeySlot(sw.keys.proxies())] = true
	}
	assert.Len(t, slots, 3, "each part in a slot of its own")
	per := map[string]int{}
	for range 30 {
		l, err := s.Lease(ctx, "shop.example")
		require.NoError(t, err)
		per[l.be.pool()]++
	}
	t.Logf("30 leases over the parts: %v", per)
	for _, part := range parts {
		assert.InDelta(t, 10, per[part], 1, part)
	}
	for range 30 {
		_, err := s.Lease(ctx, "shop.example")
		require.NoError(t, err, "a part that runs out passes on to the others")
	}
	_, err = s.Lease(ctx, "shop.example")
	require.ErrorIs(t, err, ErrNoProxy)
}

// A Colly crawl routed over two pools: more workers than the first pool
// has proxies spill into the second, never two at once on one IP.
func TestRoutedCrawl(t *testing.T) {
	bed := testbed.NewBed(t, 1, 6)
	s := newSwitch(t, shared.Client(t), WithPool("dc"), WithRoute("", "dc", "res"))
	loadPool(t, s, "dc", bed.ProxyURLs()[:3])
	loadPool(t, s, "res", bed.ProxyURLs()[3:])
	c := colly.NewCollector(colly.Async(true), colly.AllowURLRevisit())
	s.Attach(c)
	require.NoError(t, c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: 6}))
	for i := range 60 {
		require.NoError(t, c.Visit(fmt.Sprintf("%s/slow?d=20ms&i=%d", bed.Sites[0].URL(), i)))
	}
	c.Wait()
	assert.Equal(t, 60, bed.SiteHits())
	assert.Len(t, bed.Sites[0].Recorder().IPs(), 6, "both pools served")
	assertGroundTruth(t, bed)
	assertNoLeases(t, s, bed.Sites...)
	res, _ := s.poolSwitch("res")
	assertNoLeases(t, res, bed.Sites...)

	// A collector for one kind of request: its context routes it.
	kind := colly.NewCollector(colly.AllowURLRevisit())
	kind.Context = UsePools(context.Background(), "res")
	s.Attach(kind)
	bed.Sites[0].Recorder().Reset()
	for i := range 6 {
		require.NoError(t, kind.Visit(fmt.Sprintf("%s/p/%d", bed.Sites[0].URL(), i+1)))
	}
	assert.NotEmpty(t, bed.Sites[0].Recorder().IPs())
	for ip := range bed.Sites[0].Recorder().IPs() {
		assert.Contains(t, []string{"127.0.1.4", "127.0.1.5", "127.0.1.6"}, ip, "only the residential pool")
	}
	assertNoLeases(t, res, bed.Sites...)
}

// The fallback covers every pool a route names: each gets a local share.
func TestFallbackCoversRoutedPools(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	all := proxyURLs(4)
	s := newSwitch(t, srv.Client(t), append(fastFallback("crawler-1"), WithPool("dc"), WithTimeouts(Timeouts{MaxWait: time.Second}),
		WithRoute("shop.example", "dc", "res"))...)
	loadPool(t, s, "dc", all[:2])
	loadPool(t, s, "res", all[2:])
	startSwitch(t, s)
	require.NoError(t, srv.Kill())
	per := map[string]int{}
	for range 4 {
		l, err := s.Lease(ctx, "shop.example")
		require.NoError(t, err)
		require.NotNil(t, l.local)
		per[l.be.pool()]++
	}
	assert.Equal(t, map[string]int{"dc": 2, "res": 2}, per)
}
