package proxyswitch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// captchaGate is a site that redirects (302) every request for a product
// page from the first n client IPs it sees to one captcha URL, the same for
// every page and every IP, and serves the other IPs the page. /hop/X is a
// redirect of the site's own (301 to /p/X) in front of the gate.
type captchaGate struct {
	n int

	mu       sync.Mutex
	location string   // Location of the redirect to the captcha: relative or absolute
	burnt    []string // the first n client IPs seen on /p/, in order
}

func (g *captchaGate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == testbed.CaptchaPath:
		fmt.Fprint(w, testbed.CaptchaHTML)
		return
	case strings.HasPrefix(r.URL.Path, "/hop/"):
		http.Redirect(w, r, "/p/"+strings.TrimPrefix(r.URL.Path, "/hop/"), http.StatusMovedPermanently)
		return
	}
	ip, _, _ := net.SplitHostPort(r.RemoteAddr)
	if to, ok := g.burn(ip); ok {
		w.Header().Set("Location", to)
		w.WriteHeader(http.StatusFound)
		return
	}
	fmt.Fprintf(w, `<html><body><div class="product">%s</div></body></html>`, r.URL.Path)
}

// burn reports whether ip is one of the first n IPs seen, and where to
// send it.
func (g *captchaGate) burn(ip string) (string, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, b := range g.burnt {
		if b == ip {
			return g.location, true
		}
	}
	if len(g.burnt) < g.n {
		g.burnt = append(g.burnt, ip)
		return g.location, true
	}
	return "", false
}

func (g *captchaGate) setLocation(to string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.location = to
}

func (g *captchaGate) burntIPs() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.burnt...)
}

// TestChallengeRedirectWithoutRevisits: a page redirected to one captcha URL
// through several proxies in a row, by a collector with Colly's default
// revisit check (no AllowURLRevisit). The redirect is the ban: the captcha
// URL is never requested (so Colly never marks it visited, and never refuses
// it as "already visited" the second time), each burnt proxy is quarantined
// for the site that redirected, and the page comes through a good proxy
// within the retry budget (one retry per burnt proxy), without OnError.
func TestChallengeRedirectWithoutRevisits(t *testing.T) {
	const proxies, burnt = 5, 3
	captchaHost := testbed.NewSite(t, "captcha-host", nil)
	for name, tc := range map[string]struct {
		location string // where the burnt IPs are sent ("SITE" stands for the shop's base URL)
		path     string // the page asked for
		final    string // the page's final path
	}{
		"relative Location":              {location: testbed.CaptchaPath, path: "/p/1", final: "/p/1"},
		"absolute Location":              {location: "SITE" + testbed.CaptchaPath + "?return=%2Fp%2F1", path: "/p/1", final: "/p/1"},
		"captcha on another host":        {location: captchaHost.URL() + "/showcaptcha?retpath=%2Fp%2F1", path: "/p/1", final: "/p/1"},
		"after a redirect of the site's": {location: testbed.CaptchaPath, path: "/hop/1", final: "/p/1"},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			gate := &captchaGate{n: burnt}
			site := testbed.NewSite(t, "shop", gate)
			gate.setLocation(strings.Replace(tc.location, "SITE", site.URL(), 1))
			tps := testbed.NewProxies(t, proxies)
			s := newSwitch(t, shared.Client(t), WithBans(Bans{Retries: burnt}))
			obs := &recordingObserver{}
			s.SetObserver(obs)
			urls := make([]string, proxies)
			for i, p := range tps {
				urls[i] = p.URL()
			}
			_, err := s.Add(ctx, urls...)
			require.NoError(t, err)

			c := colly.NewCollector() // Colly's defaults: the revisit check is on
			s.Attach(c)
			var (
				finals []string
				errs   []error
			)
			c.OnResponse(func(r *colly.Response) {
				if strings.Contains(string(r.Body), `class="product"`) {
					finals = append(finals, r.Request.URL.String())
				}
			})
			c.OnError(func(_ *colly.Response, err error) { errs = append(errs, err) })

			require.NoError(t, c.Visit(site.URL()+tc.path))
			assert.Empty(t, errs, "OnError")
			assert.Equal(t, []string{site.URL() + tc.final}, finals, "the page, through a good proxy")

			// The site's ground truth: every burnt IP once, the captcha never.
			burntIPs := gate.burntIPs()
			require.Len(t, burntIPs, burnt)
			for _, h := range site.Recorder().Hits() {
				assert.NotEqual(t, testbed.CaptchaPath, h.Path, "the captcha page was requested by %s", h.ClientIP)
			}
			assert.Zero(t, captchaHost.Recorder().Count(), "the captcha host was requested")
			ips := site.Recorder().IPs()
			for i, ip := range burntIPs {
				want := 1
				if i == 0 && strings.HasPrefix(tc.path, "/hop/") {
					// The site's own redirect, then the page redirected to the
					// captcha: the hop that was, not the chain, goes again.
					want = 2
				}
				assert.Equal(t, want, ips[ip], "requests from burnt IP %s", ip)
			}
			assert.Len(t, ips, burnt+1, "the burnt IPs and one good one")

			// Each burnt proxy is quarantined for the shop, once.
			assert.Equal(t, map[BanKey]int64{{site.Host(), ban.ReasonChallenge}: burnt}, s.BanCounts())
			st, err := s.SiteState(ctx, site.Host())
			require.NoError(t, err)
			assert.Equal(t, burnt, st.Quarantined)
			ipOf := map[string]string{} // proxy ID -> source IP
			list, err := s.List(ctx)
			require.NoError(t, err)
			for _, p := range list {
				for _, tp := range tps {
					if p.URL().String() == tp.URL() {
						ipOf[p.ID()] = tp.SourceIP().String()
					}
				}
			}
			obs.mu.Lock()
			var banned, quarantined []string
			var oks int
			for _, e := range obs.attempts {
				assert.Equal(t, site.Host(), e.Site, "attempt event %+v", e)
				switch e.Kind {
				case ban.Ban:
					assert.Equal(t, ban.ReasonChallenge, e.Reason)
					banned = append(banned, ipOf[e.ProxyID])
				case ban.OK:
					oks++
				}
			}
			for _, e := range obs.quarantines {
				assert.Equal(t, site.Host(), e.Site, "quarantine event %+v", e)
				assert.Equal(t, ban.ReasonChallenge, e.Reason)
				quarantined = append(quarantined, ipOf[e.ProxyID])
			}
			obs.mu.Unlock()
			assert.Equal(t, burntIPs, banned, "one ban event per burnt proxy, in order")
			assert.Equal(t, burntIPs, quarantined, "one quarantine event per burnt proxy, in order")
			assert.Equal(t, 1, oks, "one OK event: the page")

			// More pages of the site: only the good proxies are leased.
			for i := 2; i <= 5; i++ {
				require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), i)))
			}
			assert.Empty(t, errs, "OnError")
			assert.Len(t, finals, 5)
			ips = site.Recorder().IPs()
			for _, ip := range burntIPs {
				assert.LessOrEqual(t, ips[ip], 2, "burnt IP %s came back during its quarantine", ip)
			}
			assertNoLeases(t, s, site, captchaHost)
		})
	}
}

// TestChallengeRedirectRetriesRunOut: with fewer retries than burnt proxies
// the request fails with a *BlockedError for the challenge, through OnError,
// not with Colly's "already visited", and no lease is left.
func TestChallengeRedirectRetriesRunOut(t *testing.T) {
	ctx := context.Background()
	gate := &captchaGate{n: 3, location: testbed.CaptchaPath}
	site := testbed.NewSite(t, "shop", gate)
	tps := testbed.NewProxies(t, 4)
	s := newSwitch(t, shared.Client(t), WithBans(Bans{Retries: 1}))
	urls := make([]string, len(tps))
	for i, p := range tps {
		urls[i] = p.URL()
	}
	_, err := s.Add(ctx, urls...)
	require.NoError(t, err)
	c := colly.NewCollector()
	s.Attach(c)
	var hookErr error
	c.OnError(func(_ *colly.Response, err error) { hookErr = err })
	err = c.Visit(site.URL() + "/p/1")
	require.ErrorIs(t, err, ErrBanned)
	assert.Equal(t, ban.ReasonChallenge, blockedReason(t, err))
	var be *BlockedError
	require.True(t, errors.As(err, &be))
	assert.Equal(t, site.Host(), be.Site)
	assert.Equal(t, 2, be.Attempts)
	assert.ErrorIs(t, hookErr, ErrBanned, "OnError sees it too")
	assert.Equal(t, 2, site.Recorder().Count(), "two proxies tried, the captcha never")
	assert.Equal(t, map[BanKey]int64{{site.Host(), ban.ReasonChallenge}: 2}, s.BanCounts())
	assertNoLeases(t, s, site)
}
