package testbed

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// ---- helpers ----

func newTransport(t *testing.T, proxyURL string) *http.Transport {
	t.Helper()
	tr := &http.Transport{
		TLSClientConfig:     &tls.Config{InsecureSkipVerify: true},
		MaxIdleConnsPerHost: 256,
	}
	if proxyURL != "" {
		u, err := url.Parse(proxyURL)
		if err != nil {
			t.Fatal(err)
		}
		tr.Proxy = http.ProxyURL(u)
	}
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// client returns a client using proxyURL ("" = direct) that does not follow
// redirects.
func client(t *testing.T, proxyURL string) *http.Client {
	t.Helper()
	return &http.Client{
		Transport:     newTransport(t, proxyURL),
		Timeout:       10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

func get(t *testing.T, c *http.Client, u string) (*http.Response, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read body: %v", u, err)
	}
	return resp, string(b)
}

func wantStatus(t *testing.T, resp *http.Response, code int) {
	t.Helper()
	if resp.StatusCode != code {
		t.Fatalf("%s %s: status %d, want %d", resp.Request.Method, resp.Request.URL, resp.StatusCode, code)
	}
}

func wantInt(t *testing.T, what string, got, want int) {
	t.Helper()
	if got != want {
		t.Errorf("%s = %d, want %d", what, got, want)
	}
}

// ---- proxies and sites ----

func TestProxyForwardsFromSourceIP(t *testing.T) {
	site := NewSite(t, "shop", nil)
	p := NewProxy(t, net.ParseIP("127.0.3.7"))
	if got := p.SourceIP().String(); got != "127.0.3.7" {
		t.Fatalf("SourceIP = %s", got)
	}
	if !strings.HasPrefix(p.URL(), "http://127.0.0.1:") {
		t.Fatalf("URL = %q", p.URL())
	}

	resp, body := get(t, client(t, p.URL()), site.URL()+"/p/3?x=1")
	wantStatus(t, resp, http.StatusOK)
	if want := `<div class="product" data-id="3">Product 3</div>`; !strings.Contains(body, want) {
		t.Fatalf("body %q does not contain %q", body, want)
	}
	if !strings.Contains(resp.Header.Get("Via"), p.Via()) {
		t.Errorf("response Via = %q, want it to contain %q", resp.Header.Get("Via"), p.Via())
	}

	rec := site.Recorder()
	hits := rec.Hits()
	if len(hits) != 1 {
		t.Fatalf("hits = %+v", hits)
	}
	h := hits[0]
	if h.ClientIP != "127.0.3.7" || h.Path != "/p/3" || h.Query != "x=1" || h.Method != http.MethodGet ||
		h.Via != p.Via() || h.Status != http.StatusOK || h.Collided {
		t.Errorf("unexpected hit %+v", h)
	}
	if h.Start.IsZero() || h.End.Before(h.Start) || h.Duration() < DefaultProductDelay {
		t.Errorf("bad interval %v .. %v", h.Start, h.End)
	}
	wantInt(t, "Count", rec.Count(), 1)
	wantInt(t, "DirectHits", rec.DirectHits(), 0)
	wantInt(t, "IPs[127.0.3.7]", rec.IPs()["127.0.3.7"], 1)
	wantInt(t, "Requests", p.Requests(), 1)
	wantInt(t, "Hosts[site]", p.Hosts()[site.Host()], 1)
	wantInt(t, "proxy Collisions", p.Collisions(), 0)
	wantInt(t, "MaxConcurrentPerHost", p.MaxConcurrentPerHost(), 1)
	if site.Name() != "shop" || !strings.HasPrefix(site.Host(), "127.0.0.1:") || site.URL() != "http://"+site.Host() {
		t.Errorf("site name/host/url: %q %q %q", site.Name(), site.Host(), site.URL())
	}
}

func TestTwoProxiesGiveDistinctClientIPs(t *testing.T) {
	site := NewSite(t, "shop", nil)
	ps := NewProxies(t, 2)
	for _, p := range ps {
		resp, _ := get(t, client(t, p.URL()), site.URL()+"/")
		wantStatus(t, resp, http.StatusOK)
	}
	ips := site.Recorder().IPs()
	if len(ips) != 2 || ips["127.0.1.1"] != 1 || ips["127.0.1.2"] != 1 {
		t.Fatalf("IPs = %v", ips)
	}
	wantInt(t, "Collisions", site.Recorder().Collisions(), 0)
}

func TestConcurrentRequestsThroughOneProxyCollide(t *testing.T) {
	site := NewSite(t, "shop", &ShopHandler{Delay: 100 * time.Millisecond})
	p := NewProxy(t, SourceIP(0))
	c := client(t, p.URL())

	const n = 6
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := c.Get(fmt.Sprintf("%s/p/%d", site.URL(), i+1))
			if err != nil {
				errs <- err
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	rec := site.Recorder()
	wantInt(t, "Count", rec.Count(), n)
	if rec.Collisions() == 0 || rec.MaxConcurrentPerIP() < 2 {
		t.Errorf("site: Collisions = %d, MaxConcurrentPerIP = %d; want collisions", rec.Collisions(), rec.MaxConcurrentPerIP())
	}
	if p.Collisions() == 0 || p.MaxConcurrentPerHost() < 2 {
		t.Errorf("proxy: Collisions = %d, MaxConcurrentPerHost = %d; want collisions", p.Collisions(), p.MaxConcurrentPerHost())
	}
	collided := 0
	for _, h := range rec.Hits() {
		if h.Collided {
			collided++
		}
	}
	wantInt(t, "hits marked Collided", collided, rec.Collisions())
	sc, pc := TotalCollisions([]*Site{site}, []*Proxy{p})
	if sc != rec.Collisions() || pc != p.Collisions() {
		t.Errorf("TotalCollisions = %d, %d", sc, pc)
	}
}

func TestSequentialRequestsDoNotCollide(t *testing.T) {
	site := NewSite(t, "shop", &ShopHandler{Delay: 5 * time.Millisecond})
	p := NewProxy(t, nil)
	c := client(t, p.URL())
	for i := range 20 {
		resp, _ := get(t, c, fmt.Sprintf("%s/p/%d", site.URL(), i+1))
		wantStatus(t, resp, http.StatusOK)
	}
	rec := site.Recorder()
	wantInt(t, "Count", rec.Count(), 20)
	wantInt(t, "site Collisions", rec.Collisions(), 0)
	wantInt(t, "MaxConcurrentPerIP", rec.MaxConcurrentPerIP(), 1)
	wantInt(t, "proxy Collisions", p.Collisions(), 0)
	wantInt(t, "MaxConcurrentPerHost", p.MaxConcurrentPerHost(), 1)
}

// TestLeaseHandoffNoFalsePositives mimics the library: 150 workers lease a
// proxy per site from a pool, use it for one request and hand it straight to
// the next worker. Correct leasing must never be reported as a collision.
func TestLeaseHandoffNoFalsePositives(t *testing.T) {
	const (
		nSites    = 3
		nProxies  = 12
		nWorkers  = 150
		nRequests = 2400
	)
	bed := NewBed(t, nSites, nProxies)
	for _, s := range bed.Sites {
		s.Handler().(*ShopHandler).Delay = 0
	}
	clients := make([]*http.Client, nProxies)
	for i, p := range bed.Proxies {
		clients[i] = client(t, p.URL())
	}
	// pools[s] holds the proxies currently free for site s.
	pools := make([]chan int, nSites)
	for s := range pools {
		pools[s] = make(chan int, nProxies)
		for i := range nProxies {
			pools[s] <- i
		}
	}
	jobs := make(chan int)
	go func() {
		defer close(jobs)
		for i := range nRequests {
			jobs <- i
		}
	}()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for range nWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				s := rand.IntN(nSites)
				pi := <-pools[s] // lease (proxy, site)
				resp, err := clients[pi].Get(fmt.Sprintf("%s/p/%d", bed.Sites[s].URL(), i+1))
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				pools[s] <- pi // release
				if err != nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, err)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	wantInt(t, "site hits", bed.SiteHits(), nRequests)
	wantInt(t, "direct hits", bed.DirectHits(), 0)
	sc, pc := bed.Collisions()
	wantInt(t, "site collisions", sc, 0)
	wantInt(t, "proxy collisions", pc, 0)
	total := 0
	for _, p := range bed.Proxies {
		total += p.Requests()
	}
	wantInt(t, "proxy requests", total, nRequests)
}

func cmpErr(old, err error) error {
	if old != nil {
		return old
	}
	return err
}

func TestDirectHits(t *testing.T) {
	site := NewSite(t, "shop", nil)
	p := NewProxy(t, nil)
	get(t, client(t, ""), site.URL()+"/p/1")
	get(t, client(t, p.URL()), site.URL()+"/p/2")
	rec := site.Recorder()
	wantInt(t, "DirectHits", rec.DirectHits(), 1)
	wantInt(t, "Count", rec.Count(), 2)
	if ips := rec.IPs(); ips[DirectIP] != 1 || ips[p.SourceIP().String()] != 1 {
		t.Errorf("IPs = %v", ips)
	}
}

func TestProxy407Mode(t *testing.T) {
	site := NewSite(t, "shop", nil)
	p := NewProxy(t, nil)
	p.SetMode(Proxy407)
	if p.Mode() != Proxy407 || p.Mode().String() != "407" {
		t.Fatalf("Mode = %v", p.Mode())
	}
	resp, _ := get(t, client(t, p.URL()), site.URL()+"/")
	wantStatus(t, resp, http.StatusProxyAuthRequired)
	if !strings.HasPrefix(resp.Header.Get("Proxy-Authenticate"), "Basic") {
		t.Errorf("Proxy-Authenticate = %q", resp.Header.Get("Proxy-Authenticate"))
	}
	wantInt(t, "site Count", site.Recorder().Count(), 0)
	wantInt(t, "Requests", p.Requests(), 1)
}

func TestProxyCredentials(t *testing.T) {
	site := NewSite(t, "shop", nil)
	p := NewProxy(t, nil)
	p.SetCredentials("alice", "s3cr:et")
	u, _ := url.Parse(p.URL())
	if pw, _ := u.User.Password(); u.User.Username() != "alice" || pw != "s3cr:et" || u.Host != p.Addr() {
		t.Fatalf("URL = %q", p.URL())
	}

	// Correct credentials pass and are not leaked to the target.
	resp, body := get(t, client(t, p.URL()), site.URL()+"/echo")
	wantStatus(t, resp, http.StatusOK)
	var echo EchoResponse
	if err := json.Unmarshal([]byte(body), &echo); err != nil {
		t.Fatal(err)
	}
	if _, leaked := echo.Header["Proxy-Authorization"]; leaked {
		t.Errorf("Proxy-Authorization forwarded to target: %v", echo.Header)
	}
	if echo.ClientIP != p.SourceIP().String() {
		t.Errorf("echo ClientIP = %q", echo.ClientIP)
	}

	// Wrong or missing credentials get 407.
	for _, pu := range []string{
		"http://alice:wrong@" + p.Addr(),
		"http://" + p.Addr(),
	} {
		resp, _ := get(t, client(t, pu), site.URL()+"/")
		wantStatus(t, resp, http.StatusProxyAuthRequired)
		if resp.Header.Get("Proxy-Authenticate") == "" {
			t.Errorf("missing Proxy-Authenticate")
		}
	}
	wantInt(t, "site Count", site.Recorder().Count(), 1)

	p.SetCredentials("", "")
	if p.URL() != "http://"+p.Addr() {
		t.Errorf("URL after clearing credentials = %q", p.URL())
	}
}

func TestDeadProxy(t *testing.T) {
	site := NewSite(t, "shop", nil)
	p := NewProxy(t, nil)
	c := client(t, p.URL())
	get(t, c, site.URL()+"/") // leaves an idle keep-alive conn to the proxy

	p.SetMode(ProxyDead)
	_, err := c.Get(site.URL() + "/")
	if err == nil {
		t.Fatal("request through dead proxy succeeded")
	}
	if _, err := client(t, p.URL()).Get(site.URL() + "/"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("fresh client through dead proxy: err = %v, want connection refused", err)
	}

	p.SetMode(ProxyOK) // revives on the same address
	resp, _ := get(t, client(t, p.URL()), site.URL()+"/")
	wantStatus(t, resp, http.StatusOK)
	wantInt(t, "site Count", site.Recorder().Count(), 2)
}

func TestHangProxy(t *testing.T) {
	site := NewSite(t, "shop", nil)
	p := NewProxy(t, nil)
	p.SetMode(ProxyHang)
	c := client(t, p.URL())
	c.Timeout = 300 * time.Millisecond

	start := time.Now()
	_, err := c.Get(site.URL() + "/")
	if err == nil {
		t.Fatal("request through hanging proxy succeeded")
	}
	if el := time.Since(start); el < 250*time.Millisecond || el > 3*time.Second {
		t.Errorf("hang timed out after %v", el)
	}

	// A second hung request still pending when Close is called.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, site.URL()+"/", nil)
		_, err := client(t, p.URL()).Do(req)
		done <- err
	}()
	for p.Requests() < 2 {
		time.Sleep(time.Millisecond)
	}
	start = time.Now()
	p.Close()
	if el := time.Since(start); el > time.Second {
		t.Errorf("Close took %v", el)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Error("hung request succeeded after Close")
		}
	case <-time.After(2 * time.Second):
		t.Error("hung client not released by Close")
	}
	wantInt(t, "site Count", site.Recorder().Count(), 0)
	p.Close() // idempotent
}

func TestSlowProxy(t *testing.T) {
	site := NewSite(t, "shop", nil)
	p := NewProxy(t, nil)
	p.SetMode(ProxySlow)
	p.SetDelay(150 * time.Millisecond)
	start := time.Now()
	resp, _ := get(t, client(t, p.URL()), site.URL()+"/p/1")
	wantStatus(t, resp, http.StatusOK)
	if el := time.Since(start); el < 150*time.Millisecond {
		t.Errorf("slow proxy answered after %v", el)
	}
}

func TestProxy502Mode(t *testing.T) {
	site := NewSite(t, "shop", nil)
	p := NewProxy(t, nil)
	p.SetMode(Proxy502)
	resp, _ := get(t, client(t, p.URL()), site.URL()+"/")
	wantStatus(t, resp, http.StatusBadGateway)
	wantInt(t, "site Count", site.Recorder().Count(), 0)
}

func TestRedirectNotFollowedByProxy(t *testing.T) {
	site := NewSite(t, "shop", nil)
	p := NewProxy(t, nil)
	resp, _ := get(t, client(t, p.URL()), site.URL()+"/redirect?n=1")
	wantStatus(t, resp, http.StatusFound)
	if loc := resp.Header.Get("Location"); loc != "/p/1" {
		t.Errorf("Location = %q", loc)
	}
	wantInt(t, "site Count", site.Recorder().Count(), 1)
	wantInt(t, "proxy Requests", p.Requests(), 1)

	// A following client walks the chain itself: 3 redirects + final page.
	c := client(t, p.URL())
	c.CheckRedirect = nil
	resp, body := get(t, c, site.URL()+"/redirect?n=3")
	wantStatus(t, resp, http.StatusOK)
	if resp.Request.URL.Path != "/p/1" || !strings.Contains(body, `data-id="1"`) {
		t.Errorf("landed on %s: %q", resp.Request.URL, body)
	}
	wantInt(t, "site Count", site.Recorder().Count(), 5)
	wantInt(t, "proxy Requests", p.Requests(), 5)

	// to= target.
	resp, _ = get(t, client(t, p.URL()), site.URL()+"/redirect?to="+url.QueryEscape(site.URL()+"/p/9"))
	wantStatus(t, resp, http.StatusFound)
	if loc := resp.Header.Get("Location"); loc != site.URL()+"/p/9" {
		t.Errorf("Location = %q", loc)
	}
}

func TestNonLoopbackTargetRefused(t *testing.T) {
	p := NewProxy(t, nil)
	c := client(t, p.URL())
	for _, u := range []string{
		"http://192.0.2.1/",     // TEST-NET-1, must never be dialed
		"http://example.com/",   // names other than localhost are not resolved
		"http://10.0.0.1:8080/", // private
	} {
		resp, _ := get(t, c, u)
		wantStatus(t, resp, http.StatusForbidden)
	}
	// CONNECT to a non-loopback target fails too.
	if _, err := c.Get("https://192.0.2.1/"); err == nil {
		t.Error("CONNECT to 192.0.2.1 succeeded")
	}
	if len(p.Hosts()) != 0 {
		t.Errorf("Hosts = %v, want none", p.Hosts())
	}

}

func TestLocalhostTargetUsesSourceIP(t *testing.T) {
	site := NewSite(t, "shop", nil)
	p := NewProxy(t, SourceIP(5))
	_, port, _ := net.SplitHostPort(site.Host())
	resp, _ := get(t, client(t, p.URL()), "http://localhost:"+port+"/")
	wantStatus(t, resp, http.StatusOK)
	if ips := site.Recorder().IPs(); ips["127.0.1.6"] != 1 {
		t.Errorf("IPs = %v", ips)
	}
}

func TestConnectTunnel(t *testing.T) {
	p := NewProxy(t, SourceIP(41))

	// Plain httptest TLS server.
	ts := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ip, _, _ := net.SplitHostPort(r.RemoteAddr)
		io.WriteString(w, ip)
	}))
	t.Cleanup(ts.Close)
	c := client(t, p.URL())
	resp, body := get(t, c, ts.URL+"/whoami")
	wantStatus(t, resp, http.StatusOK)
	if body != p.SourceIP().String() {
		t.Errorf("TLS server saw client IP %q, want %s", body, p.SourceIP())
	}
	wantInt(t, "Requests (one CONNECT)", p.Requests(), 1)
	wantInt(t, "Hosts[ts]", p.Hosts()[strings.TrimPrefix(ts.URL, "https://")], 1)

	// Recorded TLS site, with proxy credentials on the CONNECT.
	site := NewTLSSite(t, "secure", nil)
	if !site.TLS() || site.TLSConfig() == nil {
		t.Fatal("site is not TLS")
	}
	p.SetCredentials("u", "p")
	c = client(t, p.URL())
	for i := range 3 {
		resp, body := get(t, c, fmt.Sprintf("%s/p/%d", site.URL(), i+1))
		wantStatus(t, resp, http.StatusOK)
		if !strings.Contains(body, fmt.Sprintf(`data-id="%d"`, i+1)) {
			t.Errorf("body %q", body)
		}
	}
	rec := site.Recorder()
	wantInt(t, "TLS site Count", rec.Count(), 3)
	wantInt(t, "TLS site hits from proxy", rec.IPs()[p.SourceIP().String()], 3)
	wantInt(t, "TLS site Collisions", rec.Collisions(), 0)

	// Wrong credentials: CONNECT rejected.
	if _, err := client(t, "http://u:bad@"+p.Addr()).Get(site.URL() + "/"); err == nil {
		t.Error("CONNECT with wrong credentials succeeded")
	}

	// Close tears down open tunnels (idle keep-alive TLS conns in c).
	p.Close()
	if _, err := c.Get(site.URL() + "/"); err == nil {
		t.Error("request through closed proxy succeeded")
	}
}

func TestNewProxies300(t *testing.T) {
	ps := NewProxies(t, 300)
	seen := make(map[string]bool)
	for _, p := range ps {
		ip := p.SourceIP().To4()
		if ip == nil || ip[0] != 127 || ip[1] != 0 || ip[2] == 0 || ip[3] == 0 || ip[3] == 255 {
			t.Fatalf("bad source IP %v", ip)
		}
		if seen[ip.String()] {
			t.Fatalf("duplicate source IP %v", ip)
		}
		seen[ip.String()] = true
	}
	if ps[0].SourceIP().String() != "127.0.1.1" || ps[254].SourceIP().String() != "127.0.2.1" {
		t.Errorf("first IPs: %v %v", ps[0].SourceIP(), ps[254].SourceIP())
	}
	site := NewSite(t, "shop", nil)
	last := ps[len(ps)-1]
	resp, _ := get(t, client(t, last.URL()), site.URL()+"/")
	wantStatus(t, resp, http.StatusOK)
	if ips := site.Recorder().IPs(); ips[last.SourceIP().String()] != 1 {
		t.Errorf("IPs = %v, want hit from %v", ips, last.SourceIP())
	}
}

func TestSourceIP(t *testing.T) {
	for i, want := range map[int]string{
		0: "127.0.1.1", 253: "127.0.1.254", 254: "127.0.2.1", 4999: "127.0.20.174",
		MaxSourceIPs - 1: "127.0.255.254",
	} {
		if got := SourceIP(i).String(); got != want {
			t.Errorf("SourceIP(%d) = %s, want %s", i, got, want)
		}
	}
	for _, i := range []int{-1, MaxSourceIPs} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("SourceIP(%d) did not panic", i)
				}
			}()
			SourceIP(i)
		}()
	}
}

// ---- default handler ----

func TestDefaultHandlerRoutes(t *testing.T) {
	site := NewSite(t, "shop", &ShopHandler{ProductCount: 5})
	p := NewProxy(t, nil)
	c := client(t, p.URL())

	resp, body := get(t, c, site.URL()+"/")
	wantStatus(t, resp, http.StatusOK)
	if !strings.Contains(body, `href="/p/5"`) || strings.Contains(body, `href="/p/6"`) {
		t.Errorf("index: %q", body)
	}
	resp, body = get(t, c, site.URL()+"/p/123")
	wantStatus(t, resp, http.StatusOK)
	if body != `<html><body><div class="product" data-id="123">Product 123</div></body></html>` {
		t.Errorf("product body %q", body)
	}
	for path, code := range map[string]int{
		"/p/0": 404, "/p/x": 404, "/nope": 404, "/status/418": 418, "/status/503": 503,
		"/status/204": 204, "/status/99": 400, "/slow?d=10ms": 200, "/slow?d=bad": 400,
		"/big?kb=-1": 400,
	} {
		resp, _ := get(t, c, site.URL()+path)
		if resp.StatusCode != code {
			t.Errorf("%s: status %d, want %d", path, resp.StatusCode, code)
		}
	}
	resp, body = get(t, c, site.URL()+"/big?kb=300")
	wantStatus(t, resp, http.StatusOK)
	wantInt(t, "/big length", len(body), 300*1024)

	resp, _ = get(t, c, site.URL()+"/setcookie")
	wantStatus(t, resp, http.StatusOK)
	if ck := resp.Cookies(); len(ck) != 1 || ck[0].Name != "testbed" || ck[0].Value != "1" {
		t.Errorf("cookies %v", ck)
	}

	// /slow respects the request context.
	sc := client(t, p.URL())
	sc.Timeout = 100 * time.Millisecond
	start := time.Now()
	if _, err := sc.Get(site.URL() + "/slow?d=5s"); err == nil {
		t.Error("/slow?d=5s did not time out")
	}
	if time.Since(start) > 2*time.Second {
		t.Error("/slow timeout took too long")
	}
	// The handler returns promptly once the client is gone.
	deadline := time.Now().Add(2 * time.Second)
	for site.Recorder().InFlight() != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	wantInt(t, "InFlight", site.Recorder().InFlight(), 0)
}

// ---- recorder ----

func TestRecorderIntervalEndsAtFirstWrite(t *testing.T) {
	release := make(chan struct{})
	site := NewSite(t, "manual", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/flush":
			w.WriteHeader(http.StatusAccepted)
			http.NewResponseController(w).Flush()
			<-release
		case "/silent": // never writes
		}
	}))
	rec := site.Recorder()
	c := client(t, "")

	resp, _ := get(t, c, site.URL()+"/silent")
	wantStatus(t, resp, http.StatusOK)
	if h := rec.Hits(); len(h) != 1 || h[0].Status != http.StatusOK || h[0].Path != "/silent" {
		t.Errorf("hits %+v", h)
	}

	resp, err := c.Get(site.URL() + "/flush")
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, resp, http.StatusAccepted)
	// The handler is still running, but the interval ended at WriteHeader.
	wantInt(t, "InFlight", rec.InFlight(), 0)
	wantInt(t, "Count", rec.Count(), 2)
	if h := rec.Hits(); h[1].Status != http.StatusAccepted {
		t.Errorf("status %d", h[1].Status)
	}
	close(release)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	rec.Reset()
	wantInt(t, "Count after Reset", rec.Count(), 0)
	wantInt(t, "DirectHits after Reset", rec.DirectHits(), 0)
	wantInt(t, "MaxConcurrentPerIP after Reset", rec.MaxConcurrentPerIP(), 0)
	if len(rec.IPs()) != 0 || len(rec.Hits()) != 0 {
		t.Error("Reset left data")
	}
}

func TestRecorderCountsCollisionsPerIP(t *testing.T) {
	rec := NewRecorder()
	entered := make(chan struct{})
	release := make(chan struct{})
	h := rec.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
	}))
	serve := func(remote string, wg *sync.WaitGroup) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			req.RemoteAddr = remote
			h.ServeHTTP(httptest.NewRecorder(), req)
		}()
	}
	var wg sync.WaitGroup
	for _, remote := range []string{"127.0.1.1:1000", "127.0.1.1:1001", "127.0.1.1:1002", "127.0.1.2:1000"} {
		serve(remote, &wg)
		<-entered
	}
	close(release)
	wg.Wait()
	wantInt(t, "Collisions", rec.Collisions(), 2)
	wantInt(t, "MaxConcurrentPerIP", rec.MaxConcurrentPerIP(), 3)
	if m := rec.MaxConcurrentByIP(); m["127.0.1.1"] != 3 || m["127.0.1.2"] != 1 {
		t.Errorf("MaxConcurrentByIP = %v", m)
	}
	wantInt(t, "DirectHits", rec.DirectHits(), 0)
	wantInt(t, "InFlight", rec.InFlight(), 0)
}

func TestBedHelpers(t *testing.T) {
	bed := NewBed(t, 2, 3)
	if len(bed.Sites) != 2 || len(bed.Proxies) != 3 || len(bed.ProxyURLs()) != 3 {
		t.Fatalf("bed %+v", bed)
	}
	if bed.Sites[1].Name() != "site-1" {
		t.Errorf("name %q", bed.Sites[1].Name())
	}
	for i, p := range bed.Proxies {
		get(t, client(t, p.URL()), bed.Sites[i%2].URL()+"/")
	}
	wantInt(t, "SiteHits", bed.SiteHits(), 3)
	sc, pc := bed.Collisions()
	wantInt(t, "site collisions", sc, 0)
	wantInt(t, "proxy collisions", pc, 0)
}
