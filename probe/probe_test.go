package probe_test

import (
	"context"
	"errors"
	"github.com/proxyswitch/proxyswitch/internal/testlog"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/internal/engine"
	"github.com/proxyswitch/proxyswitch/probe"
	"github.com/proxyswitch/proxyswitch/proxyswitchtest"
	"github.com/stretchr/testify/require"
)

const canary = "CANARYprobe4417"

// echo is an echo site: it answers the client's IP, and counts the
// requests in flight.
type echo struct {
	site          *proxyswitchtest.Site
	inFlight, max atomic.Int64
}

func newEcho(t *testing.T, delay time.Duration) *echo {
	e := &echo{}
	e.site = proxyswitchtest.NewSite(t, "echo", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := e.inFlight.Add(1)
		defer e.inFlight.Add(-1)
		for m := e.max.Load(); n > m && !e.max.CompareAndSwap(m, n); m = e.max.Load() {
		}
		time.Sleep(delay)
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		w.Write([]byte(host + "\n"))
	}))
	return e
}

func newSwitch(t *testing.T, prefix string, opts ...proxyswitch.Option) *proxyswitch.Switch {
	t.Helper()
	sw, err := proxyswitch.NewSwitch(shared.Client(t), append([]proxyswitch.Option{proxyswitch.WithPrefix(prefix), proxyswitch.WithTimeouts(proxyswitch.Timeouts{MaxWait: proxyswitch.Off})}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { sw.Close(context.Background()) })
	return sw
}

// farmPool starts a farm of n proxies and a Switch, under prefix, of a
// pool holding them.
func farmPool(t *testing.T, prefix string, n int, opts ...proxyswitch.Option) (*proxyswitchtest.Farm, *proxyswitch.Switch) {
	t.Helper()
	farm := proxyswitchtest.NewFarm(t, n)
	sw := newSwitch(t, prefix, opts...)
	_, err := sw.Add(context.Background(), farm.URLs()...)
	require.NoError(t, err)
	return farm, sw
}

func idOf(t *testing.T, u string) string {
	t.Helper()
	p, err := proxyswitch.ParseProxy(u)
	require.NoError(t, err)
	return p.ID()
}

func deadReasons(t *testing.T, sw *proxyswitch.Switch) map[string]string {
	t.Helper()
	dead, err := sw.Dead(context.Background())
	require.NoError(t, err)
	out := map[string]string{}
	for _, d := range dead {
		out[d.Proxy.ID()] = d.Reason
	}
	return out
}

// leaseAll leases every proxy free for site, and returns their IDs.
func leaseAll(t *testing.T, sw *proxyswitch.Switch, site string) map[string]bool {
	t.Helper()
	ctx := context.Background()
	got := map[string]bool{}
	var ls []*proxyswitch.Lease
	for {
		l, err := sw.Lease(ctx, site)
		if errors.Is(err, proxyswitch.ErrNoProxy) {
			break
		}
		require.NoError(t, err)
		got[l.Proxy().ID()] = true
		ls = append(ls, l)
	}
	for _, l := range ls {
		require.NoError(t, l.Release(ctx))
	}
	return got
}

// TestCheckerMarksAndRevives: in a pool of 200, the dead, hanging, 502 and
// 407 proxies are marked dead by one round, before any request leases
// them; the live ones report their exit IP; the probes in flight never
// exceed the bound; an operator's drain is neither probed nor revived;
// the recovered proxies come back in the next round; no password leaks.
func TestCheckerMarksAndRevives(t *testing.T) {
	ctx := context.Background()
	farm := proxyswitchtest.NewFarm(t, 200)
	for i := 0; i < 10; i++ {
		farm.Proxies[i].SetCredentials("user", canary)
	}
	sw := newSwitch(t, testPrefix())
	_, err := sw.Add(ctx, farm.URLs()...)
	require.NoError(t, err)
	ec := newEcho(t, 5*time.Millisecond)

	bad := map[int]proxyswitchtest.ProxyMode{3: proxyswitchtest.Proxy407}
	for i := 10; i < 30; i++ {
		bad[i] = proxyswitchtest.ProxyDead
	}
	for i := 30; i < 35; i++ {
		bad[i] = proxyswitchtest.Proxy502
	}
	for i := 35; i < 40; i++ {
		bad[i] = proxyswitchtest.ProxyHang
	}
	for i, m := range bad {
		farm.Proxies[i].SetMode(m)
	}
	// 199 drained alive, 198 drained and dead: the operator's, not the probe's.
	require.NoError(t, func() error { _, err := sw.Drain(ctx, "", farm.Proxies[199].URL()); return err }())
	require.NoError(t, func() error { _, err := sw.Drain(ctx, "", farm.Proxies[198].URL()); return err }())
	farm.Proxies[198].SetMode(proxyswitchtest.ProxyDead)

	var logs testlog.Buffer
	var results sync.Map
	c := &probe.Checker{Switch: sw, EchoURL: ec.site.URL() + "/ip", Timeout: 2 * time.Second, Concurrency: 12,
		Logger:   slog.New(slog.NewTextHandler(&logs, nil)),
		OnResult: func(r probe.Result) { results.Store(r.Proxy.ID(), r) }}
	rep, err := c.Check(ctx)
	require.NoError(t, err)
	require.Equal(t, 198, rep.Probed)
	require.Equal(t, len(bad), rep.Dead)
	require.LessOrEqual(t, ec.max.Load(), int64(12), "more probes in flight than Concurrency")

	want := map[string]string{idOf(t, farm.Proxies[198].URL()): "drained", idOf(t, farm.Proxies[199].URL()): "drained"}
	for i := range bad {
		want[idOf(t, farm.Proxies[i].URL())] = "probe"
	}
	require.Equal(t, want, deadReasons(t, sw))
	for i, p := range farm.Proxies[:198] {
		v, ok := results.Load(idOf(t, p.URL()))
		require.True(t, ok, "proxy %d not probed", i)
		r := v.(probe.Result)
		if _, isBad := bad[i]; isBad {
			require.False(t, r.OK)
			require.Equal(t, "dead", r.Action)
			require.NotContains(t, r.Err.Error(), canary)
		} else {
			require.True(t, r.OK, "proxy %d: %v", i, r.Err)
			require.Equal(t, p.SourceIP().String(), r.ExitIP)
			require.Positive(t, r.Latency)
		}
	}
	require.Zero(t, farm.Proxies[198].Requests()+farm.Proxies[199].Requests(), "a drained proxy was probed")

	// Before any request: a crawl of a new site leases only live proxies.
	leased := leaseAll(t, sw, "shop.example")
	require.Len(t, leased, 200-len(bad)-2)
	for id := range want {
		require.False(t, leased[id], "a dead proxy was leased")
	}

	// They recover; the next round revives the probe's, not the drains.
	for i := range bad {
		farm.Proxies[i].SetMode(proxyswitchtest.ProxyOK)
	}
	farm.Proxies[198].SetMode(proxyswitchtest.ProxyOK)
	rep, err = c.Check(ctx)
	require.NoError(t, err)
	require.Equal(t, len(bad), rep.Revived)
	require.Equal(t, 0, rep.Dead)
	require.Equal(t, map[string]string{idOf(t, farm.Proxies[198].URL()): "drained", idOf(t, farm.Proxies[199].URL()): "drained"}, deadReasons(t, sw))
	require.Len(t, leaseAll(t, sw, "shop2.example"), 198)
	require.NotContains(t, logs.String(), canary)
	require.Contains(t, logs.String(), "marked dead")
	require.Contains(t, logs.String(), "revived")
}

// TestCheckerNeverCollidesWithCrawl: crawl requests of three processes
// (three Redis clients) to the echo site and probe rounds run together:
// the echo site never sees two requests at once from one IP, and the
// probes skip the proxies the crawl holds.
func TestCheckerNeverCollidesWithCrawl(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	farm := proxyswitchtest.NewFarm(t, 12)
	prefix := testPrefix()
	sw := newSwitch(t, prefix)
	_, err := sw.Add(ctx, farm.URLs()...)
	require.NoError(t, err)
	ec := newEcho(t, 3*time.Millisecond)
	site := strings.ToLower(strings.TrimPrefix(ec.site.URL(), "http://"))
	var wg sync.WaitGroup
	var crawled atomic.Int64
	for w := 0; w < 3; w++ {
		csw := newSwitch(t, prefix, proxyswitch.WithTimeouts(proxyswitch.Timeouts{MaxWait: time.Second}))
		for g := 0; g < 2; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					l, err := csw.Lease(ctx, site)
					if err != nil {
						continue
					}
					tr := &http.Transport{Proxy: http.ProxyURL(l.Proxy().URL()), DisableKeepAlives: true}
					req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ec.site.URL()+"/crawl", nil)
					if resp, err := tr.RoundTrip(req); err == nil {
						resp.Body.Close()
						crawled.Add(1)
					}
					_ = l.Release(context.WithoutCancel(ctx))
				}
			}()
		}
	}
	c := &probe.Checker{Switch: sw, EchoURL: ec.site.URL() + "/ip", Timeout: 2 * time.Second, Concurrency: 6}
	probed, skipped := 0, 0
	for i := 0; i < 20; i++ {
		rep, err := c.Check(ctx)
		require.NoError(t, err)
		require.Zero(t, rep.Dead, "%+v", rep.Results)
		probed += rep.Probed
		skipped += rep.Skipped
	}
	cancel()
	wg.Wait()
	require.Positive(t, crawled.Load())
	require.Positive(t, probed)
	require.Zero(t, ec.site.Recorder().Collisions(), "a probe and a request reached the echo site from one IP at once")
	t.Logf("crawl requests %d, probes %d, skipped as busy %d", crawled.Load(), probed, skipped)
}

// TestCheckerSiteProbe: a proxy that cannot reach one site is quarantined
// on that site only, not marked dead.
func TestCheckerSiteProbe(t *testing.T) {
	ctx := context.Background()
	farm := proxyswitchtest.NewFarm(t, 6)
	sw := newSwitch(t, testPrefix())
	_, err := sw.Add(ctx, farm.URLs()...)
	require.NoError(t, err)
	ec := newEcho(t, 0)
	cut, blocked := farm.Proxies[2].SourceIP().String(), farm.Proxies[4].SourceIP().String()
	ozon := proxyswitchtest.NewSite(t, "ozon", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		switch host {
		case cut:
			panic(http.ErrAbortHandler) // the connection drops: the proxy answers 502
		case blocked:
			http.Error(w, "blocked", http.StatusForbidden)
		}
	}))
	var results []probe.Result
	var mu sync.Mutex
	c := &probe.Checker{Switch: sw, EchoURL: ec.site.URL(), Sites: []probe.SiteProbe{{URL: ozon.URL() + "/"}},
		Timeout: time.Second, SiteQuarantine: time.Hour, OnResult: func(r probe.Result) {
			mu.Lock()
			results = append(results, r)
			mu.Unlock()
		}}
	rep, err := c.Check(ctx)
	require.NoError(t, err)
	require.Equal(t, 0, rep.Dead)
	require.Equal(t, 2, rep.Quarantined)
	require.Equal(t, 12, rep.Probed)
	ozonSite := strings.TrimPrefix(ozon.URL(), "http://")
	st, err := sw.ProxyStates(ctx, ozonSite)
	require.NoError(t, err)
	var quarantined []string
	for _, s := range st {
		if s.State == proxyswitch.StateQuarantined {
			quarantined = append(quarantined, s.Proxy.ID())
		}
	}
	want := []string{idOf(t, farm.Proxies[2].URL()), idOf(t, farm.Proxies[4].URL())}
	sort.Strings(quarantined)
	sort.Strings(want)
	require.Equal(t, want, quarantined)
	require.Len(t, leaseAll(t, sw, "avito.example"), 6, "quarantined elsewhere too")
	require.Empty(t, deadReasons(t, sw))
}

// TestCheckerOneLeader: three checkers (three Redis clients) run Run
// together: one probes at a time, its rounds never overlap another's, and
// when it stops another takes over within the lock TTL.
func TestCheckerOneLeader(t *testing.T) {
	farm := proxyswitchtest.NewFarm(t, 8)
	prefix := testPrefix()
	ec := newEcho(t, 2*time.Millisecond)
	type round struct {
		who        int
		start, end time.Time
	}
	var mu sync.Mutex
	var rounds []round
	ctxs := make([]context.CancelFunc, 3)
	checkers := make([]*probe.Checker, 3)
	done := make([]chan error, 3)
	for i := range checkers {
		sw := newSwitch(t, prefix)
		if i == 0 {
			_, err := sw.Add(context.Background(), farm.URLs()...)
			require.NoError(t, err)
		}
		checkers[i] = &probe.Checker{Switch: sw, Redis: shared.Client(t), EchoURL: ec.site.URL(), Every: 40 * time.Millisecond,
			LockTTL: time.Second, Timeout: time.Second, Logger: slog.New(slog.NewTextHandler(&testlog.Buffer{}, nil)),
			OnReport: func(r probe.Report) {
				mu.Lock()
				rounds = append(rounds, round{i, r.Start, r.End})
				mu.Unlock()
			}}
		ctx, cancel := context.WithCancel(context.Background())
		ctxs[i] = cancel
		done[i] = make(chan error, 1)
		go func() { done[i] <- checkers[i].Run(ctx) }()
	}
	defer func() {
		for _, c := range ctxs {
			c()
		}
	}()
	leader := func() int {
		n, who := 0, -1
		for i, c := range checkers {
			if c.Leader() {
				n++
				who = i
			}
		}
		require.LessOrEqual(t, n, 1, "two leaders at once")
		return who
	}
	require.Eventually(t, func() bool { return leader() >= 0 }, 5*time.Second, 5*time.Millisecond)
	for end := time.Now().Add(600 * time.Millisecond); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		leader()
	}
	var first int
	require.Eventually(t, func() bool { first = leader(); return first >= 0 }, 5*time.Second, 5*time.Millisecond)
	ctxs[first]() // it gives the lock up: another takes it within a third of the TTL
	require.ErrorIs(t, <-done[first], context.Canceled)
	var second int
	require.Eventually(t, func() bool { second = leader(); return second >= 0 }, 5*time.Second, 5*time.Millisecond)
	require.NotEqual(t, first, second)
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		leader()
	}
	for i, c := range ctxs {
		if i != first {
			c()
			require.ErrorIs(t, <-done[i], context.Canceled)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	sort.Slice(rounds, func(a, b int) bool { return rounds[a].start.Before(rounds[b].start) })
	who := map[int]int{}
	for i, r := range rounds {
		who[r.who]++
		require.False(t, r.end.Before(r.start), "a round's End before its Start (or not set): %v, %v", r.start, r.end)
		if i > 0 && rounds[i-1].who != r.who {
			require.False(t, r.start.Before(rounds[i-1].end), "rounds of two checkers overlap")
		}
	}
	require.GreaterOrEqual(t, len(who), 2, "rounds by %v", who)
	require.Positive(t, who[second], "rounds by %v", who)
}

// TestCheckerConfig: a Checker without a Switch or an echo URL, with an
// echo URL holding user info, or Run without Redis fail with ErrConfig.
func TestCheckerConfig(t *testing.T) {
	ctx := context.Background()
	sw := newSwitch(t, testPrefix())
	for _, c := range []*probe.Checker{{}, {Switch: sw}, {Switch: sw, EchoURL: "ftp://x/"},
		{Switch: sw, EchoURL: "http://u:" + canary + "@127.0.0.1:1/"}, {Switch: sw, EchoURL: "http://127.0.0.1:1/", Timeout: -1},
		{Switch: sw, EchoURL: "http://127.0.0.1:1/", Sites: []probe.SiteProbe{{URL: "nope"}}}} {
		_, err := c.Check(ctx)
		require.ErrorIs(t, err, proxyswitch.ErrConfig)
		require.NotContains(t, err.Error(), canary)
	}
	// A port must be a number from 1 to 65535 (url.Parse takes an empty one).
	for _, u := range []string{"http://127.0.0.1:/ip", "http://127.0.0.1:0/ip", "https://echo.example:65536/", "http://:8080/ip", "http://[::1]:/ip"} {
		for _, c := range []*probe.Checker{{Switch: sw, EchoURL: u}, {Switch: sw, EchoURL: "http://127.0.0.1:1/", Sites: []probe.SiteProbe{{URL: u}}}} {
			rep, err := c.Check(ctx)
			require.ErrorIs(t, err, proxyswitch.ErrConfig, u)
			require.True(t, rep.Start.IsZero(), "no round ran")
		}
	}
	_, err := (&probe.Checker{Switch: sw, EchoURL: "http://127.0.0.1:/ip"}).Check(ctx)
	require.ErrorContains(t, err, `port "" of "127.0.0.1:"`)
	for _, u := range []string{"http://[::1]:8080/ip", "http://[::1]/ip", "https://echo.example/ip", "http://127.0.0.1:65535/"} {
		_, err := (&probe.Checker{Switch: sw, EchoURL: u, Timeout: 50 * time.Millisecond}).Check(ctx)
		require.NoError(t, err, u) // an empty pool: no probe sent
	}
	err = (&probe.Checker{Switch: sw, EchoURL: "http://127.0.0.1:1/"}).Run(ctx)
	require.ErrorIs(t, err, proxyswitch.ErrConfig)
}

// blockingSite is a site that answers 403 to the source IPs in block.
func blockingSite(t *testing.T, name string, block func(ip string) bool) *proxyswitchtest.Site {
	return proxyswitchtest.NewSite(t, name, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		if block(host) {
			http.Error(w, "blocked", http.StatusForbidden)
		}
	}))
}

// quarantinedOn returns the IDs of the proxies quarantined on site, sorted.
func quarantinedOn(t *testing.T, sw *proxyswitch.Switch, site string) []string {
	t.Helper()
	st, err := sw.ProxyStates(context.Background(), site)
	require.NoError(t, err)
	var out []string
	for _, s := range st {
		if s.State == proxyswitch.StateQuarantined {
			out = append(out, s.Proxy.ID())
		}
	}
	sort.Strings(out)
	return out
}

// TestCheckerSiteProbeOnSiteOnly: a site probe's failure quarantines the
// proxy on that site only, with Bans.AllSites on and a site circuit
// breaker that two bans in a row would open: every proxy that failed is
// quarantined (the breaker absorbs none, and does not open: the site still
// leases its healthy proxy), and every other site leases all of them.
func TestCheckerSiteProbeOnSiteOnly(t *testing.T) {
	ctx := context.Background()
	farm := proxyswitchtest.NewFarm(t, 6)
	sw := newSwitch(t, testPrefix(), proxyswitch.WithBans(proxyswitch.Bans{AllSites: true}),
		proxyswitch.WithBreaker(proxyswitch.Breaker{Burst: 2, MinProxies: 2, MinAttempts: 2}))
	_, err := sw.Add(ctx, farm.URLs()...)
	require.NoError(t, err)
	ec := newEcho(t, 0)
	healthy := farm.Proxies[0].SourceIP().String()
	ozon := blockingSite(t, "ozon", func(ip string) bool { return ip != healthy })
	c := &probe.Checker{Switch: sw, EchoURL: ec.site.URL(), Sites: []probe.SiteProbe{{URL: ozon.URL() + "/"}},
		Timeout: time.Second, SiteQuarantine: time.Hour, Logger: (&testlog.Buffer{}).Logger()}
	rep, err := c.Check(ctx)
	require.NoError(t, err)
	require.Equal(t, 5, rep.Quarantined)
	require.Empty(t, rep.SitesDown)
	ozonSite := strings.TrimPrefix(ozon.URL(), "http://")
	var want []string
	for _, p := range farm.Proxies[1:] {
		want = append(want, idOf(t, p.URL()))
	}
	sort.Strings(want)
	require.Equal(t, want, quarantinedOn(t, sw, ozonSite))
	require.Equal(t, map[string]bool{idOf(t, farm.Proxies[0].URL()): true}, leaseAll(t, sw, ozonSite),
		"the site is not paused: its healthy proxy leases")
	require.Len(t, leaseAll(t, sw, "avito.example"), 6, "not quarantined on other sites")
	require.Empty(t, quarantinedOn(t, sw, "avito.example"))
	require.Equal(t, int64(5), sw.BanCounts()[proxyswitch.BanKey{Site: ozonSite, Reason: proxyswitch.ReasonSiteProbe}])
}

// TestCheckerSiteProbeGatewayHeld: a gateway session that cannot reach a
// site is held off it, not rotated: the pool keeps its sessions.
func TestCheckerSiteProbeGatewayHeld(t *testing.T) {
	ctx := context.Background()
	gw := proxyswitchtest.NewGateway(t, proxyswitchtest.GatewayConfig{Exits: 8})
	sw := newSwitch(t, testPrefix())
	_, err := sw.Add(ctx, gw.Template("customer-test", 3))
	require.NoError(t, err)
	list := func() []string {
		ps, err := sw.List(ctx)
		require.NoError(t, err)
		var ids []string
		for _, p := range ps {
			ids = append(ids, p.ID())
		}
		sort.Strings(ids)
		return ids
	}
	before := list()
	require.Len(t, before, 3)
	ec := newEcho(t, 0)
	// The echo round gives each session its exit; the site blocks the
	// first session's.
	var mu sync.Mutex
	var blocked string
	var victim string
	ozon := blockingSite(t, "ozon", func(ip string) bool {
		mu.Lock()
		defer mu.Unlock()
		return ip == blocked
	})
	c := &probe.Checker{Switch: sw, EchoURL: ec.site.URL(), Timeout: time.Second, SiteQuarantine: time.Hour,
		Logger: (&testlog.Buffer{}).Logger(), OnResult: func(r probe.Result) {
			mu.Lock()
			defer mu.Unlock()
			if r.Echo && r.OK && blocked == "" {
				blocked, victim = r.ExitIP, r.Proxy.ID()
			}
		}}
	_, err = c.Check(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, blocked)
	c.Sites = []probe.SiteProbe{{URL: ozon.URL() + "/"}}
	rep, err := c.Check(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, rep.Quarantined)
	require.Equal(t, before, list(), "no session rotated")
	require.Equal(t, []string{victim}, quarantinedOn(t, sw, strings.TrimPrefix(ozon.URL(), "http://")))
}

// TestCheckerSiteDown: when every proxy fails a site's probe, the site is
// down, not the proxies: nobody is quarantined, the round reports it, and
// the site leases every proxy.
func TestCheckerSiteDown(t *testing.T) {
	ctx := context.Background()
	farm := proxyswitchtest.NewFarm(t, 4)
	var buf testlog.Buffer
	sw := newSwitch(t, testPrefix())
	_, err := sw.Add(ctx, farm.URLs()...)
	require.NoError(t, err)
	ec := newEcho(t, 0)
	ozon := proxyswitchtest.NewSite(t, "ozon", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
	}))
	ozonSite := strings.TrimPrefix(ozon.URL(), "http://")
	var failed atomic.Int64
	c := &probe.Checker{Switch: sw, EchoURL: ec.site.URL(), Sites: []probe.SiteProbe{{URL: ozon.URL() + "/"}},
		Timeout: time.Second, SiteQuarantine: time.Hour, Logger: buf.Logger(),
		OnResult: func(r probe.Result) {
			if !r.Echo && !r.OK {
				failed.Add(1)
			}
		}}
	rep, err := c.Check(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(4), failed.Load(), "every proxy probed the site, and failed")
	require.Equal(t, 0, rep.Quarantined)
	require.Equal(t, []string{ozonSite}, rep.SitesDown)
	require.Empty(t, quarantinedOn(t, sw, ozonSite))
	require.Len(t, leaseAll(t, sw, ozonSite), 4)
	require.Contains(t, buf.String(), "taking the site for down")
}

// TestCheckerSiteProbeLifts: a proxy a site probe quarantined is probed
// there again in the next round, under its quarantine, and lifted when it
// passes; a quarantine that is not the probe's (an operator's ban), or
// that a later ban lengthened, is left alone.
func TestCheckerSiteProbeLifts(t *testing.T) {
	ctx := context.Background()
	farm := proxyswitchtest.NewFarm(t, 5)
	prefix := testPrefix()
	sw := newSwitch(t, prefix)
	_, err := sw.Add(ctx, farm.URLs()...)
	require.NoError(t, err)
	ec := newEcho(t, 0)
	var blocking atomic.Bool
	blocking.Store(true)
	one, three := farm.Proxies[1].SourceIP().String(), farm.Proxies[3].SourceIP().String()
	ozon := blockingSite(t, "ozon", func(ip string) bool { return blocking.Load() && (ip == one || ip == three) })
	ozonSite := strings.TrimPrefix(ozon.URL(), "http://")
	c := &probe.Checker{Switch: sw, EchoURL: ec.site.URL(), Sites: []probe.SiteProbe{{URL: ozon.URL() + "/"}},
		Timeout: time.Second, SiteQuarantine: time.Hour, Logger: (&testlog.Buffer{}).Logger()}
	rep, err := c.Check(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, rep.Quarantined)
	id := func(i int) string { return idOf(t, farm.Proxies[i].URL()) }
	sorted := func(ids ...string) []string { sort.Strings(ids); return ids }
	require.Equal(t, sorted(id(1), id(3)), quarantinedOn(t, sw, ozonSite))
	base, err := engine.KeyBase(prefix, sw.Pool())
	require.NoError(t, err)
	ledger := base + ":siteprobe:" + ozonSite
	require.Equal(t, int64(1), shared.Client(t).Exists(ctx, ledger).Val(), "the ledger of the probe's quarantines")

	require.NoError(t, sw.Ban(ctx, id(2), ozonSite, time.Hour), "an operator's ban: not the probe's")
	require.NoError(t, sw.Ban(ctx, id(3), ozonSite, 3*time.Hour), "a longer ban over the probe's")
	blocking.Store(false)
	rep, err = c.Check(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, rep.Lifted)
	require.Equal(t, 0, rep.Quarantined)
	require.Equal(t, sorted(id(2), id(3)), quarantinedOn(t, sw, ozonSite))
	got := leaseAll(t, sw, ozonSite)
	require.True(t, got[id(1)], "lifted: the site leases it again")
	require.Len(t, got, 3)

	rep, err = c.Check(ctx)
	require.NoError(t, err)
	require.Equal(t, 0, rep.Lifted, "nothing left the probe's to lift")
	require.Equal(t, sorted(id(2), id(3)), quarantinedOn(t, sw, ozonSite))

	// Clear deletes the ledger: another site's, written by a fourth round.
	zero := farm.Proxies[0].SourceIP().String()
	wb := blockingSite(t, "wb", func(ip string) bool { return ip == zero })
	c.Sites = append(c.Sites, probe.SiteProbe{URL: wb.URL() + "/"})
	rep, err = c.Check(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, rep.Quarantined)
	ledger = base + ":siteprobe:" + strings.TrimPrefix(wb.URL(), "http://")
	require.Equal(t, int64(1), shared.Client(t).Exists(ctx, ledger).Val())
	require.NoError(t, sw.Clear(ctx))
	require.Zero(t, shared.Client(t).Exists(ctx, ledger).Val(), "Clear deletes the ledger")
}

// TestCheckerSiteProbeLedgerPerSite: under ScopeGlobal one scope holds
// every site's quarantines (the ledger names the site whose probe put
// each): a proxy that fails wb's probe is out everywhere, its echo probe
// finds it busy, and no pass of ozon's lifts it. A site that every proxy
// fails (two at least) is down: the quarantines its probes put are lifted
// at the round's end, and nobody stays quarantined.
func TestCheckerSiteProbeLedgerPerSite(t *testing.T) {
	ctx := context.Background()
	farm := proxyswitchtest.NewFarm(t, 3)
	sw := newSwitch(t, testPrefix(), proxyswitch.WithRotation(proxyswitch.Rotation{Scope: proxyswitch.ScopeGlobal}))
	_, err := sw.Add(ctx, farm.URLs()...)
	require.NoError(t, err)
	ec := newEcho(t, 0)
	zero := farm.Proxies[0].SourceIP().String()
	wb := blockingSite(t, "wb", func(ip string) bool { return ip == zero })
	ozon := blockingSite(t, "ozon", func(string) bool { return false })
	c := &probe.Checker{Switch: sw, EchoURL: ec.site.URL(), Sites: []probe.SiteProbe{{URL: wb.URL() + "/"}, {URL: ozon.URL() + "/"}},
		Timeout: time.Second, SiteQuarantine: time.Hour, Logger: (&testlog.Buffer{}).Logger()}
	rep, err := c.Check(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, rep.Quarantined)
	id0 := idOf(t, farm.Proxies[0].URL())
	wbSite := strings.TrimPrefix(wb.URL(), "http://")
	require.Equal(t, []string{id0}, quarantinedOn(t, sw, wbSite))
	for range 2 {
		rep, err = c.Check(ctx)
		require.NoError(t, err)
		require.Zero(t, rep.Lifted, "ozon's pass lifted the quarantine wb's probe put")
		require.Equal(t, []string{id0}, quarantinedOn(t, sw, wbSite))
	}

	// Every proxy fails a third site: down, nobody stays quarantined.
	down := blockingSite(t, "down", func(string) bool { return true })
	c.Sites = []probe.SiteProbe{{URL: down.URL() + "/"}}
	fresh := newSwitch(t, testPrefix())
	_, err = fresh.Add(ctx, farm.URLs()...)
	require.NoError(t, err)
	c.Switch = fresh
	rep, err = c.Check(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{strings.TrimPrefix(down.URL(), "http://")}, rep.SitesDown)
	require.Zero(t, rep.Quarantined)
	require.Empty(t, quarantinedOn(t, fresh, strings.TrimPrefix(down.URL(), "http://")), "the quarantines of a down site's probes were not lifted")
}

// TestCheckerReportEnd: a round's Report carries its End, after its
// Start, to Check's caller and to OnReport (a failed round's too).
func TestCheckerReportEnd(t *testing.T) {
	ctx := context.Background()
	_, sw := farmPool(t, testPrefix(), 2)
	ec := newEcho(t, 20*time.Millisecond)
	var seen []probe.Report
	c := &probe.Checker{Switch: sw, EchoURL: ec.site.URL(), Timeout: time.Second, Logger: (&testlog.Buffer{}).Logger(),
		OnReport: func(r probe.Report) { seen = append(seen, r) }}
	before := time.Now()
	rep, err := c.Check(ctx)
	require.NoError(t, err)
	after := time.Now()
	require.Equal(t, 2, rep.Probed)
	require.False(t, rep.Start.Before(before))
	require.True(t, rep.End.After(rep.Start), "End %v, Start %v", rep.End, rep.Start)
	require.GreaterOrEqual(t, rep.End.Sub(rep.Start), 20*time.Millisecond, "the round lasted a probe at least")
	require.False(t, rep.End.After(after))
	require.Len(t, seen, 1)
	require.Equal(t, rep.End, seen[0].End, "OnReport sees End")

	// A failed round (a cancelled context) reports its End too.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	rep, err = c.Check(cctx)
	require.Error(t, err)
	require.False(t, rep.End.IsZero())
	require.False(t, rep.End.Before(rep.Start))
	require.Len(t, seen, 2)
	require.Equal(t, rep.End, seen[1].End)
}

// TestCheckerSiteDownLiftsInChunks: a down site's quarantines are lifted
// in calls of at most the chunk (site_hold.lua's work is per proxy), and
// every one of them is lifted: with a chunk of 2, 5 proxies go in 3 calls.
func TestCheckerSiteDownLiftsInChunks(t *testing.T) {
	ctx := context.Background()
	defer probe.SetLiftChunk(2)()
	var mu sync.Mutex
	var lifts []int
	defer probe.SpySiteHold(func(mode string, ids int) {
		if mode == "lift" {
			mu.Lock()
			lifts = append(lifts, ids)
			mu.Unlock()
		}
	})()
	_, sw := farmPool(t, testPrefix(), 5)
	ec := newEcho(t, 0)
	down := blockingSite(t, "down", func(string) bool { return true })
	downSite := strings.TrimPrefix(down.URL(), "http://")
	c := &probe.Checker{Switch: sw, EchoURL: ec.site.URL(), Sites: []probe.SiteProbe{{URL: down.URL() + "/"}},
		Timeout: time.Second, SiteQuarantine: time.Hour, Logger: (&testlog.Buffer{}).Logger()}
	rep, err := c.Check(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{downSite}, rep.SitesDown)
	require.Zero(t, rep.Quarantined)
	require.Empty(t, quarantinedOn(t, sw, downSite), "a quarantine of the down site's probes was not lifted")
	require.Len(t, leaseAll(t, sw, downSite), 5)
	mu.Lock()
	defer mu.Unlock()
	sum := 0
	for _, n := range lifts {
		require.LessOrEqual(t, n, 2, "a lift call of more than the chunk: %v", lifts)
		sum += n
	}
	require.Equal(t, 5, sum, "lift calls %v", lifts)
	require.Len(t, lifts, 3)
}

// closedURL is an http URL of a loopback port nothing listens on.
func closedURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return "http://" + addr + "/ip"
}

// TestCheckerEchoDown: when every echo probe fails, through two proxies
// at least (an echo URL nothing listens on: each proxy answers 502; an
// echo answering 503; one that outlasts the timeout), the echo URL is
// down, not the proxies: nobody is marked dead, the round reports it
// (EchoDown) and fails with ErrEchoDown, and every proxy still leases.
// A proxy that refuses connections is dead whatever the echo URL: it is
// marked, and does not count for the echo URL.
func TestCheckerEchoDown(t *testing.T) {
	ctx := context.Background()
	down503 := proxyswitchtest.NewSite(t, "echo503", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "maintenance", http.StatusServiceUnavailable)
	}))
	slow := newEcho(t, 700*time.Millisecond)
	for name, echoURL := range map[string]string{"unreachable": closedURL(t), "503": down503.URL() + "/ip", "timeout": slow.site.URL() + "/ip"} {
		t.Run(name, func(t *testing.T) {
			farm, sw := farmPool(t, testPrefix(), 4)
			farm.Proxies[3].SetMode(proxyswitchtest.ProxyDead)
			var buf testlog.Buffer
			c := &probe.Checker{Switch: sw, EchoURL: echoURL, Timeout: 300 * time.Millisecond, Logger: buf.Logger()}
			rep, err := c.Check(ctx)
			require.ErrorIs(t, err, probe.ErrEchoDown)
			require.True(t, rep.EchoDown)
			require.Equal(t, 4, rep.Probed)
			require.Equal(t, 1, rep.Dead, "only the proxy refusing connections: %+v", rep.Results)
			require.Equal(t, map[string]string{idOf(t, farm.Proxies[3].URL()): "probe"}, deadReasons(t, sw))
			require.Len(t, leaseAll(t, sw, "shop.example"), 3)
			require.Contains(t, buf.String(), "taking the echo URL for down")
			require.False(t, rep.End.Before(rep.Start))
		})
	}
}

// TestCheckerEchoDownKeepsMarks: a round whose echo URL is down neither
// marks nor revives anyone: a proxy marked dead before stays so, and is
// revived by the next round that finds the echo URL up and the proxy
// recovered; a single proxy's failure, before any other passed, is still
// marked (when the first probe passes).
func TestCheckerEchoDownKeepsMarks(t *testing.T) {
	ctx := context.Background()
	farm, sw := farmPool(t, testPrefix(), 3)
	ec := newEcho(t, 0)
	// 0 fails at once (502), 1 and 2 pass later: 0's failure waits for
	// the first pass, then is marked.
	farm.Proxies[0].SetMode(proxyswitchtest.Proxy502)
	for _, p := range farm.Proxies[1:] {
		p.SetDelay(150 * time.Millisecond)
		p.SetMode(proxyswitchtest.ProxySlow)
	}
	var results sync.Map
	c := &probe.Checker{Switch: sw, EchoURL: ec.site.URL() + "/ip", Timeout: time.Second, Logger: (&testlog.Buffer{}).Logger(),
		OnResult: func(r probe.Result) { results.Store(r.Proxy.ID(), r) }}
	rep, err := c.Check(ctx)
	require.NoError(t, err)
	require.False(t, rep.EchoDown)
	require.Equal(t, 1, rep.Dead)
	id0 := idOf(t, farm.Proxies[0].URL())
	require.Equal(t, map[string]string{id0: "probe"}, deadReasons(t, sw))
	r, ok := results.Load(id0)
	require.True(t, ok)
	require.Equal(t, "dead", r.(probe.Result).Action)

	// The echo URL goes down (and 0 recovers): nobody marked, nobody revived.
	for _, p := range farm.Proxies {
		p.SetMode(proxyswitchtest.ProxyOK)
	}
	c.EchoURL = closedURL(t)
	rep, err = c.Check(ctx)
	require.ErrorIs(t, err, probe.ErrEchoDown)
	require.True(t, rep.EchoDown)
	require.Zero(t, rep.Dead)
	require.Zero(t, rep.Revived)
	require.Equal(t, map[string]string{id0: "probe"}, deadReasons(t, sw))

	// Up again: 0 is revived.
	c.EchoURL = ec.site.URL() + "/ip"
	rep, err = c.Check(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, rep.Revived)
	require.Empty(t, deadReasons(t, sw))

	// A pool of one cannot tell its proxy's fault from the echo URL's:
	// its failure marks it, as before.
	one, sw1 := farmPool(t, testPrefix(), 1)
	c1 := &probe.Checker{Switch: sw1, EchoURL: closedURL(t), Timeout: time.Second, Logger: (&testlog.Buffer{}).Logger()}
	rep, err = c1.Check(ctx)
	require.NoError(t, err)
	require.False(t, rep.EchoDown)
	require.Equal(t, map[string]string{idOf(t, one.Proxies[0].URL()): "probe"}, deadReasons(t, sw1))
}

// TestCheckerAllProxiesRefuse: proxies that all refuse connections are
// dead whatever the echo URL: every one is marked, the round does not
// take the echo URL for down.
func TestCheckerAllProxiesRefuse(t *testing.T) {
	farm, sw := farmPool(t, testPrefix(), 3)
	for _, p := range farm.Proxies {
		p.SetMode(proxyswitchtest.ProxyDead)
	}
	ec := newEcho(t, 0)
	log := &testlog.Buffer{}
	c := &probe.Checker{Switch: sw, EchoURL: ec.site.URL(), Timeout: time.Second, Logger: log.Logger()}
	rep, err := c.Check(context.Background())
	require.NoError(t, err)
	require.False(t, rep.EchoDown)
	if rep.Dead != 3 {
		// Seen once in a CI run under load (2 of 3): say what became of each.
		for _, r := range rep.Results {
			t.Logf("%s: ok %v, action %q, err %v", r.Proxy, r.OK, r.Action, r.Err)
		}
		t.Logf("probed %d, skipped %d; log:\n%s", rep.Probed, rep.Skipped, log.String())
	}
	require.Equal(t, 3, rep.Dead)
}
