package metrics

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The acceptance test of labels (issue 15, item 4), counted at the proxies:
// a Colly crawl asking for country=ru over a mixed pool of local forward
// proxies (2 ru, 2 de, 2 kz, with passwords) never leaves through a non-ru
// proxy, and proxyswitch_label_attempts_total splits the attempts by label
// exactly as the proxies saw them, also after a crawl of no label that
// shares the pool.
func TestLabelledCrawlCountedAtTheProxies(t *testing.T) {
	ctx := context.Background()
	shop := testbed.NewSite(t, "shop", nil)
	proxies := testbed.NewProxies(t, 6)
	labels := []string{"country=ru type=datacenter", "country=ru type=residential", "country=de type=datacenter",
		"country=de type=datacenter", "country=kz type=residential", "country=kz type=datacenter"}
	lines := make([]string, len(proxies))
	for i, p := range proxies {
		p.SetCredentials(fmt.Sprintf("%s-user%d", proxyUser, i), proxySecret)
		lines[i] = p.URL() + " " + labels[i]
	}
	sw := newSwitch(t)
	_, err := sw.Replace(ctx, lines)
	require.NoError(t, err)
	col := New(sw, WithServer("worker-1"))

	crawl := func(c context.Context, n int) (int, int) {
		var oks, errs atomic.Int64
		cc := colly.NewCollector(colly.AllowURLRevisit(), colly.Async(true))
		cc.Context = c
		require.NoError(t, cc.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: 4}))
		sw.Attach(cc)
		cc.OnResponse(func(*colly.Response) { oks.Add(1) })
		cc.OnError(func(*colly.Response, error) { errs.Add(1) })
		for i := range n {
			require.NoError(t, cc.Visit(fmt.Sprintf("%s/p/%d", shop.URL(), i%testbed.DefaultProductCount+1)))
		}
		cc.Wait()
		return int(oks.Load()), int(errs.Load())
	}
	byLabel := func() map[string]int { // requests each label's proxies received, counted at the proxies
		out := map[string]int{}
		for i, p := range proxies {
			for _, l := range strings.Fields(labels[i]) {
				out[l] += p.Requests()
			}
		}
		return out
	}
	check := func(step string) {
		t.Helper()
		f, page := scrape(t, col)
		assert.NotContains(t, page, proxySecret)
		for l, n := range byLabel() {
			assert.InDelta(t, float64(n), f.sum("proxyswitch_label_attempts_total", "label="+l), 0, "%s: label %s", step, l)
		}
		assert.Empty(t, f.sum("proxyswitch_label_attempts_total", "label=_other"))
	}

	oks, errs := crawl(proxyswitch.UseLabels(ctx, "country=ru"), 40)
	require.Equal(t, 40, oks)
	require.Zero(t, errs)
	for i, p := range proxies {
		if i >= 2 {
			assert.Zero(t, p.Requests(), "a country=ru request left through proxy %d (%s)", i, labels[i])
		}
	}
	assert.Equal(t, 40, proxies[0].Requests()+proxies[1].Requests())
	assert.Positive(t, proxies[0].Requests(), "both ru proxies serve")
	assert.Positive(t, proxies[1].Requests(), "both ru proxies serve")
	assert.Zero(t, shop.Recorder().Collisions(), "two requests from one IP at once")
	assert.Zero(t, shop.Recorder().DirectHits())
	check("the ru crawl")
	f, _ := scrape(t, col)
	f.expect(t,
		want{"proxyswitch_label_attempts_total", []string{"pool=default", "server=worker-1", "label=country=ru", "outcome=ok"}, 40},
		want{"proxyswitch_label_attempts_total", []string{"label=type=datacenter", "outcome=ok"}, float64(proxies[0].Requests())},
		want{"proxyswitch_label_attempts_total", []string{"label=type=residential", "outcome=ok"}, float64(proxies[1].Requests())})
	assert.Empty(t, f.find("proxyswitch_label_attempts_total", pairs([]string{"label=country=de"})))
	assert.Empty(t, f.find("proxyswitch_label_attempts_total", pairs([]string{"label=country=kz"})))

	oks, errs = crawl(ctx, 60) // no label: the whole pool
	require.Equal(t, 60, oks)
	require.Zero(t, errs)
	for i, p := range proxies {
		if i >= 2 {
			assert.Positive(t, p.Requests(), "the crawl of no label uses proxy %d", i)
		}
	}
	check("both crawls")
	assert.Equal(t, 100, byLabel()["country=ru"]+byLabel()["country=de"]+byLabel()["country=kz"])
}
