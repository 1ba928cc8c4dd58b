package proxyswitch

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/proxyswitch/proxyswitch/proxyswitchtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestGatewayTemplates(t *testing.T) {
	for _, c := range []struct{ raw, want string }{
		{"http://user-session-{session:3}:pw@GW.example:7000", "http://user-session-{session}:pw@gw.example:7000"},
		{"gw.example:7000:customer-acme-cc-ru-sessid-{session}:pw", "http://customer-acme-cc-ru-sessid-{session}:pw@gw.example:7000"},
		{"user:pw_country-ru_session-{session:2}_lifetime-30m@gw.example:12321", "http://user:pw_country-ru_session-{session}_lifetime-30m@gw.example:12321"},
	} {
		tmpl, _, err := parseGateway(c.raw)
		require.NoError(t, err, c.raw)
		assert.Equal(t, c.want, tmpl, c.raw)
	}
	ps, err := ParseProxies([]string{"http://user-session-{session:3}:pw@gw.example:7000", "http://plain:pw@gw.example:7000",
		"http://user-session-{session:3}:pw@gw.example:7000"})
	require.NoError(t, err)
	require.Len(t, ps, 4, "3 sessions (the template given twice counts once) and the plain proxy")
	ids := map[string]bool{}
	for _, p := range ps[:3] {
		assert.Equal(t, "http://user-session-{session}:pw@gw.example:7000", p.gw)
		assert.Regexp(t, `^http://user-session-[a-z0-9]{8}:pw@gw\.example:7000$`, p.raw())
		ids[p.id] = true
	}
	assert.Len(t, ids, 3, "three sessions, three proxies")
	assert.Empty(t, ps[3].gw)

	for _, bad := range []string{
		"http://user-session-{session:0}:secretpw@gw.example:7000",
		"http://user-session-{session:10001}:secretpw@gw.example:7000",
		"http://user-{session}-{session}:secretpw@gw.example:7000",
		"http://user-session-{sessionx}:secretpw@gw.example:7000",
		"http://gw-{session}.example:7000",
		"http://user:secretpw@gw.example:7000/{session}",
	} {
		_, err := ParseProxies([]string{bad})
		require.ErrorIs(t, err, ErrInvalidProxy, bad)
		assert.NotContains(t, err.Error(), "secretpw", bad)
		assert.NotContains(t, err.Error(), "user-", bad)
	}
	_, err = ParseProxy("http://user-session-{session:3}:secretpw@gw.example:7000")
	require.ErrorIs(t, err, ErrInvalidProxy, "one proxy wanted, a template names many")
	assert.Contains(t, err.Error(), "gateway template")
	assert.NotContains(t, err.Error(), "secretpw")
}

// ids returns the IDs of the pool's proxies.
func poolIDs(t *testing.T, s *Switch) []string {
	t.Helper()
	ps, err := s.List(context.Background())
	require.NoError(t, err)
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.id
	}
	slices.Sort(out)
	return out
}

func TestGatewayEntriesKeepTheirSessions(t *testing.T) {
	ctx := context.Background()
	s := newSwitch(t, shared.Client(t))
	tmpl := "http://user-session-{session:5}:pw@gw.example:7000"
	ch, err := s.Add(ctx, tmpl)
	require.NoError(t, err)
	assert.Equal(t, PoolChange{Added: 5, Size: 5}, ch)
	five := poolIDs(t, s)

	ch, err = s.Add(ctx, tmpl)
	require.NoError(t, err)
	assert.Equal(t, PoolChange{Size: 5}, ch, "the gateway has its 5 sessions: nothing to add")
	ch, err = s.Replace(ctx, []string{tmpl, "http://plain:pw@127.0.0.2:8080"})
	require.NoError(t, err)
	assert.Equal(t, PoolChange{Added: 1, Size: 6}, ch, "a replace with the same template keeps its sessions")
	assert.Subset(t, poolIDs(t, s), five)

	ch, err = s.Replace(ctx, []string{strings.Replace(tmpl, ":5}", ":3}", 1), "http://plain:pw@127.0.0.2:8080"})
	require.NoError(t, err)
	assert.Equal(t, PoolChange{Removed: 2, Size: 4}, ch, "fewer sessions: 3 of the 5 stay")
	assert.Len(t, slices.DeleteFunc(poolIDs(t, s), func(id string) bool { return !slices.Contains(five, id) }), 3)

	ch, err = s.Remove(ctx, tmpl)
	require.NoError(t, err)
	assert.Equal(t, PoolChange{Removed: 3, Size: 1}, ch, "removing the template removes its sessions, whatever the count")
}

// TestGatewayBanRotatesOnce: a ban of a virtual proxy replaces it by a new
// session of its gateway, once, whoever reports it (two workers, or one
// reporting twice); the pool keeps its size.
func TestGatewayBanRotatesOnce(t *testing.T) {
	ctx := context.Background()
	s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: Off}))
	s2 := sibling(t, s, shared.Client(t))
	_, err := s.Add(ctx, "http://user-session-{session:3}:pw@gw.example:7000", "http://plain:pw@127.0.0.2:8080")
	require.NoError(t, err)
	before := poolIDs(t, s)

	var l *Lease
	for l == nil || l.proxy.gw == "" && strings.Contains(l.proxy.raw(), "plain") {
		if l != nil {
			defer l.Release(ctx)
		}
		l, err = s.Lease(ctx, "shop.example")
		require.NoError(t, err)
	}
	require.NoError(t, l.Report(ctx, ban.Verdict{Kind: ban.Ban, Reason: "http_403"}))
	require.NoError(t, l.Report(ctx, ban.Verdict{Kind: ban.Ban, Reason: "http_403"}), "a second report finds it gone")
	l2, err := s2.proxyFor(l.proxy.raw())
	require.NoError(t, err)
	_, err = s2.penalize(ctx, "shop.example", l2, nil, ban.Verdict{Kind: ban.Ban, Reason: "http_403"})
	require.NoError(t, err, "another worker's ban of the same session")

	after := poolIDs(t, s)
	require.Len(t, after, 4, "one session replaced by one")
	assert.NotContains(t, after, l.proxy.id)
	assert.Len(t, slices.DeleteFunc(slices.Clone(after), func(id string) bool { return slices.Contains(before, id) }), 1)
	st, err := s.ProxyStates(ctx, "shop.example")
	require.NoError(t, err)
	for _, ps := range st {
		assert.NotEqual(t, StateQuarantined, ps.State, "a rotated session leaves no quarantine: %s", ps.Proxy.id)
	}
	assert.Equal(t, int64(3), s.BanCounts()[BanKey{"shop.example", "http_403"}]+s2.BanCounts()[BanKey{"shop.example", "http_403"}],
		"bans count as bans")

	// The plain proxy is quarantined as ever; an operator's ban too.
	plain, err := ParseProxy("http://plain:pw@127.0.0.2:8080")
	require.NoError(t, err)
	_, err = s.penalize(ctx, "shop.example", plain, nil, ban.Verdict{Kind: ban.Ban, Reason: "http_403"})
	require.NoError(t, err)
	assert.Len(t, poolIDs(t, s), 4)
	assert.Contains(t, poolIDs(t, s), plain.id)
}

// gatewaySite is a site that refuses (403) the exit IPs burnt on it.
type gatewaySite struct {
	*testbed.Site
	mu    sync.Mutex
	burnt map[string]bool
}

func newGatewaySite(t *testing.T, name string) *gatewaySite {
	g := &gatewaySite{burnt: map[string]bool{}}
	g.Site = testbed.NewSite(t, name, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ip, _, _ := net.SplitHostPort(r.RemoteAddr)
		g.mu.Lock()
		b := g.burnt[ip]
		g.mu.Unlock()
		if b {
			http.Error(w, "forbidden", http.StatusForbidden)
			return
		}
		time.Sleep(2 * time.Millisecond)
		fmt.Fprintf(w, "<html><body><h1>%s</h1>%s</body></html>", r.URL.Path, strings.Repeat("x", 512))
	}))
	return g
}

func (g *gatewaySite) burn(ip string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.burnt[ip] = true
}

// The acceptance test of gateway entries: a crawl through a fake gateway
// of 4 sessions, 32 exit IPs, on two sites. A site refuses the exit IP
// of the first session: the ban rotates that session, the retry and every
// later request leave from other IPs; no two requests reach a site from
// one exit IP at once; the pool keeps 4 sessions, one of them new.
func TestGatewayCrawlRotatesBannedSessions(t *testing.T) {
	gw := proxyswitchtest.NewGateway(t, proxyswitchtest.GatewayConfig{Exits: 32})
	sites := []*gatewaySite{newGatewaySite(t, "a"), newGatewaySite(t, "b")}
	exits := gw.Exits()
	sites[0].burn(exits[0]) // the first session's exit
	s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: 20 * time.Second}))
	_, err := s.Add(context.Background(), gw.Template("customer-test", 4))
	require.NoError(t, err)
	before := poolIDs(t, s)

	c := colly.NewCollector(colly.AllowURLRevisit(), colly.Async(true))
	require.NoError(t, c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: 4}))
	s.Attach(c)
	var mu sync.Mutex
	var failed []string
	ok := 0
	c.OnResponse(func(r *colly.Response) { mu.Lock(); ok++; mu.Unlock() })
	c.OnError(func(r *colly.Response, err error) {
		mu.Lock()
		failed = append(failed, fmt.Sprintf("%s: %v", r.Request.URL, err))
		mu.Unlock()
	})
	const pages = 40
	for i := range pages {
		require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", sites[i%2].URL(), i)))
	}
	c.Wait()
	assert.Empty(t, failed)
	assert.Equal(t, pages, ok)

	refused := 0
	for i, site := range sites {
		rec := site.Recorder()
		assert.Zero(t, rec.Collisions(), "site %d: two requests from one exit IP at once", i)
		assert.Zero(t, rec.DirectHits(), "site %d: a request without a proxy", i)
		for _, h := range rec.Hits() {
			if h.Status == http.StatusForbidden {
				refused++
				assert.Equal(t, exits[0], h.ClientIP)
			}
		}
		if i == 0 {
			assert.Equal(t, refused, rec.IPs()[exits[0]], "every request from the burnt exit was refused, and then it was left")
		}
	}
	assert.Equal(t, 1, refused, "one ban: the session rotated at once")
	after := poolIDs(t, s)
	assert.Len(t, after, 4)
	assert.Len(t, slices.DeleteFunc(slices.Clone(after), func(id string) bool { return slices.Contains(before, id) }), 1,
		"one new session")
	assert.Equal(t, 5, gw.Sessions(), "the gateway saw 4 sessions and the new one")
}

// A task's sticky session holds one provider session, hence one exit IP,
// for its life; a ban on its exit retires it and rotates the provider
// session, and the task goes on from one other IP.
func TestGatewayStickyTasksKeepOneExitIP(t *testing.T) {
	gw := proxyswitchtest.NewGateway(t, proxyswitchtest.GatewayConfig{Exits: 32})
	site := newGatewaySite(t, "shop")
	s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: 20 * time.Second}))
	_, err := s.Add(context.Background(), gw.Template("customer-test", 6))
	require.NoError(t, err)
	before := poolIDs(t, s)
	c := attached(s)
	var failed []error
	c.OnError(func(r *colly.Response, err error) { failed = append(failed, err) })

	const tasks, steps = 3, 8
	ipsOf := make([][]string, tasks)
	c.OnResponse(func(r *colly.Response) {
		k := 0
		fmt.Sscanf(r.Request.URL.Query().Get("task"), "t%d", &k)
		hits := site.Recorder().Hits()
		ipsOf[k] = append(ipsOf[k], hits[len(hits)-1].ClientIP)
	})
	for n := range steps {
		if n == steps/2 { // task 0's exit is burnt half way
			site.burn(ipsOf[0][0])
		}
		for k := range tasks {
			ctx := NewTaskContext(fmt.Sprintf("t%d", k))
			require.NoError(t, c.Request("GET", fmt.Sprintf("%s/step?task=t%d&n=%d", site.URL(), k, n), nil, ctx, nil))
		}
	}
	require.Empty(t, failed)
	for k, ips := range ipsOf {
		require.Len(t, ips, steps)
		if k == 0 {
			assert.Equal(t, slices.Repeat(ips[:1], steps/2), ips[:steps/2], "task 0: one IP until the ban")
			assert.Equal(t, slices.Repeat(ips[steps/2:steps/2+1], steps/2), ips[steps/2:], "task 0: one other IP after it")
			assert.NotEqual(t, ips[0], ips[steps/2])
			continue
		}
		assert.Equal(t, slices.Repeat(ips[:1], steps), ips, "task %d keeps one exit IP", k)
	}
	assert.Len(t, map[string]bool{ipsOf[0][steps-1]: true, ipsOf[1][0]: true, ipsOf[2][0]: true}, 3, "tasks never share an exit")
	assert.Equal(t, 4, gw.Sessions(), "the gateway saw the tasks' 3 sessions and task 0's second")
	after := poolIDs(t, s)
	assert.Len(t, after, 6)
	assert.Len(t, slices.DeleteFunc(slices.Clone(after), func(id string) bool { return slices.Contains(before, id) }), 1,
		"the banned session was replaced by one new")
}

// A rotation ends the banned lease only: the same session's live leases on
// other sites stay with their holders (extended, released as usual), and
// the old session is never leased again.
func TestGatewayRotationLeavesOtherLeases(t *testing.T) {
	ctx := context.Background()
	s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: Off}))
	_, err := s.Add(ctx, "http://user-session-{session:1}:pw@gw.example:7000")
	require.NoError(t, err)
	a, err := s.Lease(ctx, "a.example")
	require.NoError(t, err)
	b, err := s.LeaseProxy(ctx, "b.example", a.proxy.id)
	require.NoError(t, err)
	require.NoError(t, a.Report(ctx, ban.Verdict{Kind: ban.Ban, Reason: "http_403"}))
	require.NotContains(t, poolIDs(t, s), a.proxy.id)

	require.NoError(t, b.Extend(ctx, time.Minute), "b's lease is still b's")
	c, err := s.Lease(ctx, "b.example")
	require.NoError(t, err, "the new session is free on b")
	assert.NotEqual(t, a.proxy.id, c.proxy.id)
	require.NoError(t, b.Release(ctx))
	require.NoError(t, c.Release(ctx))
	for range 3 { // the old session's slot, released, is dropped, never leased
		l, err := s.Lease(ctx, "b.example")
		if err == nil {
			assert.NotEqual(t, a.proxy.id, l.proxy.id)
			require.NoError(t, l.Release(ctx))
		}
	}
}
