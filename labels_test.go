package proxyswitch

import (
	"context"
	"fmt"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"sync"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/proxyswitch/proxyswitch/proxyswitchtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLabelLines(t *testing.T) {
	ps, err := ParseProxies([]string{"http://10.0.0.1:3128 type=datacenter country=de price=0.5",
		"gw.example:7000:user-cc-ru-session-{session:2}:pw country=ru type=residential", "10.0.0.2:3128"})
	require.NoError(t, err)
	require.Len(t, ps, 4)
	assert.Equal(t, map[string]string{"type": "datacenter", "country": "de", "price": "0.5"}, ps[0].Labels())
	assert.Equal(t, "country=de,price=0.5,type=datacenter", ps[0].labels, "canonical: sorted by key")
	assert.Equal(t, map[string]string{"country": "ru", "type": "residential"}, ps[2].Labels(), "each session of a gateway carries its labels")
	assert.Nil(t, ps[3].Labels())
	for _, bad := range []string{"http://u:pw@10.0.0.1:3128 country", "http://u:pw@10.0.0.1:3128 Country=ru",
		"http://u:pw@10.0.0.1:3128 country=ru country=de", "http://u:secret@10.0.0.1:3128 a=b=c", "http://u secret@10.0.0.1:3128"} {
		_, err := ParseProxies([]string{bad})
		require.ErrorIs(t, err, ErrInvalidProxy, bad)
		assert.NotContains(t, err.Error(), "secret", bad)
	}
	_, err = newSwitch(t, shared.Client(t)).Lease(UseLabels(context.Background(), "Country=ru"), "shop.example")
	require.ErrorIs(t, err, ErrNoProxy)
	require.ErrorIs(t, err, ErrInvalidProxy)
	s := newSwitch(t, shared.Client(t))
	_, err = s.Add(context.Background(), "http://10.0.0.1:3128 country=de")
	require.NoError(t, err)
	start := time.Now()
	_, err = s.Lease(UseLabels(context.Background(), "country=ru"), "shop.example")
	assert.Less(t, time.Since(start), time.Second, "no proxy carries it: at once")
	require.ErrorIs(t, err, ErrNoProxy)
	assert.Contains(t, err.Error(), "carries the labels country=ru")
}

func TestLabelsKeptInStep(t *testing.T) {
	ctx := context.Background()
	s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: Off}))
	_, err := s.Replace(ctx, []string{"http://10.0.0.1:3128 country=de", "http://10.0.0.2:3128 country=ru",
		"http://u-session-{session:2}:pw@10.0.0.3:7000 country=ru type=residential"})
	require.NoError(t, err)
	labels := func() map[string]string {
		ps, err := s.List(ctx)
		require.NoError(t, err)
		out := map[string]string{}
		for _, p := range ps {
			out[p.id] = p.labels
		}
		return out
	}
	byLabel := func() map[string]int {
		out := map[string]int{}
		for _, l := range labels() {
			out[l]++
		}
		return out
	}
	assert.Equal(t, map[string]int{"country=de": 1, "country=ru": 1, "country=ru,type=residential": 2}, byLabel())

	// A gateway session rotated after a ban keeps its labels.
	l, err := s.Lease(UseLabels(ctx, "type=residential"), "shop.example")
	require.NoError(t, err)
	require.NoError(t, l.Report(ctx, ban.Verdict{Kind: ban.Ban, Reason: "http_403"}))
	assert.NotContains(t, labels(), l.proxy.id, "rotated")
	assert.Equal(t, map[string]int{"country=de": 1, "country=ru": 1, "country=ru,type=residential": 2}, byLabel())

	// Replace relabels, Remove forgets.
	_, err = s.Replace(ctx, []string{"http://10.0.0.1:3128 country=fr", "http://10.0.0.2:3128",
		"http://u-session-{session:2}:pw@10.0.0.3:7000 country=kz"})
	require.NoError(t, err)
	assert.Equal(t, map[string]int{"country=fr": 1, "": 1, "country=kz": 2}, byLabel())
	_, err = s.Remove(ctx, "http://10.0.0.1:3128")
	require.NoError(t, err)
	assert.Equal(t, map[string]int{"": 1, "country=kz": 2}, byLabel())
	_, err = s.Lease(UseLabels(ctx, "country=fr"), "shop.example")
	require.ErrorIs(t, err, ErrNoProxy, "its labels left with it")
}

// The acceptance test of labels: a crawl asking for country=ru, through a
// pool of 2 ru proxies, 4 de ones and a ru gateway, never leaves through
// another label, with no IP twice at once at the site, while a crawl of no
// label shares the pool.
func TestLabelledCrawlNeverLeavesThroughAnotherLabel(t *testing.T) {
	farm := testbed.NewProxies(t, 6)
	gw := proxyswitchtest.NewGateway(t, proxyswitchtest.GatewayConfig{Exits: 8})
	site := newGatewaySite(t, "shop")
	var lines []string
	ru := map[string]bool{}
	for i, p := range farm {
		country := "de"
		if i < 2 {
			country = "ru"
			ru[p.SourceIP().String()] = true
		}
		lines = append(lines, p.URL()+" country="+country)
	}
	lines = append(lines, gw.Template("cust-cc-ru", 2)+" country=ru type=residential")
	for _, ip := range gw.Exits() {
		ru[ip] = true
	}
	s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: 20 * time.Second}))
	_, err := s.Replace(context.Background(), lines)
	require.NoError(t, err)
	obs := &recordingObserver{}
	s.SetObserver(obs)

	var mu sync.Mutex
	var failed []string
	crawl := func(ctx context.Context, path string, n int) *colly.Collector {
		c := colly.NewCollector(colly.AllowURLRevisit(), colly.Async(true))
		c.Context = ctx
		require.NoError(t, c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: 4}))
		s.Attach(c)
		c.OnError(func(r *colly.Response, err error) {
			mu.Lock()
			failed = append(failed, fmt.Sprintf("%s: %v", r.Request.URL, err))
			mu.Unlock()
		})
		for i := range n {
			require.NoError(t, c.Visit(fmt.Sprintf("%s/%s/%d", site.URL(), path, i)))
		}
		return c
	}
	a := crawl(UseLabels(context.Background(), "country=ru"), "ru", 40)
	b := crawl(context.Background(), "any", 40)
	a.Wait()
	b.Wait()
	require.Empty(t, failed)
	rec := site.Recorder()
	assert.Zero(t, rec.Collisions(), "two requests from one IP at once")
	assert.Zero(t, rec.DirectHits())
	ruHits, anyIPs := 0, map[string]bool{}
	for _, h := range rec.Hits() {
		if len(h.Path) > 4 && h.Path[:4] == "/ru/" {
			ruHits++
			assert.True(t, ru[h.ClientIP], "a country=ru request left from %s", h.ClientIP)
		} else {
			anyIPs[h.ClientIP] = true
		}
	}
	assert.Equal(t, 40, ruHits)
	assert.Greater(t, len(anyIPs), 2, "the requests of no label use the whole pool")

	// The observer (metrics) sees each attempt's labels.
	obs.mu.Lock()
	defer obs.mu.Unlock()
	byLabels := map[string]int{}
	for _, e := range obs.attempts {
		byLabels[e.Labels]++
	}
	assert.Zero(t, byLabels[""], "every proxy has labels: %v", byLabels)
	assert.GreaterOrEqual(t, byLabels["country=ru"]+byLabels["country=ru,type=residential"], 40, "%v", byLabels)
	assert.Equal(t, 80, len(obs.attempts))
}

// With Redis gone, a labelled request leases from the local shard (WithFallback)
// a proxy of its share that carries its labels, never another one; labels
// no proxy of the share carries fail at once.
func TestLabelledLeaseFromLocalShard(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	s := newSwitch(t, srv.Client(t), append(fastFallback("crawler-1"), WithRotation(Rotation{Cooldown: Off}))...)
	var lines []string
	country := map[string]string{}
	for i, u := range proxyURLs(6) {
		c := "de"
		if i%3 == 0 {
			c = "ru"
		}
		lines = append(lines, u+" country="+c)
	}
	_, err := s.Replace(ctx, lines)
	require.NoError(t, err)
	ps, err := s.List(ctx)
	require.NoError(t, err)
	for _, p := range ps {
		country[p.ID()] = p.Labels()["country"]
	}
	startSwitch(t, s)
	ru := UseLabels(ctx, "country=ru")
	fromRedis, err := s.Lease(ru, "shop.example")
	require.NoError(t, err)
	require.Nil(t, fromRedis.local)
	assert.Equal(t, "ru", country[fromRedis.Proxy().ID()])

	require.NoError(t, srv.Kill())
	for i := range 10 {
		l, err := s.Lease(ru, "shop.example")
		require.NoError(t, err, "lease %d from the local shard", i)
		require.NotNil(t, l.local)
		assert.Equal(t, "ru", country[l.Proxy().ID()], "a country=ru request got a proxy of country=%s", country[l.Proxy().ID()])
		assert.NotEqual(t, fromRedis.Proxy().ID(), l.Proxy().ID(), "the Redis lease still running is reserved")
		if i == 9 {
			short, cancel := context.WithTimeout(ru, 300*time.Millisecond)
			_, err := s.Lease(short, "shop.example")
			cancel()
			require.ErrorIs(t, err, ErrNoProxy, "both ru proxies are busy: no other one")
		}
		require.NoError(t, l.Release(ctx))
	}
	assert.Equal(t, modeLocal.String(), s.FallbackStatus().Mode)
	start := time.Now()
	_, err = s.Lease(UseLabels(ctx, "country=fr"), "shop.example")
	require.ErrorIs(t, err, ErrNoProxy)
	assert.Less(t, time.Since(start), time.Second, "no proxy of the share carries it: at once")
	de, err := s.Lease(UseLabels(ctx, "country=de"), "shop.example")
	require.NoError(t, err)
	assert.Equal(t, "de", country[de.Proxy().ID()])
	any, err := s.Lease(ctx, "shop.example")
	require.NoError(t, err, "requests of no label share the rest")
	assert.NotNil(t, any.local)
}
