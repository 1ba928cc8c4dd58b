package proxyswitch

import (
	"context"
	"fmt"
	"net"
	"net/http"
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

// Site storms of proxy failures (storm.go), and the one-IP redirect chain
// (transport.go's retry).

// outOfRotation counts the proxies of s's pool quarantined or dead on site.
func outOfRotation(t *testing.T, s *Switch, site string) int {
	t.Helper()
	st, err := s.ProxyStates(context.Background(), site)
	require.NoError(t, err)
	n := 0
	for _, p := range st {
		if p.State == StateQuarantined || p.State == StateDead {
			n++
		}
	}
	return n
}

// failureStorm runs a crawl of 4 workers through 12 proxies on a site
// whose storm (from 1s on, for 2s) is given by set, with the breaker's
// pause 3s (longer than the storm: its probes meet a healthy site) and a
// wait for a proxy of 8s (a request the pause holds waits it out). It
// checks that the site is paused during the storm, that at most 2 proxies
// are out of the site's rotation when the storm ends and at the end of
// the crawl, that every request started after the storm succeeds, and
// that no request fails with ErrPageRefused.
func failureStorm(t *testing.T, set func(*testbed.Storm), opts ...Option) {
	t.Helper()
	storm := testbed.NewStorm(nil, time.Now().Add(time.Second), 2*time.Second)
	set(storm)
	site := testbed.NewSite(t, "storm", storm)
	_, _, s := stormBed(t, site, 12, append([]Option{WithTimeouts(Timeouts{MaxWait: 8 * time.Second}),
		WithBreaker(Breaker{Pause: 3 * time.Second})}, opts...)...)
	c := colly.NewCollector(colly.AllowURLRevisit())
	s.Attach(c)

	var paused atomic.Bool
	var atEnd atomic.Int64
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		ctx := context.Background()
		for time.Now().Before(storm.To) {
			if sites, err := s.PausedSites(ctx); err == nil && len(sites) > 0 {
				paused.Store(true)
			}
			time.Sleep(20 * time.Millisecond)
		}
		atEnd.Store(int64(outOfRotation(t, s, site.Host())))
	}()
	shots := stormLoop(c, site.URL(), 4, storm.To.Add(2*time.Second), "")
	<-watched

	var late, lateOK int
	for _, sh := range shots {
		assert.NotContains(t, sh.Err, "page refused", "a storm's failure is not the page's")
		if sh.Start >= storm.To.UnixMilli() {
			late++
			if sh.OK {
				lateOK++
			} else {
				t.Logf("failed after the storm: %s", sh.Err)
			}
		}
	}
	before, during, after := storm.Counts()
	t.Logf("site requests: %d before, %d during, %d after the storm; %d proxies out of rotation at its end, %d now",
		before, during, after, atEnd.Load(), outOfRotation(t, s, site.Host()))
	assert.True(t, paused.Load(), "the site is paused during the storm")
	assert.LessOrEqual(t, atEnd.Load(), int64(2), "proxies out of the site's rotation when the storm ends")
	assert.LessOrEqual(t, outOfRotation(t, s, site.Host()), 2, "proxies out of the site's rotation after the crawl")
	require.Positive(t, late)
	assert.Equal(t, late, lateOK, "requests started after the storm that succeed")
}

// TestSiteGatewayStormPausesTheSite: the site answers 502 to everyone for
// 2s (through a plain-HTTP proxy, each proxy's 502: proxy_gateway). The
// proxies are fine: the breaker pauses the site instead of quarantining
// the pool, and the crawl goes on after the storm. (Before, every proxy
// was quarantined for about a minute within half a second, the breaker
// never opened, and the requests after the storm failed with ErrNoProxy.)
func TestSiteGatewayStormPausesTheSite(t *testing.T) {
	failureStorm(t, func(st *testbed.Storm) { st.Status = http.StatusBadGateway })
}

// TestSiteSlowdownPausesTheSite: the site answers every request 1.5s late
// for 2s, with Timeouts.Attempt 300ms: every attempt times out
// (proxy_timeout), through whatever proxy. The site is paused, the pool is
// not burnt.
func TestSiteSlowdownPausesTheSite(t *testing.T) {
	failureStorm(t, func(st *testbed.Storm) { st.Delay = 1500 * time.Millisecond },
		WithTimeouts(Timeouts{MaxWait: 8 * time.Second, Attempt: 300 * time.Millisecond}))
}

// TestSlowPagesKeepThePool: a few pages slow for every IP (a page-level
// slowness, not the proxies'), with Timeouts.Attempt 300ms, among good
// pages. Each slow page fails (ErrProxyFailed) through the proxies it
// tried, and takes their quarantines back: the pool stays whole, the good
// pages are served, and the breaker does not pause the site (it serves).
func TestSlowPagesKeepThePool(t *testing.T) {
	ctx := context.Background()
	site := testbed.NewSite(t, "slowpages", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/slow/") {
			select {
			case <-time.After(2 * time.Second):
			case <-r.Context().Done():
				return
			}
		}
		fmt.Fprintf(w, `<html><body><div class="product">%s</div></body></html>`, r.URL.Path)
	}))
	_, _, s := stormBed(t, site, 8, WithTimeouts(Timeouts{MaxWait: 5 * time.Second, Attempt: 300 * time.Millisecond}))
	c := colly.NewCollector(colly.AllowURLRevisit(), colly.Async(true))
	require.NoError(t, c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: 4}))
	s.Attach(c)
	var mu sync.Mutex
	var ok int
	var errs []error
	c.OnResponse(func(*colly.Response) { mu.Lock(); ok++; mu.Unlock() })
	c.OnError(func(r *colly.Response, err error) {
		mu.Lock()
		defer mu.Unlock()
		if !strings.HasPrefix(r.Request.URL.Path, "/slow/") {
			errs = append(errs, err)
		}
	})
	for i := range 30 {
		require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), i)))
		if i == 5 {
			for j := range 3 {
				require.NoError(t, c.Visit(fmt.Sprintf("%s/slow/%d", site.URL(), j)))
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.Wait()
	assert.Empty(t, errs, "good pages that failed")
	assert.Equal(t, 30, ok, "good pages served")
	assert.Zero(t, outOfRotation(t, s, site.Host()), "proxies out of the site's rotation")
	paused, err := s.PausedSites(ctx)
	require.NoError(t, err)
	assert.Empty(t, paused, "the site serves: no pause")
}

// TestOneBadProxyStillQuarantined: one proxy of six is dead, slow (with
// Timeouts.Attempt) or answers 502 for every site. It is still taken out of
// the site's rotation at its first failure, the crawl goes on through the
// others, and the breaker stays closed: one proxy failing is no storm. (A
// guard of the storm rules against blaming the site for a bad proxy.)
func TestOneBadProxyStillQuarantined(t *testing.T) {
	for _, mode := range []testbed.ProxyMode{testbed.ProxyDead, testbed.ProxySlow, testbed.Proxy502} {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := context.Background()
			site := testbed.NewSite(t, "shop", nil)
			_, proxies, s := stormBed(t, site, 6, WithTimeouts(Timeouts{MaxWait: 5 * time.Second, Attempt: 500 * time.Millisecond}))
			bad := proxies[0]
			bad.SetDelay(5 * time.Second)
			bad.SetMode(mode)
			c := colly.NewCollector(colly.AllowURLRevisit())
			s.Attach(c)
			var errs []error
			c.OnError(func(_ *colly.Response, err error) { errs = append(errs, err) })
			for i := range 60 {
				require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), i+1)))
			}
			assert.Empty(t, errs)
			st, err := s.ProxyStates(ctx, site.Host())
			require.NoError(t, err)
			out := map[string]string{}
			for _, p := range st {
				if p.State == StateQuarantined || p.State == StateDead {
					out[p.Proxy.URL().Host] = p.State
				}
			}
			assert.Len(t, out, 1, "only the bad proxy is out of rotation: %v", out)
			assert.Contains(t, out, bad.Addr(), "the bad proxy is out of rotation")
			paused, err := s.PausedSites(ctx)
			require.NoError(t, err)
			assert.Empty(t, paused, "one bad proxy pauses no site")
		})
	}
}

// loginChain is a site that sends the IP ip through a login chain, every
// page of it: /p/N -> 302 /session/refresh?next=/p/N -> 302 /signin (for
// everyone: the session refresh has no session to refresh); the other
// IPs get the page.
type loginChain struct {
	ip      string
	mu      sync.Mutex
	refresh map[string]int // client IP -> requests of /session/refresh
	burnt   int            // pages asked by ip
}

func (h *loginChain) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ip, _, _ := net.SplitHostPort(r.RemoteAddr)
	switch {
	case r.URL.Path == "/signin":
		fmt.Fprint(w, `<html><body><form>sign in</form></body></html>`)
		return
	case r.URL.Path == "/session/refresh":
		h.mu.Lock()
		h.refresh[ip]++
		h.mu.Unlock()
		http.Redirect(w, r, "/signin?next="+r.URL.Query().Get("next"), http.StatusFound)
		return
	case ip == h.ip:
		h.mu.Lock()
		h.burnt++
		h.mu.Unlock()
		http.Redirect(w, r, "/session/refresh?next="+r.URL.Path, http.StatusFound)
		return
	}
	fmt.Fprintf(w, `<html><body><div class="product">%s</div></body></html>`, r.URL.Path)
}

// TestLoginChainForOneIPBansOnlyIt: one IP is sent through a login chain
// (its page redirects to a session refresh, which redirects to the sign-in
// page: a challenge). The retry through another proxy starts where a
// fresh client would, from the page asked for, not from the intermediate
// hop (which sends everyone to the sign-in page): only that IP's proxy is
// banned, and the page comes through another, with Colly's revisit check
// on. (Before, the session refresh was sent again through other proxies,
// each banned in turn, and the page failed with ErrBanned.)
func TestLoginChainForOneIPBansOnlyIt(t *testing.T) {
	ctx := context.Background()
	proxies := testbed.NewProxies(t, 4)
	h := &loginChain{ip: proxies[0].SourceIP().String(), refresh: map[string]int{}}
	site := testbed.NewSite(t, "shop", h)
	s := newSwitch(t, shared.Client(t))
	_, err := s.Add(ctx, (&testbed.Bed{Proxies: proxies}).ProxyURLs()...)
	require.NoError(t, err)
	c := colly.NewCollector() // Colly's defaults: the revisit check is on
	s.Attach(c)
	var served []string
	var errs []error
	c.OnResponse(func(r *colly.Response) {
		if strings.Contains(string(r.Body), `class="product"`) {
			served = append(served, r.Request.URL.Path)
		}
	})
	c.OnError(func(_ *colly.Response, err error) { errs = append(errs, err) })
	n := 0
	for ; n < 200; n++ {
		_ = c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), n)) // an error is in errs
		h.mu.Lock()
		hit := h.burnt > 0
		h.mu.Unlock()
		if hit && n >= 10 {
			break
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	require.Positive(t, h.burnt, "the login IP was leased")
	assert.Empty(t, errs, "OnError")
	assert.Len(t, served, n+1, "every page served")
	assert.Equal(t, map[string]int{h.ip: h.burnt}, h.refresh, "the session refresh asked by the login IP only")
	assert.Equal(t, map[BanKey]int64{{site.Host(), ban.ReasonChallenge}: 1}, s.BanCounts(), "one ban: the login IP's")
	assert.Equal(t, 1, outOfRotation(t, s, site.Host()), "one proxy out of the site's rotation")
}
