package proxyswitch

import (
	"context"
	"fmt"
	"testing"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/proxyswitch/proxyswitch/internal/testlog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Colly's Clone shares the original's HTTP client, so the transport the
// last Attach installed serves both collectors. Attach's promise ("on every
// collector and clone") must hold all the same.

// TestCloneKeepsItsMaxBodySize: a clone attached with its own MaxBodySize
// does not impose it on the original, nor the original on the clone.
func TestCloneKeepsItsMaxBodySize(t *testing.T) {
	site := testbed.NewSite(t, "clone-body", &testbed.ShopHandler{PageSize: 5 << 10})
	s := newSwitch(t, shared.Client(t))
	_, err := s.Add(context.Background(), testbed.NewProxies(t, 2)[0].URL())
	require.NoError(t, err)
	c := colly.NewCollector(colly.AllowURLRevisit())
	s.Attach(c)
	c2 := c.Clone()
	c2.MaxBodySize = 1000
	s.Attach(c2)
	sizes := map[*colly.Collector]int{}
	for _, col := range []*colly.Collector{c, c2} {
		col.OnResponse(func(r *colly.Response) { sizes[col] = len(r.Body) })
	}
	require.NoError(t, c.Visit(site.URL()+"/p/1"))
	require.NoError(t, c2.Visit(site.URL()+"/p/1"))
	assert.Greater(t, sizes[c], 5<<10-100, "the original reads whole pages (Colly's default MaxBodySize, 10 MiB)")
	assert.Equal(t, 1000, sizes[c2], "the clone its own MaxBodySize")
	assertNoLeases(t, s, site)
}

// TestCloneAttachedByAnotherSwitch: a datacenter Switch attaches a
// collector, a residential one its clone. Each collector's requests leave
// from its own Switch's pool, classified and released by it, and neither
// warns of requests without hooks.
func TestCloneAttachedByAnotherSwitch(t *testing.T) {
	ctx := context.Background()
	site := testbed.NewSite(t, "clone-pools", &testbed.ShopHandler{})
	proxies := testbed.NewProxies(t, 4)
	var logs testlog.Buffer
	prefix := testPrefix()
	dc := newSwitch(t, shared.Client(t), WithPrefix(prefix), WithPool("datacenter"), WithLogger(logs.Logger()))
	resi := newSwitch(t, shared.Client(t), WithPrefix(prefix), WithPool("residential"), WithLogger(logs.Logger()))
	_, err := dc.Add(ctx, proxies[0].URL(), proxies[1].URL())
	require.NoError(t, err)
	_, err = resi.Add(ctx, proxies[2].URL(), proxies[3].URL())
	require.NoError(t, err)

	c := colly.NewCollector(colly.AllowURLRevisit())
	dc.Attach(c)
	c2 := c.Clone()
	resi.Attach(c2) // installs resi's transport on the client c shares
	via := map[*colly.Collector][]string{}
	for _, col := range []*colly.Collector{c, c2} {
		col.OnResponse(func(r *colly.Response) { via[col] = append(via[col], r.Request.ProxyURL) })
	}
	for i := range 6 {
		require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), i+1)))
		require.NoError(t, c2.Visit(fmt.Sprintf("%s/p/%d", site.URL(), i+1)))
	}
	assert.Equal(t, 6, proxies[0].Requests()+proxies[1].Requests(), "the original's requests through the datacenter pool")
	assert.Equal(t, 6, proxies[2].Requests()+proxies[3].Requests(), "the clone's through the residential pool")
	for _, col := range []*colly.Collector{c, c2} {
		require.Len(t, via[col], 6)
		for _, u := range via[col] {
			assert.NotEmpty(t, u, "Request.ProxyURL set by the collector's own Switch")
		}
	}
	assert.NotContains(t, logs.String(), "without the release hooks")
	assertNoLeases(t, dc, site)
	assertNoLeases(t, resi, site)
}

// TestRobotsTxtIsNoMissingAttach: Colly fetches robots.txt past its
// request hooks (IgnoreRobotsTxt false); that is no collector left
// unattached, so no warning says so, and the fetch goes through a proxy.
func TestRobotsTxtIsNoMissingAttach(t *testing.T) {
	site := testbed.NewSite(t, "robots", &testbed.ShopHandler{})
	var logs testlog.Buffer
	s := newSwitch(t, shared.Client(t), WithLogger(logs.Logger()))
	_, err := s.Add(context.Background(), testbed.NewProxies(t, 1)[0].URL())
	require.NoError(t, err)
	c := colly.NewCollector()
	c.IgnoreRobotsTxt = false
	s.Attach(c)
	require.NoError(t, c.Visit(site.URL()+"/p/1"))
	assert.NotContains(t, logs.String(), "without the release hooks")
	assert.Zero(t, site.Recorder().DirectHits(), "robots.txt too went through a proxy")
	robots := false
	for _, h := range site.Recorder().Hits() {
		robots = robots || h.Path == "/robots.txt"
	}
	assert.True(t, robots, "Colly asked for robots.txt")
}
