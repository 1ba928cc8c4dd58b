package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/proxyswitch/proxyswitch/internal/testlog"
	"github.com/proxyswitch/proxyswitch/proxyswitchtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// EnvScreenshot names a file the browser test also writes a screenshot of
// the status page to (PNG), to look at; unset, it takes none.
const EnvScreenshot = "PROXYSWITCH_SCREENSHOT"

// chromiumPath finds Debian's chromium. Without it the browser test skips,
// unless CI=true: there it fails (.ci/run installs it).
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is not installed (apt-get install chromium): CI=true, so the browser test may not skip")
	}
	t.Skip("chromium is not installed (apt-get install chromium); CI=true makes this a failure")
	return ""
}

// chromium runs headless Chromium on u with the given action flags and
// returns what it printed on stdout.
func chromium(t *testing.T, bin, u string, action ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	args := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + t.TempDir()}, action...)
	cmd := exec.CommandContext(ctx, bin, append(args, u)...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "chromium %v: %s", action, stderr.String())
	return stdout.String()
}

// TestStatusPageInChromium crawls a shop through a farm of proxies with
// Attach, where the shop refuses three of the proxies' IPs with 403 and one
// proxy is down, then opens serve's status page in headless Chromium: the
// rendered DOM shows the counts the crawl left (quarantined, dead, free),
// the three banned proxies by ID, the live sticky sessions, and neither the
// Redis password nor the proxy password.
func TestStatusPageInChromium(t *testing.T) {
	bin := chromiumPath(t)
	ctx := context.Background()
	srv := redistest.Start(t, "--requirepass", redisSecret)
	env := map[string]string{EnvRedisURL: "redis://:" + redisSecret + "@" + srv.Addr() + "/0"}

	const proxies = 8
	farm := proxyswitchtest.NewFarm(t, proxies)
	farm.Proxies[0].SetCredentials("u1", proxySecret)
	urls := farm.URLs()         // the first with its password
	banned := map[string]bool{} // source IPs the shop refuses
	for _, i := range []int{0, 3, 5} {
		banned[farm.Proxies[i].SourceIP().String()] = true
	}
	farm.Proxies[7].SetMode(proxyswitchtest.ProxyDead)

	var mu sync.Mutex
	refused := map[string]int{} // 403s by client IP, as the shop counted them
	shop := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ip, _, _ := net.SplitHostPort(r.RemoteAddr)
		if banned[ip] {
			mu.Lock()
			refused[ip]++
			mu.Unlock()
			http.Error(w, "forbidden", http.StatusForbidden)
			return
		}
		fmt.Fprintf(w, "<html><body><h1 class=product>%s</h1><p>%s</p></body></html>", r.URL.Path, strings.Repeat("x", 500))
	}))
	defer shop.Close()
	site := strings.TrimPrefix(shop.URL, "http://")

	// The crawl: 40 pages, 4 at a time, then two shoppers' sticky sessions.
	var logs testlog.Buffer
	sw, err := proxyswitch.NewSwitch(srv.Client(t), proxyswitch.WithLogger(logs.Logger()), proxyswitch.WithBans(proxyswitch.Bans{DeadAfter: 1, Retries: 4, Quarantine: time.Hour, QuarantineMax: 2 * time.Hour, FailureQuarantine: time.Hour, FailureQuarantineMax: 2 * time.Hour}))
	require.NoError(t, err)
	_, err = sw.Replace(ctx, urls)
	require.NoError(t, err)
	c := colly.NewCollector(colly.Async(true))
	sw.Attach(c)
	require.NoError(t, c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: 4}))
	var scraped, failed int
	c.OnHTML(".product", func(*colly.HTMLElement) { mu.Lock(); scraped++; mu.Unlock() })
	c.OnError(func(r *colly.Response, err error) {
		mu.Lock()
		failed++
		mu.Unlock()
		t.Logf("%s: %v", r.Request.URL, err)
	})
	for i := range 40 {
		require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", shop.URL, i)))
	}
	c.Wait()
	for _, task := range []string{"shopper-1", "shopper-2"} {
		require.NoError(t, c.Request("GET", shop.URL+"/cart/"+task, nil, proxyswitch.NewTaskContext(task), nil))
	}
	c.Wait()
	require.Equal(t, 42, scraped, "every page through a good proxy")
	require.Zero(t, failed)
	require.Len(t, refused, 3, "the shop refused each banned IP")
	var wantBanned []string
	for _, i := range []int{0, 3, 5} {
		wantBanned = append(wantBanned, proxyIDOf(t, urls[i]))
	}
	sort.Strings(wantBanned)

	// serve, as an operator runs it.
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	var out, errOut testlog.Buffer
	code := make(chan int, 1)
	go func() {
		code <- run(sctx, []string{"serve", "-addr", "127.0.0.1:0"}, func(k string) string { return env[k] }, strings.NewReader(""), &out, &errOut)
	}()
	var pageURL string
	require.Eventually(t, func() bool {
		for _, line := range strings.Split(out.String(), "\n") {
			if after, ok := strings.CutPrefix(line, "status page on "); ok {
				pageURL = after
				return true
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond, "stdout: %q, stderr: %q", out.String(), errOut.String())

	dom := chromium(t, bin, pageURL, "--dump-dom")
	doc, err := goquery.NewDocumentFromReader(strings.NewReader(dom))
	require.NoError(t, err)
	assert.Equal(t, "proxyswitch status", doc.Find("title").Text())
	assert.Equal(t, "8", poolValue(doc, "default", "proxies"), dom)
	assert.Equal(t, "2", poolValue(doc, "default", "sessions"))
	assert.Equal(t, "1", poolValue(doc, "default", "dead-total"))
	// free, leased, cooling, quarantined, dead: the 3 IPs the shop refused
	// quarantined, the proxy that was down dead, 2 held by the shoppers'
	// live sessions, the other 2 free.
	assert.Equal(t, []int{2, 2, 0, len(refused), 1}, siteCounts(t, doc, "default", site))
	var ids []string
	doc.Find(`table.quarantine[data-site="` + site + `"] tbody tr`).Each(func(_ int, s *goquery.Selection) {
		ids = append(ids, s.AttrOr("data-id", ""))
		assert.Equal(t, "ban on this site", s.Find("td.reason").Text())
		left, err := time.ParseDuration(s.Find("td.left").Text())
		if assert.NoError(t, err) {
			assert.InDelta(t, time.Hour.Seconds(), left.Seconds(), (10 * time.Minute).Seconds(), "Bans{Quarantine: 1h} with its ±15% jitter")
		}
	})
	sort.Strings(ids)
	assert.Equal(t, wantBanned, ids)
	assert.Contains(t, dom, "http://xxxxx:xxxxx@"+farm.Proxies[0].Addr())
	dead := doc.Find("table.dead tbody tr")
	assert.Equal(t, proxyIDOf(t, urls[7]), dead.AttrOr("data-id", ""))
	assert.Equal(t, "proxy_connect", dead.Find("td.reason").Text())
	assert.NotContains(t, dom, proxySecret)
	assert.NotContains(t, dom, redisSecret)
	assert.NotContains(t, logs.String()+out.String()+errOut.String(), proxySecret)

	if shot := os.Getenv(EnvScreenshot); shot != "" {
		path, err := filepath.Abs(shot)
		require.NoError(t, err)
		chromium(t, bin, pageURL, "--screenshot="+path, "--window-size=1200,1100", "--hide-scrollbars")
		st, err := os.Stat(path)
		require.NoError(t, err)
		assert.Positive(t, st.Size())
	}
	stop()
	assert.Equal(t, 0, <-code, errOut.String())
}
