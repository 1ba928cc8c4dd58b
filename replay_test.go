package proxyswitch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
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

// The replay rule (transport.go's doc comment, Bans.Retries): a request
// net/http would not replay is sent again through another proxy only after
// a ban the site answered or a failure before it could reach the site.

// checkout is a site's order handler: it records every request that
// reaches it (client IP, method, body) as it arrives, refuses the IPs of
// forbid with 403, and takes delay to place the order whatever the client
// does meanwhile, as a real checkout would.
type checkout struct {
	delay  time.Duration
	forbid string // a client IP answered 403

	mu   sync.Mutex
	hits []checkoutHit
}

type checkoutHit struct{ ip, method, body string }

func (h *checkout) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ip, _, _ := net.SplitHostPort(r.RemoteAddr)
	body, _ := io.ReadAll(r.Body)
	h.mu.Lock()
	h.hits = append(h.hits, checkoutHit{ip, r.Method, string(body)})
	h.mu.Unlock()
	if ip == h.forbid {
		http.Error(w, "forbidden", http.StatusForbidden)
		return
	}
	time.Sleep(h.delay) // not the request's context: the order goes through
	fmt.Fprintf(w, `<html><body><div class="product">%s %s</div></body></html>`, r.Method, body)
}

func (h *checkout) got() []checkoutHit {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]checkoutHit(nil), h.hits...)
}

func (h *checkout) ips() map[string]bool {
	m := map[string]bool{}
	for _, x := range h.got() {
		m[x.ip] = true
	}
	return m
}

// replayBed starts h as a site (HTTPS with useTLS) and n proxies, in a
// Switch's pool; a synchronous collector attached to it with Colly's
// defaults (a 10s request timeout).
func replayBed(t *testing.T, h http.Handler, useTLS bool, n int, opts ...Option) (*testbed.Site, []*testbed.Proxy, *Switch, *colly.Collector) {
	t.Helper()
	site, proxies, s := handlerBed(t, "shop", h, useTLS, n, opts...)
	c := colly.NewCollector(colly.AllowURLRevisit())
	s.Attach(c)
	return site, proxies, s, c
}

// wrappedClient is WithClient with a RoundTripper that is not an
// *http.Transport (as a uTLS client is): its httptrace is not believed, so
// only the error tells a failure before the send.
func wrappedClient() Option {
	return WithClient(Client{New: func(proxy *url.URL) (http.RoundTripper, error) {
		inner := &http.Transport{Proxy: http.ProxyURL(proxy), DisableKeepAlives: true}
		return &fingerprintRT{proxy: proxy, inner: inner, sent: new(atomic.Int64)}, nil
	}})
}

func requireBlocked(t *testing.T, err error) *BlockedError {
	t.Helper()
	var be *BlockedError
	require.True(t, errors.As(err, &be), "want a *BlockedError, got %v", err)
	return be
}

// A POST to a slow site whose attempt outlives Timeouts.Attempt reached
// the site: it is not sent again through the other proxies (it would place
// the order once per proxy). The proxy is judged as ever (a proxy_timeout,
// quarantined on the site), its lease ends, and the request fails with its
// *BlockedError: ErrProxyFailed, NotResent, not ErrNoProxy.
func TestReplayPOSTTimedOutReachesSiteOnce(t *testing.T) {
	for _, tc := range []struct {
		name    string
		tls     bool
		wrapped bool
		opts    []Option
	}{
		{name: "http"},
		{name: "https", tls: true},
		{name: "per-proxy client", opts: []Option{WithClient(Client{})}},
		{name: "custom RoundTripper", wrapped: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := &checkout{delay: time.Second}
			opts := append([]Option{WithTimeouts(Timeouts{Attempt: 300 * time.Millisecond})}, tc.opts...)
			if tc.wrapped {
				opts = append(opts, wrappedClient())
			}
			site, proxies, s, c := replayBed(t, h, tc.tls, 3, opts...)
			err := c.Post(site.URL()+"/checkout", map[string]string{"item": "1"})
			require.Error(t, err)
			got := h.got()
			require.Len(t, got, 1, "POSTs that reached the site: %v", got)
			assert.Equal(t, "POST", got[0].method)
			assert.Equal(t, "item=1", got[0].body)

			be := requireBlocked(t, err)
			assert.True(t, errors.Is(err, ErrProxyFailed), "%v", err)
			assert.False(t, errors.Is(err, ErrNoProxy), "%v", err)
			assert.True(t, be.NotResent)
			assert.Equal(t, 1, be.Attempts)
			assert.Equal(t, ban.ReasonProxyTimeout, be.Verdict.Reason)
			assert.Contains(t, err.Error(), "not sent again")
			assert.Equal(t, map[BanKey]int64{{site.Host(), ban.ReasonProxyTimeout}: 1}, s.BanCounts())
			var through string // the proxy the POST went through
			for _, p := range proxies {
				if p.SourceIP().String() == got[0].ip {
					through = p.URL()
				}
			}
			// The proxy is held out for Bans.FailureQuarantine (1m, jittered),
			// which ProxyStates shows as a long cooldown; the others are free.
			states, err := s.ProxyStates(context.Background(), site.Host())
			require.NoError(t, err)
			held := 0
			for _, st := range states {
				if st.State != StateFree {
					held++
					assert.Equal(t, through, st.Proxy.URL().String(), "the proxy the POST went through")
					assert.Greater(t, time.Until(st.Until), 30*time.Second, "held out for its failure quarantine")
				}
			}
			assert.Equal(t, 1, held, "the timed-out proxy is held out as ever")
			assertNoLeases(t, s, site)
		})
	}
}

// The same slow site asked with a GET: retried through every proxy, as
// before (net/http itself would replay it).
func TestReplayGETTimedOutIsRetried(t *testing.T) {
	h := &checkout{delay: time.Second}
	site, _, s, c := replayBed(t, h, false, 3, WithTimeouts(Timeouts{Attempt: 300 * time.Millisecond}))
	err := c.Visit(site.URL() + "/checkout")
	be := requireBlocked(t, err)
	assert.False(t, be.NotResent)
	assert.Equal(t, 3, be.Attempts)
	assert.Len(t, h.got(), 3)
	assert.Len(t, h.ips(), 3, "each try through another proxy")
	assert.Equal(t, map[BanKey]int64{{site.Host(), ban.ReasonProxyTimeout}: 3}, s.BanCounts())
	assertNoLeases(t, s, site)
}

// A POST carrying an Idempotency-Key (or X-Idempotency-Key) header is one
// net/http would replay: retried after a timeout like a GET.
func TestReplayPOSTWithIdempotencyKeyIsRetried(t *testing.T) {
	for _, key := range []string{"Idempotency-Key", "X-Idempotency-Key"} {
		t.Run(key, func(t *testing.T) {
			t.Parallel()
			h := &checkout{delay: time.Second}
			site, _, s, c := replayBed(t, h, false, 3, WithTimeouts(Timeouts{Attempt: 300 * time.Millisecond}))
			hdr := http.Header{}
			hdr.Set(key, "order-1")
			err := c.Request("POST", site.URL()+"/checkout", strings.NewReader("item=1"), nil, hdr)
			be := requireBlocked(t, err)
			assert.False(t, be.NotResent)
			assert.Equal(t, 3, be.Attempts)
			got := h.got()
			require.Len(t, got, 3)
			for _, x := range got {
				assert.Equal(t, checkoutHit{x.ip, "POST", "item=1"}, x, "the body rewound for each try")
			}
			assert.Len(t, h.ips(), 3)
			assertNoLeases(t, s, site)
		})
	}
}

// A POST whose first proxy fails before the request could reach the site
// (refuses the connection, refuses its credentials or the tunnel) goes
// again through another proxy and reaches the site once.
func TestReplayPOSTProxyFailedBeforeSendIsRetried(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mode    testbed.ProxyMode
		tls     bool
		wrapped bool
		reason  string
	}{
		{"dead", testbed.ProxyDead, false, false, ban.ReasonProxyConnect},
		{"dead https", testbed.ProxyDead, true, false, ban.ReasonProxyConnect},
		{"dead custom RoundTripper", testbed.ProxyDead, false, true, ban.ReasonProxyConnect},
		{"407", testbed.Proxy407, false, false, ban.ReasonProxyAuth},
		{"407 CONNECT", testbed.Proxy407, true, false, ban.ReasonProxyAuth},
		{"502 CONNECT", testbed.Proxy502, true, false, ban.ReasonProxyTunnel},
		{"hang before CONNECT's answer, timed out", testbed.ProxyHang, true, false, ban.ReasonProxyTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := &checkout{}
			opts := []Option{WithBans(Bans{Retries: 1}), WithTimeouts(Timeouts{Attempt: 500 * time.Millisecond})}
			if tc.wrapped {
				opts = append(opts, wrappedClient())
			}
			site, proxies, s, c := replayBed(t, h, tc.tls, 2, opts...)
			proxies[0].SetMode(tc.mode)
			var bodies []string
			c.OnResponse(func(r *colly.Response) { bodies = append(bodies, string(r.Body)) })
			// Two orders: whichever proxy the first one leases, one of them
			// meets the bad proxy first (the other proxy was just used).
			for i := range 2 {
				require.NoError(t, c.Post(site.URL()+"/checkout", map[string]string{"item": fmt.Sprint(i)}))
			}
			require.Len(t, bodies, 2)
			good := proxies[1].SourceIP().String()
			assert.Equal(t, []checkoutHit{{good, "POST", "item=0"}, {good, "POST", "item=1"}}, h.got(),
				"each order reached the site once, through the working proxy")
			assert.Equal(t, map[BanKey]int64{{site.Host(), tc.reason}: 1}, s.BanCounts(), "the bad proxy failed once")
			assertNoLeases(t, s, site)
		})
	}
}

// A POST whose proxy fails once the request was sent (the connection
// dropped while the site was still placing the order; a plain-HTTP proxy's
// 502, which may come after the site got it) is not sent again.
func TestReplayPOSTFailedAfterSendIsNotRetried(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tls    bool
		drop   bool
		mode   testbed.ProxyMode
		hits   int
		reason string
	}{
		{name: "dropped", drop: true, hits: 1, reason: ban.ReasonProxyError},
		{name: "dropped https", tls: true, drop: true, hits: 1, reason: ban.ReasonProxyError},
		{name: "502", mode: testbed.Proxy502, reason: ban.ReasonProxyGateway},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := &checkout{delay: time.Second}
			site, proxies, s, c := replayBed(t, h, tc.tls, 3)
			if tc.drop {
				// The proxy the POST reached the site through dies while
				// the site places the order.
				go func() {
					for len(h.got()) == 0 {
						time.Sleep(2 * time.Millisecond)
					}
					for _, p := range proxies {
						if p.SourceIP().String() == h.got()[0].ip {
							p.SetMode(testbed.ProxyDead)
						}
					}
				}()
			} else {
				for _, p := range proxies { // whichever it leases
					p.SetMode(tc.mode)
				}
			}
			err := c.Post(site.URL()+"/checkout", map[string]string{"item": "1"})
			be := requireBlocked(t, err)
			assert.True(t, errors.Is(err, ErrProxyFailed), "%v", err)
			assert.False(t, errors.Is(err, ErrNoProxy), "%v", err)
			assert.True(t, be.NotResent)
			assert.Equal(t, 1, be.Attempts)
			assert.Equal(t, tc.reason, be.Verdict.Reason)
			assert.Len(t, h.got(), tc.hits, "POSTs that reached the site")
			assert.Equal(t, map[BanKey]int64{{site.Host(), tc.reason}: 1}, s.BanCounts())
			assertNoLeases(t, s, site)
		})
	}
}

// A POST the site refuses with 403 through one proxy is its answer, not a
// lost request: the site did not act on it, so it goes again through
// another proxy, as before, and is served there.
func TestReplayPOSTBannedIsRetried(t *testing.T) {
	h := &checkout{}
	site, proxies, s, c := replayBed(t, h, false, 2, WithBans(Bans{Retries: 1}))
	burnt, good := proxies[0].SourceIP().String(), proxies[1].SourceIP().String()
	h.forbid = burnt
	var bodies []string
	c.OnResponse(func(r *colly.Response) { bodies = append(bodies, string(r.Body)) })
	// Two orders: whichever proxy the first one leases, one of them meets
	// the burnt proxy first (the other proxy was just used).
	for i := range 2 {
		require.NoError(t, c.Post(site.URL()+"/checkout", map[string]string{"item": fmt.Sprint(i)}))
	}
	require.Len(t, bodies, 2)
	served := map[string]int{}
	refused := 0
	for _, x := range h.got() {
		assert.Equal(t, "POST", x.method)
		if x.ip == burnt {
			refused++
			continue
		}
		assert.Equal(t, good, x.ip)
		served[x.body]++
	}
	assert.Equal(t, 1, refused, "the POST refused with 403")
	assert.Equal(t, map[string]int{"item=0": 1, "item=1": 1}, served, "each order served once, the refused one sent again")
	assert.Equal(t, map[BanKey]int64{{site.Host(), "http_403"}: 1}, s.BanCounts())
	assertNoLeases(t, s, site)
}

// replayable is net/http's Request.isReplayable.
func TestReplayableIsNetHTTPs(t *testing.T) {
	body := func() io.Reader { return strings.NewReader("x") }
	for _, tc := range []struct {
		method string
		body   io.Reader
		header string
		getter bool // GetBody kept
		want   bool
	}{
		{"GET", nil, "", true, true},
		{"", nil, "", true, true},
		{"HEAD", nil, "", true, true},
		{"OPTIONS", nil, "", true, true},
		{"TRACE", nil, "", true, true},
		{"POST", body(), "", true, false},
		{"POST", nil, "", true, false},
		{"PUT", body(), "", true, false},
		{"DELETE", nil, "", true, false},
		{"PATCH", body(), "", true, false},
		{"POST", body(), "Idempotency-Key", true, true},
		{"POST", body(), "X-Idempotency-Key", true, true},
		{"POST", body(), "Idempotency-Key", false, false},
		{"GET", body(), "", false, false},
	} {
		req, err := http.NewRequest(tc.method, "http://example.test/", tc.body)
		require.NoError(t, err)
		req.Method = tc.method
		if tc.header != "" {
			req.Header[tc.header] = nil // present, even without a value
		}
		if !tc.getter {
			req.GetBody = nil
		}
		assert.Equal(t, tc.want, replayable(req), "%s body=%v %s GetBody=%v", tc.method, tc.body != nil, tc.header, tc.getter)
	}
}

// orderFlow places an order on POST /order and redirects (303) to its
// confirmation page, which is a captcha for the burnt IP.
type orderFlow struct {
	mu     sync.Mutex
	orders []string // "<method> <client IP>" of each request to /order
	burnt  string
}

func (h *orderFlow) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ip, _, _ := net.SplitHostPort(r.RemoteAddr)
	switch r.URL.Path {
	case "/order":
		h.mu.Lock()
		h.orders = append(h.orders, r.Method+" "+ip)
		h.mu.Unlock()
		http.Redirect(w, r, "/order/confirm", http.StatusSeeOther)
	case "/order/confirm":
		if ip == h.burnt {
			_, _ = io.WriteString(w, "<html><body>captcha</body></html>")
			return
		}
		_, _ = io.WriteString(w, `<html><body><div class="product">ok</div></body></html>`)
	}
}

// TestReplayPOSTChainEndingOnChallengeIsNotRestarted: a chain that ends on
// a challenge page starts again from its first URL, unless that first
// request is one net/http would not replay: the site acted on it (it
// answered with a redirect), so the request fails, NotResent, and the
// order is placed once. (A GET chain's restart: challengehop_test.go.)
func TestReplayPOSTChainEndingOnChallengeIsNotRestarted(t *testing.T) {
	h := &orderFlow{}
	captcha := func(x *ban.Exchange) ban.Verdict {
		if x.Final() && strings.Contains(string(x.Body), "captcha") {
			return ban.Verdict{Kind: ban.Ban, Reason: ban.ReasonChallenge}
		}
		return ban.Verdict{Kind: ban.Pass}
	}
	site, proxies, _, c := replayBed(t, h, false, 2, WithClassifier(captcha))
	h.burnt = proxies[0].SourceIP().String()
	var notResent int
	for range 2 { // the second goes through the other proxy (least recently used first)
		if err := c.Post(site.URL()+"/order", map[string]string{"item": "x"}); err != nil {
			var be *BlockedError
			require.ErrorAs(t, err, &be)
			assert.True(t, be.NotResent)
			notResent++
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	assert.Len(t, h.orders, 2, "each order placed once: %q", h.orders)
	assert.Equal(t, 1, notResent, "the order confirmed on a captcha fails")
}
