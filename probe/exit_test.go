package probe_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/engine"
	"github.com/proxyswitch/proxyswitch/probe"
	"github.com/proxyswitch/proxyswitch/proxyswitchtest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// exitBed is a testbed of plain proxy entries, some of which leave from
// one source address: entries 0 and 1 from IP A, 2 and 3 from IP B, 4 from
// C, 5 from D (each entry its own port, as a provider's list may hold two
// ports of one host). Its echo site answers the client's IP, or the IP
// set by lie for a proxy (its probes carry X-Entry, the proxy's address:
// transport): an exit that changed.
type exitBed struct {
	proxies []*proxyswitchtest.Proxy
	ips     []string // the true source IP of each
	echo    *proxyswitchtest.Site
	mu      sync.Mutex
	lie     map[string]string // proxy address -> the IP the echo answers
}

func newExitBed(t *testing.T, base int) *exitBed {
	b := &exitBed{lie: map[string]string{}}
	for _, ip := range []int{0, 0, 1, 1, 2, 3} {
		p := proxyswitchtest.NewProxy(t, proxyswitchtest.SourceIP(base+ip))
		b.proxies = append(b.proxies, p)
		b.ips = append(b.ips, p.SourceIP().String())
	}
	b.echo = proxyswitchtest.NewSite(t, "echo", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		b.mu.Lock()
		if ip, ok := b.lie[r.Header.Get("X-Entry")]; ok {
			host = ip
		}
		b.mu.Unlock()
		w.Write([]byte(host + "\n"))
	}))
	return b
}

// transport is the Checker's: it marks each probe with its proxy's address.
func (b *exitBed) transport(proxy *url.URL) http.RoundTripper {
	tr := &http.Transport{Proxy: http.ProxyURL(proxy), DisableKeepAlives: true}
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		r.Header.Set("X-Entry", proxy.Host)
		return tr.RoundTrip(r)
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// exitOf maps each entry's proxy ID to its true source IP.
func (b *exitBed) exitOf(t *testing.T) map[string]string {
	m := map[string]string{}
	for i, p := range b.proxies {
		m[idOf(t, p.URL())] = b.ips[i]
	}
	return m
}

// perIP counts the leased proxy IDs by exit IP.
func perIP(leased map[string]bool, exit map[string]string) map[string]int {
	out := map[string]int{}
	for id := range leased {
		out[exit[id]]++
	}
	return out
}

func (b *exitBed) urls() []string {
	var out []string
	for _, p := range b.proxies {
		out = append(out, p.URL())
	}
	return out
}

// crawl runs workers that each lease a proxy for site, send one request
// through it and release it, n requests in all.
func crawl(t *testing.T, sw *proxyswitch.Switch, s *proxyswitchtest.Site, workers, n int) {
	t.Helper()
	ctx := context.Background()
	site := s.Host()
	var left atomic.Int64
	left.Store(int64(n))
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for left.Add(-1) >= 0 {
				l, err := sw.Lease(ctx, site)
				if err != nil {
					t.Errorf("lease: %v", err)
					return
				}
				tr := &http.Transport{Proxy: http.ProxyURL(l.Proxy().URL()), DisableKeepAlives: true}
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL()+"/page", nil)
				if resp, err := tr.RoundTrip(req); err == nil {
					resp.Body.Close()
				} else {
					t.Errorf("request: %v", err)
				}
				_ = l.Release(ctx)
			}
		}()
	}
	wg.Wait()
}

func slowSite(t *testing.T, name string) *proxyswitchtest.Site {
	return proxyswitchtest.NewSite(t, name, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(15 * time.Millisecond)
	}))
}

// overlapWithoutExits crawls a site through a pool of proxies with no
// exits recorded, n requests by workers, and checks that two of them met
// there from one exit IP at once: what the testbed must show for the
// exits to prove anything. It returns the site.
func overlapWithoutExits(t *testing.T, workers, n int, proxies ...string) *proxyswitchtest.Site {
	t.Helper()
	sw := newSwitch(t, testPrefix(), proxyswitch.WithTimeouts(proxyswitch.Timeouts{MaxWait: 10 * time.Second}))
	_, err := sw.Add(context.Background(), proxies...)
	require.NoError(t, err)
	site := slowSite(t, "before")
	crawl(t, sw, site, workers, n)
	require.Equal(t, n, site.Recorder().Count())
	require.Positive(t, site.Recorder().Collisions(), "the testbed shows no overlap by IP without exits")
	return site
}

// TestExitsSharedIPNeverOverlap: six entries over four exit IPs, six
// workers. Without exits recorded, the two entries of one IP reach the
// site at once (collisions by IP); with the Checker's Exits round first,
// never: the site sees at most one request per IP at a time.
func TestExitsSharedIPNeverOverlap(t *testing.T) {
	ctx := context.Background()
	b := newExitBed(t, 300)
	wait := proxyswitch.WithTimeouts(proxyswitch.Timeouts{MaxWait: 10 * time.Second})

	before := overlapWithoutExits(t, 6, 120, b.urls()...)
	var err error

	sw := newSwitch(t, testPrefix(), wait)
	_, err = sw.Add(ctx, b.urls()...)
	require.NoError(t, err)
	c := &probe.Checker{Switch: sw, EchoURL: b.echo.URL() + "/ip", Timeout: 2 * time.Second, Exits: true}
	rep, err := c.Check(ctx)
	require.NoError(t, err)
	require.Equal(t, 6, rep.Probed)
	require.Zero(t, rep.ExitChanges)
	exits, err := c.ExitIPs(ctx)
	require.NoError(t, err)
	want := map[string]string{}
	for i, p := range b.proxies {
		want[idOf(t, p.URL())] = b.ips[i]
	}
	require.Equal(t, want, exits)

	after := slowSite(t, "after")
	crawl(t, sw, after, 6, 120)
	require.Equal(t, 120, after.Recorder().Count())
	require.Zero(t, after.Recorder().Collisions(), "two requests reached the site from one exit IP at once")
	require.LessOrEqual(t, after.Recorder().MaxConcurrentPerIP(), 1)
	require.Len(t, after.Recorder().IPs(), 4)
	t.Logf("collisions by IP: %d without exits, %d with", before.Recorder().Collisions(), after.Recorder().Collisions())
}

// collyCrawl visits n pages of s with an asynchronous Colly collector of
// 6 parallel requests, through sw (Attach).
func collyCrawl(t *testing.T, sw *proxyswitch.Switch, s *proxyswitchtest.Site, n int) {
	t.Helper()
	c := colly.NewCollector(colly.Async(true))
	require.NoError(t, c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: 6}))
	sw.Attach(c)
	var failed atomic.Int64
	c.OnError(func(r *colly.Response, err error) { failed.Add(1) })
	for i := 0; i < n; i++ {
		require.NoError(t, c.Visit(fmt.Sprintf("%s/page?n=%d", s.URL(), i)))
	}
	c.Wait()
	require.Zero(t, failed.Load())
}

// TestExitsCollyCrawl: the same through Colly (Attach): 0 collisions by
// exit IP at the site with exits recorded, some without.
func TestExitsCollyCrawl(t *testing.T) {
	ctx := context.Background()
	b := newExitBed(t, 340)
	wait := proxyswitch.WithTimeouts(proxyswitch.Timeouts{MaxWait: 10 * time.Second})
	plain := newSwitch(t, testPrefix(), wait)
	_, err := plain.Add(ctx, b.urls()...)
	require.NoError(t, err)
	before := slowSite(t, "before")
	collyCrawl(t, plain, before, 100)
	require.Equal(t, 100, before.Recorder().Count())
	require.Positive(t, before.Recorder().Collisions())

	sw := newSwitch(t, testPrefix(), wait)
	_, err = sw.Add(ctx, b.urls()...)
	require.NoError(t, err)
	_, err = (&probe.Checker{Switch: sw, EchoURL: b.echo.URL(), Timeout: 2 * time.Second, Exits: true}).Check(ctx)
	require.NoError(t, err)
	after := slowSite(t, "after")
	collyCrawl(t, sw, after, 100)
	require.Equal(t, 100, after.Recorder().Count())
	require.Zero(t, after.Recorder().Collisions(), "two requests reached the site from one exit IP at once")
	t.Logf("Colly, collisions by IP: %d without exits, %d with", before.Recorder().Collisions(), after.Recorder().Collisions())
}

// ban quarantines the proxy of url on site for an hour.
func banOn(t *testing.T, sw *proxyswitch.Switch, site, url string) {
	t.Helper()
	ctx := context.Background()
	l, err := sw.LeaseProxy(ctx, site, idOf(t, url))
	require.NoError(t, err)
	require.NoError(t, l.Report(ctx, ban.Verdict{Kind: ban.Ban, Reason: ban.ReasonCustom, RetryAfter: time.Hour}))
}

// TestExitsBanHoldsIP: a ban of one entry on a site holds the other entry
// of its exit IP there too (not elsewhere); without exits recorded it
// does not.
func TestExitsBanHoldsIP(t *testing.T) {
	ctx := context.Background()
	b := newExitBed(t, 310)
	ids := make([]string, len(b.proxies))
	for i, p := range b.proxies {
		ids[i] = idOf(t, p.URL())
	}
	set := func(is ...int) map[string]bool {
		m := map[string]bool{}
		for _, i := range is {
			m[ids[i]] = true
		}
		return m
	}

	plain := newSwitch(t, testPrefix())
	_, err := plain.Add(ctx, b.urls()...)
	require.NoError(t, err)
	banOn(t, plain, "shop.example", b.proxies[0].URL())
	require.Equal(t, set(1, 2, 3, 4, 5), leaseAll(t, plain, "shop.example"), "without exits, the ban holds one entry")

	sw := newSwitch(t, testPrefix())
	_, err = sw.Add(ctx, b.urls()...)
	require.NoError(t, err)
	c := &probe.Checker{Switch: sw, EchoURL: b.echo.URL(), Timeout: 2 * time.Second, Exits: true}
	_, err = c.Check(ctx)
	require.NoError(t, err)
	banOn(t, sw, "shop.example", b.proxies[0].URL())
	exit := b.exitOf(t)
	got := leaseAll(t, sw, "shop.example")
	require.Equal(t, map[string]int{b.ips[2]: 1, b.ips[4]: 1, b.ips[5]: 1}, perIP(got, exit), "the ban holds its exit IP")
	require.False(t, got[ids[1]])
	require.Equal(t, map[string]int{b.ips[0]: 1, b.ips[2]: 1, b.ips[4]: 1, b.ips[5]: 1}, perIP(leaseAll(t, sw, "other.example"), exit),
		"one entry per exit IP elsewhere")

	// A dead entry holds nothing: 1 is leased on the site once 0 is dead.
	_, err = sw.Drain(ctx, "", b.proxies[0].URL())
	require.NoError(t, err)
	got = leaseAll(t, sw, "shop.example")
	require.True(t, got[ids[1]], "a dead entry holds its exit IP")
	require.Equal(t, map[string]int{b.ips[0]: 1, b.ips[2]: 1, b.ips[4]: 1, b.ips[5]: 1}, perIP(got, exit))
}

// TestExitChangeCountedAndCarried: entry 0 (IP A, banned on the site)
// moves to IP B. The next round notices the change and counts it (the
// Result, the Report, the Observer); entry 0 keeps its ban and now holds
// B (entry 2); entry 1, left on A, stays held as long as the ban would
// have held it.
func TestExitChangeCountedAndCarried(t *testing.T) {
	ctx := context.Background()
	b := newExitBed(t, 320)
	ids := make([]string, len(b.proxies))
	for i, p := range b.proxies {
		ids[i] = idOf(t, p.URL())
	}
	set := func(is ...int) map[string]bool {
		m := map[string]bool{}
		for _, i := range is {
			m[ids[i]] = true
		}
		return m
	}
	sw := newSwitch(t, testPrefix())
	obs := &probeObserver{}
	sw.SetObserver(obs)
	_, err := sw.Add(ctx, b.urls()...)
	require.NoError(t, err)
	var changed []probe.Result
	var mu sync.Mutex
	c := &probe.Checker{Switch: sw, EchoURL: b.echo.URL(), Timeout: 2 * time.Second, Exits: true, Transport: b.transport,
		OnResult: func(r probe.Result) {
			if r.ExitChanged {
				mu.Lock()
				changed = append(changed, r)
				mu.Unlock()
			}
		}}
	_, err = c.Check(ctx)
	require.NoError(t, err)
	banOn(t, sw, "shop.example", b.proxies[0].URL())
	require.Equal(t, map[string]int{b.ips[2]: 1, b.ips[4]: 1, b.ips[5]: 1}, perIP(leaseAll(t, sw, "shop.example"), b.exitOf(t)))

	b.mu.Lock()
	b.lie[b.proxies[0].Addr()] = b.ips[2]
	b.mu.Unlock()
	rep, err := c.Check(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, rep.ExitChanges)
	require.Len(t, changed, 1)
	require.Equal(t, ids[0], changed[0].Proxy.ID())
	require.Equal(t, b.ips[0], changed[0].OldExitIP)
	require.Equal(t, b.ips[2], changed[0].ExitIP)
	require.Equal(t, int64(1), obs.changes.Load())
	require.Equal(t, int64(12), obs.probes.Load())
	exits, err := c.ExitIPs(ctx)
	require.NoError(t, err)
	require.Equal(t, b.ips[2], exits[ids[0]])

	// 0 keeps its ban and holds B (2, 3); 1 stays held on A.
	require.Equal(t, set(4, 5), leaseAll(t, sw, "shop.example"))
	exit := b.exitOf(t)
	exit[ids[0]] = b.ips[2]
	got := leaseAll(t, sw, "other.example")
	require.True(t, got[ids[1]], "1 is alone on A")
	require.Equal(t, map[string]int{b.ips[0]: 1, b.ips[2]: 1, b.ips[4]: 1, b.ips[5]: 1}, perIP(got, exit))

	// Removed entries' exits are forgotten by the next round.
	_, err = sw.Remove(ctx, b.proxies[5].URL())
	require.NoError(t, err)
	_, err = c.Check(ctx)
	require.NoError(t, err)
	exits, err = c.ExitIPs(ctx)
	require.NoError(t, err)
	require.Len(t, exits, 5)
	require.NotContains(t, exits, ids[5])
}

// probeObserver is a proxyswitch.Observer that also counts probes.
type probeObserver struct {
	probes, changes atomic.Int64
}

func (o *probeObserver) ObserveAttempt(proxyswitch.AttemptEvent)       {}
func (o *probeObserver) ObserveQuarantine(proxyswitch.QuarantineEvent) {}
func (o *probeObserver) ObserveSession(proxyswitch.SessionEvent)       {}
func (o *probeObserver) ObserveEvidence(proxyswitch.EvidenceEvent)     {}
func (o *probeObserver) ObserveProbe(e probe.Event) {
	o.probes.Add(1)
	if e.ExitChanged {
		o.changes.Add(1)
	}
}

// TestRunRecordsExitsOfNewProxies: Run with Exits probes a proxy added
// after its round within NewEvery, not at the next round (an hour away).
func TestRunRecordsExitsOfNewProxies(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b := newExitBed(t, 330)
	sw := newSwitch(t, testPrefix())
	_, err := sw.Add(ctx, b.proxies[0].URL())
	require.NoError(t, err)
	var rounds atomic.Int64
	c := &probe.Checker{Switch: sw, EchoURL: b.echo.URL(), Timeout: 2 * time.Second, Exits: true,
		Every: time.Hour, NewEvery: 100 * time.Millisecond, Redis: shared.Client(t),
		OnReport: func(probe.Report) { rounds.Add(1) }}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	require.Eventually(t, func() bool { return rounds.Load() >= 1 }, 10*time.Second, 10*time.Millisecond)

	_, err = sw.Add(ctx, b.proxies[4].URL())
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		exits, err := c.ExitIPs(ctx)
		return err == nil && exits[idOf(t, b.proxies[4].URL())] == b.ips[4]
	}, 10*time.Second, 20*time.Millisecond, "the new proxy's exit was not recorded")
	exits, err := c.ExitIPs(ctx)
	require.NoError(t, err)
	require.Equal(t, map[string]string{idOf(t, b.proxies[0].URL()): b.ips[0], idOf(t, b.proxies[4].URL()): b.ips[4]}, exits)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
}

// countingScripter counts the script calls going through it and the
// largest reply.
type countingScripter struct {
	redis.Scripter
	calls, maxReply int
}

func (c *countingScripter) note(cmd *redis.Cmd) *redis.Cmd {
	c.calls++
	if v, ok := cmd.Val().([]any); ok {
		c.maxReply = max(c.maxReply, len(v))
	}
	return cmd
}

func (c *countingScripter) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return c.note(c.Scripter.Eval(ctx, script, keys, args...))
}

func (c *countingScripter) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	return c.note(c.Scripter.EvalSha(ctx, sha, keys, args...))
}

// TestExitIPsPaged (issue 14): the exit IPs of a large pool are read in
// calls of a page each (7 here), and all of them.
func TestExitIPsPaged(t *testing.T) {
	const n, page = 3000, 7
	defer probe.SetExitPage(page)()
	ctx := context.Background()
	rdb := shared.Client(t)
	cs := &countingScripter{Scripter: rdb}
	prefix := testPrefix()
	sw, err := proxyswitch.NewSwitch(cs, proxyswitch.WithPrefix(prefix))
	require.NoError(t, err)
	t.Cleanup(func() { sw.Close(context.Background()) })
	base := "{" + prefix + ":" + sw.Pool() + "}"
	want := map[string]string{}
	pipe := rdb.Pipeline()
	for i := range n {
		id, ip := fmt.Sprintf("p%d", i), fmt.Sprintf("198.51.%d.%d", i/250, i%250)
		want[id] = ip
		pipe.HSet(ctx, base+":exit", id, ip)
	}
	_, err = pipe.Exec(ctx)
	require.NoError(t, err)
	c := &probe.Checker{Switch: sw, EchoURL: "http://127.0.0.1:1/ip", Exits: true}
	got, err := c.ExitIPs(ctx)
	require.NoError(t, err)
	require.Equal(t, want, got)
	t.Logf("%d calls, the largest reply %d items", cs.calls, cs.maxReply)
	require.Greater(t, cs.calls, n/(4*page), "read in many calls")
	require.LessOrEqual(t, cs.maxReply, 1+2*4*page, "one page per call")
}

// TestStrictExitsHoldUnknown: with Strict, an entry whose exit is not
// recorded yet is leased on no site (it might share an IP with one in use)
// but by the probe that records it; once recorded it shares its IP's
// slots; when no strict round runs any more the hold lapses. Without
// Strict the same entry is leased at once, beside its twin.
func TestStrictExitsHoldUnknown(t *testing.T) {
	ctx := context.Background()
	b := newExitBed(t, 360)
	brief := func(sw *proxyswitch.Switch, site string) (*proxyswitch.Lease, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		return sw.Lease(ctx, site)
	}
	twins := func(strict bool) (*proxyswitch.Switch, *probe.Checker, *proxyswitch.Lease) {
		sw := newSwitch(t, testPrefix(), proxyswitch.WithTimeouts(proxyswitch.Timeouts{MaxWait: 200 * time.Millisecond}))
		_, err := sw.Add(ctx, b.proxies[0].URL())
		require.NoError(t, err)
		c := &probe.Checker{Switch: sw, EchoURL: b.echo.URL(), Timeout: 2 * time.Second, Exits: true, Strict: strict, Every: 5 * time.Second}
		_, err = c.Check(ctx)
		require.NoError(t, err)
		first, err := sw.Lease(ctx, "shop.example")
		require.NoError(t, err)
		require.Equal(t, idOf(t, b.proxies[0].URL()), first.Proxy().ID())
		_, err = sw.Add(ctx, b.proxies[1].URL()) // the same exit IP, not probed yet
		require.NoError(t, err)
		return sw, c, first
	}

	// Without Strict: the window the option closes.
	sw, c, first := twins(false)
	l, err := brief(sw, "shop.example")
	require.NoError(t, err, "without Strict the unprobed twin is its own IP")
	require.Equal(t, idOf(t, b.proxies[1].URL()), l.Proxy().ID())
	require.NoError(t, l.Release(ctx))
	require.NoError(t, first.Release(ctx))
	require.False(t, c.Strict)

	// With Strict.
	sw, c, first = twins(true)
	twin := idOf(t, b.proxies[1].URL())
	_, err = brief(sw, "shop.example")
	require.ErrorIs(t, err, proxyswitch.ErrNoProxy, "the unprobed twin was leased beside its IP's lease")
	_, err = brief(sw, "other.example")
	require.NoError(t, err, "the probed entry is free on another site") // and the twin held there too:
	_, err = brief(sw, "other.example")
	require.ErrorIs(t, err, proxyswitch.ErrNoProxy)
	named, err := sw.LeaseProxy(ctx, "probe.example", twin)
	require.NoError(t, err, "a lease naming the unprobed entry (the probe's) takes it")
	require.NoError(t, named.Release(ctx))

	rep, err := c.Check(ctx) // records the twin's exit: it shares its IP's slots now
	require.NoError(t, err)
	require.Equal(t, 2, rep.Probed)
	_, err = brief(sw, "shop.example")
	require.ErrorIs(t, err, proxyswitch.ErrNoProxy, "the twin was leased while its IP is out on the site")
	require.NoError(t, first.Release(ctx))
	l, err = brief(sw, "shop.example")
	require.NoError(t, err, "the IP came back")
	require.NoError(t, l.Release(ctx))

	// A third entry of its own IP, probed by nobody: held while the hold
	// lasts, leased once it lapses (3 × Every after the last strict round).
	_, err = (&probe.Checker{Switch: sw, EchoURL: b.echo.URL(), Timeout: 2 * time.Second, Exits: true, Strict: true, Every: time.Second}).Check(ctx)
	require.NoError(t, err)
	_, err = sw.Add(ctx, b.proxies[4].URL())
	require.NoError(t, err)
	var got []*proxyswitch.Lease
	for range 2 {
		if l, err := brief(sw, "late.example"); err == nil {
			got = append(got, l)
		}
	}
	require.Len(t, got, 1, "the unprobed entry was leased under strict exits")
	require.Eventually(t, func() bool {
		l, err := brief(sw, "late.example")
		if err != nil {
			return false
		}
		require.Equal(t, idOf(t, b.proxies[4].URL()), l.Proxy().ID())
		return true
	}, 10*time.Second, 50*time.Millisecond, "strict exits did not lapse without a strict checker")

	_, err = (&probe.Checker{Switch: sw, EchoURL: b.echo.URL(), Strict: true}).Check(ctx)
	require.ErrorIs(t, err, proxyswitch.ErrConfig, "Strict without Exits")
}

// TestExitsThroughSharedGateway: a gateway entry of 8 sessions over 3 exit
// IPs that sessions share, as a residential pool's do. Without exits
// recorded, two sessions of one IP reach the site at once; with the
// checker's Exits, never. With Strict, a session that a ban rotates in is
// not used before a probe records its exit.
func TestExitsThroughSharedGateway(t *testing.T) {
	ctx := context.Background()
	gw := proxyswitchtest.NewGateway(t, proxyswitchtest.GatewayConfig{Exits: 3, FirstExit: 1500, Shared: true})
	echo := newEcho(t, 0)
	wait := proxyswitch.WithTimeouts(proxyswitch.Timeouts{MaxWait: 10 * time.Second})
	session := func(p *proxyswitch.Proxy) string {
		_, id, ok := strings.Cut(p.URL().User.Username(), "-session-")
		require.True(t, ok, "not a gateway session")
		return id
	}

	before := overlapWithoutExits(t, 8, 160, gw.Template("user", 8))
	var err error

	sw := newSwitch(t, testPrefix(), wait)
	_, err = sw.Add(ctx, gw.Template("user", 8))
	require.NoError(t, err)
	c := &probe.Checker{Switch: sw, EchoURL: echo.site.URL(), Timeout: 2 * time.Second, Exits: true, Strict: true}
	rep, err := c.Check(ctx)
	require.NoError(t, err)
	require.Equal(t, 8, rep.Probed)
	exits, err := c.ExitIPs(ctx)
	require.NoError(t, err)
	require.Len(t, exits, 8)
	ips := map[string]bool{}
	for _, ip := range exits {
		ips[ip] = true
	}
	require.Len(t, ips, 3, "8 sessions over 3 shared exits")

	after := slowSite(t, "after")
	crawl(t, sw, after, 8, 160)
	require.Equal(t, 160, after.Recorder().Count())
	require.Zero(t, after.Recorder().Collisions(), "two sessions of one exit IP reached the site at once")
	require.LessOrEqual(t, after.Recorder().MaxConcurrentPerIP(), 1)
	t.Logf("collisions by IP: %d without exits, %d with", before.Recorder().Collisions(), after.Recorder().Collisions())

	// A ban rotates one session: the new one has no exit yet and is held.
	old, err := sw.List(ctx)
	require.NoError(t, err)
	banOn(t, sw, after.Host(), old[0].URL().String())
	now, err := sw.List(ctx)
	require.NoError(t, err)
	require.Len(t, now, 8)
	var fresh *proxyswitch.Proxy
	for _, p := range now {
		if _, ok := exits[p.ID()]; !ok {
			require.Nil(t, fresh, "more than one new session")
			fresh = p
		}
	}
	require.NotNil(t, fresh, "the ban did not rotate the session")
	third := slowSite(t, "third")
	crawl(t, sw, third, 8, 80)
	require.Zero(t, third.Recorder().Collisions())
	require.Empty(t, gw.SessionIP(session(fresh)), "the new session was used before its exit was known")

	_, err = c.Check(ctx)
	require.NoError(t, err)
	exits, err = c.ExitIPs(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, exits[fresh.ID()])
	require.Equal(t, gw.SessionIP(session(fresh)), exits[fresh.ID()])

	// While Run runs, its look for new proxies (every NewEvery) finds the
	// session a ban rotates in, though the banned one's stale exit (until
	// the next full round, an hour away) keeps as many exits as proxies.
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var rounds atomic.Int64
	c.Every, c.NewEvery, c.Redis = time.Hour, 100*time.Millisecond, shared.Client(t)
	c.OnReport = func(probe.Report) { rounds.Add(1) }
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx) }()
	require.Eventually(t, func() bool { return rounds.Load() >= 1 }, 10*time.Second, 10*time.Millisecond)
	banOn(t, sw, after.Host(), fresh.URL().String())
	require.Eventually(t, func() bool {
		now, err := sw.List(ctx)
		require.NoError(t, err)
		exits, err := c.ExitIPs(ctx)
		require.NoError(t, err)
		for _, p := range now {
			if exits[p.ID()] == "" {
				return false
			}
		}
		return true
	}, 10*time.Second, 20*time.Millisecond, "the rotated session's exit was not recorded within NewEvery")
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
}

// TestStrictExitsNeedAnIP: an echo URL whose answer holds no IP (JSON, say)
// records no exit: the round fails with ErrConfig instead of passing, and
// Strict holds nothing, so the pool keeps serving.
func TestStrictExitsNeedAnIP(t *testing.T) {
	ctx := context.Background()
	p := proxyswitchtest.NewProxy(t, proxyswitchtest.SourceIP(370))
	json := proxyswitchtest.NewSite(t, "json-echo", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		fmt.Fprintf(w, `{"origin": %q}`, host)
	}))
	sw := newSwitch(t, testPrefix())
	_, err := sw.Add(ctx, p.URL())
	require.NoError(t, err)
	c := &probe.Checker{Switch: sw, EchoURL: json.URL(), Timeout: 2 * time.Second, Exits: true, Strict: true}
	rep, err := c.Check(ctx)
	require.ErrorIs(t, err, proxyswitch.ErrConfig)
	require.ErrorContains(t, err, "no IP address for any of 1 passing")
	require.Equal(t, 1, rep.Probed)
	require.Zero(t, rep.Dead, "a proxy that answered is not dead")
	l, err := sw.Lease(ctx, "shop.example")
	require.NoError(t, err, "strict exits held the pool though no exit could be recorded")
	require.NoError(t, l.Release(ctx))

	// A second proxy whose answers hold its IP: the round passes, the
	// first proxy's exit stays unknown (and held under Strict).
	ip := proxyswitchtest.NewProxy(t, proxyswitchtest.SourceIP(371))
	_, err = sw.Add(ctx, ip.URL())
	require.NoError(t, err)
	mixed := proxyswitchtest.NewSite(t, "mixed-echo", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		if host == p.SourceIP().String() {
			fmt.Fprintf(w, "<html>welcome</html>")
			return
		}
		fmt.Fprintln(w, host)
	}))
	c.EchoURL = mixed.URL()
	rep, err = c.Check(ctx)
	require.NoError(t, err, "one captive answer failed the round")
	require.Equal(t, 2, rep.Probed)
	exits, err := c.ExitIPs(ctx)
	require.NoError(t, err)
	require.Equal(t, map[string]string{idOf(t, ip.URL()): ip.SourceIP().String()}, exits)
}

// commandCalls sums INFO commandstats' calls of cmd over the test Redis
// (every master of a cluster).
func commandCalls(t *testing.T, cmd string) int64 {
	t.Helper()
	ctx := context.Background()
	var total atomic.Int64
	count := func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			return err
		}
		for _, line := range strings.Split(info, "\n") {
			v, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls=")
			if !ok {
				continue
			}
			v, _, _ = strings.Cut(v, ",")
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return err
			}
			total.Add(n)
		}
		return nil
	}
	switch c := shared.Client(t).(type) {
	case *redis.ClusterClient:
		require.NoError(t, c.ForEachMaster(ctx, count))
	case *redis.Client:
		require.NoError(t, count(ctx, c))
	default:
		t.Skipf("commandstats of a %T", c)
	}
	return total.Load()
}

// TestExitForgetGoneReadsNoEntries: forgetting the exits of 100 proxies
// that left the pool, on an IP with 20,000 entries, carries nothing (they
// have no state left) and so never reads the IP's entries (SMEMBERS: one
// such call took 674 ms); it takes them out of the IP's set and leaves the
// other entries there.
func TestExitForgetGoneReadsNoEntries(t *testing.T) {
	ctx := context.Background()
	prefix := testPrefix()
	_, sw := farmPool(t, prefix, 2)
	ec := newEcho(t, 0)
	c := &probe.Checker{Switch: sw, EchoURL: ec.site.URL(), Timeout: time.Second, Exits: true}
	_, err := c.Check(ctx)
	require.NoError(t, err)
	leaseAll(t, sw, "shop.example") // a site with cooling slots: carry looks at it

	// The exits of 100 proxies gone from the pool (rotated sessions, say),
	// on one IP with 20,000 entries.
	base, err := engine.KeyBase(prefix, sw.Pool())
	require.NoError(t, err)
	const ip = "10.77.0.1"
	rdb := shared.Client(t)
	var gone []string
	var members []any
	for i := range 20000 {
		id := fmt.Sprintf("gone%05d", i)
		if i < 100 {
			gone = append(gone, id)
			require.NoError(t, rdb.HSet(ctx, base+":exit", id, ip).Err())
		}
		members = append(members, id)
	}
	for part := range slices.Chunk(members, 1000) {
		require.NoError(t, rdb.SAdd(ctx, base+":exit:"+ip, part...).Err())
	}

	before := commandCalls(t, "smembers")
	start := time.Now()
	require.NoError(t, probe.ForgetExits(ctx, c, gone...))
	took := time.Since(start)
	require.Equal(t, before, commandCalls(t, "smembers"), "forgetting proxies with nothing to carry read the IP's entries")
	t.Logf("forgot 100 exits on an IP of 20,000 entries in %v", took)
	exits, err := c.ExitIPs(ctx)
	require.NoError(t, err)
	require.Len(t, exits, 2, "the gone proxies' exits are forgotten, the pool's kept")
	require.Equal(t, int64(20000-100), rdb.SCard(ctx, base+":exit:"+ip).Val())
	require.False(t, rdb.SIsMember(ctx, base+":exit:"+ip, gone[0]).Val())
}

// TestStrictHugeEvery: an Every so long that three of them overflow a
// Duration still holds unprobed entries for a day, the most, rather than
// failing every strict round.
func TestStrictHugeEvery(t *testing.T) {
	b := newExitBed(t, 240)
	ctx := context.Background()
	sw := newSwitch(t, testPrefix())
	_, err := sw.Add(ctx, b.urls()...)
	require.NoError(t, err)
	_, err = (&probe.Checker{Switch: sw, EchoURL: b.echo.URL(), Exits: true, Strict: true, Every: 1 << 62, Transport: b.transport}).Check(ctx)
	require.NoError(t, err)
}
