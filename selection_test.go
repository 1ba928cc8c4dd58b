package proxyswitch

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// crawlAsync visits pages of site through s with an async collector of the
// given parallelism, and waits for the crawl to end.
func crawlAsync(t *testing.T, s *Switch, site *testbed.Site, pages, parallelism int) {
	t.Helper()
	c := colly.NewCollector(colly.Async(true), colly.AllowURLRevisit())
	s.Attach(c)
	c.SetRequestTimeout(30 * time.Second)
	require.NoError(t, c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: parallelism}))
	for i := range pages {
		require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), i+1)))
	}
	c.Wait()
}

// flakyShare is the share of attempts through a flaky IP.
func flakyShare(as []testbed.Attempt) float64 {
	n := 0
	for _, a := range as {
		if a.Marked {
			n++
		}
	}
	return float64(n) / float64(len(as))
}

// TestFlakyProxiesServedLess is issue 16's acceptance for success-aware
// selection: 60 proxies, 20 of which are answered 503 on 40% of their
// requests; the share of attempts through flaky proxies in the last 1,000
// of 3,000 attempts is at most half that of the first 1,000. The
// quarantine is short (20-40ms) so that it is not what holds them back.
// Every flaky proxy still comes round (bounded delay).
func TestFlakyProxiesServedLess(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3,000-attempt crawl")
	}
	const proxies, flaky, attempts = 60, 20, 3000
	ps := testbed.NewProxies(t, proxies)
	site := &testbed.Flaky{IPs: map[string]bool{}, Rate: 0.4}
	for _, p := range ps[:flaky] {
		site.IPs[p.SourceIP().String()] = true
	}
	srv := testbed.NewSite(t, "flaky", site)
	s := newSwitch(t, shared.Client(t), WithBans(Bans{Quarantine: 20 * time.Millisecond, QuarantineMax: 40 * time.Millisecond, Retries: 2}))
	bed := &testbed.Bed{Proxies: ps}
	_, err := s.Add(context.Background(), bed.ProxyURLs()...)
	require.NoError(t, err)

	for len(site.Attempts()) < attempts {
		crawlAsync(t, s, srv, 500, 20)
	}
	as := site.Attempts()[:attempts]
	first, last := flakyShare(as[:1000]), flakyShare(as[attempts-1000:])
	t.Logf("share of attempts through flaky proxies: first 1,000 %.3f, last 1,000 %.3f", first, last)
	assert.LessOrEqual(t, last, first/2, "flaky proxies are served at most half as often at the end")

	seen := map[string]bool{}
	for _, a := range site.Attempts() {
		if a.Marked {
			seen[a.ClientIP] = true
		}
	}
	assert.Len(t, seen, flaky, "every flaky proxy still came round")
}
