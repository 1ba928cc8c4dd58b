package proxyswitch

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/proxyswitch/proxyswitch/internal/testlog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fingerprintRT is a custom RoundTripper, not an *http.Transport: what a
// uTLS or HTTP/2-fingerprint client looks like to Attach. It sends through
// its one proxy and counts what it carried.
type fingerprintRT struct {
	proxy *url.URL
	inner *http.Transport
	sent  *atomic.Int64
}

func (f *fingerprintRT) RoundTrip(req *http.Request) (*http.Response, error) {
	f.sent.Add(1)
	return f.inner.RoundTrip(req)
}

func (f *fingerprintRT) CloseIdleConnections() { f.inner.CloseIdleConnections() }

// banIPs is a site handler that refuses the given client IPs with 403 and
// serves the default shop to the others; it records the User-Agent of each
// request.
type banIPs struct {
	banned sync.Map // ip -> true
	next   http.Handler
	mu     sync.Mutex
	agents []string
}

func (b *banIPs) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ip, _, _ := net.SplitHostPort(r.RemoteAddr)
	b.mu.Lock()
	b.agents = append(b.agents, r.UserAgent())
	b.mu.Unlock()
	if _, ok := b.banned.Load(ip); ok {
		http.Error(w, "blocked", http.StatusForbidden)
		return
	}
	b.next.ServeHTTP(w, r)
}

func (b *banIPs) userAgents() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.agents...)
}

// A custom RoundTripper through Attach keeps every guarantee under many
// goroutines: no two requests from one IP at once on a site, no request
// without a proxy, no lease left, bans seen and retried, and sticky
// sessions (on a third site) that keep one IP each.
func TestClientCustomRoundTripper(t *testing.T) {
	guard := &banIPs{next: testbed.DefaultHandler()}
	bed := &testbed.Bed{Sites: []*testbed.Site{testbed.NewSite(t, "guarded", guard), testbed.NewSite(t, "open", nil),
		testbed.NewSite(t, "shop", nil)}, Proxies: testbed.NewProxies(t, 4)}
	burnt := bed.Proxies[0].SourceIP().String()
	guard.banned.Store(burnt, true)

	var sent atomic.Int64
	var mu sync.Mutex
	built := map[string]int{} // proxy host -> clients built
	s := newSwitch(t, shared.Client(t), WithClient(Client{New: func(proxy *url.URL) (http.RoundTripper, error) {
		mu.Lock()
		built[proxy.Host]++
		mu.Unlock()
		return &fingerprintRT{proxy: proxy, inner: &http.Transport{Proxy: http.ProxyURL(proxy)}, sent: &sent}, nil
	}}))
	_, err := s.Add(context.Background(), bed.ProxyURLs()...)
	require.NoError(t, err)

	c := colly.NewCollector(colly.Async(true), colly.AllowURLRevisit())
	s.Attach(c)
	require.NoError(t, c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: 8}))
	var ok, failed atomic.Int64
	c.OnResponse(func(*colly.Response) { ok.Add(1) })
	c.OnError(func(_ *colly.Response, err error) { failed.Add(1); t.Log(err) })
	const n, tasks, steps = 80, 2, 10
	var wg sync.WaitGroup
	for k := range tasks { // each task's flow, one step after the other, beside the crawl
		task := fmt.Sprintf("task%d", k)
		tc := colly.NewCollector(colly.AllowURLRevisit())
		s.Attach(tc)
		tc.OnResponse(func(*colly.Response) { ok.Add(1) })
		tc.OnError(func(_ *colly.Response, err error) { failed.Add(1); t.Log(err) })
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := NewTaskContext(task)
			for i := range steps {
				assert.NoError(t, tc.Request("GET", fmt.Sprintf("%s/p/%d?task=%s", bed.Sites[2].URL(), i+1, task), nil, ctx, nil))
			}
		}()
	}
	for i := range n {
		require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", bed.Sites[i%2].URL(), i+1)))
	}
	c.Wait()
	wg.Wait()
	for k := range tasks {
		_, err := s.EndSession(context.Background(), fmt.Sprintf("task%d", k))
		require.NoError(t, err)
	}

	assert.Equal(t, int64(n+tasks*steps), ok.Load(), "every page served, the guarded ones through another proxy")
	ipsOf := map[string]map[string]bool{}
	for _, h := range bed.Sites[2].Recorder().Hits() {
		if ipsOf[h.Query] == nil {
			ipsOf[h.Query] = map[string]bool{}
		}
		ipsOf[h.Query][h.ClientIP] = true
	}
	assert.Len(t, ipsOf, tasks)
	for task, ips := range ipsOf {
		assert.Len(t, ips, 1, "%s: one IP for its session", task)
	}
	assert.Zero(t, failed.Load())
	assertGroundTruth(t, bed)
	assertNoLeases(t, s, bed.Sites...)
	assert.Equal(t, int64(bed.SiteHits()), sent.Load(), "every request went through the custom RoundTripper")
	assert.Positive(t, s.BanCounts()[BanKey{Site: bed.Sites[0].Host(), Reason: "http_403"}], "the 403s were seen as bans")
	for _, h := range bed.Sites[0].Recorder().Hits() {
		if h.ClientIP == burnt {
			assert.Equal(t, http.StatusForbidden, h.Status)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for host, k := range built {
		assert.LessOrEqual(t, k, 2+tasks, "proxy %s: one client per site, and per session", host)
	}
}

// A client that cannot be built, or would not send through its proxy,
// fails the request with ErrNoProxy before anything leaves; the lease
// comes back.
func TestClientFailsClosed(t *testing.T) {
	cases := map[string]func(*url.URL) (http.RoundTripper, error){
		"error":  func(*url.URL) (http.RoundTripper, error) { return nil, errors.New("no fingerprint for this proxy") },
		"panic":  func(*url.URL) (http.RoundTripper, error) { panic("boom") },
		"nil":    func(*url.URL) (http.RoundTripper, error) { return nil, nil },
		"direct": func(*url.URL) (http.RoundTripper, error) { return &http.Transport{}, nil },
		"other proxy": func(*url.URL) (http.RoundTripper, error) {
			return &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: "127.0.0.1:1"})}, nil
		},
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) {
			bed, s := bedSwitch(t, 1, 2, WithClient(Client{New: f, KeepAlive: true}))
			c := colly.NewCollector()
			s.Attach(c)
			err := c.Visit(bed.Sites[0].URL() + "/p/1")
			require.ErrorIs(t, err, ErrNoProxy)
			assert.NotContains(t, err.Error(), "panicked: boom\n")
			assert.Zero(t, bed.SiteHits(), "nothing reached the site")
			for _, p := range bed.Proxies {
				assert.Zero(t, p.Requests(), "nothing reached a proxy")
			}
			assertNoLeases(t, s, bed.Sites...)
		})
	}
}

// With keep-alives, a sticky session of 20 requests opens one connection
// per site at its proxy, a plain site and a TLS one alike; without them,
// one per request.
func TestClientKeepAliveSession(t *testing.T) {
	for _, keep := range []bool{true, false} {
		t.Run(fmt.Sprintf("keepalive=%v", keep), func(t *testing.T) {
			plain := testbed.NewSite(t, "plain", nil)
			tlsSite := testbed.NewTLSSite(t, "tls", nil)
			proxies := testbed.NewProxies(t, 2)
			s := newSwitch(t, shared.Client(t), WithBaseTransport(&http.Transport{TLSClientConfig: tlsSite.TLSConfig()}),
				WithClient(Client{KeepAlive: keep}))
			_, err := s.Add(context.Background(), proxies[0].URL(), proxies[1].URL())
			require.NoError(t, err)
			c := colly.NewCollector(colly.AllowURLRevisit())
			s.Attach(c)
			var failed atomic.Int64
			c.OnError(func(_ *colly.Response, err error) { failed.Add(1); t.Log(err) })
			ctx := NewTaskContext("shopper")
			const n = 20
			for i := range n {
				for _, site := range []*testbed.Site{plain, tlsSite} {
					require.NoError(t, c.Request("GET", fmt.Sprintf("%s/p/%d", site.URL(), i+1), nil, ctx, nil))
				}
			}
			require.Zero(t, failed.Load())
			accepted := 0
			for _, p := range proxies {
				a, _ := p.Conns()
				accepted += a
			}
			for _, site := range []*testbed.Site{plain, tlsSite} {
				assert.Len(t, site.Recorder().IPs(), 1, "one IP for the session on %s", site.Name())
				assert.Equal(t, n, site.Recorder().Count())
			}
			if keep {
				assert.Equal(t, 2, accepted, "one connection per site")
				assert.Equal(t, 2, s.clients.size(), "one pool per (proxy, site, session)")
			} else {
				assert.Equal(t, 2*n, accepted, "one connection per request")
			}
			_, err = s.EndSession(context.Background(), "shopper")
			require.NoError(t, err)
			require.NoError(t, s.Close(context.Background()))
			for _, p := range proxies {
				require.Eventually(t, func() bool { _, open := p.Conns(); return open == 0 }, 5*time.Second, 10*time.Millisecond,
					"Close closed the idle connections")
			}
		})
	}
}

// Requests of no task reuse a connection per (proxy, site) too.
func TestClientKeepAliveRequests(t *testing.T) {
	bed, s := bedSwitch(t, 2, 1, WithClient(Client{KeepAlive: true}))
	c := colly.NewCollector(colly.AllowURLRevisit())
	s.Attach(c)
	for i := range 10 {
		require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", bed.Sites[i%2].URL(), i+1)))
	}
	accepted, open := bed.Proxies[0].Conns()
	assert.Equal(t, 2, accepted, "one connection per site")
	assert.Equal(t, 2, open)
	assertNoLeases(t, s, bed.Sites...)
}

// A proxy quarantined on a site (by its ban through the transport, or by
// an operator) or drained loses its idle connections there: the proxy sees
// them close.
func TestClientQuarantineClosesIdle(t *testing.T) {
	guard := &banIPs{next: testbed.DefaultHandler()}
	site := testbed.NewSite(t, "guarded", guard)
	other := testbed.NewSite(t, "other", nil)
	proxies := testbed.NewProxies(t, 2)
	p0 := proxies[0]
	s := newSwitch(t, shared.Client(t), WithClient(Client{KeepAlive: true}), WithTimeouts(Timeouts{MaxWait: 100 * time.Millisecond}))
	_, err := s.Add(context.Background(), p0.URL())
	require.NoError(t, err)
	c := colly.NewCollector(colly.AllowURLRevisit())
	s.Attach(c)
	require.NoError(t, c.Visit(site.URL()+"/p/1"))
	require.NoError(t, c.Visit(other.URL()+"/p/1"))
	accepted, open := p0.Conns()
	require.Equal(t, 2, accepted)
	require.Equal(t, 2, open, "idle, kept for the next requests")

	// The site bans the proxy: the ban's own connection, and every idle one
	// of the proxy on that site, close; the other site's stays.
	guard.banned.Store(p0.SourceIP().String(), true)
	err = c.Visit(site.URL() + "/p/2")
	require.ErrorIs(t, err, ErrNoProxy, "the only proxy is quarantined")
	require.ErrorIs(t, err, ErrBanned)
	require.Eventually(t, func() bool { _, open := p0.Conns(); return open == 1 }, 5*time.Second, 10*time.Millisecond)
	accepted, _ = p0.Conns()
	assert.Equal(t, 2, accepted, "the banned request reused the idle connection")

	// An operator's ban on the other site closes that one too.
	require.NoError(t, s.Ban(context.Background(), p0.URL(), other.Host(), time.Minute))
	require.Eventually(t, func() bool { _, open := p0.Conns(); return open == 0 }, 5*time.Second, 10*time.Millisecond)

	// Drain closes every site's.
	p1 := proxies[1]
	_, err = s.Add(context.Background(), p1.URL())
	require.NoError(t, err)
	require.NoError(t, c.Visit(other.URL()+"/p/2"))
	_, open = p1.Conns()
	require.Equal(t, 1, open)
	require.NoError(t, func() error { _, err := s.Drain(context.Background(), "", p1.URL()); return err }())
	require.Eventually(t, func() bool { _, open := p1.Conns(); return open == 0 }, 5*time.Second, 10*time.Millisecond)
	assertNoLeases(t, s, site, other)
}

// The pools are bounded per proxy and in all, least recently used out,
// and closed as they go.
func TestClientCacheBounds(t *testing.T) {
	s := newSwitch(t, shared.Client(t), WithClient(Client{KeepAlive: true, MaxPerProxy: 2, MaxTotal: 3}))
	build := func(req *http.Request, p *Proxy, site string) http.RoundTripper {
		rt, err := s.clients.get(req, p, p.URL(), site, "")
		require.NoError(t, err)
		return rt
	}
	req, _ := http.NewRequest("GET", "http://example.test/", nil)
	a, err := ParseProxy("http://127.0.0.1:1")
	require.NoError(t, err)
	b, err := ParseProxy("http://127.0.0.1:2")
	require.NoError(t, err)
	rts := map[string]http.RoundTripper{}
	for _, site := range []string{"s1", "s2", "s3"} {
		rts["a"+site] = build(req, a, site)
	}
	assert.Equal(t, 2, s.clients.size(), "two per proxy")
	assert.NotSame(t, rts["as3"], build(req, a, "s1"), "s1, the least recently used, was closed")
	assert.Same(t, rts["as3"], build(req, a, "s3"))
	build(req, b, "s1")
	build(req, b, "s2")
	assert.Equal(t, 3, s.clients.size(), "three in all: a's s1, the least recently used, went")
	s.clients.closeProxy(b.ID(), "")
	assert.Equal(t, 1, s.clients.size(), "a's s3 is left")
	require.NoError(t, s.Close(context.Background()))
	_, err = s.clients.get(req, a, a.URL(), "s1", "")
	require.ErrorIs(t, err, ErrNoProxy, "closed")
	assert.Zero(t, s.clients.size())
}

// A session carries one client identity for its life, the same on every
// worker (picked by its ID); requests of no task keep their own headers.
func TestClientSessionIdentity(t *testing.T) {
	guard := &banIPs{next: testbed.DefaultHandler()}
	site := testbed.NewSite(t, "shop", guard)
	proxies := testbed.NewProxies(t, 2)
	ids := []http.Header{
		{"User-Agent": {"agent-a"}, "Accept-Language": {"ru-RU"}},
		{"User-Agent": {"agent-b"}},
		{"user-agent": {"agent-c"}},
	}
	s := newSwitch(t, shared.Client(t), WithClient(Client{Identities: ids}))
	_, err := s.Add(context.Background(), proxies[0].URL(), proxies[1].URL())
	require.NoError(t, err)
	other := sibling(t, s, shared.Client(t))
	c1, c2 := colly.NewCollector(colly.AllowURLRevisit()), colly.NewCollector(colly.AllowURLRevisit())
	s.Attach(c1)
	other.Attach(c2)
	ctx := NewTaskContext("visitor")
	for i := range 10 {
		c := []*colly.Collector{c1, c2}[i%2]
		require.NoError(t, c.Request("GET", fmt.Sprintf("%s/p/%d", site.URL(), i+1), nil, ctx, nil))
	}
	require.NoError(t, c1.Visit(site.URL()+"/p/100"))

	info := SessionOf(ctx)
	require.NotNil(t, info)
	f := fnv.New64a()
	f.Write([]byte(info.ID))
	want := []string{"agent-a", "agent-b", "agent-c"}[f.Sum64()%3]
	agents := guard.userAgents()
	require.Len(t, agents, 11)
	for _, ua := range agents[:10] {
		assert.Equal(t, want, ua, "one identity for the session's life, on both workers")
	}
	assert.Contains(t, agents[10], "colly", "a request of no task keeps Colly's User-Agent")
}

func TestClientConfig(t *testing.T) {
	for name, cl := range map[string]Client{
		"negative per proxy": {MaxPerProxy: -1},
		"negative total":     {MaxTotal: -1},
		"negative idle":      {IdleTimeout: -time.Second},
		"both identities":    {Identities: []http.Header{{"User-Agent": {"x"}}}, Identity: func(string) http.Header { return nil }},
		"empty identity":     {Identities: []http.Header{{}}},
	} {
		_, err := NewSwitch(shared.Client(t), WithClient(cl))
		assert.ErrorIs(t, err, ErrConfig, name)
	}
}

// hangRT is a custom RoundTripper whose proxy never answers and that calls
// no httptrace hook: only the request's context ends it.
type hangRT struct{}

func (hangRT) RoundTrip(req *http.Request) (*http.Response, error) {
	<-req.Context().Done()
	return nil, req.Context().Err()
}

// Timeouts.Attempt bounds an attempt through a custom RoundTripper too
// (its bound starts as the proxy's client is picked, not at net/http's
// GetConn): the hanging proxy is dropped and the request served through
// another one within its own timeout.
func TestClientAttemptTimeout(t *testing.T) {
	bed := testbed.NewBed(t, 1, 2)
	hung := bed.Proxies[0].Addr()
	s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{Attempt: 200 * time.Millisecond}), WithClient(Client{
		New: func(proxy *url.URL) (http.RoundTripper, error) {
			if proxy.Host == hung {
				return hangRT{}, nil
			}
			return &fingerprintRT{proxy: proxy, inner: &http.Transport{Proxy: http.ProxyURL(proxy)}, sent: new(atomic.Int64)}, nil
		}}))
	_, err := s.Add(context.Background(), bed.ProxyURLs()...)
	require.NoError(t, err)
	c := colly.NewCollector(colly.AllowURLRevisit())
	c.SetRequestTimeout(3 * time.Second)
	s.Attach(c)
	for i := range 2 {
		require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", bed.Sites[0].URL(), i+1)))
	}
	assert.Positive(t, s.BanCounts()[BanKey{Site: bed.Sites[0].Host(), Reason: "proxy_timeout"}])
	assert.Equal(t, 2, bed.SiteHits())
	assertNoLeases(t, s, bed.Sites...)
}

// Pools unused for the idle timeout are dropped, and their connections
// closed, by the next request's sweep.
func TestClientIdleSweep(t *testing.T) {
	bed, s := bedSwitch(t, 2, 1, WithClient(Client{KeepAlive: true, IdleTimeout: 300 * time.Millisecond}))
	c := colly.NewCollector(colly.AllowURLRevisit())
	s.Attach(c)
	require.NoError(t, c.Visit(bed.Sites[0].URL()+"/p/1"))
	time.Sleep(1100 * time.Millisecond) // past the idle timeout and the sweep interval
	require.NoError(t, c.Visit(bed.Sites[1].URL()+"/p/1"))
	require.Eventually(t, func() bool { return s.clients.size() == 1 }, 2*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { _, open := bed.Proxies[0].Conns(); return open == 1 }, 2*time.Second, 10*time.Millisecond)
}

// BenchmarkClientSession measures one request of a sticky session to a TLS
// site through a fake proxy (CONNECT, then TLS), with keep-alives off (the
// default: a new tunnel and TLS handshake per request) and on (one
// connection for the session), side by side in one run. conns/op counts
// the connections the proxy accepted. Run:
//
//	go test -run '^$' -bench 'BenchmarkClientSession' -benchtime 300x -count 6 . | tee bench.txt
//
// See BENCHMARKS.md.
func BenchmarkClientSession(b *testing.B) {
	for _, keep := range []bool{false, true} {
		name := "conn=per-request"
		if keep {
			name = "conn=keepalive"
		}
		b.Run(name, func(b *testing.B) {
			site := testbed.NewTLSSite(b, "tls", nil)
			proxy := testbed.NewProxies(b, 1)[0]
			s := newSwitch(b, shared.Client(b), WithBaseTransport(&http.Transport{TLSClientConfig: site.TLSConfig()}),
				WithClient(Client{KeepAlive: keep}))
			_, err := s.Add(context.Background(), proxy.URL())
			require.NoError(b, err)
			c := colly.NewCollector(colly.AllowURLRevisit())
			s.Attach(c)
			ctx := NewTaskContext("bench")
			u := site.URL() + "/p/1"
			require.NoError(b, c.Request("GET", u, nil, ctx, nil)) // the session starts
			before, _ := proxy.Conns()
			b.ResetTimer()
			for range b.N {
				if err := c.Request("GET", u, nil, ctx, nil); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			after, _ := proxy.Conns()
			b.ReportMetric(float64(after-before)/float64(b.N), "conns/op")
			require.NoError(b, s.Close(context.Background()))
		})
	}
}

// Client.Identity derives a session's identity from its ID; a panic in it
// fails the request before anything leaves.
func TestClientIdentityFunc(t *testing.T) {
	guard := &banIPs{next: testbed.DefaultHandler()}
	site := testbed.NewSite(t, "shop", guard)
	proxies := testbed.NewProxies(t, 1)
	var panics atomic.Bool
	s := newSwitch(t, shared.Client(t), WithClient(Client{Identity: func(id string) http.Header {
		if panics.Load() {
			panic("no identity")
		}
		return http.Header{"User-Agent": {"ua-" + id}}
	}}))
	_, err := s.Add(context.Background(), proxies[0].URL())
	require.NoError(t, err)
	c := colly.NewCollector(colly.AllowURLRevisit())
	s.Attach(c)
	ctx := NewTaskContext("visitor")
	require.NoError(t, c.Request("GET", site.URL()+"/p/1", nil, ctx, nil))
	require.Equal(t, []string{"ua-" + SessionOf(ctx).ID}, guard.userAgents())

	panics.Store(true)
	err = c.Request("GET", site.URL()+"/p/2", nil, ctx, nil)
	require.ErrorIs(t, err, ErrNoProxy)
	assert.Len(t, guard.userAgents(), 1, "nothing sent")
}

// With keep-alives off, a custom RoundTripper that would keep its
// connections has them closed as each response ends: one connection per
// request, none left open.
func TestClientCustomNoKeepAlive(t *testing.T) {
	bed := testbed.NewBed(t, 1, 1)
	s := newSwitch(t, shared.Client(t), WithClient(Client{New: func(proxy *url.URL) (http.RoundTripper, error) {
		return &fingerprintRT{proxy: proxy, inner: &http.Transport{Proxy: http.ProxyURL(proxy)}, sent: new(atomic.Int64)}, nil
	}}))
	_, err := s.Add(context.Background(), bed.ProxyURLs()...)
	require.NoError(t, err)
	c := colly.NewCollector(colly.AllowURLRevisit())
	s.Attach(c)
	for i := range 5 {
		require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", bed.Sites[0].URL(), i+1)))
	}
	accepted, _ := bed.Proxies[0].Conns()
	assert.Equal(t, 5, accepted)
	require.Eventually(t, func() bool { _, open := bed.Proxies[0].Conns(); return open == 0 }, 5*time.Second, 10*time.Millisecond)
}

// idleOnTwoSites sends one page of each of bed's two sites through its one
// proxy, with s on a collector of its own, and checks that the proxy then
// keeps one idle connection to each (s with KeepAlive).
func idleOnTwoSites(t *testing.T, bed *testbed.Bed, s *Switch) (site, other *testbed.Site, p *testbed.Proxy, c *colly.Collector) {
	t.Helper()
	site, other, p = bed.Sites[0], bed.Sites[1], bed.Proxies[0]
	c = colly.NewCollector(colly.AllowURLRevisit())
	s.Attach(c)
	require.NoError(t, c.Visit(site.URL()+"/p/1"))
	require.NoError(t, c.Visit(other.URL()+"/p/1"))
	accepted, open := p.Conns()
	require.Equal(t, 2, accepted)
	require.Equal(t, 2, open, "idle, kept for the next requests")
	return site, other, p, c
}

// A request that finds its lease lost (the renewer's owner check failed:
// the lease record vanished from Redis while the request ran) closes its
// proxy's idle connections on that site: the one it went through, back in
// the pool once its body was read, is closed at the proxy; the proxy's
// connection to another site stays.
func TestClientLeaseLossClosesIdle(t *testing.T) {
	var logs testlog.Buffer
	bed, s := bedSwitch(t, 2, 1, WithTimeouts(Timeouts{LeaseTTL: renewTTL}), WithClient(Client{KeepAlive: true}),
		WithLogger(logs.Logger()))
	site, other, p, c := idleOnTwoSites(t, bed, s)

	slow := colly.NewCollector(colly.Async(true))
	s.Attach(slow)
	var gotErr error
	var responses atomic.Int64
	slow.OnResponse(func(*colly.Response) { responses.Add(1) })
	slow.OnError(func(_ *colly.Response, err error) { gotErr = err })
	require.NoError(t, slow.Visit(site.URL()+"/slow?d=1s"))
	require.Eventually(t, func() bool { return site.Recorder().InFlight() == 1 }, 5*time.Second, 5*time.Millisecond)
	accepted, _ := p.Conns()
	require.Equal(t, 2, accepted, "the slow request reuses the site's idle connection")
	require.NoError(t, shared.Client(t).Del(context.Background(), s.keys.leases(site.Host())).Err())
	slow.Wait()
	require.ErrorIs(t, gotErr, ErrLeaseLost)
	assert.Zero(t, responses.Load())
	assert.Equal(t, 1, strings.Count(logs.String(), "lost its lease"), logs.String())

	require.Eventually(t, func() bool { _, open := p.Conns(); return open == 1 }, 5*time.Second, 10*time.Millisecond,
		"the lost lease's site connection closed")
	time.Sleep(100 * time.Millisecond)
	_, open := p.Conns()
	assert.Equal(t, 1, open, "the other site's connection is kept")
	require.NoError(t, c.Visit(other.URL()+"/p/2"))
	accepted, _ = p.Conns()
	assert.Equal(t, 2, accepted, "and reused")
	assertNoLeases(t, s, bed.Sites...)
}

// A lease whose owner check fails at its release (its record lost or
// taken over, and the renewer has not seen it yet) closes its proxy's idle
// connections on that site too; the other site's stay.
func TestClientReleaseLossClosesIdle(t *testing.T) {
	var logs testlog.Buffer
	bed, s := bedSwitch(t, 2, 1, WithClient(Client{KeepAlive: true}), WithLogger(logs.Logger()))
	site, other, p, c := idleOnTwoSites(t, bed, s)

	ctx := context.Background()
	l, err := s.Lease(ctx, site.Host())
	require.NoError(t, err)
	require.NoError(t, shared.Client(t).Del(ctx, s.keys.leases(site.Host())).Err())
	s.releaseQuietly(l) // as a request's end does
	assert.Equal(t, 1, strings.Count(logs.String(), "outlived its lease"), logs.String())
	require.Eventually(t, func() bool { _, open := p.Conns(); return open == 1 }, 5*time.Second, 10*time.Millisecond,
		"the lost lease's site connection closed")
	require.NoError(t, c.Visit(other.URL()+"/p/2"))
	accepted, _ := p.Conns()
	assert.Equal(t, 2, accepted, "the other site's connection kept and reused")
}

// keepRT is fingerprintRT (a custom RoundTripper that is not an
// *http.Transport and keeps connections, as a uTLS transport does) that
// also counts how often it was asked to close its idle connections.
type keepRT struct {
	fingerprintRT
	closes *atomic.Int64
}

func (k *keepRT) CloseIdleConnections() {
	k.closes.Add(1)
	k.fingerprintRT.CloseIdleConnections()
}

// With KeepAlive, a custom RoundTripper (not an *http.Transport) carries a
// sticky session of 20 requests per site over one connection per site, and
// a quarantine closes the proxy's idle connections through its
// CloseIdleConnections: a ban seen by the transport those on the banned
// site (the session's among them), an operator's ban the other site's.
func TestClientCustomKeepAlive(t *testing.T) {
	guard := &banIPs{next: testbed.DefaultHandler()}
	plain := testbed.NewSite(t, "plain", guard)
	tlsSite := testbed.NewTLSSite(t, "tls", nil)
	p := testbed.NewProxies(t, 1)[0]
	var sent, closes, built atomic.Int64
	s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: 100 * time.Millisecond}), WithClient(Client{KeepAlive: true,
		New: func(proxy *url.URL) (http.RoundTripper, error) {
			built.Add(1)
			inner := &http.Transport{Proxy: http.ProxyURL(proxy), TLSClientConfig: tlsSite.TLSConfig()}
			return &keepRT{fingerprintRT{proxy: proxy, inner: inner, sent: &sent}, &closes}, nil
		}}))
	_, err := s.Add(context.Background(), p.URL())
	require.NoError(t, err)
	c := colly.NewCollector(colly.AllowURLRevisit())
	s.Attach(c)
	ctx := NewTaskContext("shopper")
	const n = 20
	for i := range n {
		for _, site := range []*testbed.Site{plain, tlsSite} {
			require.NoError(t, c.Request("GET", fmt.Sprintf("%s/p/%d", site.URL(), i+1), nil, ctx, nil))
		}
	}
	for _, site := range []*testbed.Site{plain, tlsSite} {
		assert.Equal(t, n, site.Recorder().Count())
	}
	assert.Equal(t, int64(2*n), sent.Load(), "every request went through the custom RoundTripper")
	assert.Equal(t, int64(2), built.Load(), "one RoundTripper per site for the session")
	accepted, open := p.Conns()
	assert.Equal(t, 2, accepted, "one connection per site, not one per request")
	assert.Equal(t, 2, open)
	assert.Zero(t, closes.Load())
	_, err = s.EndSession(context.Background(), "shopper")
	require.NoError(t, err)

	// The plain site bans the proxy: its connections there close, the
	// session's idle one too; the TLS site's stays.
	guard.banned.Store(p.SourceIP().String(), true)
	err = c.Visit(plain.URL() + "/p/100")
	require.ErrorIs(t, err, ErrBanned)
	require.Eventually(t, func() bool { _, open := p.Conns(); return open == 1 }, 5*time.Second, 10*time.Millisecond,
		"the banned site's idle connections closed")
	assert.Positive(t, closes.Load(), "through the RoundTripper's CloseIdleConnections")
	require.NoError(t, s.Ban(context.Background(), p.URL(), tlsSite.Host(), time.Minute))
	require.Eventually(t, func() bool { _, open := p.Conns(); return open == 0 }, 5*time.Second, 10*time.Millisecond,
		"an operator's ban closes the TLS site's")
	assertNoLeases(t, s, plain, tlsSite)
}

// plainRT is a custom RoundTripper without CloseIdleConnections.
type plainRT struct{ inner *http.Transport }

func (r plainRT) RoundTrip(req *http.Request) (*http.Response, error) { return r.inner.RoundTrip(req) }

// With KeepAlive, a RoundTripper of Client.New that cannot close its idle
// connections (no CloseIdleConnections) fails its requests with a clear
// error before anything is sent: its connections could not be closed when
// the proxy is banned. Without KeepAlive it is used.
func TestClientKeepAliveNeedsCloseIdle(t *testing.T) {
	for _, keep := range []bool{true, false} {
		t.Run(fmt.Sprintf("keepalive=%v", keep), func(t *testing.T) {
			bed := testbed.NewBed(t, 1, 1)
			p := bed.Proxies[0]
			p.SetCredentials("user", "pw")
			s := newSwitch(t, shared.Client(t), WithClient(Client{KeepAlive: keep, New: func(proxy *url.URL) (http.RoundTripper, error) {
				return plainRT{inner: &http.Transport{Proxy: http.ProxyURL(proxy), DisableKeepAlives: true}}, nil
			}}))
			_, err := s.Add(context.Background(), p.URL())
			require.NoError(t, err)
			c := colly.NewCollector()
			s.Attach(c)
			err = c.Visit(bed.Sites[0].URL() + "/p/1")
			if !keep {
				require.NoError(t, err)
				assert.Equal(t, 1, bed.SiteHits())
				return
			}
			require.ErrorIs(t, err, ErrNoProxy)
			require.ErrorIs(t, err, ErrConfig)
			assert.Contains(t, err.Error(), "CloseIdleConnections")
			assert.Contains(t, err.Error(), "plainRT")
			assert.NotContains(t, err.Error(), "pw")
			t.Log(err)
			assert.Zero(t, p.Requests(), "nothing reached the proxy")
			assert.Zero(t, bed.SiteHits())
			assertNoLeases(t, s, bed.Sites...)
		})
	}
}

// headerRT is a custom RoundTripper that sets a header of its own on a copy
// of the request, as a RoundTripper must (it may not modify its request),
// and returns net/http's response, whose Request is that copy.
type headerRT struct{ inner *http.Transport }

func (h headerRT) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set("X-Client", "fingerprint")
	return h.inner.RoundTrip(req)
}

func (h headerRT) CloseIdleConnections() { h.inner.CloseIdleConnections() }

// A custom RoundTripper that sends a copy of its request (with headers of
// its own) loses no lease: each request's lease comes back as it ends, so
// requests one after the other through one proxy never wait for one
// another, a redirect chain included, and none is left.
func TestClientCopyingRoundTripper(t *testing.T) {
	var marked, unmarked atomic.Int64
	shop := testbed.DefaultHandler()
	site := testbed.NewSite(t, "shop", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Client") == "fingerprint" {
			marked.Add(1)
		} else {
			unmarked.Add(1)
		}
		shop.ServeHTTP(w, r)
	}))
	p := testbed.NewProxies(t, 1)[0]
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("keepalive=%v", keep), func(t *testing.T) {
			s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: 2 * time.Second}), WithClient(Client{KeepAlive: keep,
				New: func(proxy *url.URL) (http.RoundTripper, error) {
					return headerRT{inner: &http.Transport{Proxy: http.ProxyURL(proxy)}}, nil
				}}))
			_, err := s.Add(context.Background(), p.URL())
			require.NoError(t, err)
			c := colly.NewCollector(colly.AllowURLRevisit())
			s.Attach(c)
			var proxies []string
			c.OnResponse(func(r *colly.Response) { proxies = append(proxies, r.Request.ProxyURL) })
			for i := range 4 { // one proxy: each request needs the lease of the one before back
				require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), i+1)))
			}
			require.NoError(t, c.Visit(site.URL()+"/redirect?n=2"))
			assert.Len(t, proxies, 5)
			for _, u := range proxies {
				assert.Equal(t, p.URL(), u, "Request.ProxyURL names the proxy")
			}
			assertNoLeases(t, s, site)
		})
	}
	assert.Equal(t, int64(14), marked.Load(), "every request, redirect hops included, went through the RoundTripper")
	assert.Zero(t, unmarked.Load())
}
