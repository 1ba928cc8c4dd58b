package metrics

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/proxyswitch/proxyswitch/internal/testlog"
	"github.com/proxyswitch/proxyswitch/shard"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// End-to-end: real Colly collectors through the Switch, a real redis-server,
// fake sites and proxies on loopback; the testbed's recorders, the fake
// marketplace's decisions and the Switch's own counters are the ground
// truth the scraped values must match.

// crawler is a synchronous collector attached to sw that counts what
// reaches the user's callbacks.
type crawler struct {
	*colly.Collector
	oks, errs atomic.Int64
}

func newCrawler(sw *proxyswitch.Switch, opts ...colly.CollectorOption) *crawler {
	c := &crawler{Collector: colly.NewCollector(append([]colly.CollectorOption{colly.AllowURLRevisit()}, opts...)...)}
	sw.Attach(c.Collector)
	c.OnResponse(func(*colly.Response) { c.oks.Add(1) })
	c.OnError(func(*colly.Response, error) { c.errs.Add(1) })
	return c
}

func (c *crawler) visitPages(t *testing.T, site *testbed.Site, n int) {
	t.Helper()
	for i := range n {
		require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), i%testbed.DefaultProductCount+1)))
	}
	c.Wait()
}

func proxyID(t *testing.T, p *testbed.Proxy) string {
	t.Helper()
	pp, err := proxyswitch.ParseProxy(p.URL())
	require.NoError(t, err)
	return pp.ID()
}

// TestScriptedCrawl crawls a plain shop and a marketplace through six
// proxies with passwords: one burnt on the marketplace (403), one dead
// (refuses connections: a proxy failure on each site, then marked dead),
// one slow. Then an operator bans, drains and revives proxies, and three
// shopper tasks run sticky sessions on the shop (one retired by its request
// limit, one ended, one retired by an operator's ban). Every scraped number
// is checked against the ground truth.
func TestScriptedCrawl(t *testing.T) {
	ctx := context.Background()
	shop := testbed.NewSite(t, "shop", nil)
	market := testbed.NewMarketplace(nil)
	mkt := testbed.NewSite(t, "market", market)
	proxies := testbed.NewProxies(t, 6)
	urls := make([]string, len(proxies))
	for i, p := range proxies {
		p.SetCredentials(fmt.Sprintf("%s-user%d", proxyUser, i), proxySecret)
		urls[i] = p.URL()
	}
	slow, burnt, dead := proxies[3], proxies[4], proxies[5]
	slow.SetMode(testbed.ProxySlow)
	slow.SetDelay(150 * time.Millisecond)
	market.Burn(burnt.SourceIP().String(), testbed.Forbid)
	dead.SetMode(testbed.ProxyDead)

	var logs testlog.Buffer
	prefix := nextPrefix()
	sw := switchOn(t, shared.Client(t), prefix, proxyswitch.WithLogger(logs.Logger()),
		proxyswitch.WithBans(proxyswitch.Bans{Quarantine: time.Hour, QuarantineMax: 2 * time.Hour, FailureQuarantine: 10 * time.Minute, FailureQuarantineMax: 20 * time.Minute, DeadAfter: 2}), proxyswitch.WithSessions(proxyswitch.Sessions{MaxRequests: 3}))
	_, err := sw.Add(ctx, urls...)
	require.NoError(t, err)
	col := New(sw, WithServer("worker-1"), WithTopProxies(3))
	state := NewState(sw, WithLogger(logs.Logger()))
	startMember(t, sw, prefix, "worker-1", shard.MemberConfig{Changed: col.ObserveMembers})

	c := newCrawler(sw)
	c.visitPages(t, shop, 20)
	c.visitPages(t, mkt, 20)
	require.EqualValues(t, 40, c.oks.Load(), "every page came through another proxy")
	require.Zero(t, c.errs.Load())

	// Ground truth.
	a, b := shop.Host(), mkt.Host()
	require.Equal(t, 20, shop.Recorder().Count())
	require.Equal(t, 21, mkt.Recorder().Count())
	require.Equal(t, 1, market.Count(testbed.DecidedForbidden))
	require.Zero(t, dead.Requests())
	require.Equal(t, map[proxyswitch.BanKey]int64{
		{Site: a, Reason: ban.ReasonProxyConnect}: 1,
		{Site: b, Reason: ban.ReasonProxyConnect}: 1,
		{Site: b, Reason: "http_403"}:             1,
	}, sw.BanCounts())

	f, page := scrape(t, col, state)
	f.expect(t, []want{
		{"proxyswitch_attempts_total", []string{"pool=default", "server=worker-1", "site=" + a, "outcome=ok"}, 20},
		{"proxyswitch_attempts_total", []string{"site=" + a, "outcome=proxy_failure"}, 1},
		{"proxyswitch_attempts_total", []string{"site=" + b, "outcome=ok"}, 20},
		{"proxyswitch_attempts_total", []string{"site=" + b, "outcome=ban"}, 1},
		{"proxyswitch_attempts_total", []string{"site=" + b, "outcome=proxy_failure"}, 1},
		{"proxyswitch_bans_total", []string{"site=" + a, "kind=proxy_failure", "reason=proxy_connect"}, 1},
		{"proxyswitch_bans_total", []string{"site=" + b, "kind=proxy_failure", "reason=proxy_connect"}, 1},
		{"proxyswitch_bans_total", []string{"site=" + b, "kind=ban", "reason=http_403"}, 1},
		{"proxyswitch_proxies_marked_dead_total", []string{"reason=proxy_connect"}, 1},
		{"proxyswitch_members", nil, 1},
		{"proxyswitch_tracked_proxies", nil, 6},
		// State read from Redis: the dead proxy is out of both sites, the
		// burnt one quarantined on the marketplace.
		{"proxyswitch_pool_proxies", []string{"pool=default"}, 6},
		{"proxyswitch_sites", nil, 2},
		{"proxyswitch_pool_members", nil, 1},
		{"proxyswitch_state_up", nil, 1},
		{"proxyswitch_dead_proxies", []string{"reason=proxy_connect"}, 1},
		{"proxyswitch_site_slots", []string{"site=" + a, "state=free"}, 5},
		{"proxyswitch_site_slots", []string{"site=" + a, "state=dead"}, 1},
		{"proxyswitch_site_slots", []string{"site=" + a, "state=quarantined"}, 0},
		{"proxyswitch_site_slots", []string{"site=" + b, "state=free"}, 4},
		{"proxyswitch_site_slots", []string{"site=" + b, "state=quarantined"}, 1},
		{"proxyswitch_site_slots", []string{"site=" + b, "state=dead"}, 1},
		{"proxyswitch_site_slots", []string{"site=" + b, "state=leased"}, 0},
		{"proxyswitch_site_slots", []string{"site=" + b, "state=cooling"}, 0},
	}...)
	// Sums over outcomes equal what the sites saw plus the failed attempts.
	assert.Equal(t, float64(shop.Recorder().Count()+1), f.sum("proxyswitch_attempts_total", "site="+a))
	assert.Equal(t, float64(mkt.Recorder().Count()+1), f.sum("proxyswitch_attempts_total", "site="+b))
	n, _, _ := f.histogram("proxyswitch_attempt_duration_seconds", "site="+a)
	assert.EqualValues(t, 21, n)
	n, _, _ = f.histogram("proxyswitch_attempt_duration_seconds", "site="+b)
	assert.EqualValues(t, 22, n)

	// Quarantine lengths, jittered by up to 15%: a ban's is the first
	// quarantine of Bans.EvidenceFirst (1m; the retry served through another
	// proxy then confirms it, unobserved, to the base), a failure's the base.
	n, sum, ok := f.histogram("proxyswitch_quarantine_duration_seconds", "site="+b, "kind=ban")
	require.True(t, ok)
	assert.EqualValues(t, 1, n)
	assert.InDelta(t, 60, sum, 60*0.151)
	n, sum, ok = f.histogram("proxyswitch_quarantine_duration_seconds", "site="+a, "kind=proxy_failure")
	require.True(t, ok)
	assert.EqualValues(t, 1, n)
	assert.InDelta(t, 600, sum, 600*0.151)

	// The three worst proxies: the dead one (0 of 2), the burnt one (one
	// 403 among its attempts), the slow one (all good, 150ms slower).
	idDead, idBurnt, idSlow := proxyID(t, dead), proxyID(t, burnt), proxyID(t, slow)
	hits := func(p *testbed.Proxy) int {
		ip := p.SourceIP().String()
		return shop.Recorder().IPs()[ip] + mkt.Recorder().IPs()[ip]
	}
	assert.ElementsMatch(t, []string{idDead, idBurnt, idSlow}, f.labelValues("proxyswitch_proxy_success_ratio", "proxy"))
	for _, tc := range []struct {
		id       string
		attempts int
		success  float64
	}{
		{idDead, 2, 0},
		{idBurnt, hits(burnt), float64(hits(burnt)-1) / float64(hits(burnt))},
		{idSlow, hits(slow), 1},
	} {
		v, _ := f.value("proxyswitch_proxy_window_attempts", "proxy="+tc.id)
		assert.Equal(t, float64(tc.attempts), v, tc.id)
		v, _ = f.value("proxyswitch_proxy_success_ratio", "proxy="+tc.id)
		assert.InDelta(t, tc.success, v, 1e-9, tc.id)
	}
	lat, _ := f.value("proxyswitch_proxy_latency_seconds", "proxy="+idSlow)
	assert.GreaterOrEqual(t, lat, 0.150)
	assert.Less(t, lat, 2.0)

	// An operator bans one proxy on the shop, drains another, revives the
	// dead one.
	require.NoError(t, sw.Ban(ctx, urls[0], a, 90*time.Minute))
	require.NoError(t, func() error { _, err := sw.Drain(ctx, "", proxyID(t, proxies[1])); return err }())
	revived, err := sw.Revive(ctx, "", idDead)
	require.NoError(t, err)
	require.Equal(t, 1, revived)
	f, page2 := scrape(t, col, state)
	f.expect(t, []want{
		{"proxyswitch_site_slots", []string{"site=" + a, "state=quarantined"}, 1},
		{"proxyswitch_site_slots", []string{"site=" + a, "state=dead"}, 1},
		{"proxyswitch_site_slots", []string{"site=" + a, "state=free"}, 4},
		{"proxyswitch_site_slots", []string{"site=" + b, "state=dead"}, 1},
		{"proxyswitch_site_slots", []string{"site=" + b, "state=quarantined"}, 1},
		{"proxyswitch_dead_proxies", []string{"reason=drained"}, 1},
	}...)
	assert.Empty(t, f.find("proxyswitch_dead_proxies", map[string]string{"reason": "proxy_connect"}), "revived")
	n, sum, _ = f.histogram("proxyswitch_quarantine_duration_seconds", "site="+a, "kind=ban")
	assert.EqualValues(t, 1, n, "the operator's ban")
	assert.GreaterOrEqual(t, sum, 90*60.0)
	assert.LessOrEqual(t, sum, 2*3600.0)

	page3 := scriptedSessions(t, sw, c, col, state, shop, proxies[0], dead)
	for _, out := range []string{page, page2, page3, logs.String()} {
		assert.NotContains(t, out, proxyUser)
		assert.NotContains(t, out, proxySecret)
		assert.NotContains(t, out, redisSecret)
	}
	for _, p := range proxies {
		assert.NotContains(t, page+page2+page3, p.Addr(), "proxies are named by ID only")
	}
}

// scriptedSessions is TestScriptedCrawl's last act: sticky sessions on
// shop, with Sessions{MaxRequests: 3}. The operator drains the dead proxy
// (revived in Redis, still refusing connections) and unbans proxy 0 on the
// shop: with proxy 1 drained, the sessions have proxies 0, 2, 3 and 4. The
// shop's recorder is the ground truth: each session of a task is a run of
// requests from one IP.
func scriptedSessions(t *testing.T, sw *proxyswitch.Switch, c *crawler, col *Collector, state *StateCollector,
	shop *testbed.Site, unban, dead *testbed.Proxy) string {
	ctx := context.Background()
	require.NoError(t, func() error { _, err := sw.Drain(ctx, "", proxyID(t, dead)); return err }())
	require.NoError(t, sw.Unban(ctx, proxyID(t, unban), shop.Host()))
	before := shop.Recorder().Count()
	step := func(task string, n int) {
		t.Helper()
		u := fmt.Sprintf("%s/p/%d?task=%s", shop.URL(), n, task)
		require.NoError(t, c.Request("GET", u, nil, proxyswitch.NewTaskContext(task), nil))
	}
	for n := 1; n <= 4; n++ {
		step("cart-1", n) // a session of 3 requests, retired (max_requests), then one of 1
	}
	step("cart-2", 1)
	step("cart-2", 2)
	ended, err := sw.EndSession(ctx, "cart-2")
	require.NoError(t, err)
	require.True(t, ended)
	step("cart-3", 1)
	s3, err := sw.Session(ctx, "cart-3")
	require.NoError(t, err)
	require.NotNil(t, s3)
	require.NoError(t, sw.Ban(ctx, s3.ProxyID, shop.Host(), time.Hour))
	step("cart-3", 2) // the ban retires the session (quarantined) before the request leaves
	live, err := sw.LiveSessions(ctx)
	require.NoError(t, err)

	// Ground truth: the runs of one IP per task at the shop.
	runs := map[string][]int{}
	last := map[string]string{}
	for _, h := range shop.Recorder().Hits()[before:] {
		task := strings.TrimPrefix(h.Query, "task=")
		if last[task] != h.ClientIP {
			runs[task] = append(runs[task], 0)
			last[task] = h.ClientIP
		}
		runs[task][len(runs[task])-1]++
	}
	require.Equal(t, map[string][]int{"cart-1": {3, 1}, "cart-2": {2}, "cart-3": {1, 1}}, runs)
	require.Equal(t, 2, live, "cart-1's and cart-3's second sessions")

	f, page := scrape(t, col, state)
	f.expect(t, []want{
		{"proxyswitch_sessions_started_total", []string{"pool=default", "server=worker-1"}, 5},
		{"proxyswitch_sessions_ended_total", []string{"reason=" + proxyswitch.SessionMaxRequests}, 1},
		{"proxyswitch_sessions_ended_total", []string{"reason=" + proxyswitch.SessionEnded}, 1},
		{"proxyswitch_sessions_ended_total", []string{"reason=" + proxyswitch.SessionQuarantined}, 1},
		{"proxyswitch_sessions_live", []string{"pool=default"}, 2},
		{"proxyswitch_attempts_total", []string{"site=" + shop.Host(), "outcome=ok"}, float64(20 + 8)},
	}...)
	assert.Equal(t, 3.0, f.sum("proxyswitch_sessions_ended_total"))
	n, sum, ok := f.histogram("proxyswitch_session_requests")
	require.True(t, ok)
	assert.EqualValues(t, 3, n)
	assert.Equal(t, float64(3+2+1), sum, "requests of the three sessions that ended")
	n, sum, ok = f.histogram("proxyswitch_session_duration_seconds")
	require.True(t, ok)
	assert.EqualValues(t, 3, n)
	assert.Greater(t, sum, 0.0)
	assert.Less(t, sum, 60.0)
	return page
}

// TestRecovery times a proxy's way back: banned (403) with a short
// quarantine, forgiven by the site, then used again. The recovery the
// Collector records matches the time between the two hits the site saw.
func TestRecovery(t *testing.T) {
	ctx := context.Background()
	market := testbed.NewMarketplace(nil)
	site := testbed.NewSite(t, "market", market)
	proxies := testbed.NewProxies(t, 2)
	ip := proxies[0].SourceIP().String()
	market.Burn(ip, testbed.Forbid)
	sw := newSwitch(t, proxyswitch.WithBans(proxyswitch.Bans{Quarantine: 300 * time.Millisecond, QuarantineMax: time.Second}))
	_, err := sw.Add(ctx, proxies[0].URL(), proxies[1].URL())
	require.NoError(t, err)
	col := New(sw)

	c := newCrawler(sw)
	c.visitPages(t, site, 2)
	require.Equal(t, 1, market.Count(testbed.DecidedForbidden))
	market.Burn(ip, testbed.Serve)
	deadline := time.Now().Add(10 * time.Second)
	for site.Recorder().IPs()[ip] < 2 && time.Now().Before(deadline) {
		c.visitPages(t, site, 1)
		time.Sleep(20 * time.Millisecond)
	}
	require.Equal(t, 2, site.Recorder().IPs()[ip])

	var banned, back time.Time
	for _, h := range market.Hits() {
		if h.IP != ip {
			continue
		}
		if h.Decision == testbed.DecidedForbidden {
			banned = h.At
		} else if back.IsZero() {
			back = h.At
		}
	}
	f, _ := scrape(t, col)
	n, sum, ok := f.histogram("proxyswitch_recovery_duration_seconds", "site="+site.Host())
	require.True(t, ok)
	assert.EqualValues(t, 1, n)
	assert.GreaterOrEqual(t, sum, 0.85*0.3)
	assert.InDelta(t, back.Sub(banned).Seconds(), sum, 0.1, "the site saw the ban at %v and the proxy back at %v", banned, back)
}

// TestLoadSplitAcrossServers runs two workers ("servers") on one pool,
// each with its own Collector and /metrics, and checks the per-server
// counters against the site's own count: the load split the dashboard
// computes from them is the real one.
func TestLoadSplitAcrossServers(t *testing.T) {
	ctx := context.Background()
	bed := testbed.NewBed(t, 1, 4)
	prefix := fmt.Sprintf("m%d", prefixSeq.Add(1))
	swA := switchOn(t, shared.Client(t), prefix)
	swB := switchOn(t, shared.Client(t), prefix)
	_, err := swA.Add(ctx, bed.ProxyURLs()...)
	require.NoError(t, err)
	colA, colB := New(swA, WithServer("a")), New(swB, WithServer("b"))

	ca := newCrawler(swA, colly.Async(true))
	cb := newCrawler(swB, colly.Async(true))
	for _, c := range []*crawler{ca, cb} {
		require.NoError(t, c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: 2}))
	}
	done := make(chan struct{})
	go func() { ca.visitPages(t, bed.Sites[0], 30); close(done) }()
	cb.visitPages(t, bed.Sites[0], 10)
	<-done
	require.EqualValues(t, 40, ca.oks.Load()+cb.oks.Load())

	fa, _ := scrape(t, colA)
	fb, _ := scrape(t, colB)
	na := fa.sum("proxyswitch_attempts_total", "server=a")
	nb := fb.sum("proxyswitch_attempts_total", "server=b")
	assert.Equal(t, 30.0, na)
	assert.Equal(t, 10.0, nb)
	assert.Equal(t, float64(bed.Sites[0].Recorder().Count()), na+nb)
	assert.InDelta(t, 0.75, na/(na+nb), 1e-9)
	assertGroundTruth(t, bed)

	// Both servers' collectors fit in one registry too (a process running
	// two Switches): the server label tells them apart.
	f, _ := scrape(t, colA, colB)
	assert.Equal(t, []string{"a", "b"}, f.labelValues("proxyswitch_attempts_total", "server"))
}

func assertGroundTruth(t *testing.T, bed *testbed.Bed) {
	t.Helper()
	siteColl, proxyColl := bed.Collisions()
	assert.Zero(t, siteColl)
	assert.Zero(t, proxyColl)
	assert.Zero(t, bed.DirectHits())
}

// TestStateCollectorWhenRedisFails: a scrape still answers, with
// proxyswitch_state_up 0, when Redis refuses the password or is gone; one
// warning per run of failures, and no secret anywhere.
func TestStateCollectorWhenRedisFails(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	prefix := fmt.Sprintf("m%d", prefixSeq.Add(1))
	sw := switchOn(t, rdb, prefix)
	_, err := sw.Add(ctx, "http://u:"+proxySecret+"@127.0.0.1:3128")
	require.NoError(t, err)

	var logs testlog.Buffer
	wrong := shared.Client(t, func(o *redis.Options) { o.Password = "wrong-" + redisSecret })
	bad := NewState(switchOn(t, wrong, prefix, proxyswitch.WithTimeouts(proxyswitch.Timeouts{Redis: time.Second})), WithLogger(logs.Logger()))
	for range 3 {
		f, page := scrape(t, bad)
		v, ok := f.value("proxyswitch_state_up")
		require.True(t, ok)
		assert.Zero(t, v)
		assert.NotContains(t, page, redisSecret)
		assert.NotContains(t, page, proxySecret)
	}
	assert.Equal(t, 1, strings.Count(logs.String(), "level=WARN"), logs.String())

	good := NewState(sw, WithLogger(logs.Logger()))
	f, _ := scrape(t, good)
	v, _ := f.value("proxyswitch_state_up")
	assert.Equal(t, 1.0, v)
	v, _ = f.value("proxyswitch_pool_proxies")
	assert.Equal(t, 1.0, v, "a pool no one leased from yet")

	srv := redistest.Start(t, "--requirepass", redisSecret)
	gone := srv.Client(t)
	require.NoError(t, srv.Kill())
	down := NewState(switchOn(t, gone, prefix, proxyswitch.WithTimeouts(proxyswitch.Timeouts{Redis: 200 * time.Millisecond})),
		WithLogger(logs.Logger()), WithScrapeTimeout(time.Second))
	start := time.Now()
	f, page := scrape(t, down)
	assert.Less(t, time.Since(start), 5*time.Second)
	v, _ = f.value("proxyswitch_state_up")
	assert.Zero(t, v)
	assert.NotContains(t, page+logs.String(), redisSecret)
	assert.NotContains(t, page+logs.String(), proxySecret)
}

// TestBanSpikeAfterJoin wires the Collector to a real Membership: a second
// server registers, the heartbeat reports the longer list, and the site
// starts banning right then (as it would with two servers' shards
// overlapping). The join is counted and the spike signalled, with the ban
// shares the marketplace's own decisions give.
func TestBanSpikeAfterJoin(t *testing.T) {
	ctx := context.Background()
	market := testbed.NewMarketplace(nil)
	site := testbed.NewSite(t, "market", market)
	proxies := testbed.NewProxies(t, 6)
	prefix := nextPrefix()
	// Bans{EvidenceFirst: Off, PageProxies: Off}: three of six proxies burnt at once while
	// healthy. Once one of them is proven burnt (a page it refused is
	// served through another proxy), the others are no witnesses of a page
	// refusing everyone until healthy again; but a request that meets two
	// of them in a row before that sees what a page refusing everyone shows
	// (two proxies healthy on the site's other pages refuse it) and fails
	// with ErrPageRefused (3 of 4 runs, by the order of the rotation). This
	// test is about the spike, counted on bans.
	sw := switchOn(t, shared.Client(t), prefix, proxyswitch.WithBans(proxyswitch.Bans{Quarantine: time.Hour, QuarantineMax: time.Hour, Retries: 3, EvidenceFirst: proxyswitch.Off, PageProxies: proxyswitch.Off}))
	for _, p := range proxies {
		_, err := sw.Add(ctx, p.URL())
		require.NoError(t, err)
	}
	col := New(sw, WithServer("w1"))
	fast := shard.MemberConfig{Heartbeat: 50 * time.Millisecond, TTL: 500 * time.Millisecond}
	w1 := fast
	w1.Changed = col.ObserveMembers
	startMember(t, sw, prefix, "w1", w1)

	c := newCrawler(sw)
	c.visitPages(t, site, 30) // before: no bans
	// A second server of the same pool registers.
	startMember(t, switchOn(t, shared.Client(t), prefix), prefix, "w2", fast)
	require.Eventually(t, func() bool {
		f, _ := scrape(t, col)
		v, _ := f.value("proxyswitch_member_joins_total")
		return v == 1
	}, 5*time.Second, 20*time.Millisecond)

	hitsBefore := site.Recorder().Count()
	for _, p := range proxies[:3] {
		market.Burn(p.SourceIP().String(), testbed.Forbid)
	}
	c.visitPages(t, site, 30)
	require.EqualValues(t, 60, c.oks.Load())
	bans := market.Count(testbed.DecidedForbidden)
	after := site.Recorder().Count() - hitsBefore
	require.Equal(t, 3, bans, "each burnt proxy banned once, then quarantined")

	f, _ := scrape(t, col)
	f.expect(t, []want{
		{"proxyswitch_members", nil, 2},
		{"proxyswitch_member_joins_total", nil, 1},
		{"proxyswitch_join_ban_ratio", []string{"window=before"}, 0},
		{"proxyswitch_join_ban_ratio", []string{"window=after"}, float64(bans) / float64(after)},
		{"proxyswitch_join_ban_spike", nil, 1},
	}...)
}
