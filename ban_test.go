package proxyswitch

import (
	"context"
	"crypto/sha1"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/engine"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/proxyswitch/proxyswitch/internal/testlog"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// quarantineEnd reads when p's first slot on site is free again, as Redis has
// it: no entry in the site's busy set is free now.
func quarantineEnd(t *testing.T, s *Switch, site string, p *Proxy) time.Time {
	t.Helper()
	score, err := shared.Client(t).ZScore(context.Background(), s.keys.free(s.scopeOf(site)), p.id+":0").Result()
	if errors.Is(err, redis.Nil) {
		return time.Now()
	}
	require.NoError(t, err)
	return time.UnixMilli(int64(score))
}

// leaseAll leases every proxy free for site right now, through a worker of
// s's pool that does not wait, and returns their IDs; the leases are
// released before it returns.
func leaseAll(t *testing.T, s *Switch, site string) map[string]bool {
	t.Helper()
	ctx := context.Background()
	s = sibling(t, s, shared.Client(t))
	s.cfg.maxWait = 0
	ids := map[string]bool{}
	var held []*Lease
	for {
		l, err := s.acquire(ctx, site, "", false)
		if err != nil {
			require.ErrorIs(t, err, ErrNoProxy)
			break
		}
		ids[l.Proxy().ID()] = true
		held = append(held, l)
	}
	for _, l := range held {
		require.NoError(t, l.Release(ctx))
	}
	return ids
}

// TestQuarantineIsClusterWide: a proxy banned through one collector is
// leased by no other worker for that site (another collector with its own
// Redis client, another process) until its quarantine ends, and is leased
// again afterwards.
func TestQuarantineIsClusterWide(t *testing.T) {
	m := testbed.NewMarketplace(nil)
	site, proxies, s := marketBed(t, m, false, 3, WithBans(Bans{Retries: Off, Quarantine: 2 * time.Second, QuarantineMax: 10 * time.Second}))
	burnt := proxies[0]
	m.Burn(burnt.SourceIP().String(), testbed.Forbid)
	pb, err := ParseProxy(burnt.URL())
	require.NoError(t, err)

	c := newPageCollector(t, s)
	var banned time.Time
	for i := 0; banned.IsZero(); i++ {
		require.Less(t, i, 3, "least recently used first reaches every proxy within three requests")
		if err := c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), i+1)); err != nil {
			require.ErrorIs(t, err, ErrBanned)
			banned = time.Now()
		}
	}
	until := quarantineEnd(t, s, site.Host(), pb)
	require.WithinDuration(t, banned.Add(2*time.Second), until, 400*time.Millisecond, "2s, jittered")
	probeEnd := until.Add(-200 * time.Millisecond)

	cmd := startWorker(t, workerSpec{Mode: "probe", Redis: shared.Addr(), Prefix: s.cfg.prefix,
		HoldSites: []string{site.Host()}, Until: probeEnd.UnixMilli()})
	type out struct {
		res workerResult
		err error
	}
	done := make(chan out, 1)
	go func() {
		b, err := cmd.Output()
		if err != nil {
			done <- out{err: err}
			return
		}
		var r workerResult
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		err = json.Unmarshal([]byte(lines[len(lines)-1]), &r)
		done <- out{r, err}
	}()
	other := newPageCollector(t, sibling(t, s, shared.Client(t)))
	pages := 0
	for ; time.Now().Before(probeEnd); pages++ {
		require.NoError(t, other.Visit(fmt.Sprintf("%s/p/%d", site.URL(), 100+pages)))
	}
	o := <-done
	require.NoError(t, o.err)
	assert.NotEmpty(t, o.res.IDs, "the other process leased")
	assert.NotContains(t, o.res.IDs, pb.ID(), "the other process never got the banned proxy")
	assert.Equal(t, pages, other.products, "the other collector got every page, none through the banned proxy")
	for _, h := range site.Recorder().Hits() {
		if h.ClientIP == burnt.SourceIP().String() {
			assert.True(t, h.Start.Before(banned), "a request from the banned IP at %v, ban at %v", h.Start, banned)
		}
	}
	t.Logf("during the quarantine: %d pages through another collector, %d leases in another process",
		pages, o.res.IDs[proxyID(proxies[1])]+o.res.IDs[proxyID(proxies[2])])

	time.Sleep(time.Until(until.Add(50 * time.Millisecond)))
	assert.True(t, leaseAll(t, s, site.Host())[pb.ID()], "leased again after the quarantine")
}

func proxyID(p *testbed.Proxy) string {
	pp, _ := ParseProxy(p.URL())
	return pp.ID()
}

// TestBanBackoff: bans in a row double the quarantine (jittered, capped,
// never below Retry-After), leases wait it out, and a healthy answer starts
// the backoff over. WithBans(Bans{EvidenceFirst: Off, PageProxies: Off}): every refusal a ban at once (the
// ladder of strikes is TestBanEvidenceLadder's).
func TestBanBackoff(t *testing.T) {
	ctx := context.Background()
	const base, maxq = 50 * time.Millisecond, 400 * time.Millisecond
	// WithRotation(Rotation{FlakyDelay: Off}): the quarantine alone holds the proxy back (the
	// flaky delay would keep it out r x 10s: selection_test.go).
	s := newSwitch(t, shared.Client(t), WithBans(Bans{Quarantine: base, QuarantineMax: maxq, EvidenceFirst: Off, PageProxies: Off}), WithTimeouts(Timeouts{MaxWait: 5 * time.Second}), WithRotation(Rotation{FlakyDelay: Off}))
	_, err := s.Add(ctx, proxyURLs(1)...)
	require.NoError(t, err)
	const site = "shop.example"
	ban403 := ban.Verdict{Kind: ban.Ban, Reason: "http_403"}
	within := func(got, want time.Duration, what string) {
		assert.GreaterOrEqual(t, got, want*85/100-time.Millisecond, what)
		assert.LessOrEqual(t, got, min(want*115/100+time.Millisecond, maxq), what)
	}

	var last time.Time
	var lastQ time.Duration
	for i := range 5 {
		l, err := s.Lease(ctx, site)
		require.NoError(t, err)
		if i > 0 {
			assert.GreaterOrEqual(t, time.Since(last), lastQ-20*time.Millisecond, "the lease waited out the quarantine")
		}
		pen, err := s.penalize(ctx, site, l.proxy, l, ban403)
		require.NoError(t, err)
		assert.Equal(t, i+1, pen.strikes)
		within(pen.quarantine, min(base<<i, maxq), fmt.Sprintf("ban %d", i+1))
		last, lastQ = time.Now(), pen.quarantine
		assert.NoError(t, l.Release(ctx), "the ban ended the lease: releasing is a no-op")
	}

	// A healthy answer resets the backoff.
	l, err := s.Lease(ctx, site)
	require.NoError(t, err)
	require.NoError(t, l.Report(ctx, ban.Verdict{Kind: ban.OK}))
	l, err = s.Lease(ctx, site)
	require.NoError(t, err)
	banAt := time.Now()
	pen, err := s.penalize(ctx, site, l.proxy, l, ban403)
	require.NoError(t, err)
	assert.Equal(t, 1, pen.strikes)
	within(pen.quarantine, base, "after a healthy answer")

	// Retry-After is the least quarantine, capped by the max. (These bans
	// come while the proxy is still quarantined, as when several requests
	// through it meet one ban: the same offence, no doubling. A loaded
	// machine may reach a ban only after the quarantine before it ended:
	// then it is a new offence, and doubles.)
	sameOffence := func(since time.Time, q time.Duration, strikes int, what string) {
		switch d := time.Since(since); {
		case d < q*8/10:
			assert.Equal(t, 1, strikes, what)
		case d > q*12/10:
			assert.Equal(t, 2, strikes, what+" (after the quarantine before it ended)")
		}
	}
	pen, err = s.penalize(ctx, site, l.proxy, nil, ban.Verdict{Kind: ban.Ban, Reason: "http_429", RetryAfter: 300 * time.Millisecond})
	require.NoError(t, err)
	assert.GreaterOrEqual(t, pen.quarantine, 300*time.Millisecond)
	sameOffence(banAt, base, pen.strikes, "a ban while quarantined")
	banAt, strikes := time.Now(), pen.strikes
	pen, err = s.penalize(ctx, site, l.proxy, nil, ban.Verdict{Kind: ban.Ban, Reason: "http_429", RetryAfter: time.Hour})
	require.NoError(t, err)
	assert.Equal(t, maxq, pen.quarantine)
	if time.Since(banAt) < 250*time.Millisecond {
		assert.Equal(t, strikes, pen.strikes, "a second ban while quarantined")
	}
	assert.Equal(t, map[BanKey]int64{{site, "http_403"}: 6, {site, "http_429"}: 2}, s.BanCounts())
}

// TestDeadProxyRule pins when failures make a proxy dead (Bans.DeadAfter)
// and what Dead, Revive and Remove do.
func TestDeadProxyRule(t *testing.T) {
	ctx := context.Background()
	s := newSwitch(t, shared.Client(t), WithBans(Bans{FailureQuarantine: 10 * time.Millisecond, FailureQuarantineMax: 20 * time.Millisecond, Quarantine: 10 * time.Millisecond, QuarantineMax: 20 * time.Millisecond, DeadAfter: 3}), WithTimeouts(Timeouts{MaxWait: Off}), WithRotation(Rotation{FlakyDelay: Off})) // the quarantines alone
	ps, err := ParseProxies(proxyURLs(6))
	require.NoError(t, err)
	_, err = s.Add(ctx, proxyURLs(6)...)
	require.NoError(t, err)
	for _, site := range []string{"a.example", "b.example"} { // both sites have a free set
		leaseAll(t, s, site)
	}
	step := func(p *Proxy, what string) bool {
		var v ban.Verdict
		site := "a.example"
		switch what {
		case "softA":
			v = ban.Verdict{Kind: ban.ProxyFailure, Reason: ban.ReasonProxyTimeout}
		case "softB":
			v, site = ban.Verdict{Kind: ban.ProxyFailure, Reason: ban.ReasonProxyGateway}, "b.example"
		case "hard":
			v = ban.Verdict{Kind: ban.ProxyFailure, Reason: ban.ReasonProxyConnect}
		case "ban":
			v = ban.Verdict{Kind: ban.Ban, Reason: "http_403"}
		case "healthy":
			_, err := s.own.redis().releaseMember(ctx, site, "none", "none", p.id)
			require.NoError(t, err)
			return false
		}
		pen, err := s.penalize(ctx, site, p, nil, v)
		require.NoError(t, err)
		return pen.dead
	}
	for i, tc := range []struct {
		steps []string
		dead  bool
	}{
		{[]string{"softA", "softA", "softA", "softA"}, false}, // one site's timeouts: maybe the site
		{[]string{"softA", "softB", "softA"}, true},           // failing on two sites
		{[]string{"hard", "hard", "hard"}, true},              // refusing connections
		{[]string{"hard", "hard", "ban", "hard"}, false},      // a ban proves the proxy works
		{[]string{"hard", "hard", "healthy", "hard"}, false},  // so does a healthy answer
	} {
		dead := false
		for _, st := range tc.steps {
			dead = step(ps[i], st)
		}
		assert.Equal(t, tc.dead, dead, "%v", tc.steps)
	}
	list, err := s.Dead(ctx)
	require.NoError(t, err)
	require.Len(t, list, 2)
	byID := map[string]ProxyState{list[0].Proxy.ID(): list[0], list[1].Proxy.ID(): list[1]}
	assert.Equal(t, ban.ReasonProxyTimeout, byID[ps[1].ID()].Reason)
	assert.Equal(t, ban.ReasonProxyConnect, byID[ps[2].ID()].Reason)
	assert.WithinDuration(t, time.Now(), byID[ps[2].ID()].Since, 5*time.Second)

	time.Sleep(30 * time.Millisecond) // past every other quarantine
	for _, site := range []string{"a.example", "b.example", "fresh.example"} {
		ids := leaseAll(t, s, site)
		assert.Len(t, ids, 4, site)
		assert.NotContains(t, ids, ps[1].ID(), "dead on %s", site)
		assert.NotContains(t, ids, ps[2].ID(), "dead on %s", site)
	}

	n, err := s.Revive(ctx, "", ps[1].URL().String(), ps[5].ID())
	require.NoError(t, err)
	assert.Equal(t, 1, n, "only one of them was dead")
	assert.Contains(t, leaseAll(t, s, "fresh.example"), ps[1].ID(), "revived on every site at once")
	assert.Contains(t, leaseAll(t, s, "a.example"), ps[1].ID())
	_, err = s.Remove(ctx, ps[2].ID())
	require.NoError(t, err)
	list, err = s.Dead(ctx)
	require.NoError(t, err)
	assert.Empty(t, list, "a removed proxy leaves no dead record")
	records, err := shared.Client(t).HLen(ctx, s.keys.dead()).Result()
	require.NoError(t, err)
	assert.Zero(t, records)
}

// TestDeadProxyOutOfEverySiteUntilHealthCheck: a proxy that refuses
// connections is marked dead through a crawl, stays out of every site's
// rotation (a site crawled only later included) and comes back through
// Revive once it works again (probe.CheckDead's test probes it).
func TestDeadProxyOutOfEverySiteUntilHealthCheck(t *testing.T) {
	ctx := context.Background()
	bed := testbed.NewBed(t, 3, 4)
	s := newSwitch(t, shared.Client(t), WithBans(Bans{FailureQuarantine: 10 * time.Millisecond, FailureQuarantineMax: 20 * time.Millisecond, DeadAfter: 3, Retries: 3}),
		WithRotation(Rotation{FlakyDelay: Off})) // the failure quarantine alone, as in TestBanBackoff
	_, err := s.Add(ctx, bed.ProxyURLs()...)
	require.NoError(t, err)
	dead := bed.Proxies[0]
	dead.SetMode(testbed.ProxyDead)
	c := newPageCollector(t, s)
	for i := range 30 {
		require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", bed.Sites[i%2].URL(), i+1)))
		time.Sleep(5 * time.Millisecond) // let failure quarantines lapse
	}
	assert.Equal(t, 30, c.products)
	list, err := s.Dead(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, proxyID(dead), list[0].Proxy.ID())
	failures := s.BanCounts()[BanKey{bed.Sites[0].Host(), ban.ReasonProxyConnect}] + s.BanCounts()[BanKey{bed.Sites[1].Host(), ban.ReasonProxyConnect}]
	assert.Equal(t, int64(3), failures, "dead after three, never tried again")

	for i := range 12 {
		require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", bed.Sites[2].URL(), i+1)))
	}
	assert.Zero(t, s.BanCounts()[BanKey{bed.Sites[2].Host(), ban.ReasonProxyConnect}],
		"never leased on a site first crawled after it died")

	dead.SetMode(testbed.ProxyOK)
	n, err := s.Revive(ctx, "", proxyID(dead)) // what probe.CheckDead does once its probe passes
	require.NoError(t, err)
	require.Equal(t, 1, n)
	for i := range 8 {
		require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", bed.Sites[2].URL(), 100+i)))
	}
	assert.Positive(t, bed.Sites[2].Recorder().IPs()[dead.SourceIP().String()], "back in rotation")
}

// TestBanAllSites: with Bans.AllSites a ban takes the proxy out of every
// site's rotation, sites first crawled later included; without it, only out
// of the banning site's.
func TestBanAllSites(t *testing.T) {
	for _, all := range []bool{false, true} {
		t.Run(fmt.Sprint("all=", all), func(t *testing.T) {
			m := testbed.NewMarketplace(nil)
			site, proxies, s := marketBed(t, m, false, 3, WithBans(Bans{AllSites: all, Retries: Off}), WithTimeouts(Timeouts{MaxWait: Off}))
			leaseAll(t, s, "b.example") // b has a free set before the ban
			m.Burn(proxies[0].SourceIP().String(), testbed.Forbid)
			c := newPageCollector(t, s)
			for i := range 3 {
				_ = c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), i+1))
			}
			require.Len(t, s.BanCounts(), 1)
			burnt := proxyID(proxies[0])
			assert.NotContains(t, leaseAll(t, s, site.Host()), burnt)
			assert.Equal(t, !all, leaseAll(t, s, "b.example")[burnt])
			assert.Equal(t, !all, leaseAll(t, s, "c.example")[burnt], "a site first leased after the ban")
		})
	}
}

// TestBanPathsNeverLeakSecrets: bans, proxy failures, dead proxies and a
// Redis that dies mid-ban, with canary passwords for the proxies and Redis:
// neither appears in errors, logs, counters or listings.
func TestBanPathsNeverLeakSecrets(t *testing.T) {
	const proxyPW, redisPW = "Canary-proxy-pw", "Canary-redis-pw"
	ctx := context.Background()
	srv := redistest.Start(t, "--requirepass", redisPW)
	m := testbed.NewMarketplace(nil)
	site := testbed.NewSite(t, "market", m)
	killer := testbed.NewSite(t, "killer", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_ = srv.Kill() // Redis dies between the lease and the ban
		w.WriteHeader(http.StatusForbidden)
	}))
	proxies := testbed.NewProxies(t, 4)
	urls := make([]string, len(proxies))
	for i, p := range proxies {
		p.SetCredentials("crawler", proxyPW)
		urls[i] = p.URL()
	}
	m.Burn(proxies[0].SourceIP().String(), testbed.Forbid)
	proxies[1].SetCredentials("crawler", "another-secret") // refuses ours: 407
	proxies[2].SetMode(testbed.ProxyDead)
	var logs testlog.Buffer
	s := newSwitch(t, srv.Client(t), WithLogger(logs.Logger()),
		WithBans(Bans{Retries: Off, DeadAfter: 1}), WithTimeouts(Timeouts{Redis: 500 * time.Millisecond}))
	_, err := s.Add(ctx, urls...)
	require.NoError(t, err)

	c := newPageCollector(t, s)
	var errs []string
	for i := range 8 {
		if err := c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), i+1)); err != nil {
			errs = append(errs, err.Error(), fmt.Sprintf("%+v", err))
		}
	}
	dead, err := s.Dead(ctx)
	require.NoError(t, err)
	for _, d := range dead {
		errs = append(errs, d.Proxy.String(), d.Reason)
	}
	if err := c.Visit(killer.URL() + "/p/1"); err != nil {
		errs = append(errs, err.Error())
	}
	if err := c.Visit(site.URL() + "/p/99"); err != nil {
		errs = append(errs, err.Error())
	}
	for k := range s.BanCounts() {
		errs = append(errs, k.Site, k.Reason)
	}
	reasons := map[string]bool{}
	for k := range s.BanCounts() {
		reasons[k.Reason] = true
	}
	assert.Equal(t, map[string]bool{"http_403": true, ban.ReasonProxyAuth: true, ban.ReasonProxyConnect: true}, reasons)
	assert.NotEmpty(t, dead)
	all := strings.Join(errs, "\n") + logs.String()
	assert.Contains(t, all, "quarantine failed", "the Redis failure was logged")
	assert.Contains(t, all, "xxxxx:xxxxx@", "proxies are named, redacted")
	assert.NotContains(t, all, proxyPW)
	assert.NotContains(t, all, redisPW)
}

// TestBanCoversEverySlotAndKeepsKeysTidy: with K slots per proxy, a ban
// takes all of them, a slot another request holds included (it does not come
// back when that request releases it); and the ban state lives under the
// pool's hash tag, with TTLs, except the operator's dead list.
func TestBanCoversEverySlotAndKeepsKeysTidy(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	const site = "ozon.example"
	s := newSwitch(t, rdb, WithRotation(Rotation{Concurrency: 2}), WithTimeouts(Timeouts{MaxWait: Off}), WithBans(Bans{AllSites: true, DeadAfter: 1, Quarantine: 300 * time.Millisecond, QuarantineMax: time.Second}), WithRotation(Rotation{FlakyDelay: Off})) // the quarantine alone, as in TestBanBackoff
	_, err := s.Add(ctx, proxyURLs(2)...)
	require.NoError(t, err)
	a, err := s.Lease(ctx, site)
	require.NoError(t, err)
	b, err := s.acquire(ctx, site, a.Proxy().ID(), false) // the rotation offers the next proxy: ask for this one
	require.NoError(t, err)
	require.Equal(t, a.Proxy().ID(), b.Proxy().ID(), "two slots of one proxy")
	banned := a.Proxy()
	require.NoError(t, b.Report(ctx, ban.Verdict{Kind: ban.Ban, Reason: "http_403"}))
	require.NoError(t, a.Release(ctx), "the other holder's release")
	for range 2 {
		assert.NotContains(t, leaseAll(t, s, site), banned.ID(), "no slot of the banned proxy is free")
	}
	time.Sleep(400 * time.Millisecond)
	assert.Contains(t, leaseAll(t, s, site), banned.ID(), "back after the quarantine")

	// A failure that kills the other proxy, to have every kind of key.
	l, err := s.Lease(ctx, "avito.example")
	require.NoError(t, err)
	for l.Proxy().ID() == banned.ID() {
		l, err = s.Lease(ctx, "avito.example")
		require.NoError(t, err)
	}
	require.NoError(t, l.Report(ctx, ban.Verdict{Kind: ban.ProxyFailure, Reason: ban.ReasonProxyConnect}))
	keys := keysMatching(t, rdb, "{"+s.cfg.prefix+":*")
	kinds := map[string]bool{}
	for _, k := range keys {
		assert.Equal(t, redisKeySlot(keys[0]), redisKeySlot(k), k)
		kind := strings.Split(strings.TrimPrefix(k, "{"+s.cfg.prefix+":default}:"), ":")[0]
		kinds[kind] = true
		ttl, err := rdb.PTTL(ctx, k).Result()
		require.NoError(t, err)
		switch kind {
		case "proxies", "meta", "order", "dead":
			assert.Equal(t, time.Duration(-1), ttl, "%s is configuration or operator state and lives on", k)
		default:
			assert.Positive(t, ttl, "%s carries a TTL", k)
		}
	}
	for _, kind := range []string{"strikes", "fails", "quarantine", "dead"} {
		assert.True(t, kinds[kind], "no %s key among %v", kind, keys)
	}
}

// TestBansOnRedisCluster: the ban scripts touch keys they derive
// themselves (the meta hash for a dead proxy, the dead hash and the
// quarantine zset in a session's or Stats' reads),
// all under the pool's hash tag, so they run on a Redis Cluster too.
func TestBansOnRedisCluster(t *testing.T) {
	ctx := context.Background()
	s := newSwitch(t, redistest.StartCluster(t, 3).Client(t), WithBans(Bans{AllSites: true, DeadAfter: 1}), WithTimeouts(Timeouts{MaxWait: Off}))
	ps, err := ParseProxies(proxyURLs(3))
	require.NoError(t, err)
	_, err = s.Add(ctx, proxyURLs(3)...)
	require.NoError(t, err)
	free := func(site string) int {
		st, err := s.Stats(ctx, site)
		require.NoError(t, err)
		return st.FreeSlots
	}
	l, err := s.Lease(ctx, "a.example")
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	_, err = s.penalize(ctx, "b.example", ps[0], nil, ban.Verdict{Kind: ban.Ban, Reason: "http_403"})
	require.NoError(t, err)
	_, err = s.penalize(ctx, "b.example", ps[1], nil, ban.Verdict{Kind: ban.ProxyFailure, Reason: ban.ReasonProxyConnect})
	require.NoError(t, err)
	dead, err := s.Dead(ctx)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	assert.Equal(t, 1, free("a.example"), "banned on every site, the other one dead")
	l, err = s.Lease(ctx, "c.example")
	require.NoError(t, err)
	assert.Equal(t, ps[2].ID(), l.Proxy().ID(), "a new site starts without them")
	require.NoError(t, l.Report(ctx, ban.Verdict{Kind: ban.OK}))
	n, err := s.Revive(ctx, "", ps[1].ID())
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.Equal(t, 2, free("a.example"))
}

// scriptLog is a redis.Hook that records the script (by name) of every
// EVALSHA and EVAL sent through the client it is added to.
type scriptLog struct {
	mu    sync.Mutex
	bySHA map[string]string
	names []string
}

func newScriptLog() *scriptLog {
	l := &scriptLog{bySHA: map[string]string{}}
	for _, name := range engine.Root.Names() {
		l.bySHA[engine.Root.Script(name).Hash()] = name
	}
	return l
}

func (l *scriptLog) DialHook(next redis.DialHook) redis.DialHook { return next }
func (l *scriptLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n == "evalsha" || n == "eval" {
			name := "?"
			if a := cmd.Args(); len(a) > 1 {
				if s, ok := a[1].(string); ok {
					if n == "eval" {
						s = fmt.Sprintf("%x", sha1.Sum([]byte(s)))
					}
					name = l.bySHA[s]
				}
			}
			l.mu.Lock()
			l.names = append(l.names, name)
			l.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}
func (l *scriptLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// take returns the scripts run since the last take, but those a Switch
// runs in the background (its copy of the pool, lease renewals, its
// membership) and the circuit breaker's report of a ban that is evidence
// (breaker.go: the site's ban rate, not the proxy's penalty), and forgets
// them.
func (l *scriptLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, n := range l.names {
		switch n {
		case "pool_snapshot", "extend_many", "member_heartbeat", "member_list", "breaker":
		default:
			out = append(out, n)
		}
	}
	l.names = nil
	return out
}

// A ban costs one round trip: penalize.lua for a plain proxy (it checks
// whether the proxy is a gateway's in the same call), pool_update.lua's
// rotate for a gateway session the pool's copy knows; two only for a
// session the copy does not know yet (penalize.lua returns its template,
// then rotate). Each still does what it did: the plain proxy is
// quarantined, the session rotated.
func TestBanRoundTrips(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	for _, name := range engine.Root.Names() { // loaded: no NOSCRIPT, EVAL pair counts here
		require.NoError(t, engine.Root.Script(name).Load(ctx, rdb).Err())
	}
	log := newScriptLog()
	rdb.AddHook(log)
	s := newSwitch(t, rdb, WithTimeouts(Timeouts{MaxWait: Off}))
	_, err := s.Add(ctx, proxyURLs(3)...)
	require.NoError(t, err)
	const site = "shop.example"
	for i := range 3 {
		l, err := s.Lease(ctx, site)
		require.NoError(t, err)
		log.take()
		require.NoError(t, l.Report(ctx, ban.Verdict{Kind: ban.Ban, Reason: "http_403"}))
		assert.Equal(t, []string{"penalize"}, log.take(), "ban %d of a plain proxy: one call", i+1)
		assert.Equal(t, StateQuarantined, stateOf(t, s, site, l.Proxy().ID()), "a plain ban still quarantines")
	}

	// A gateway's sessions, in a pool with plain proxies.
	g := newSwitch(t, rdb, WithTimeouts(Timeouts{MaxWait: Off}))
	_, err = g.Add(ctx, "http://user-session-{session:3}:pw@gw.example:7000", "http://plain:pw@127.0.0.2:8080")
	require.NoError(t, err)
	rp := g.own.redis()
	_, err = rp.refreshSnapshot(ctx)
	require.NoError(t, err)
	lease := func(gw bool) *Lease {
		t.Helper()
		var held []*Lease
		defer func() {
			for _, h := range held {
				require.NoError(t, h.Release(ctx))
			}
		}()
		for {
			l, err := g.Lease(ctx, site)
			require.NoError(t, err)
			if isGW := !strings.Contains(l.proxy.raw(), "plain"); isGW == gw {
				return l
			}
			held = append(held, l)
		}
	}
	l := lease(true)
	require.NotEmpty(t, rp.snapshot().gatewayOf(l.proxy.id), "the copy knows the session")
	log.take()
	require.NoError(t, l.Report(ctx, ban.Verdict{Kind: ban.Ban, Reason: "http_403"}))
	assert.Equal(t, []string{"pool_update"}, log.take(), "a session the copy knows: rotated in one call")
	assert.NotContains(t, poolIDs(t, g), l.proxy.id, "rotated")
	assert.Len(t, poolIDs(t, g), 4)

	// The session rotated in is not in the copy (read before the rotate).
	var fresh string
	for _, id := range poolIDs(t, g) {
		if rp.snapshot().gatewayOf(id) == "" && id != mustID(t, "http://plain:pw@127.0.0.2:8080") {
			fresh = id
		}
	}
	require.NotEmpty(t, fresh, "a session newer than the copy")
	px, err := g.find(ctx, fresh)
	require.NoError(t, err)
	log.take()
	_, err = g.penalize(ctx, site, px, nil, ban.Verdict{Kind: ban.Ban, Reason: "http_403"})
	require.NoError(t, err)
	assert.Equal(t, []string{"penalize", "pool_update"}, log.take(), "a session newer than the copy: its template from penalize.lua, then rotate")
	assert.NotContains(t, poolIDs(t, g), fresh, "rotated, not quarantined")
	assert.Len(t, poolIDs(t, g), 4)

	// The plain proxy of the same pool: one call, quarantined.
	l = lease(false)
	log.take()
	require.NoError(t, l.Report(ctx, ban.Verdict{Kind: ban.Ban, Reason: "http_403"}))
	assert.Equal(t, []string{"penalize"}, log.take(), "a plain proxy beside gateways: one call")
	assert.Equal(t, StateQuarantined, stateOf(t, g, site, l.Proxy().ID()))
}

// stateOf returns the state of proxy id on site, as ProxyStates has it.
func stateOf(t *testing.T, s *Switch, site, id string) string {
	t.Helper()
	st, err := s.ProxyStates(context.Background(), site)
	require.NoError(t, err)
	for _, ps := range st {
		if ps.Proxy.ID() == id {
			return ps.State
		}
	}
	t.Fatalf("proxy %s not in the pool", id)
	return ""
}

func mustID(t *testing.T, raw string) string {
	t.Helper()
	p, err := ParseProxy(raw)
	require.NoError(t, err)
	return p.ID()
}
