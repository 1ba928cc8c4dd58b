package proxyswitchtest_test

// The examples run proxyswitch on the embedded miniredis unless told
// otherwise (StartRedis). These tests check that every Lua script of the
// library loads there, and that a scenario calling each of them through the
// public API gives the same transcript on miniredis as on a real
// redis-server, dead and drained proxies included (TestDeadScoreOnMiniredis
// pins the one difference of their Lua that the scripts work around).

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/gocolly/colly/v2/queue"
	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/engine"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/proxyswitch/proxyswitch/proxyswitchtest"
	"github.com/proxyswitch/proxyswitch/shard"
	"github.com/proxyswitch/proxyswitch/storage"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// embedded starts the embedded server and a client, both closed with the
// test.
func embedded(t *testing.T) (*proxyswitchtest.Redis, *redis.Client) {
	t.Helper()
	s, err := proxyswitchtest.StartRedis(proxyswitchtest.RedisEmbedded)
	require.NoError(t, err)
	t.Cleanup(s.Close)
	rdb := s.Client()
	t.Cleanup(func() { _ = rdb.Close() })
	return s, rdb
}

func TestEveryScriptLoadsOnMiniredis(t *testing.T) {
	_, rdb := embedded(t)

	for _, r := range []*engine.Registry{engine.Root, engine.Storage} {
		require.NotEmpty(t, r.Names())
		for name, sc := range r.All() {
			assert.NoError(t, sc.Load(context.Background(), rdb).Err(), "%s/%s", r.Dir(), name)
		}
	}
}

func TestKeysExpireOnMiniredis(t *testing.T) {
	_, rdb := embedded(t)
	ctx := context.Background()
	require.NoError(t, rdb.Set(ctx, "k", "v", 100*time.Millisecond).Err())
	require.Eventually(t, func() bool { return rdb.Exists(ctx, "k").Val() == 0 }, 100*time.Millisecond+2*proxyswitchtest.ExpireEvery, 10*time.Millisecond,
		"a key outlived its TTL")
}

func TestScenarioSameOnMiniredisAndRedis(t *testing.T) {
	emb, embClient := embedded(t)
	onMiniredis := scenario(t, embClient,
		func() { proxyswitchtest.Miniredis(emb).Close() },
		func() {
			proxyswitchtest.Miniredis(emb).FlushAll()
			require.NoError(t, proxyswitchtest.Miniredis(emb).Restart())
		})

	srv := redistest.Start(t)
	onRedis := scenario(t, srv.Client(t),
		func() { require.NoError(t, srv.Kill()) },
		func() { require.NoError(t, srv.Restart()) })
	assert.Equal(t, onRedis, onMiniredis)
	t.Logf("transcript:\n%s", strings.Join(onRedis, "\n"))

	// The dead and drained steps did what they should, on both.
	for _, want := range deadSteps {
		assert.Contains(t, onRedis, want, "redis-server")
		assert.Contains(t, onMiniredis, want, "miniredis")
	}
}

// deadSteps are lines the dead and drained steps of scenario must write.
var deadSteps = []string{
	"dead: p3 proxy_connect",
	"state b.example with a dead proxy: {Site:b.example Free:3 Leased:0 Cooling:0 Quarantined:0 Dead:1 Learned:0s} err=<nil>",
	"lease all on b.example: [p2 p4 p5], p3 leased: false, then no proxy=true redis error=false",
	"lease all on f.example: [p2 p4 p5], p3 leased: false, then no proxy=true redis error=false",
	"ban dead: <nil>",
	"unban dead: <nil>",
	"state b after a ban and an unban of the dead proxy: {Site:b.example Free:3 Leased:0 Cooling:0 Quarantined:0 Dead:1 Learned:0s} err=<nil>",
	"revive: 1 err=<nil>",
	"state b after revive: {Site:b.example Free:4 Leased:0 Cooling:0 Quarantined:0 Dead:0 Learned:0s} err=<nil>",
	"lease all on b.example: [p2 p3 p4 p5], p3 leased: true, then no proxy=true redis error=false",
	"dead: p3 drained", // the first lease on c.example: the rotation's first proxy there
	"state c with a drained proxy leased: {Site:c.example Free:3 Leased:1 Cooling:0 Quarantined:0 Dead:0 Learned:0s} err=<nil>",
	"extend drained: <nil>",
	"release drained: <nil>",
	"state c with a drained proxy: {Site:c.example Free:3 Leased:0 Cooling:0 Quarantined:0 Dead:1 Learned:0s} err=<nil>",
	"lease all on c.example: [p2 p4 p5], p3 leased: false, then no proxy=true redis error=false",
	"revive drained: 1 err=<nil>",
	"state c after revive: {Site:c.example Free:4 Leased:0 Cooling:0 Quarantined:0 Dead:0 Learned:0s} err=<nil>",
	"lease with every proxy drained: no proxy=true redis error=false",
	"state g: {Site:g.example Free:0 Leased:0 Cooling:0 Quarantined:0 Dead:1 Learned:0s} err=<nil>",
}

// TestDeadScoreOnMiniredis pins why the scripts read scores with their
// helper num rather than tonumber: they park a dead proxy's slots at the
// score 1e15, miniredis answers ZSCORE with "1e+15" (as Redis 7.2 and later
// do too), and the tonumber of gopher-lua, unlike Redis' Lua, reads no
// exponent without a dot. "s + 0", which num does, reads it in both.
func TestDeadScoreOnMiniredis(t *testing.T) {
	ctx := context.Background()
	_, rdb := embedded(t)
	got, err := rdb.Eval(ctx, `
redis.call('ZADD', KEYS[1], 1e15, 'm')
local s = redis.call('ZSCORE', KEYS[1], 'm')
return {s, tostring(tonumber(s)), tostring(s + 0)}`, []string{"z"}).StringSlice()
	require.NoError(t, err)
	assert.Equal(t, []string{"1e+15", "nil", "1000000000000000"}, got)

	// num, as the scripts define it, reads the dead score and no score on
	// both servers.
	num := scriptsNum(t)
	for name, c := range map[string]*redis.Client{"miniredis": rdb, "redis-server": redistest.Start(t).Client(t)} {
		got, err := c.Eval(ctx, num+`
redis.call('ZADD', KEYS[1], 1e15, 'm')
return {tostring(num(redis.call('ZSCORE', KEYS[1], 'm')) == 1e15), tostring(num(redis.call('ZSCORE', KEYS[1], 'none')))}`,
			[]string{"z"}).StringSlice()
		require.NoError(t, err, name)
		assert.Equal(t, []string{"true", "false"}, got, name)
	}
}

// scriptsNum returns the line of lib.lua (in front of every script) that
// defines num.
func scriptsNum(t *testing.T) string {
	t.Helper()
	src, err := fs.ReadFile(engine.FS(), "lua/"+engine.LibFile)
	require.NoError(t, err)
	for line := range strings.Lines(string(src)) {
		if strings.HasPrefix(line, "local function num(") {
			return line
		}
	}
	t.Fatal("lib.lua defines no num")
	return ""
}

// scenario runs every script of the library through the public API and
// returns what it saw, free of times and random IDs: proxies are named by
// their position in the pool. kill makes Redis unreachable; restartEmpty
// brings it back without data.
func scenario(t *testing.T, rdb *redis.Client, kill, restartEmpty func()) []string {
	ctx := context.Background()
	var out []string
	say := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }

	urls := []string{"http://127.0.0.1:9001", "http://u:secret@127.0.0.1:9002", "http://127.0.0.1:9003", "socks5://127.0.0.1:9004", "http://127.0.0.1:9005"}
	name := map[string]string{}
	for i, u := range urls {
		p, err := proxyswitch.ParseProxy(u)
		require.NoError(t, err)
		name[p.ID()] = fmt.Sprintf("p%d", i+1)
	}
	names := func(ids ...string) string {
		var ns []string
		for _, id := range ids {
			ns = append(ns, name[id])
		}
		sort.Strings(ns)
		return strings.Join(ns, ",")
	}

	sw, err := proxyswitch.NewSwitch(rdb, proxyswitch.WithPrefix("scripts"), proxyswitch.WithTimeouts(proxyswitch.Timeouts{MaxWait: proxyswitch.Off}),
		proxyswitch.WithBans(proxyswitch.Bans{DeadAfter: 1, Quarantine: time.Minute, QuarantineMax: time.Hour}))
	require.NoError(t, err)
	require.NoError(t, sw.Clear(ctx))

	// pool_update, list
	ch, err := sw.Replace(ctx, urls[:4])
	say("replace: %+v err=%v", ch, err)
	ch, err = sw.Add(ctx, urls[4])
	say("add: %+v err=%v", ch, err)
	ch, err = sw.Remove(ctx, urls[0])
	say("remove: %+v err=%v", ch, err)
	list, err := sw.List(ctx)
	var ids []string
	for _, p := range list {
		ids = append(ids, p.ID())
	}
	say("list: %s err=%v", names(ids...), err)

	// lease, extend, release, stats, state
	a, err := sw.Lease(ctx, "a.example")
	require.NoError(t, err)
	b, err := sw.Lease(ctx, "a.example")
	require.NoError(t, err)
	say("two leases on a: distinct=%v", a.Proxy().ID() != b.Proxy().ID())
	say("extend: %v", a.Extend(ctx, time.Minute))
	st, err := sw.Stats(ctx, "a.example")
	say("stats a: %+v err=%v", st, err)
	say("release: %v, again: %v", a.Release(ctx), a.Release(ctx))
	say("extend released: %v", a.Extend(ctx, time.Minute) != nil)
	state, err := sw.SiteState(ctx, "a.example")
	say("state a: %+v err=%v", state, err)

	// penalize (a ban reported)
	say("report ban: %v", b.Report(ctx, ban.Verdict{Kind: ban.Ban, Reason: "http_403"}))
	state, _ = sw.SiteState(ctx, "a.example")
	say("state a after the ban: %+v", state)

	// A proxy failure that kills (Bans{DeadAfter: 1}); the dead proxy in
	// Dead, in SiteState and out of every lease, on a site that knew it and
	// on a new one; an operator's ban (a lease preferring it) and unban
	// leave it dead; revive.
	c, err := sw.Lease(ctx, "b.example")
	require.NoError(t, err)
	dp := c.Proxy()
	say("report failure of %s: %v", name[dp.ID()], c.Report(ctx, ban.Verdict{Kind: ban.ProxyFailure, Reason: ban.ReasonProxyConnect}))
	listDead(ctx, t, sw, say, name)
	for _, site := range []string{"a.example", "b.example"} {
		state, err = sw.SiteState(ctx, site)
		say("state %s with a dead proxy: %+v err=%v", site, state, err)
	}
	leaseAll(ctx, t, sw, say, name, "b.example", dp)
	leaseAll(ctx, t, sw, say, name, "f.example", dp)
	say("ban dead: %v", sw.Ban(ctx, dp.ID(), "b.example", time.Minute))
	say("unban dead: %v", sw.Unban(ctx, dp.ID(), "b.example"))
	state, err = sw.SiteState(ctx, "b.example")
	say("state b after a ban and an unban of the dead proxy: %+v err=%v", state, err)
	listDead(ctx, t, sw, say, name)
	n, err := sw.Revive(ctx, "", dp.ID())
	say("revive: %d err=%v", n, err)
	listDead(ctx, t, sw, say, name)
	state, err = sw.SiteState(ctx, "b.example")
	say("state b after revive: %+v err=%v", state, err)
	leaseAll(ctx, t, sw, say, name, "b.example", dp)

	// operator: ban, unban, drain (the site's free set built by the ban)
	say("ban: %v", sw.Ban(ctx, urls[2], "c.example", time.Minute))
	state, _ = sw.SiteState(ctx, "c.example")
	say("state c: %+v", state)
	say("unban: %v", sw.Unban(ctx, urls[2], "c.example"))
	state, _ = sw.SiteState(ctx, "c.example")
	say("state c after unban: %+v", state)

	// drain: a proxy drained under a lease; the lease extends and releases
	// without bringing it back; revive does.
	d, err := sw.Lease(ctx, "c.example")
	require.NoError(t, err)
	dr := d.Proxy()
	say("drain %s under a lease: %v", name[dr.ID()], func() error { _, err := sw.Drain(ctx, "", dr.ID()); return err }())
	listDead(ctx, t, sw, say, name)
	state, err = sw.SiteState(ctx, "c.example")
	say("state c with a drained proxy leased: %+v err=%v", state, err)
	say("extend drained: %v", d.Extend(ctx, time.Minute))
	say("release drained: %v", d.Release(ctx))
	state, err = sw.SiteState(ctx, "c.example")
	say("state c with a drained proxy: %+v err=%v", state, err)
	leaseAll(ctx, t, sw, say, name, "c.example", dr)
	n, err = sw.Revive(ctx, "", dr.ID())
	say("revive drained: %d err=%v", n, err)
	state, err = sw.SiteState(ctx, "c.example")
	say("state c after revive: %+v err=%v", state, err)

	// A pool whose only proxy is drained: no proxy, and no Redis error.
	one, err := proxyswitch.NewSwitch(rdb, proxyswitch.WithPrefix("scripts"), proxyswitch.WithPool("one"), proxyswitch.WithTimeouts(proxyswitch.Timeouts{MaxWait: proxyswitch.Off}))
	require.NoError(t, err)
	require.NoError(t, one.Clear(ctx))
	_, err = one.Replace(ctx, urls[1:2])
	require.NoError(t, err)
	say("drain the only proxy: %v", func() error { _, err := one.Drain(ctx, "", urls[1]); return err }())
	for i := 0; i < 2; i++ { // the site's free set built, then read
		_, err = one.Lease(ctx, "g.example")
		say("lease with every proxy drained: no proxy=%v redis error=%v", errors.Is(err, proxyswitch.ErrNoProxy), errors.Is(err, proxyswitch.ErrRedis))
	}
	state, err = one.SiteState(ctx, "g.example")
	say("state g: %+v err=%v", state, err)
	require.NoError(t, one.Clear(ctx))

	// every proxy busy, no wait
	var held []*proxyswitch.Lease
	for {
		l, err := sw.Lease(ctx, "d.example")
		if err != nil {
			say("lease on a full site: no proxy=%v after %d", err != nil, len(held))
			break
		}
		held = append(held, l)
	}
	for _, l := range held {
		require.NoError(t, l.Release(ctx))
	}

	// sites
	sites, err := sw.Sites(ctx)
	var sn []string
	for _, s := range sites {
		sn = append(sn, s.Site)
	}
	sort.Strings(sn)
	say("sites: %v err=%v", sn, err)

	// member_heartbeat, member_list, member_leave
	m, err := shard.NewMembership(rdb, shard.MemberConfig{Prefix: "scripts", Pool: sw.Pool(), Self: "server-1"})
	require.NoError(t, err)
	say("member start: %v", m.Start(ctx))
	members, err := m.Members(ctx)
	say("members: %v err=%v", members, err)
	say("member stop: %v", m.Stop(ctx))
	members, err = m.Members(ctx)
	say("members after stop: %v err=%v", members, err)

	// clear
	say("clear: %v", sw.Clear(ctx))
	list, err = sw.List(ctx)
	say("list after clear: %d err=%v", len(list), err)

	// fallback_probe, fallback_seed, fallback_writeback: Redis lost, a ban
	// learnt on the local shard, Redis back empty.
	fb, err := proxyswitch.NewSwitch(rdb, proxyswitch.WithPrefix("scripts"), proxyswitch.WithPool("fallback"),
		proxyswitch.WithFallback("server-1", nil), proxyswitch.WithTimeouts(proxyswitch.Timeouts{Fallback: 300 * time.Millisecond}),
		proxyswitch.WithMembership(shard.MemberConfig{Heartbeat: 100 * time.Millisecond, TTL: time.Second}),
		proxyswitch.WithTimeouts(proxyswitch.Timeouts{Attempt: 600 * time.Millisecond, MaxWait: 5 * time.Second}))
	require.NoError(t, err)
	require.NoError(t, fb.Clear(ctx))
	_, err = fb.Add(ctx, urls...)
	require.NoError(t, err)
	require.NoError(t, fb.Start(ctx))
	defer fb.Stop(ctx)
	fst := fb.FallbackStatus()
	say("fallback: mode %v, members %v, share %d", fst.Mode, fst.Members, fst.Share)
	kill()
	local, err := fb.Lease(ctx, "e.example")
	require.NoError(t, err)
	say("lease with Redis gone: mode %v", fb.FallbackStatus().Mode)
	say("local ban: %v", local.Report(ctx, ban.Verdict{Kind: ban.Ban, Reason: "http_403"}))
	restartEmpty()
	require.Eventually(t, func() bool { return fb.FallbackStatus().Mode == "broker" }, 10*time.Second, 10*time.Millisecond)
	fst = fb.FallbackStatus()
	say("back: reseeded %d, bans written %d, outages %d", fst.Reseeded, fst.BansWritten, fst.Outages)
	state, err = fb.SiteState(ctx, "e.example")
	say("state e: %+v err=%v", state, err)
	require.NoError(t, fb.Stop(ctx))
	require.NoError(t, fb.Clear(ctx))
	return out
}

// leaseAll leases every proxy it can on site (no wait), says which and
// whether dead was one, and releases them.
func leaseAll(ctx context.Context, t *testing.T, sw *proxyswitch.Switch, say func(string, ...any), name map[string]string, site string, dead *proxyswitch.Proxy) {
	t.Helper()
	var held []*proxyswitch.Lease
	var got []string
	var err error
	for len(held) < 10 {
		var l *proxyswitch.Lease
		if l, err = sw.Lease(ctx, site); err != nil {
			break
		}
		held = append(held, l)
		got = append(got, name[l.Proxy().ID()])
	}
	sort.Strings(got)
	say("lease all on %s: %v, %s leased: %v, then no proxy=%v redis error=%v", site, got, name[dead.ID()],
		slices.Contains(got, name[dead.ID()]), errors.Is(err, proxyswitch.ErrNoProxy), errors.Is(err, proxyswitch.ErrRedis))
	for _, l := range held {
		require.NoError(t, l.Release(ctx))
	}
}

// listDead says what Dead lists.
func listDead(ctx context.Context, t *testing.T, sw *proxyswitch.Switch, say func(string, ...any), name map[string]string) {
	t.Helper()
	dead, err := sw.Dead(ctx)
	require.NoError(t, err)
	for _, d := range dead {
		say("dead: %s %s", name[d.Proxy.ID()], d.Reason)
	}
	say("dead proxies: %d", len(dead))
}

// sameTranscript runs scenario on the embedded server and on a fresh
// redis-server and checks that both give the same transcript.
func sameTranscript(t *testing.T, scenario func(*testing.T, *redis.Client) []string) {
	t.Helper()
	_, embClient := embedded(t)
	onMiniredis := scenario(t, embClient)
	onRedis := scenario(t, redistest.Start(t).Client(t))
	assert.Equal(t, onRedis, onMiniredis)
	t.Logf("transcript:\n%s", strings.Join(onRedis, "\n"))
}

func TestSessionsSameOnMiniredisAndRedis(t *testing.T) {
	sameTranscript(t, sessionScenario)
}

// sessionScenario runs the session scripts (bind, use, cookies, end) through
// a collector: a task's requests keep one IP and their cookies, a ban
// retires the session and the next one leaves from another IP, EndSession
// ends it.
func sessionScenario(t *testing.T, rdb *redis.Client) []string {
	ctx := context.Background()
	var out []string
	say := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }

	guard := testbed.NewMarketplace(testbed.DefaultHandler())
	site := testbed.NewSite(t, "shop", guard)
	proxies := testbed.NewProxies(t, 3)
	var urls []string
	for _, p := range proxies {
		urls = append(urls, p.URL())
	}
	var retired []string
	sw, err := proxyswitch.NewSwitch(rdb, proxyswitch.WithPrefix("scripts"), proxyswitch.WithPool("sessions"),
		proxyswitch.WithSessions(proxyswitch.Sessions{Retired: func(r proxyswitch.SessionRetirement) { retired = append(retired, r.Reason) }}))
	require.NoError(t, err)
	require.NoError(t, sw.Clear(ctx))
	defer sw.Clear(ctx)
	_, err = sw.Replace(ctx, urls)
	require.NoError(t, err)
	c := colly.NewCollector(colly.AllowURLRevisit())
	sw.Attach(c)

	const task = "cart-1"
	tctx := proxyswitch.NewTaskContext(task)
	for _, path := range []string{"/setcookie?name=sid&value=s1", "/p/1", "/setcookie?name=cart&value=c1", "/p/2"} {
		say("GET %s: %v", path, c.Request("GET", site.URL()+path, nil, tctx, nil))
	}
	ips := site.Recorder().IPs()
	say("client IPs: %d", len(ips))
	info, err := sw.Session(ctx, task)
	require.NoError(t, err)
	require.NotNil(t, info)
	say("session: generation %d, %d requests, err=%v", info.Generation, info.Requests, err)
	u, _ := url.Parse(site.URL() + "/p/3")
	jar, err := sw.SessionCookies(ctx, task, u)
	var names []string
	for _, ck := range jar {
		names = append(names, ck.Name+"="+ck.Value)
	}
	sort.Strings(names)
	say("session cookies: %v err=%v", names, err)

	var first string
	for ip := range ips {
		first = ip
	}
	guard.Burn(first, testbed.Forbid)
	say("GET after a ban: %v", c.Request("GET", site.URL()+"/p/4", nil, tctx, nil))
	say("retired: %v", retired)
	info, err = sw.Session(ctx, task)
	require.NoError(t, err)
	require.NotNil(t, info)
	say("session: generation %d, previous %s, err=%v", info.Generation, info.Previous.Reason, err)
	say("client IPs: %d", len(site.Recorder().IPs()))
	ended, err := sw.EndSession(ctx, task)
	say("end: %v err=%v", ended, err)
	info, err = sw.Session(ctx, task)
	say("session after end: %v err=%v", info != nil, err)
	return out
}

func TestStorageSameOnMiniredisAndRedis(t *testing.T) {
	sameTranscript(t, storageScenario)
}

// storageScenario runs the storage scripts (visited set, cookies, queue
// with acknowledgements and dead letters) through a collector and Colly's
// queue.
func storageScenario(t *testing.T, rdb *redis.Client) []string {
	ctx := context.Background()
	var out []string
	say := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	site := testbed.NewSite(t, "shop", nil)

	st, err := storage.New(rdb, storage.WithNamespace("scripts-storage"), storage.WithMaxDeliveries(1))
	require.NoError(t, err)
	require.NoError(t, st.Clear(ctx))
	defer st.Clear(ctx)
	c := colly.NewCollector()
	require.NoError(t, c.SetStorage(st))
	st.Attach(c)
	q, err := queue.New(2, st)
	require.NoError(t, err)
	for _, path := range []string{"/setcookie?name=a&value=1", "/p/1", "/p/2", "/p/1", "/status/500"} {
		say("add %s: %v", path, q.AddURL(site.URL()+path))
	}
	n, err := st.QueueSize()
	say("queue size: %d err=%v", n, err)
	say("run: %v", q.Run(c))
	say("site hits: %d", site.Recorder().Count())
	u, _ := url.Parse(site.URL() + "/")
	say("cookies: %q", st.Cookies(u))
	dead, err := st.DeadLetters(ctx, 0, 10)
	for _, d := range dead {
		say("dead letter: %s after %d deliveries", strings.TrimPrefix(d.URL, site.URL()), d.Deliveries)
	}
	say("dead letters: %d err=%v", len(dead), err)
	if len(dead) > 0 {
		say("requeue: %v", st.Requeue(ctx, dead[0].ID))
		n, err = st.QueueSize()
		say("queue size: %d err=%v", n, err)
	}
	stats, err := st.Stats(ctx)
	say("stats: %+v err=%v", stats, err)
	return out
}

// TestLargeReadsOnMiniredis: the paged reads and Clear's chunks of issue
// 14 (ZSCAN, HSCAN and HRANDFIELD in scripts) run on miniredis too: a site
// with hundreds of dead proxies, a pool with hundreds of exit IPs and
// circuit breakers (more than one call's worth, 500, of each).
func TestLargeReadsOnMiniredis(t *testing.T) {
	const n = 1200
	ctx := context.Background()
	_, rdb := embedded(t)
	sw, err := proxyswitch.NewSwitch(rdb, proxyswitch.WithPrefix("mini"), proxyswitch.WithTimeouts(proxyswitch.Timeouts{MaxWait: proxyswitch.Off}))
	require.NoError(t, err)
	t.Cleanup(func() { sw.Close(context.Background()) })
	urls := make([]string, n)
	for i := range urls {
		urls[i] = fmt.Sprintf("http://10.1.%d.%d:3128", i/250, i%250)
	}
	_, err = sw.Add(ctx, urls...)
	require.NoError(t, err)
	l, err := sw.Lease(ctx, "a.example")
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	_, err = sw.Drain(ctx, "", urls[:700]...)
	require.NoError(t, err)
	st, err := sw.SiteState(ctx, "a.example")
	require.NoError(t, err)
	require.Equal(t, proxyswitch.SiteState{Site: "a.example", Free: n - 700, Dead: 700}, st)
	stats, err := sw.Stats(ctx, "a.example")
	require.NoError(t, err)
	require.Equal(t, n, stats.Proxies)

	base := "{mini:" + sw.Pool() + "}"
	for i := range 700 {
		ip := fmt.Sprintf("198.51.%d.%d", i/250, i%250)
		require.NoError(t, rdb.HSet(ctx, base+":exit", fmt.Sprintf("p%d", i), ip).Err())
		require.NoError(t, rdb.SAdd(ctx, base+":exit:"+ip, fmt.Sprintf("p%d", i)).Err())
		require.NoError(t, rdb.HSet(ctx, base+":breaker", fmt.Sprintf("s%d.example", i), "1").Err())
		require.NoError(t, rdb.Set(ctx, base+":breaker:"+fmt.Sprintf("s%d.example", i), "1", 0).Err())
	}
	require.NoError(t, sw.Clear(ctx))
	keys, err := rdb.Keys(ctx, "*").Result()
	require.NoError(t, err)
	require.Equal(t, []string{base + ":meta"}, keys)
}

// TestGatewaysOnMiniredis: the gateway index (pool_update.lua: a zset per
// template named by redis.sha1hex, listed with ZRANGE BYLEX, relabelled in
// pages) works on the embedded Redis too: a gateway larger than a call,
// a change of its labels, Remove of its template and Clear.
func TestGatewaysOnMiniredis(t *testing.T) {
	ctx := context.Background()
	_, rdb := embedded(t)
	sw, err := proxyswitch.NewSwitch(rdb, proxyswitch.WithPrefix("mini"), proxyswitch.WithTimeouts(proxyswitch.Timeouts{MaxWait: proxyswitch.Off}))
	require.NoError(t, err)
	t.Cleanup(func() { sw.Close(context.Background()) })
	const tmpl = "http://user-session-{session}:pw@gw.example:7000"
	gw := func(labels string) string {
		return strings.Replace(tmpl, "{session}", "{session:1200}", 1) + " " + labels
	}
	ch, err := sw.Add(ctx, gw("country=ru"), "http://10.0.0.1:3128")
	require.NoError(t, err)
	require.Equal(t, proxyswitch.PoolChange{Added: 1201, Size: 1201}, ch)
	ch, err = sw.Add(ctx, gw("country=de"))
	require.NoError(t, err)
	require.Equal(t, proxyswitch.PoolChange{Size: 1201}, ch)
	base := "{mini:" + sw.Pool() + "}"
	labels, err := rdb.HGetAll(ctx, base+":labels").Result()
	require.NoError(t, err)
	require.Len(t, labels, 1200)
	for id, l := range labels {
		require.Equal(t, "country=de", l, "member %s", id)
	}
	ch, err = sw.Remove(ctx, tmpl)
	require.NoError(t, err)
	require.Equal(t, proxyswitch.PoolChange{Removed: 1200, Size: 1}, ch)
	_, err = sw.Add(ctx, gw(""))
	require.NoError(t, err)
	require.NoError(t, sw.Clear(ctx))
	keys, err := rdb.Keys(ctx, "*").Result()
	require.NoError(t, err)
	require.Equal(t, []string{base + ":meta"}, keys)
}
