package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gocolly/colly/v2/queue"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/proxyswitch/proxyswitch/internal/testlog"
	"github.com/proxyswitch/proxyswitch/storage"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	redisSecret = "Canary-redis-secret"
	proxySecret = "Canary-proxy-secret"
)

type result struct {
	code           int
	stdout, stderr string
}

func (r result) all() string { return r.stdout + r.stderr }

func cli(t *testing.T, env map[string]string, stdin string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, func(k string) string { return env[k] }, strings.NewReader(stdin), &out, &errOut)
	return result{code, out.String(), errOut.String()}
}

func TestCLIEndToEnd(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", redisSecret)
	url := "redis://:" + redisSecret + "@" + srv.Addr() + "/0"
	env := map[string]string{EnvRedisURL: url}

	dir := t.TempDir()
	file := filepath.Join(dir, "proxies.txt")
	require.NoError(t, os.WriteFile(file, []byte("# pool\nhttp://u1:"+proxySecret+"@127.0.0.1:3128\nsocks5://127.0.0.2:1080\n"), 0o600))

	r := cli(t, env, "", "load", file)
	require.Equal(t, 0, r.code, r.all())
	assert.Equal(t, "added 2, removed 0, pool size 2\n", r.stdout)

	r = cli(t, env, "http://127.0.0.3:8080\n", "-pool", "residential", "load", "-")
	require.Equal(t, 0, r.code, r.all())

	r = cli(t, env, "", "list")
	require.Equal(t, 0, r.code, r.all())
	assert.Contains(t, r.stdout, "http://xxxxx:xxxxx@127.0.0.1:3128")
	assert.Contains(t, r.stdout, "socks5://127.0.0.2:1080")
	assert.NotContains(t, r.stdout, "127.0.0.3", "pools are separate")

	// A worker leases for a site; stats shows it.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: redisSecret})
	defer rdb.Close()
	sw, err := proxyswitch.NewSwitch(rdb)
	require.NoError(t, err)
	l, err := sw.Lease(context.Background(), "ozon.example")
	require.NoError(t, err)
	r = cli(t, env, "", "stats")
	require.Equal(t, 0, r.code, r.all())
	assert.Regexp(t, `ozon\.example\s+2\s+1\s+1\s+1`, r.stdout)
	require.NoError(t, l.Release(context.Background()))

	p, err := proxyswitch.ParseProxy("socks5://127.0.0.2:1080")
	require.NoError(t, err)
	r = cli(t, env, "", "remove", p.ID())
	require.Equal(t, 0, r.code, r.all())
	assert.Equal(t, "removed 1 of 1 proxies, pool size 1\n", r.stdout)

	r = cli(t, nil, "", "-redis", url, "add", "http://u2:"+proxySecret+"@127.0.0.9:1")
	require.Equal(t, 0, r.code, r.all())
	assert.NotContains(t, r.all(), proxySecret)
}

func TestCLIErrorsAndExitCodes(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", redisSecret)
	good := map[string]string{EnvRedisURL: "redis://:" + redisSecret + "@" + srv.Addr() + "/0"}
	dead := redistest.Start(t)
	deadAddr := dead.Addr()
	require.NoError(t, dead.Kill())

	for name, tc := range map[string]struct {
		env   map[string]string
		stdin string
		args  []string
		code  int
		want  string
	}{
		"no command":      {good, "", nil, 2, "usage"},
		"unknown command": {good, "", []string{"frobnicate"}, 2, "unknown command"},
		"bad flag":        {good, "", []string{"-nope", "list"}, 2, "not defined"},
		"load arity":      {good, "", []string{"load"}, 2, "load takes one FILE"},
		"missing file":    {good, "", []string{"load", "/nonexistent/proxies.txt"}, 1, "no such file"},
		"invalid proxy":   {good, "http://ok:1\nftp://u:" + proxySecret + "@h:1\n", []string{"load", "-"}, 1, "line 2"},
		"bad redis url":   {map[string]string{EnvRedisURL: "mysql://u:" + redisSecret + "@h/"}, "", []string{"list"}, 2, "invalid Redis URL"},
		"wrong password":  {map[string]string{EnvRedisURL: "redis://:wrong-" + redisSecret + "@" + srv.Addr() + "/0"}, "", []string{"list"}, 1, "list"},
		"redis down":      {map[string]string{EnvRedisURL: "redis://:" + redisSecret + "@" + deadAddr + "/0"}, "", []string{"-timeout", "500ms", "list"}, 1, "redis error"},
		"bad prefix":      {good, "", []string{"-prefix", "a{b", "list"}, 2, "braces"},
		// go-redis completes both with localhost:6379: another Redis.
		"redis url without //": {map[string]string{EnvRedisURL: "redis:" + redisSecret + "@" + srv.Addr() + "/0"}, "", []string{"list"}, 2, "no host"},
		"redis url empty host": {map[string]string{EnvRedisURL: "redis://:" + redisSecret + "@/0"}, "", []string{"list"}, 2, "no host"},
		"unix url no path":     {map[string]string{EnvRedisURL: "unix://"}, "", []string{"list"}, 2, "no socket path"},
		"zero timeout":         {good, "", []string{"-timeout", "0s", "list"}, 2, "-timeout 0s"},
	} {
		t.Run(name, func(t *testing.T) {
			r := cli(t, tc.env, tc.stdin, tc.args...)
			assert.Equal(t, tc.code, r.code, r.all())
			assert.Contains(t, r.all(), tc.want)
			assert.NotContains(t, r.all(), redisSecret)
			assert.NotContains(t, r.all(), proxySecret)
		})
	}
}

// proxyIDOf is the ID list prints for url.
func proxyIDOf(t *testing.T, url string) string {
	t.Helper()
	p, err := proxyswitch.ParseProxy(url)
	require.NoError(t, err)
	return p.ID()
}

// transcript runs commands with -v and keeps all they print, to check at
// the end that no password showed up.
type transcript struct {
	t   *testing.T
	env map[string]string
	all strings.Builder
}

func (tr *transcript) run(args ...string) result {
	tr.t.Helper()
	r := cli(tr.t, tr.env, "", append([]string{"-v"}, args...)...)
	tr.all.WriteString(r.all())
	return r
}

// leaseID leases proxy id for site through sw, leasing the others it meets
// on the way and giving them back (with sw's cooldown).
func leaseID(t *testing.T, sw *proxyswitch.Switch, site, id string) *proxyswitch.Lease {
	t.Helper()
	ctx := context.Background()
	var skipped []*proxyswitch.Lease
	defer func() {
		for _, l := range skipped {
			require.NoError(t, l.Release(ctx))
		}
	}()
	for {
		l, err := sw.Lease(ctx, site)
		require.NoError(t, err)
		if l.Proxy().ID() == id {
			return l
		}
		skipped = append(skipped, l)
	}
}

// TestCLIOperatorCommands drives ban, unban, drain, revive, list with
// state, stats and clear against a real redis-server with a password, and
// checks each effect on the pool through the library.
func TestCLIOperatorCommands(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t, "--requirepass", redisSecret)
	env := map[string]string{EnvRedisURL: "redis://:" + redisSecret + "@" + srv.Addr() + "/0"}
	secret := "http://u1:" + proxySecret + "@127.0.0.1:3128"
	plain, third := "http://127.0.0.2:3128", "socks5://127.0.0.3:1080"
	idSecret, idPlain, idThird := proxyIDOf(t, secret), proxyIDOf(t, plain), proxyIDOf(t, third)
	tr := &transcript{t: t, env: env}
	run := tr.run

	r := run("add", secret, plain, third)
	require.Equal(t, 0, r.code, r.all())
	r = cli(t, env, "", "-pool", "other", "add", plain)
	require.Equal(t, 0, r.code, r.all())

	rdb := srv.Client(t)
	sw, err := proxyswitch.NewSwitch(rdb, proxyswitch.WithBans(proxyswitch.Bans{DeadAfter: 1}))
	require.NoError(t, err)
	// A worker kills the third proxy (a failure only the proxy can cause)
	// and holds a lease on the second one for ozon.example.
	leaseOf := func(site, id string) *proxyswitch.Lease { return leaseID(t, sw, site, id) }
	l := leaseOf("avito.example", idThird)
	require.NoError(t, l.Report(ctx, ban.Verdict{Kind: ban.ProxyFailure, Reason: ban.ReasonProxyConnect}))
	held := leaseOf("ozon.example", idPlain)
	defer held.Release(ctx)

	// ban by URL (with its password), for a given time.
	r = run("ban", secret, "ozon.example", "2h")
	require.Equal(t, 0, r.code, r.all())
	assert.Equal(t, "banned proxy "+idSecret+" on ozon.example for at least 2h0m0s\n", r.stdout)
	st, err := sw.SiteState(ctx, "ozon.example")
	require.NoError(t, err)
	assert.Equal(t, proxyswitch.SiteState{Site: "ozon.example", Leased: 1, Quarantined: 1, Dead: 1}, st)
	r = run("stats", "ozon.example", "avito.example")
	require.Equal(t, 0, r.code, r.all())
	assert.Regexp(t, `SITE\s+PROXIES\s+FREE\s+LEASED\s+BUSY\s+COOLING\s+QUARANTINED\s+DEAD`, r.stdout)
	assert.Regexp(t, `ozon\.example\s+3\s+0\s+1\s+3\s+0\s+1\s+1\s*\n`, r.stdout)
	assert.Regexp(t, `avito\.example\s+3\s+2\s+0\s+1\s+0\s+0\s+1\s*\n`, r.stdout)
	assert.Contains(t, r.stdout, "\nlive sticky sessions: 0\n")

	// unban by ID; the default ban time is an hour.
	r = run("unban", idSecret, "ozon.example")
	require.Equal(t, 0, r.code, r.all())
	assert.Equal(t, "unbanned proxy "+idSecret+" on ozon.example\n", r.stdout)
	st, err = sw.SiteState(ctx, "ozon.example")
	require.NoError(t, err)
	assert.Zero(t, st.Quarantined)
	r = run("ban", idPlain, "ozon.example")
	require.Equal(t, 0, r.code, r.all())
	assert.Contains(t, r.stdout, "for at least 1h0m0s")
	r = run("unban", idPlain, "ozon.example")
	require.Equal(t, 0, r.code, r.all())

	// drain, list with states, revive.
	r = run("drain", plain)
	require.Equal(t, 0, r.code, r.all())
	assert.Equal(t, "drained proxy "+idPlain+"\n", r.stdout)
	r = run("list")
	require.Equal(t, 0, r.code, r.all())
	assert.Regexp(t, `ID\s+PROXY\s+STATE\s+SINCE\s+REASON`, r.stdout)
	assert.Regexp(t, idSecret+`\s+http://xxxxx:xxxxx@127\.0\.0\.1:3128\s+ok\s+-\s+-`, r.stdout)
	assert.Regexp(t, idPlain+`\s+http://127\.0\.0\.2:3128\s+drained\s+\d{4}-\d\d-\d\dT[0-9:]+Z\s+-`, r.stdout)
	assert.Regexp(t, idThird+`\s+socks5://127\.0\.0\.3:1080\s+dead\s+\d{4}-\d\d-\d\dT[0-9:]+Z\s+proxy_connect`, r.stdout)
	r = run("revive", idPlain, third, secret)
	require.Equal(t, 0, r.code, r.all())
	assert.Equal(t, "revived 2 of 3 proxies (the others were neither dead nor drained)\n", r.stdout)
	dead, err := sw.Dead(ctx)
	require.NoError(t, err)
	assert.Empty(t, dead)

	// clear wants -yes, and leaves other pools alone.
	r = run("clear")
	assert.Equal(t, 2, r.code, r.all())
	assert.Contains(t, r.stderr, `clear deletes every key of pool "default" under prefix "proxyswitch": add -yes`)
	require.NoError(t, held.Release(ctx))
	r = run("clear", "-yes")
	require.Equal(t, 0, r.code, r.all())
	assert.Equal(t, "cleared pool \"default\" under prefix \"proxyswitch\"\n", r.stdout)
	keys, err := rdb.Keys(ctx, "{proxyswitch:default}*").Result()
	require.NoError(t, err)
	assert.Equal(t, []string{"{proxyswitch:default}:meta"}, keys, "only the mark that the pool was emptied on purpose")
	r = run("-pool", "other", "list")
	require.Equal(t, 0, r.code, r.all())
	assert.Contains(t, r.stdout, idPlain)

	assert.NotContains(t, tr.all.String(), proxySecret)
	assert.NotContains(t, tr.all.String(), redisSecret)
}

// The operator commands act on every slot of a pool whose workers run k
// requests per proxy at once (Rotation.Concurrency): the CLI reads k from Redis.
func TestCLIOperatorCommandsWithConcurrency(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t, "--requirepass", redisSecret)
	env := map[string]string{EnvRedisURL: "redis://:" + redisSecret + "@" + srv.Addr() + "/0"}
	tr := &transcript{t: t, env: env}
	a, b := "http://u1:"+proxySecret+"@127.0.0.1:3128", "http://127.0.0.2:3128"
	idA := proxyIDOf(t, a)
	r := tr.run("add", a, b)
	require.Equal(t, 0, r.code, r.all())
	sw, err := proxyswitch.NewSwitch(srv.Client(t), proxyswitch.WithRotation(proxyswitch.Rotation{Concurrency: 3}))
	require.NoError(t, err)
	l, err := sw.Lease(ctx, "ozon.example") // records k = 3
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	state := func() proxyswitch.SiteState {
		t.Helper()
		st, err := sw.SiteState(ctx, "ozon.example")
		require.NoError(t, err)
		return st
	}
	require.Equal(t, 6, state().Free)

	r = tr.run("ban", idA, "ozon.example", "2h")
	require.Equal(t, 0, r.code, r.all())
	assert.Equal(t, proxyswitch.SiteState{Site: "ozon.example", Free: 3, Quarantined: 3}, state(), "all three slots")
	r = tr.run("unban", a, "ozon.example")
	require.Equal(t, 0, r.code, r.all())
	assert.Equal(t, proxyswitch.SiteState{Site: "ozon.example", Free: 6}, state())
	r = tr.run("drain", idA)
	require.Equal(t, 0, r.code, r.all())
	assert.Equal(t, proxyswitch.SiteState{Site: "ozon.example", Free: 3, Dead: 3}, state())
	r = tr.run("revive", idA)
	require.Equal(t, 0, r.code, r.all())
	assert.Equal(t, proxyswitch.SiteState{Site: "ozon.example", Free: 6}, state())

	// stats counts the live sticky sessions the session scripts register
	// (here two, one of them lapsed, written as those scripts do).
	now := time.Now()
	require.NoError(t, srv.Client(t).ZAdd(ctx, "{proxyswitch:default}:sessions",
		redis.Z{Score: float64(now.Add(time.Minute).UnixMilli()), Member: "a1"},
		redis.Z{Score: float64(now.Add(-time.Second).UnixMilli()), Member: "b2"}).Err())
	r = tr.run("stats")
	require.Equal(t, 0, r.code, r.all())
	assert.Contains(t, r.stdout, "\nlive sticky sessions: 1\n")
	assert.NotContains(t, tr.all.String(), proxySecret)
}

// TestCLIListSite drives list SITE against a real redis-server with a
// password: every state a proxy can be in on a site, k slots per proxy, a
// ban on every site, a site never leased, and no password in any output.
func TestCLIListSite(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t, "--requirepass", redisSecret)
	env := map[string]string{EnvRedisURL: "redis://:" + redisSecret + "@" + srv.Addr() + "/0"}
	secret := "http://u1:" + proxySecret + "@127.0.0.1:3128"
	plain, dead, drained, cooled, added := "http://127.0.0.2:3128", "socks5://127.0.0.3:1080", "http://127.0.0.4:3128",
		"http://127.0.0.5:3128", "http://u6:"+proxySecret+"@127.0.0.6:3128"
	tr := &transcript{t: t, env: env}
	run := tr.run
	r := run("add", secret, plain, dead, drained, cooled)
	require.Equal(t, 0, r.code, r.all())

	rdb := srv.Client(t)
	w, err := proxyswitch.NewSwitch(rdb, proxyswitch.WithBans(proxyswitch.Bans{DeadAfter: 1}))
	require.NoError(t, err)
	leaseOf := func(sw *proxyswitch.Switch, site, url string) *proxyswitch.Lease {
		return leaseID(t, sw, site, proxyIDOf(t, url))
	}
	l := leaseOf(w, "avito.example", dead)
	require.NoError(t, l.Report(ctx, ban.Verdict{Kind: ban.ProxyFailure, Reason: ban.ReasonProxyConnect}))
	held := leaseOf(w, "ozon.example", plain)
	defer held.Release(ctx)
	r = run("ban", secret, "ozon.example", "2h")
	require.Equal(t, 0, r.code, r.all())
	r = run("drain", drained)
	require.Equal(t, 0, r.code, r.all())
	// The one proxy left free on ozon.example cools down for a minute.
	cool, err := proxyswitch.NewSwitch(rdb, proxyswitch.WithRotation(proxyswitch.Rotation{Cooldown: time.Minute}))
	require.NoError(t, err)
	l, err = cool.Lease(ctx, "ozon.example")
	require.NoError(t, err)
	require.Equal(t, proxyIDOf(t, cooled), l.Proxy().ID())
	require.NoError(t, l.Release(ctx))
	r = run("add", added) // free on every site
	require.Equal(t, 0, r.code, r.all())

	r = run("list", "ozon.example")
	require.Equal(t, 0, r.code, r.all())
	const when = `\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z`
	const since = `\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`
	assert.Regexp(t, `(?m)^ID\s+PROXY\s+STATE\s+LEASED\s+UNTIL\s+STRIKES\s+NOTE\s*$`, r.stdout)
	for _, row := range []string{
		proxyIDOf(t, secret) + `\s+http://xxxxx:xxxxx@127\.0\.0\.1:3128\s+quarantined\s+0/1\s+` + when + `\s+1\s+-`,
		proxyIDOf(t, plain) + `\s+http://127\.0\.0\.2:3128\s+leased\s+1/1\s+` + when + `\s+0\s+-`,
		proxyIDOf(t, dead) + `\s+socks5://127\.0\.0\.3:1080\s+dead\s+0/1\s+-\s+0\s+proxy_connect since ` + since,
		proxyIDOf(t, drained) + `\s+http://127\.0\.0\.4:3128\s+drained\s+0/1\s+-\s+0\s+since ` + since,
		proxyIDOf(t, cooled) + `\s+http://127\.0\.0\.5:3128\s+cooling\s+0/1\s+` + when + `\s+0\s+-`,
		proxyIDOf(t, added) + `\s+http://xxxxx:xxxxx@127\.0\.0\.6:3128\s+free\s+0/1\s+-\s+0\s+-`,
	} {
		assert.Regexp(t, `(?m)^`+row+`\s*$`, r.stdout)
	}
	assert.Equal(t, 7, strings.Count(r.stdout, "\n"), "a header and six proxies:\n%s", r.stdout)
	assert.Empty(t, r.stderr, "a site in use: no warning")
	// The same slots as stats counts for the site.
	r = run("stats", "ozon.example")
	require.Equal(t, 0, r.code, r.all())
	assert.Regexp(t, `ozon\.example\s+6\s+1\s+1\s+5\s+1\s+1\s+2\s*\n`, r.stdout)

	// A site nobody leased: what its first lease would find, and a warning.
	r = run("list", "fresh.example")
	require.Equal(t, 0, r.code, r.all())
	assert.Regexp(t, proxyIDOf(t, dead)+`\s+\S+\s+dead\s`, r.stdout)
	assert.Regexp(t, proxyIDOf(t, secret)+`\s+\S+\s+free\s`, r.stdout, "banned on ozon.example only")
	assert.Contains(t, r.stderr, `site "fresh.example" was not leased from pool "default" within the idle TTL`)

	// Two slots per proxy, and a ban on every site, in another pool.
	r = run("-pool", "wide", "add", secret, plain)
	require.Equal(t, 0, r.code, r.all())
	wide, err := proxyswitch.NewSwitch(rdb, proxyswitch.WithPool("wide"), proxyswitch.WithRotation(proxyswitch.Rotation{Concurrency: 2}), proxyswitch.WithBans(proxyswitch.Bans{AllSites: true}))
	require.NoError(t, err)
	first := leaseOf(wide, "ozon.example", plain)
	defer first.Release(ctx)
	second := leaseOf(wide, "ozon.example", plain)
	defer second.Release(ctx)
	require.NoError(t, wide.Ban(ctx, secret, "avito.example", time.Hour))
	r = run("-pool", "wide", "list", "ozon.example")
	require.Equal(t, 0, r.code, r.all())
	assert.Regexp(t, proxyIDOf(t, plain)+`\s+http://127\.0\.0\.2:3128\s+leased\s+2/2\s+`+when+`\s+0\s+-`, r.stdout)
	assert.Regexp(t, proxyIDOf(t, secret)+`\s+http://xxxxx:xxxxx@127\.0\.0\.1:3128\s+quarantined\s+0/2\s+`+when+`\s+0\s+banned on every site`, r.stdout)
	r = run("-pool", "wide", "list", "avito.example")
	require.Equal(t, 0, r.code, r.all())
	assert.Regexp(t, proxyIDOf(t, secret)+`\s+\S+\s+quarantined\s+0/2\s+`+when+`\s+1\s+banned on every site`, r.stdout)

	// list without a site: as before.
	r = run("list")
	require.Equal(t, 0, r.code, r.all())
	assert.Regexp(t, `ID\s+PROXY\s+STATE\s+SINCE\s+REASON`, r.stdout)
	assert.Regexp(t, proxyIDOf(t, secret)+`\s+http://xxxxx:xxxxx@127\.0\.0\.1:3128\s+ok\s+-\s+-`, r.stdout)

	assert.NotContains(t, tr.all.String(), proxySecret)
	assert.NotContains(t, tr.all.String(), redisSecret)
}

// scrapeURL fetches a /metrics page and parses it with the Prometheus
// text-format parser.
func scrapeURL(t *testing.T, u string) (map[string]*dto.MetricFamily, string) {
	t.Helper()
	code, body := get(t, u)
	require.Equal(t, http.StatusOK, code, body)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	require.NoError(t, err)
	return fams, body
}

// get fetches u and returns the status code and the body.
func get(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// gauge is the value of the gauge series of name with the given labels.
func gauge(fams map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	for _, m := range fams[name].GetMetric() {
		match := true
		for k, v := range labels {
			found := false
			for _, l := range m.GetLabel() {
				found = found || (l.GetName() == k && l.GetValue() == v)
			}
			match = match && found
		}
		if match {
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// TestCLIServe runs the standalone exporter for two pools, scrapes it while
// a worker holds a lease and a proxy is banned, then with Redis gone, and
// stops it as an interrupt would.
func TestCLIServe(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t, "--requirepass", redisSecret)
	env := map[string]string{EnvRedisURL: "redis://:" + redisSecret + "@" + srv.Addr() + "/0"}
	r := cli(t, env, "http://u1:"+proxySecret+"@127.0.0.1:3128\nhttp://127.0.0.2:3128\nhttp://127.0.0.3:3128\n", "load", "-")
	require.Equal(t, 0, r.code, r.all())
	r = cli(t, env, "", "-pool", "residential", "add", "http://127.0.0.9:3128")
	require.Equal(t, 0, r.code, r.all())
	sw, err := proxyswitch.NewSwitch(srv.Client(t))
	require.NoError(t, err)
	l, err := sw.Lease(ctx, "ozon.example")
	require.NoError(t, err)
	require.NoError(t, sw.Ban(ctx, "http://127.0.0.2:3128", "ozon.example", time.Hour))
	crawl, err := storage.New(srv.Client(t), storage.WithNamespace("crawl"))
	require.NoError(t, err)
	require.NoError(t, crawl.Init())
	q, err := queue.New(1, crawl)
	require.NoError(t, err)
	for _, u := range []string{"https://www.ozon.example/p/1", "https://www.ozon.example/p/2"} {
		require.NoError(t, q.AddURL(u))
	}

	sctx, stop := context.WithCancel(ctx)
	defer stop()
	var out, errOut testlog.Buffer
	code := make(chan int, 1)
	go func() {
		code <- run(sctx, []string{"serve", "-addr", "127.0.0.1:0", "-queue", "crawl", "default", "residential"},
			func(k string) string { return env[k] }, strings.NewReader(""), &out, &errOut)
	}()
	var metricsURL string
	require.Eventually(t, func() bool {
		first, _, _ := strings.Cut(out.String(), "\n")
		_, after, ok := strings.Cut(first, " on ")
		metricsURL = strings.TrimSpace(after)
		return ok && strings.HasSuffix(metricsURL, "/metrics")
	}, 10*time.Second, 10*time.Millisecond, "stdout: %q, stderr: %q", out.String(), errOut.String())
	assert.Contains(t, out.String(), "serving metrics of pool default, residential and queue crawl on http://127.0.0.1:")

	fams, page := scrapeURL(t, metricsURL)
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"proxyswitch_pool_proxies", map[string]string{"pool": "default"}, 3},
		{"proxyswitch_pool_proxies", map[string]string{"pool": "residential"}, 1},
		{"proxyswitch_state_up", map[string]string{"pool": "default"}, 1},
		{"proxyswitch_sites", map[string]string{"pool": "default"}, 1},
		{"proxyswitch_site_slots", map[string]string{"pool": "default", "site": "ozon.example", "state": "leased"}, 1},
		{"proxyswitch_site_slots", map[string]string{"pool": "default", "site": "ozon.example", "state": "quarantined"}, 1},
		{"proxyswitch_site_slots", map[string]string{"pool": "default", "site": "ozon.example", "state": "free"}, 1},
		{"proxyswitch_queue_requests", map[string]string{"namespace": "crawl", "state": "ready"}, 2},
		{"proxyswitch_queue_requests", map[string]string{"namespace": "crawl", "state": "dead"}, 0},
		{"proxyswitch_queue_up", map[string]string{"namespace": "crawl"}, 1},
	} {
		v, ok := gauge(fams, tc.name, tc.labels)
		assert.True(t, ok, "%s%v missing", tc.name, tc.labels)
		assert.Equal(t, tc.want, v, "%s%v", tc.name, tc.labels)
	}
	assert.Contains(t, fams, "go_goroutines")
	statusURL := strings.TrimSuffix(metricsURL, "metrics")
	code0, status := get(t, statusURL)
	assert.Equal(t, http.StatusOK, code0, status)
	assert.Contains(t, status, `<tr data-site="ozon.example"><td class="site">ozon.example</td><td class="n free">1</td><td class="n leased">1</td>`)
	assert.Contains(t, status, `<section class="pool" data-pool="residential">`)
	require.NoError(t, l.Release(ctx))

	// Redis gone: the exporter still answers, within a second (the first
	// scrape finds the pooled connections broken, the next ones dial), says
	// so, warns once.
	require.NoError(t, srv.Kill())
	var page2 string
	for i := range 3 {
		start := time.Now()
		fams, page2 = scrapeURL(t, metricsURL)
		took := time.Since(start)
		assert.Less(t, took, time.Second, "scrape %d with Redis down", i+1)
		v, ok := gauge(fams, "proxyswitch_state_up", map[string]string{"pool": "residential"})
		assert.True(t, ok)
		assert.Zero(t, v, "scrape %d", i+1)
	}
	start := time.Now()
	code0, status2 := get(t, statusURL)
	assert.Less(t, time.Since(start), time.Second, "the status page with Redis down")
	assert.Equal(t, http.StatusServiceUnavailable, code0)
	assert.Contains(t, status2, "Redis failed reading the sites")
	v, ok := gauge(fams, "proxyswitch_state_up", map[string]string{"pool": "default"})
	assert.True(t, ok)
	assert.Zero(t, v)
	v, ok = gauge(fams, "proxyswitch_queue_up", map[string]string{"namespace": "crawl"})
	assert.True(t, ok)
	assert.Zero(t, v)
	assert.Contains(t, errOut.String(), "level=WARN")

	stop()
	select {
	case c := <-code:
		assert.Equal(t, 0, c, errOut.String())
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not stop on interrupt")
	}
	for _, s := range []string{page, page2, status, status2, out.String(), errOut.String()} {
		assert.NotContains(t, s, proxySecret)
		assert.NotContains(t, s, redisSecret)
	}
}

// TestCLISecretsOnFailurePaths runs the new commands into every failure
// it can meet, with -v, and checks the exit codes and that no password
// shows up.
func TestCLISecretsOnFailurePaths(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", redisSecret)
	good := map[string]string{EnvRedisURL: "redis://:" + redisSecret + "@" + srv.Addr() + "/0"}
	r := cli(t, good, "", "add", "http://u1:"+proxySecret+"@127.0.0.1:3128")
	require.Equal(t, 0, r.code, r.all())
	dead := redistest.Start(t)
	deadAddr := dead.Addr()
	require.NoError(t, dead.Kill())
	down := map[string]string{EnvRedisURL: "redis://:" + redisSecret + "@" + deadAddr + "/0"}
	wrong := map[string]string{EnvRedisURL: "redis://:wrong-" + redisSecret + "@" + srv.Addr() + "/0"}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	unknown := "http://u9:" + proxySecret + "@127.0.0.9:3128"

	for name, tc := range map[string]struct {
		env  map[string]string
		args []string
		code int
		want string
	}{
		"ban not in pool":       {good, []string{"ban", unknown, "ozon.example"}, 1, "not in the pool"},
		"ban bad url":           {good, []string{"ban", "http://u9:" + proxySecret + "@127.0.0.9", "ozon.example"}, 1, "missing port"},
		"ban bad duration":      {good, []string{"ban", unknown, "ozon.example", "soon"}, 2, "ban duration"},
		"ban arity":             {good, []string{"ban", unknown}, 2, "ban takes"},
		"unban not in pool":     {good, []string{"unban", unknown, "ozon.example"}, 1, "not in the pool"},
		"unban arity":           {good, []string{"unban"}, 2, "unban takes"},
		"drain not in pool":     {good, []string{"drain", unknown}, 1, "not in the pool"},
		"drain arity":           {good, []string{"drain"}, 2, "drain takes"},
		"revive bad url":        {good, []string{"revive", "ftp://u:" + proxySecret + "@h:1"}, 1, "unsupported scheme"},
		"revive arity":          {good, []string{"revive"}, 2, "revive takes"},
		"clear extra":           {good, []string{"clear", "-yes", "now"}, 2, "clear takes only -yes"},
		"serve bad flag":        {good, []string{"serve", "-port", "1"}, 2, "serve"},
		"serve bad pool":        {good, []string{"serve", "a b"}, 2, "spaces"},
		"serve same pool twice": {good, []string{"serve", "x", "x"}, 2, "named twice"},
		"serve addr taken":      {good, []string{"serve", "-addr", taken.Addr().String()}, 1, "address already in use"},
		"serve bad queue":       {good, []string{"serve", "-queue", "a{b"}, 2, "braces"},
		"serve queue twice":     {good, []string{"serve", "-queue", "q,q"}, 2, `queue "q" named twice`},
		"ban redis down":        {down, []string{"-timeout", "300ms", "ban", unknown, "ozon.example"}, 1, "redis error"},
		"drain wrong password":  {wrong, []string{"drain", unknown}, 1, "WRONGPASS"},
		"clear redis down":      {down, []string{"-timeout", "300ms", "clear", "-yes"}, 1, "redis error"},
		"list wrong password":   {wrong, []string{"list"}, 1, "WRONGPASS"},
		"stats redis down":      {down, []string{"-timeout", "300ms", "stats", "ozon.example"}, 1, "redis error"},
		"list site is a URL":    {good, []string{"list", "https://u9:" + proxySecret + "@www.ozon.example/catalog"}, 2, "is a URL: give the site as the workers' site function names it, by default the host[:port] (for this URL www.ozon.example)"},
		"list proxy as site":    {good, []string{"list", "http://u1:" + proxySecret + "@127.0.0.1:3128"}, 2, "http://xxxxx@127.0.0.1:3128 is a URL"},
		"list empty site":       {good, []string{"list", ""}, 2, "empty SITE"},
		"list site with space":  {good, []string{"list", "ozon example"}, 2, `SITE "ozon example" holds spaces`},
		"list two sites":        {good, []string{"list", "ozon.example", "avito.example"}, 2, "list takes at most one SITE"},
		"list site redis down":  {down, []string{"-timeout", "300ms", "list", "ozon.example"}, 1, "redis error"},
		"list site wrong pass":  {wrong, []string{"list", "ozon.example"}, 1, "WRONGPASS"},
	} {
		t.Run(name, func(t *testing.T) {
			r := cli(t, tc.env, "", append([]string{"-v"}, tc.args...)...)
			assert.Equal(t, tc.code, r.code, r.all())
			assert.Contains(t, r.all(), tc.want)
			assert.NotContains(t, r.all(), redisSecret)
			assert.NotContains(t, r.all(), proxySecret)
		})
	}
}

// TestCLIQueue drives queue NS against a real redis-server with a password:
// counts, dead letters (URL passwords redacted), requeue, and the usage
// errors.
func TestCLIQueue(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", redisSecret)
	env := map[string]string{EnvRedisURL: "redis://:" + redisSecret + "@" + srv.Addr() + "/0"}
	tr := &transcript{t: t, env: env}
	s, err := storage.New(srv.Client(t), storage.WithNamespace("crawl"), storage.WithMaxDeliveries(1),
		storage.WithVisibilityTimeout(100*time.Millisecond), storage.WithPollInterval(time.Millisecond))
	require.NoError(t, err)
	urls := []string{"https://u1:" + proxySecret + "@www.ozon.example/p/1", "https://www.ozon.example/p/2", "https://www.ozon.example/p/3"}
	_, err = s.AddURLs(context.Background(), urls...)
	require.NoError(t, err)

	r := tr.run("queue", "crawl")
	require.Equal(t, 0, r.code, r.all())
	assert.Equal(t, "ready 3, in flight 0, dead 0\n", r.stdout)
	for range urls { // delivered, never acknowledged: their one delivery is spent
		_, err := s.GetRequest()
		require.NoError(t, err)
	}
	time.Sleep(150 * time.Millisecond)
	_, err = s.GetRequest() // buries them
	require.ErrorIs(t, err, storage.ErrQueueEmpty)
	r = tr.run("queue", "crawl", "stats")
	require.Equal(t, 0, r.code, r.all())
	assert.Equal(t, "ready 0, in flight 0, dead 3\n", r.stdout)

	r = tr.run("queue", "crawl", "dead", "2")
	require.Equal(t, 0, r.code, r.all())
	assert.Regexp(t, `ID\s+URL\s+DELIVERIES\s+SINCE\s+REASON`, r.stdout)
	assert.Regexp(t, `\n1\s+https://xxxxx@www\.ozon\.example/p/1\s+1\s+\d{4}-\d\d-\d\dT[0-9:]+Z\s+not acknowledged`, r.stdout)
	assert.Equal(t, 3, strings.Count(r.stdout, "\n"), "a header and two rows")

	r = tr.run("queue", "crawl", "requeue", "1", "3")
	require.Equal(t, 0, r.code, r.all())
	assert.Equal(t, "requeued 1\nrequeued 3\n", r.stdout)
	r = tr.run("queue", "crawl")
	assert.Equal(t, "ready 2, in flight 0, dead 1\n", r.stdout)
	r = tr.run("queue", "crawl", "requeue", "1")
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, `"1" is not a dead letter of namespace "crawl"`)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"queue"}, "queue takes a storage NAMESPACE"},
		{[]string{"queue", "a{b"}, "braces"},
		{[]string{"queue", "crawl", "stats", "x"}, "takes no arguments"},
		{[]string{"queue", "crawl", "dead", "0"}, "want a count from 1 to"},
		{[]string{"queue", "crawl", "dead", "1", "2"}, "at most a count"},
		{[]string{"queue", "crawl", "requeue"}, "takes dead-letter IDs"},
		{[]string{"queue", "crawl", "purge"}, `queue NS "purge"`},
	} {
		r := tr.run(tc.args...)
		assert.Equal(t, 2, r.code, "%v: %s", tc.args, r.all())
		assert.Contains(t, r.stderr, tc.want, tc.args)
	}
	assert.NotContains(t, tr.all.String(), proxySecret)
	assert.NotContains(t, tr.all.String(), redisSecret)
}
