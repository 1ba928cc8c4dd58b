package proxyswitch

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBurntProxiesCrawl is the acceptance crawl: 2,400 product pages on two
// marketplaces, through 50 proxies of which 10 are burnt (the sites serve
// their IPs a placeholder or a 403), by two collectors with their own Redis
// clients, 20 parallel requests each. Every page ends with real content, no
// placeholder reaches the user's callbacks, and once a burnt proxy is
// banned on a site, the site never sees its IP again (the quarantine, 30
// minutes by default, outlasts the crawl).
func TestBurntProxiesCrawl(t *testing.T) {
	const proxies, burnt, pages, collectors, workers = 50, 10, 2400, 2, 20
	markets := []*testbed.Marketplace{testbed.NewMarketplace(nil), testbed.NewMarketplace(nil)}
	var sites []*testbed.Site
	for i, m := range markets {
		m.CaptchaOnConcurrent = true // two requests from one IP at once would be caught
		sites = append(sites, testbed.NewSite(t, fmt.Sprintf("market-%d", i), m))
	}
	ps := testbed.NewProxies(t, proxies)
	burntIPs := map[string]bool{}
	for i, p := range ps[:burnt] {
		ip := p.SourceIP().String()
		burntIPs[ip] = true
		for _, m := range markets {
			m.Burn(ip, []testbed.Treatment{testbed.Placeholder, testbed.Forbid}[i%2])
		}
	}
	urls := make([]string, proxies)
	for i, p := range ps {
		urls[i] = p.URL()
	}
	// Retries: a request can meet each burnt proxy at most once per site
	// (it is quarantined as soon as it is caught), so ten retries always
	// suffice.
	s := newSwitch(t, shared.Client(t), WithBans(Bans{Retries: burnt}), WithExpect("", `^/p/\d+$`, "div.product"))
	_, err := s.Add(context.Background(), urls...)
	require.NoError(t, err)

	var mu sync.Mutex
	got := map[string]int{} // URL -> product pages received
	var placeholders, failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i := range collectors {
		sw := sibling(t, s, shared.Client(t))
		c := colly.NewCollector(colly.Async(true))
		sw.Attach(c)
		require.NoError(t, c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: workers}))
		c.OnHTML("body", func(e *colly.HTMLElement) {
			if e.DOM.Find("div.product").Length() == 0 {
				placeholders.Add(1)
				return
			}
			mu.Lock()
			got[e.Request.URL.String()]++
			mu.Unlock()
		})
		c.OnError(func(_ *colly.Response, err error) { failed.Add(1); t.Log(err) })
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := i; n < pages; n += collectors {
				require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", sites[(n/collectors)%2].URL(), n+1)))
			}
			c.Wait()
		}()
		t.Cleanup(func() { bans := sw.BanCounts(); t.Logf("collector %d: bans %v", i, bans) })
	}
	wg.Wait()
	elapsed := time.Since(start)

	assert.Zero(t, failed.Load(), "requests that failed")
	assert.Zero(t, placeholders.Load(), "placeholders that reached OnHTML")
	assert.Len(t, got, pages, "pages with real content")
	for u, n := range got {
		assert.Equal(t, 1, n, u)
	}
	// The sites' ground truth, by client IP and time.
	var banned, collisions int
	for i, site := range sites {
		byIP := map[string][]testbed.Hit{}
		for _, h := range site.Recorder().Hits() {
			byIP[h.ClientIP] = append(byIP[h.ClientIP], h)
		}
		for ip, hits := range byIP {
			if !burntIPs[ip] {
				continue
			}
			sort.Slice(hits, func(a, b int) bool { return hits[a].Start.Before(hits[b].Start) })
			banned++
			assert.Len(t, hits, 1, "%s: requests from burnt IP %s; after its first ban at %v, none may come during its quarantine",
				site.Name(), ip, hits[0].End)
		}
		assert.Zero(t, markets[i].Count(testbed.DecidedCaptcha), "two requests from one IP at once")
		collisions += site.Recorder().Collisions()
		assert.Zero(t, site.Recorder().DirectHits())
	}
	assert.Zero(t, collisions)
	assert.Equal(t, pages+banned, sites[0].Recorder().Count()+sites[1].Recorder().Count(),
		"one wasted request per burnt proxy and site, no more")
	t.Logf("%d pages in %v (%.0f pages/s); %d bans of burnt proxies (%d placeholders and %d 403s served), each the only request from its IP to its site",
		pages, elapsed.Round(time.Millisecond), float64(pages)/elapsed.Seconds(), banned,
		markets[0].Count(testbed.DecidedPlaceholder)+markets[1].Count(testbed.DecidedPlaceholder),
		markets[0].Count(testbed.DecidedForbidden)+markets[1].Count(testbed.DecidedForbidden))
	assertNoLeases(t, s, sites...)
}

// TestRetryResendsTheBody: a POST banned through one proxy goes again,
// body and all, through another.
func TestRetryResendsTheBody(t *testing.T) {
	echo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, `<html><body><div class="product">%s %s</div></body></html>`, r.Method, b)
	})
	m := testbed.NewMarketplace(echo)
	site, proxies, s := marketBed(t, m, false, 2, WithBans(Bans{Retries: 1}))
	m.Burn(proxies[0].SourceIP().String(), testbed.Forbid)
	c := newPageCollector(t, s)
	var bodies []string
	c.OnResponse(func(r *colly.Response) { bodies = append(bodies, string(r.Body)) })
	for i := range 2 {
		require.NoError(t, c.PostRaw(site.URL()+"/order", []byte(fmt.Sprintf("item=%d", i))))
	}
	require.Len(t, bodies, 2)
	for i, b := range bodies {
		assert.Contains(t, b, fmt.Sprintf("POST item=%d", i))
	}
	assert.Equal(t, map[BanKey]int64{{site.Host(), "http_403"}: 1}, s.BanCounts())
}

// TestRequestsWithoutHooksAreNotClassified: the proxy function alone, and a
// clone of an attached collector (it shares the transport, not the hooks),
// work as before: no classification, no retry, no quarantine.
func TestRequestsWithoutHooksAreNotClassified(t *testing.T) {
	ctx := context.Background()
	m := testbed.NewMarketplace(nil)
	site, proxies, s := marketBed(t, m, false, 2, WithExpect("", "", "div.product"))
	plain := testbed.NewSite(t, "plain", nil)
	m.Burn(proxies[0].SourceIP().String(), testbed.Placeholder)
	attached := colly.NewCollector(colly.AllowURLRevisit())
	s.Attach(attached)
	alone := colly.NewCollector(colly.AllowURLRevisit())
	alone.SetProxyFunc(s.ProxyFunc)
	for _, c := range []*colly.Collector{alone, attached.Clone()} {
		var placeholders int
		c.OnResponse(func(r *colly.Response) {
			if bytes.Equal([]byte(testbed.PlaceholderHTML), r.Body) {
				placeholders++
			}
		})
		for range 2 { // least recently used first: both proxies
			require.NoError(t, c.Visit(site.URL()+"/p/1"))
		}
		assert.Equal(t, 1, placeholders, "handed over as it came")
		assert.Equal(t, "Forbidden", c.Visit(plain.URL()+"/status/403").Error(), "Colly's own status error")
	}
	assert.Empty(t, s.BanCounts())
	assert.Eventually(t, func() bool {
		st, err := s.Stats(ctx, site.Host())
		return err == nil && st.FreeSlots == 2
	}, 2*time.Second, 10*time.Millisecond, "no proxy quarantined")
}

// gzipBomb returns head followed by mib MiB of zeros, gzip-compressed (mib
// gzip members of 1 MiB, which gzip readers read as one stream): about a
// KiB per MiB.
func gzipBomb(t testing.TB, head string, mib int) []byte {
	t.Helper()
	var first, member bytes.Buffer
	for i, buf := range []*bytes.Buffer{&first, &member} {
		zw, err := gzip.NewWriterLevel(buf, gzip.BestCompression)
		require.NoError(t, err)
		if i == 0 {
			_, _ = zw.Write([]byte(head))
		}
		_, _ = zw.Write(make([]byte, 1<<20))
		require.NoError(t, zw.Close())
	}
	return append(first.Bytes(), bytes.Repeat(member.Bytes(), mib-1)...)
}

// gzipSite serves body gzip-compressed, whatever the request accepts: with
// Content-Encoding: gzip, but for paths ending in .xml.gz (a compressed
// sitemap), which it serves as a file without an encoding.
func gzipSite(t testing.TB, body []byte) *testbed.Site {
	return testbed.NewSite(t, "gzip", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, ".xml.gz") {
			w.Header().Set("Content-Type", "application/octet-stream")
		} else {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.Header().Set("Content-Encoding", "gzip")
		}
		_, _ = w.Write(body)
	}))
}

// allocated returns the bytes f allocated (the whole process's: run it in
// a test that is not parallel).
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestCompressedBodiesKeepTheCap: a gzip bomb served to a request that
// asked for gzip itself (so net/http leaves the body compressed), or as a
// .xml.gz file (which Colly gunzips too), is decoded once, by the
// transport, to MaxBodySize at most: Colly gets those decoded bytes and no
// Content-Encoding, and decodes nothing again.
func TestCompressedBodiesKeepTheCap(t *testing.T) {
	const head = `<html><body><div class="product">bomb</div>`
	const maxBody, bombMiB = 1 << 20, 256
	bomb := gzipBomb(t, head, bombMiB)
	require.Less(t, len(bomb), maxBody, "the compressed bomb fits in MaxBodySize: the old transport read it whole")
	site := gzipSite(t, bomb)
	proxies := testbed.NewProxies(t, 1)
	s := newSwitch(t, shared.Client(t), WithExpect("", "^/bomb", "div.product"))
	_, err := s.Add(context.Background(), proxies[0].URL())
	require.NoError(t, err)

	c := colly.NewCollector(colly.MaxBodySize(maxBody))
	s.Attach(c)
	c.OnRequest(func(r *colly.Request) { r.Headers.Set("Accept-Encoding", "gzip") })
	var body []byte
	var encoding, length string
	c.OnResponse(func(r *colly.Response) {
		body, encoding, length = r.Body, r.Headers.Get("Content-Encoding"), r.Headers.Get("Content-Length")
	})
	for i, path := range []string{"/bomb", "/sitemap.xml.gz"} {
		body = nil
		var verr error
		n := allocated(func() { verr = c.Visit(site.URL() + path) })
		require.NoError(t, verr, path)
		t.Logf("%s: a %d KiB gzip bomb of %d MiB: %.1f MiB allocated", path, len(bomb)>>10, bombMiB, float64(n)/(1<<20))
		assert.Less(t, n, uint64(32<<20), "%s: memory stays bounded by MaxBodySize, not by the decoded size", path)
		assert.Equal(t, maxBody, len(body), "%s: Colly gets the decoded body, capped at MaxBodySize", path)
		assert.True(t, bytes.HasPrefix(body, []byte(head)), path)
		assert.Empty(t, encoding, "%s: no Content-Encoding left for Colly to decode", path)
		assert.Empty(t, length, path)
		assert.Equal(t, i+1, site.Recorder().Count())
	}
	assert.Zero(t, site.Recorder().DirectHits())
	assert.Empty(t, s.BanCounts())
}

// TestCompressedBodiesStreamWithoutCap: without MaxBodySize (Colly's "no
// limit") a gzip body is decoded once, by the transport: the classifiers
// see its first bytes (the read limit), marked truncated, and Colly gets the
// whole decoded body, decoded on the way, with no Content-Encoding left.
func TestCompressedBodiesStreamWithoutCap(t *testing.T) {
	const head = `<html><body><div class="product">big</div>`
	const readLimit, bodyMiB = 256 << 10, 32
	var mu sync.Mutex
	type seen struct {
		n         int
		truncated bool
	}
	var judged []seen
	site := gzipSite(t, gzipBomb(t, head, bodyMiB))
	proxies := testbed.NewProxies(t, 1)
	s := newSwitch(t, shared.Client(t), WithClassifier(func(x *ban.Exchange) ban.Verdict {
		mu.Lock()
		defer mu.Unlock()
		judged = append(judged, seen{len(x.Body), x.Truncated})
		return ban.Verdict{Kind: ban.Pass}
	}))
	s.cfg.readLimit = readLimit
	_, err := s.Add(context.Background(), proxies[0].URL())
	require.NoError(t, err)
	c := colly.NewCollector(colly.MaxBodySize(0))
	s.Attach(c)
	c.OnRequest(func(r *colly.Request) { r.Headers.Set("Accept-Encoding", "gzip") })
	var body []byte
	var encoding string
	c.OnResponse(func(r *colly.Response) { body, encoding = r.Body, r.Headers.Get("Content-Encoding") })
	require.NoError(t, c.Visit(site.URL()+"/big"))
	assert.Equal(t, []seen{{readLimit, true}}, judged, "the classifiers know they saw only the beginning")
	assert.Equal(t, len(head)+bodyMiB<<20, len(body), "Colly gets all of it")
	assert.True(t, bytes.HasPrefix(body, []byte(head)))
	assert.Empty(t, encoding, "decoded once")
}

// BenchmarkBuffer: what the transport allocates to read a 100 KiB page
// (Content-Length known) for the classifiers and hand it to Colly.
func BenchmarkBuffer(b *testing.B) {
	page := bytes.Repeat([]byte("<p>x</p>"), 100<<10/8)
	tr := &transport{s: &Switch{cfg: config{readLimit: defaultReadLimit}}}
	b.ReportAllocs()
	for b.Loop() {
		resp := &http.Response{Body: io.NopCloser(bytes.NewReader(page)), Header: http.Header{}, ContentLength: int64(len(page))}
		if err := tr.buffer(resp, &ban.Exchange{}, &attempt{}, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// TestClassifierReservedReasons: a classifier's ban with a reason the
// Switch reserves (an operator's, a site probe's) counts as a custom ban:
// it does not get a site probe's treatment (on the site only, past the
// breaker), nor pass for an operator's.
func TestClassifierReservedReasons(t *testing.T) {
	for _, reason := range []string{ReasonSiteProbe, ReasonOperator} {
		t.Run(reason, func(t *testing.T) {
			site := testbed.NewSite(t, "shop", nil)
			proxies := testbed.NewProxies(t, 1)
			s := newSwitch(t, shared.Client(t), WithClassifier(func(x *ban.Exchange) ban.Verdict {
				return ban.Verdict{Kind: ban.Ban, Reason: reason}
			}), WithTimeouts(Timeouts{MaxWait: Off}))
			obs := &recordingObserver{}
			s.SetObserver(obs)
			_, err := s.Add(context.Background(), proxies[0].URL())
			require.NoError(t, err)
			c := colly.NewCollector()
			s.Attach(c)
			_ = c.Visit(site.URL() + "/p")
			obs.mu.Lock()
			defer obs.mu.Unlock()
			require.NotEmpty(t, obs.attempts)
			for _, a := range obs.attempts {
				assert.Equal(t, ban.ReasonCustom, a.Reason)
			}
			require.NotEmpty(t, obs.quarantines)
			assert.Equal(t, ban.ReasonCustom, obs.quarantines[0].Reason)
		})
	}
}
