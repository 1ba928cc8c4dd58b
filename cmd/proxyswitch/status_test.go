package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// renderStatus renders page once and parses it.
func renderStatus(t *testing.T, page http.Handler) (int, *goquery.Document, string, time.Duration) {
	t.Helper()
	rec := httptest.NewRecorder()
	start := time.Now()
	page.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	took := time.Since(start)
	body := rec.Body.String()
	doc, err := goquery.NewDocumentFromReader(strings.NewReader(body))
	require.NoError(t, err)
	return rec.Code, doc, body, took
}

// siteCounts reads the row of site in pool's table of slots: free, leased,
// cooling, quarantined, dead.
func siteCounts(t *testing.T, doc *goquery.Document, pool, site string) []int {
	t.Helper()
	row := doc.Find(`section[data-pool="` + pool + `"] table.sites tr[data-site="` + site + `"]`)
	require.Equal(t, 1, row.Length(), "the row of %s in pool %s", site, pool)
	var out []int
	for _, c := range []string{"free", "leased", "cooling", "quarantined", "dead"} {
		n, err := strconv.Atoi(strings.TrimSpace(row.Find("td." + c).Text()))
		require.NoError(t, err, c)
		out = append(out, n)
	}
	return out
}

func poolValue(doc *goquery.Document, pool, class string) string {
	return strings.TrimSpace(doc.Find(`section[data-pool="` + pool + `"] dd.` + class).Text())
}

// poolOf starts a redis-server and loads a pool of n proxies
// (http://127.0.0.1:3128 ...) through a Switch on it.
func poolOf(t *testing.T, n int) (*redistest.Server, *proxyswitch.Switch, []string) {
	t.Helper()
	srv := redistest.Start(t)
	sw, err := proxyswitch.NewSwitch(srv.Client(t))
	require.NoError(t, err)
	var urls []string
	for i := range n {
		urls = append(urls, "http://127.0.0."+strconv.Itoa(i+1)+":3128")
	}
	_, err = sw.Add(context.Background(), urls...)
	require.NoError(t, err)
	return srv, sw, urls
}

var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestStatusPage renders the page of two pools against a real redis-server
// with a password, with a proxy in every state: the counts per site, the
// quarantined proxies with their time left, dead and drained proxies, live
// sessions, the refresh, no script, and neither password anywhere.
func TestStatusPage(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t, "--requirepass", redisSecret)
	rdb := srv.Client(t)
	secret := "http://u1:" + proxySecret + "@127.0.0.1:3128"
	leased, dead, drained, free := "http://127.0.0.2:3128", "socks5://127.0.0.3:1080", "http://127.0.0.4:3128", "http://127.0.0.5:3128"
	sw, err := proxyswitch.NewSwitch(rdb, proxyswitch.WithBans(proxyswitch.Bans{DeadAfter: 1}))
	require.NoError(t, err)
	_, err = sw.Add(ctx, secret, leased, dead, drained, free)
	require.NoError(t, err)
	other, err := proxyswitch.NewSwitch(rdb, proxyswitch.WithPool("residential"), proxyswitch.WithBans(proxyswitch.Bans{AllSites: true}))
	require.NoError(t, err)
	_, err = other.Add(ctx, "http://u2:"+proxySecret+"@127.0.0.9:3128", free)
	require.NoError(t, err)

	l := leaseID(t, sw, "avito.example", proxyIDOf(t, dead))
	require.NoError(t, l.Report(ctx, ban.Verdict{Kind: ban.ProxyFailure, Reason: ban.ReasonProxyConnect}))
	held := leaseID(t, sw, "ozon.example", proxyIDOf(t, leased))
	defer held.Release(ctx)
	require.NoError(t, sw.Ban(ctx, secret, "ozon.example", 2*time.Hour))
	require.NoError(t, func() error { _, err := sw.Drain(ctx, "", drained); return err }())
	require.NoError(t, other.Ban(ctx, "http://u2:"+proxySecret+"@127.0.0.9:3128", "wb.example", time.Hour))
	now := time.Now()
	require.NoError(t, rdb.ZAdd(ctx, "{proxyswitch:default}:sessions",
		redis.Z{Score: float64(now.Add(time.Minute).UnixMilli()), Member: "a1"},
		redis.Z{Score: float64(now.Add(time.Minute).UnixMilli()), Member: "b2"},
		redis.Z{Score: float64(now.Add(-time.Second).UnixMilli()), Member: "c3"}).Err())

	page := newStatusPage([]*proxyswitch.Switch{sw, other}, DefaultScrapeTimeout, quietLogger)
	code, doc, body, _ := renderStatus(t, page)
	require.Equal(t, http.StatusOK, code, body)

	assert.Equal(t, "5", poolValue(doc, "default", "proxies"))
	assert.Equal(t, "2", poolValue(doc, "default", "sessions"))
	assert.Equal(t, "2", poolValue(doc, "default", "dead-total"))
	assert.Equal(t, "2", poolValue(doc, "default", "sites-total"))
	assert.Equal(t, "0", poolValue(doc, "default", "members"))
	assert.Equal(t, []int{1, 1, 0, 1, 2}, siteCounts(t, doc, "default", "ozon.example"))
	assert.Equal(t, []int{3, 0, 0, 0, 2}, siteCounts(t, doc, "default", "avito.example"))

	q := doc.Find(`section[data-pool="default"] table.quarantine[data-site="ozon.example"] tbody tr`)
	require.Equal(t, 1, q.Length(), body)
	assert.Equal(t, proxyIDOf(t, secret), q.AttrOr("data-id", ""))
	assert.Equal(t, "http://xxxxx:xxxxx@127.0.0.1:3128", q.Find("td.proxy").Text())
	assert.Equal(t, "ban on this site", q.Find("td.reason").Text())
	assert.Equal(t, "1", q.Find("td.strikes").Text())
	left, err := time.ParseDuration(q.Find("td.left").Text())
	require.NoError(t, err)
	assert.InDelta(t, (2 * time.Hour).Seconds(), left.Seconds(), 10)
	assert.Zero(t, doc.Find(`table.quarantine[data-site="avito.example"]`).Length(), "nothing quarantined there")

	d := doc.Find(`section[data-pool="default"] table.dead tbody tr`)
	require.Equal(t, 2, d.Length())
	reasons := map[string]string{}
	d.Each(func(_ int, s *goquery.Selection) { reasons[s.AttrOr("data-id", "")] = s.Find("td.reason").Text() })
	assert.Equal(t, map[string]string{proxyIDOf(t, dead): "proxy_connect", proxyIDOf(t, drained): "drained"}, reasons)

	// The other pool: a ban on every site.
	assert.Equal(t, []int{1, 0, 0, 1, 0}, siteCounts(t, doc, "residential", "wb.example"))
	q = doc.Find(`section[data-pool="residential"] table.quarantine tbody tr`)
	require.Equal(t, 1, q.Length())
	assert.Equal(t, "ban on every site", q.Find("td.reason").Text())
	assert.Equal(t, "http://xxxxx:xxxxx@127.0.0.9:3128", q.Find("td.proxy").Text())

	assert.Equal(t, strconv.Itoa(int(statusRefresh/time.Second)), doc.Find(`meta[http-equiv="refresh"]`).AttrOr("content", ""))
	assert.Zero(t, doc.Find("script").Length(), "no JavaScript")
	assert.Zero(t, doc.Find(".error").Length(), body)
	assert.NotContains(t, body, proxySecret)
	assert.NotContains(t, body, redisSecret)
}

// TestStatusPageBounded: a render reads at most so many sites, lists at
// most so many proxies, walks the proxies of a small pool only, and says
// what it left out.
func TestStatusPageBounded(t *testing.T) {
	ctx := context.Background()
	_, sw, urls := poolOf(t, 6)
	sites := []string{"a.example", "b.example", "c.example", "d.example", "e.example"}
	for _, site := range sites {
		for _, u := range urls[:4] {
			require.NoError(t, sw.Ban(ctx, u, site, time.Hour))
		}
		l, err := sw.Lease(ctx, site) // the site is leased: listed by Sites
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
	}
	for _, u := range urls[4:] {
		require.NoError(t, func() error { _, err := sw.Drain(ctx, "", u); return err }())
	}
	page := newStatusPage([]*proxyswitch.Switch{sw}, DefaultScrapeTimeout, quietLogger)
	page.limits = statusLimits{sites: 3, detailSites: 2, rows: 1, detailPool: 100}
	code, doc, body, _ := renderStatus(t, page)
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, 3, doc.Find("table.sites tbody tr").Length())
	assert.Contains(t, doc.Find(".sites-cut").Text(), "Only the 3 most recently leased of 5 sites are shown")
	assert.Equal(t, 2, doc.Find("table.quarantine").Length())
	assert.Equal(t, 2, doc.Find("table.quarantine tbody tr").Length(), "one row each")
	assert.Contains(t, doc.Find(".rows-cut").First().Text(), "of 4")
	assert.Contains(t, doc.Find(".detail-note").Text(), "for the first 2 sites")
	assert.Equal(t, 1, doc.Find("table.dead tbody tr").Length())
	assert.Contains(t, doc.Find(".rows-cut").Last().Text(), "1 of 2 are shown")

	page.limits.detailPool = 5 // the pool has 6 proxies
	_, doc, body, _ = renderStatus(t, page)
	assert.Zero(t, doc.Find("table.quarantine").Length(), body)
	assert.Contains(t, doc.Find(".detail-note").Text(), "more than 5 proxies")
}

// TestStatusPageRedisDown: with Redis refusing connections, or hung, the
// page answers within a second (the reads of every pool share the scrape
// timeout), with 503 and a sentence saying what failed.
func TestStatusPageRedisDown(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", redisSecret)
	// A client as serve makes it: no retries, one dial.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: redisSecret, DialTimeout: DefaultScrapeTimeout,
		DialerRetries: 1, MaxRetries: -1})
	defer rdb.Close()
	var pools []*proxyswitch.Switch
	for _, name := range []string{"default", "residential", "mobile"} {
		sw, err := proxyswitch.NewSwitch(rdb, proxyswitch.WithPool(name))
		require.NoError(t, err)
		_, err = sw.Add(context.Background(), "http://u1:"+proxySecret+"@127.0.0.1:3128")
		require.NoError(t, err)
		pools = append(pools, sw)
	}
	page := newStatusPage(pools, DefaultScrapeTimeout, quietLogger)
	code, _, body, _ := renderStatus(t, page)
	require.Equal(t, http.StatusOK, code, body)

	require.NoError(t, srv.Pause())
	code, doc, body, took := renderStatus(t, page)
	assert.Less(t, took, time.Second, "Redis hung")
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, doc.Find(`section[data-pool="default"] .redis-error`).Text(), "Redis did not answer within 700ms")
	assert.Equal(t, 3, doc.Find(".redis-error").Length(), body)
	assert.NotContains(t, body, proxySecret)
	assert.NotContains(t, body, redisSecret)
	require.NoError(t, srv.Resume())

	require.NoError(t, srv.Kill())
	for i := range 3 {
		code, doc, body, took = renderStatus(t, page)
		assert.Less(t, took, time.Second, "Redis down, render %d", i+1)
		assert.Equal(t, http.StatusServiceUnavailable, code)
		assert.Contains(t, doc.Find(`section[data-pool="default"] .redis-error`).Text(), "Redis failed reading the sites", body)
		assert.NotContains(t, body, redisSecret)
	}
}

// TestStatusPageConcurrent renders the page from many goroutines at once
// while workers on clients of their own lease, ban and release (run with
// -race): every answer is a whole page, 200, or 503 saying the renders were
// too many.
func TestStatusPageConcurrent(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv, admin, _ := poolOf(t, 20)

	var workers sync.WaitGroup
	for w := range 4 {
		sw, err := proxyswitch.NewSwitch(srv.Client(t), proxyswitch.WithTimeouts(proxyswitch.Timeouts{MaxWait: 50 * time.Millisecond}))
		require.NoError(t, err)
		workers.Add(1)
		go func() {
			defer workers.Done()
			for i := 0; ctx.Err() == nil; i++ {
				site := []string{"ozon.example", "avito.example", "wb.example"}[i%3]
				l, err := sw.Lease(ctx, site)
				if err != nil {
					continue
				}
				if (i+w)%7 == 0 {
					_ = l.Report(ctx, ban.Verdict{Kind: ban.Ban, Reason: ban.StatusReason(403)})
				}
				_ = l.Release(ctx)
			}
		}()
	}

	page := newStatusPage([]*proxyswitch.Switch{admin}, DefaultScrapeTimeout, quietLogger)
	var renders sync.WaitGroup
	codes := make(chan int, 200)
	for range 20 {
		renders.Add(1)
		go func() {
			defer renders.Done()
			for range 10 {
				rec := httptest.NewRecorder()
				page.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
				body := rec.Body.String()
				if !strings.HasSuffix(strings.TrimSpace(body), "</html>") {
					t.Errorf("a cut page: %q", body)
				}
				// A 503 says why: too many renders at once, or a read that
				// ran out of the scrape timeout (a loaded machine).
				if rec.Code == http.StatusServiceUnavailable && !strings.Contains(body, `id="busy"`) && !strings.Contains(body, `class="error redis-error"`) {
					t.Errorf("503 without saying why: %s", body)
				}
				codes <- rec.Code
			}
		}()
	}
	renders.Wait()
	cancel()
	workers.Wait()
	close(codes)
	byCode := map[int]int{}
	for c := range codes {
		byCode[c]++
	}
	t.Logf("answers by status: %v", byCode)
	assert.Equal(t, 200, byCode[http.StatusOK]+byCode[http.StatusServiceUnavailable], "%v", byCode)
	assert.Positive(t, byCode[http.StatusOK])
}
