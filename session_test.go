package proxyswitch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/proxyswitch/proxyswitch/internal/testlog"
	"github.com/proxyswitch/proxyswitch/storage"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// shopFlow is a fake shop that checks sticky sessions from the outside, as
// an anti-bot system would. The crawler names its task in the "task" query
// parameter (the shop's own way to follow a visitor; proxyswitch never sends
// it). For each task the shop follows the client IP and the cookies it
// issued: a visitor whose IP changes must come without any of the old
// cookies (a new visitor), and a visitor whose IP stays must bring back
// exactly the cookies it was given, and none of another visitor's.
//
//	/step?task=T&n=N  a step of a flow: checks the cookies, then sets
//	                  sid (once per visitor) and cart=T-N
//	/hello?task=T     a step that sets and checks nothing
//	/bulk             a request of no task: sets the cookie bulk
//
// An IP given to Ban gets 403 everywhere.
type shopFlow struct {
	sid, cart string // the names of its cookies
	mu        sync.Mutex
	tasks     map[string]*flowVisitor
	ips       map[string]*flowIP
	bulk      []flowHit
	banned    map[string]bool
	errs      []string
	seq       int
}

type flowVisitor struct {
	ips       []string // the IPs in the order they came, with repeats folded
	sid, cart string   // the cookies the current visitor holds
	steps     int
	fresh     int // IP changes that came without old cookies
}

type flowIP struct {
	tasks map[string]bool
	first time.Time // the first request of a task from this IP
}

type flowHit struct {
	ip string
	at time.Time
}

func newShopFlow() *shopFlow {
	return &shopFlow{sid: "sid", cart: "cart", tasks: map[string]*flowVisitor{}, ips: map[string]*flowIP{}, banned: map[string]bool{}}
}

func (f *shopFlow) Ban(ip string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.banned[ip] = true
}

func (f *shopFlow) errorf(format string, a ...any) {
	f.errs = append(f.errs, fmt.Sprintf(format, a...))
}

func (f *shopFlow) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ip, _, _ := strings.Cut(r.RemoteAddr, ":")
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.banned[ip] {
		w.WriteHeader(http.StatusForbidden)
		return
	}
	cookies := map[string][]string{}
	for _, c := range r.Cookies() {
		cookies[c.Name] = append(cookies[c.Name], c.Value)
	}
	task := r.URL.Query().Get("task")
	if r.URL.Path == "/bulk" {
		f.bulk = append(f.bulk, flowHit{ip, now})
		if len(cookies[f.sid])+len(cookies[f.cart]) > 0 {
			f.errorf("a request of no task brought session cookies %v", cookies)
		}
		http.SetCookie(w, &http.Cookie{Name: "bulk", Value: "1", Path: "/"})
		return
	}
	if task == "" {
		http.NotFound(w, r)
		return
	}
	v := f.tasks[task]
	if v == nil {
		v = &flowVisitor{}
		f.tasks[task] = v
	}
	byIP := f.ips[ip]
	if byIP == nil {
		byIP = &flowIP{tasks: map[string]bool{}, first: now}
		f.ips[ip] = byIP
	}
	byIP.tasks[task] = true
	if len(cookies["bulk"]) > 0 {
		f.errorf("task %s brought the cookie of requests of no task", task)
	}
	if n := len(v.ips); n > 0 && v.ips[n-1] != ip {
		// Another IP: a new visitor, who must not bring the old one's cookies.
		if len(cookies[f.sid])+len(cookies[f.cart]) > 0 {
			f.errorf("task %s came from a new IP %s with the old cookies %v", task, ip, cookies)
		} else {
			v.fresh++
		}
		v.sid, v.cart = "", ""
	}
	if n := len(v.ips); n == 0 || v.ips[n-1] != ip {
		v.ips = append(v.ips, ip)
	}
	if r.URL.Path != "/step" {
		return
	}
	v.steps++
	want := map[string]string{f.sid: v.sid, f.cart: v.cart}
	for name, val := range want {
		got := cookies[name]
		switch {
		case val == "" && len(got) > 0:
			f.errorf("task %s step %s: cookie %s=%v it was never given", task, r.URL.Query().Get("n"), name, got)
		case val != "" && (len(got) != 1 || got[0] != val):
			f.errorf("task %s step %s: cookie %s=%v, want %q", task, r.URL.Query().Get("n"), name, got, val)
		}
	}
	if v.sid == "" {
		f.seq++
		v.sid = fmt.Sprintf("v%d", f.seq)
		http.SetCookie(w, &http.Cookie{Name: f.sid, Value: v.sid, Path: "/"})
	}
	v.cart = task + "-" + r.URL.Query().Get("n")
	http.SetCookie(w, &http.Cookie{Name: f.cart, Value: v.cart, Path: "/", MaxAge: 3600})
}

// visitor returns a copy of what the shop knows of task.
func (f *shopFlow) visitor(task string) flowVisitor {
	f.mu.Lock()
	defer f.mu.Unlock()
	if v := f.tasks[task]; v != nil {
		c := *v
		c.ips = slices.Clone(v.ips)
		return c
	}
	return flowVisitor{}
}

func (f *shopFlow) errors() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.errs)
}

// sessionShop starts a shopFlow site and n proxies, and a Switch with them.
func sessionShop(t *testing.T, n int, opts ...Option) (*shopFlow, *testbed.Site, []*testbed.Proxy, *Switch) {
	t.Helper()
	flow := newShopFlow()
	site := testbed.NewSite(t, "shop", flow)
	bed := &testbed.Bed{Sites: []*testbed.Site{site}, Proxies: testbed.NewProxies(t, n)}
	s := newSwitch(t, shared.Client(t), opts...)
	_, err := s.Add(context.Background(), bed.ProxyURLs()...)
	require.NoError(t, err)
	return flow, site, bed.Proxies, s
}

// attached returns a synchronous collector with s attached.
func attached(s *Switch) *colly.Collector {
	c := colly.NewCollector(colly.AllowURLRevisit())
	s.Attach(c)
	c.SetRequestTimeout(30 * time.Second)
	return c
}

func stepURL(site *testbed.Site, task string, n int) string {
	return fmt.Sprintf("%s/step?task=%s&n=%d", site.URL(), url.QueryEscape(task), n)
}

// The acceptance test: 100 sessions of 20 steps each, every step on another
// of 3 collectors with Redis clients of their own, while requests of no
// task crawl the same shop. Every session leaves from one IP, no IP serves
// two sessions, the requests of no task never use an IP a session holds,
// and cookies never cross sessions or reach the collectors' jars.
func TestSessions100x20AcrossThreeCollectors(t *testing.T) {
	const tasks, steps, extra = 100, 20, 12
	// A 2-second lease TTL: a session ended by another server than the last
	// to use it frees its proxy two renewal ticks (1s) after that use.
	flow, site, _, s0 := sessionShop(t, tasks+extra, WithTimeouts(Timeouts{MaxWait: 20 * time.Second, LeaseTTL: 2 * time.Second}))
	sws := []*Switch{s0, sibling(t, s0, shared.Client(t)), sibling(t, s0, shared.Client(t))}
	cs := make([]*colly.Collector, len(sws))
	var failed atomic.Int64
	for i, sw := range sws {
		cs[i] = attached(sw)
		cs[i].OnError(func(r *colly.Response, err error) {
			failed.Add(1)
			t.Errorf("%s: %v", r.Request.URL, err)
		})
	}

	start := time.Now()
	stop := make(chan struct{})
	var bulk sync.WaitGroup
	for i := range cs {
		bulk.Add(1)
		go func() { // requests of no task, all along
			defer bulk.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				_ = cs[i].Visit(site.URL() + "/bulk")
			}
		}()
	}
	var wg sync.WaitGroup
	for k := range tasks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			task := fmt.Sprintf("shopper-%03d", k)
			ctx := NewTaskContext(task)
			// The flow opens with three requests at once, one per collector:
			// they race to start the session and must share its IP.
			var open sync.WaitGroup
			for _, c := range cs {
				open.Add(1)
				go func() {
					defer open.Done()
					_ = c.Request("GET", site.URL()+"/hello?task="+task, nil, ctx, nil)
				}()
			}
			open.Wait()
			for n := 1; n <= steps; n++ {
				_ = cs[(k+n)%len(cs)].Request("GET", stepURL(site, task, n), nil, ctx, nil)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(stop)
	bulk.Wait()

	assert.Zero(t, failed.Load(), "failed requests")
	assert.Empty(t, flow.errors(), "what the shop saw wrong")
	flow.mu.Lock()
	sessionIPs := map[string]string{}
	for task, v := range flow.tasks {
		assert.Len(t, v.ips, 1, "task %s changed IP: %v", task, v.ips)
		assert.Equal(t, steps, v.steps, task)
		sessionIPs[v.ips[0]] = task
	}
	for ip, byIP := range flow.ips {
		assert.Len(t, byIP.tasks, 1, "IP %s served several sessions", ip)
	}
	var bulkDuring int
	for _, h := range flow.bulk {
		if byIP := flow.ips[h.ip]; byIP != nil && h.at.After(byIP.first) {
			bulkDuring++
		}
	}
	nbulk := len(flow.bulk)
	flow.mu.Unlock()
	assert.Len(t, sessionIPs, tasks, "one IP per session")
	assert.Zero(t, bulkDuring, "requests of no task from an IP a live session held")
	assert.Positive(t, nbulk)
	for i, c := range cs {
		for _, ck := range c.Cookies(site.URL() + "/step") {
			assert.Equal(t, "bulk", ck.Name, "collector %d's jar holds a session cookie", i)
		}
	}
	t.Logf("%d sessions x (3 + %d) requests and %d requests of no task through 3 collectors in %v (%.0f session requests/s)",
		tasks, steps, nbulk, elapsed.Round(time.Millisecond), float64(tasks*(steps+3))/elapsed.Seconds())

	// Every session holds its proxy until it ends; ending them frees all.
	st, err := s0.Stats(context.Background(), site.Host())
	require.NoError(t, err)
	assert.Equal(t, tasks, st.Leased, "live leases: one per session")
	for k := range tasks {
		ended, err := sws[k%3].EndSession(context.Background(), fmt.Sprintf("shopper-%03d", k))
		require.NoError(t, err)
		assert.True(t, ended)
	}
	st, err = s0.Stats(context.Background(), site.Host())
	require.NoError(t, err)
	assert.Zero(t, st.Leased)
	require.Eventually(t, func() bool {
		st, err = s0.Stats(context.Background(), site.Host())
		return err == nil && st.FreeSlots == tasks+extra
	}, 3*time.Second, 20*time.Millisecond, "every proxy free within the requests' hold")
	assertNoLeases(t, s0, site)
}

// A ban in the middle of a session retires it: the next step leaves from
// another IP with none of the old cookies, and the retirement is reported.
func TestSessionRetiredOnBan(t *testing.T) {
	var mu sync.Mutex
	var retired []SessionRetirement
	flow, site, _, s := sessionShop(t, 3, WithSessions(Sessions{Retired: func(r SessionRetirement) {
		mu.Lock()
		retired = append(retired, r)
		mu.Unlock()
	}}))
	other := sibling(t, s, shared.Client(t))
	cs := []*colly.Collector{attached(s), attached(other)}
	const task = "cart-42"
	ctx := NewTaskContext(task)
	step := func(n int) error { return cs[n%2].Request("GET", stepURL(site, task, n), nil, ctx, nil) }
	for n := 1; n <= 4; n++ {
		require.NoError(t, step(n))
	}
	before := flow.visitor(task)
	require.Len(t, before.ips, 1)
	first := SessionOf(ctx)
	require.NotNil(t, first)
	assert.Equal(t, 1, first.Generation)
	assert.Nil(t, first.Previous)
	cookies, err := s.SessionCookies(context.Background(), task, mustURL(t, site.URL()+"/step"))
	require.NoError(t, err)
	assert.Len(t, cookies, 2, "sid and cart are in the session's jar")

	flow.Ban(before.ips[0])
	require.NoError(t, step(5), "the banned step is sent again through another proxy, in a new session")
	after := flow.visitor(task)
	require.Len(t, after.ips, 2, "one IP change")
	assert.NotEqual(t, before.ips[0], after.ips[1])
	assert.Equal(t, 1, after.fresh, "the new IP came without the old cookies")
	for n := 6; n <= 8; n++ {
		require.NoError(t, step(n))
	}
	assert.Len(t, flow.visitor(task).ips, 2, "the new session keeps its IP")
	assert.Empty(t, flow.errors())

	mu.Lock()
	require.Len(t, retired, 1)
	r := retired[0]
	mu.Unlock()
	assert.Equal(t, task, r.Task)
	assert.Equal(t, first.ID, r.ID)
	assert.Equal(t, "http_403", r.Reason)
	assert.Equal(t, site.Host(), r.Site)
	assert.Equal(t, first.Proxy, r.Proxy)
	assert.Equal(t, 5, r.Requests, "four steps and the banned one")
	info := SessionOf(ctx)
	require.NotNil(t, info)
	assert.Equal(t, 2, info.Generation)
	assert.NotEqual(t, first.ID, info.ID)
	require.NotNil(t, info.Previous)
	assert.Equal(t, "http_403", info.Previous.Reason)
	assert.Equal(t, first.ID, info.Previous.ID)
	assert.Equal(t, int64(1), s.BanCounts()[BanKey{site.Host(), "http_403"}]+other.BanCounts()[BanKey{site.Host(), "http_403"}])

	// The banned proxy is quarantined for everyone: a new task never gets it.
	require.NoError(t, cs[0].Request("GET", stepURL(site, "other", 1), nil, NewTaskContext("other"), nil))
	assert.NotEqual(t, before.ips[0], flow.visitor("other").ips[0])
}

// A session that nobody uses for its TTL frees its proxy; a task continued
// on another collector within the TTL keeps its IP, and each use renews it.
func TestSessionTTL(t *testing.T) {
	const ttl = 2 * time.Second
	flow, site, _, s := sessionShop(t, 2, WithSessions(Sessions{TTL: ttl}), WithTimeouts(Timeouts{MaxWait: Off}))
	other := sibling(t, s, shared.Client(t))
	c1, c2 := attached(s), attached(other)
	visit := func(c *colly.Collector, task string, n int) error {
		return c.Request("GET", stepURL(site, task, n), nil, NewTaskContext(task), nil)
	}
	require.NoError(t, visit(c1, "a", 1))
	require.NoError(t, visit(c2, "b", 1))
	ipA := flow.visitor("a").ips[0]
	assert.NotEqual(t, ipA, flow.visitor("b").ips[0])

	// Both proxies are held by live sessions: a third task finds none.
	err := visit(c1, "c", 1)
	require.ErrorIs(t, err, ErrNoProxy)
	assert.Empty(t, flow.visitor("c").ips, "no request left without a proxy")

	// a goes on on the other collector, renewing its session; b goes quiet.
	for n := 2; n <= 4; n++ {
		time.Sleep(ttl / 3)
		require.NoError(t, visit([]*colly.Collector{c2, c1}[n%2], "a", n))
	}
	assert.Equal(t, []string{ipA}, flow.visitor("a").ips, "a keeps its IP across collectors")
	info, err := s.Session(context.Background(), "a")
	require.NoError(t, err)
	require.NotNil(t, info)
	assert.Equal(t, 4, info.Requests)

	// b's session lapsed (no reaper ran): its proxy serves c now.
	time.Sleep(ttl/3 + 200*time.Millisecond)
	info, err = s.Session(context.Background(), "b")
	require.NoError(t, err)
	assert.Nil(t, info, "b's session lapsed")
	require.NoError(t, visit(c1, "c", 1))
	assert.Equal(t, flow.visitor("b").ips, flow.visitor("c").ips, "c got the proxy b's session freed")
	require.NoError(t, visit(c2, "a", 5))
	assert.Equal(t, []string{ipA}, flow.visitor("a").ips)
	assert.Empty(t, flow.errors())
}

func mustURL(t *testing.T, raw string) *url.URL {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err)
	return u
}

// Bad input fails clearly and closed: no request leaves without its
// session, nothing panics, and a corrupt record can be cleared.
func TestSessionBadInput(t *testing.T) {
	ctx := context.Background()
	flow, site, _, s := sessionShop(t, 2)
	c := attached(s)
	visit := func(task string) error {
		cctx := colly.NewContext()
		cctx.Put(TaskKey, task)
		return c.Request("GET", stepURL(site, "probe", 1), nil, cctx, nil)
	}
	for name, task := range map[string]string{
		"huge":        strings.Repeat("x", 300),
		"control":     "cart\n42",
		"not utf-8":   "cart\xff",
		"empty":       "",
		"zero width":  "cart\u200b42",
		"no-break sp": "cart\u00a042",
	} {
		err := visit(task)
		assert.ErrorIs(t, err, ErrInvalidTask, name)
		assert.ErrorIs(t, err, ErrNoProxy, name)
	}
	assert.Empty(t, flow.visitor("probe").ips, "no request with a bad task left")
	assert.NotContains(t, visit(strings.Repeat("y", 300)).Error(), "yyyy", "a huge task ID is not echoed")

	// A TaskKey of another type fails too, rather than go out as a request
	// of no task (through any proxy, with the collector's cookies); a
	// context without TaskKey is no task.
	for _, v := range []any{42, []byte("cart"), 'c'} {
		cctx := colly.NewContext()
		cctx.Put(TaskKey, v)
		err := c.Request("GET", stepURL(site, "probe", 1), nil, cctx, nil)
		assert.ErrorIs(t, err, ErrInvalidTask, "%T", v)
		assert.ErrorIs(t, err, ErrNoProxy, "%T", v)
		assert.Contains(t, err.Error(), fmt.Sprintf("%T", v))
	}
	assert.Empty(t, flow.visitor("probe").ips, "no request with a bad task left")
	require.NoError(t, c.Request("GET", site.URL()+"/hello?task=none", nil, colly.NewContext(), nil))
	require.NoError(t, visit("корзина 42 ✓"), "printable UTF-8 and ASCII spaces")
	info, err := s.Session(ctx, "корзина 42 ✓")
	require.NoError(t, err)
	assert.NotNil(t, info)
	ended, err := s.EndSession(ctx, "корзина 42 ✓")
	require.NoError(t, err)
	require.True(t, ended)

	// A task function that panics fails the request.
	ps := newSwitch(t, shared.Client(t), WithTaskFunc(func(*colly.Request) string { panic("boom") }))
	pc := attached(ps)
	err = pc.Visit(site.URL() + "/hello?task=panic")
	require.ErrorIs(t, err, ErrInvalidTask)
	assert.Contains(t, err.Error(), "panicked")

	// The API refuses bad task IDs too.
	for _, task := range []string{"", strings.Repeat("z", 257)} {
		_, err := s.Session(ctx, task)
		assert.ErrorIs(t, err, ErrInvalidTask)
		_, err = s.EndSession(ctx, task)
		assert.ErrorIs(t, err, ErrInvalidTask)
		_, err = s.SessionCookies(ctx, task, mustURL(t, site.URL()))
		assert.ErrorIs(t, err, ErrInvalidTask)
	}
	_, err = s.SessionCookies(ctx, "t", nil)
	assert.ErrorIs(t, err, ErrConfig)

	// Corrupt records and jars: a clear error naming the task, then
	// EndSession clears the record and the task goes on.
	rdb := shared.Client(t)
	require.NoError(t, c.Request("GET", stepURL(site, "jarred", 1), nil, NewTaskContext("jarred"), nil))
	live, err := s.Session(ctx, "jarred")
	require.NoError(t, err)
	for _, tc := range []struct {
		name  string
		spoil func(task string) error
	}{
		{"a string", func(task string) error { return rdb.Set(ctx, s.keys.session(task), "x", 0).Err() }},
		{"bad fields", func(task string) error { return rdb.HSet(ctx, s.keys.session(task), "id", "zz!", "proxy", "p").Err() }},
		{"bad exp", func(task string) error {
			return rdb.HSet(ctx, s.keys.session(task), "id", "ab", "proxy", "cd", "gen", "1", "created", "1", "n", "1", "exp", "soon").Err()
		}},
		{"a jar of list", func(string) error {
			jar := s.keys.sessionJar(live.ID)
			return errors.Join(rdb.Del(ctx, jar).Err(), rdb.RPush(ctx, jar, "x").Err())
		}},
	} {
		name, spoil := tc.name, tc.spoil
		task := "corrupt-" + strings.ReplaceAll(name, " ", "-")
		if name == "a jar of list" {
			task = "jarred"
		}
		require.NoError(t, spoil(task), name)
		err := c.Request("GET", stepURL(site, task, 1), nil, NewTaskContext(task), nil)
		require.ErrorIs(t, err, ErrCorrupt, name)
		require.ErrorIs(t, err, ErrNoProxy, name)
		assert.Contains(t, err.Error(), task, name)
		_, err = s.Session(ctx, task)
		assert.ErrorIs(t, err, ErrCorrupt, name)
		ended, err := s.EndSession(ctx, task)
		require.NoError(t, err, name)
		assert.True(t, ended, name)
		require.NoError(t, rdb.Del(ctx, s.keys.sessionJar(live.ID)).Err())
		require.NoError(t, c.Request("GET", stepURL(site, task+"-x", 1), nil, NewTaskContext(task), nil), name)
		_, err = s.EndSession(ctx, task)
		require.NoError(t, err)
	}
	ended, err = s.EndSession(ctx, "never-seen")
	require.NoError(t, err)
	assert.False(t, ended)
}

// Sessions.MaxRequests and Sessions.MaxAge retire a session: the next
// request starts a new one, and the retirement is reported.
func TestSessionLimits(t *testing.T) {
	var reasons []string
	var mu sync.Mutex
	report := WithSessions(Sessions{Retired: func(r SessionRetirement) {
		mu.Lock()
		reasons = append(reasons, r.Reason+"/"+fmt.Sprint(r.Requests))
		mu.Unlock()
	}})
	flow, site, _, s := sessionShop(t, 3, WithSessions(Sessions{MaxRequests: 3}), report)
	c := attached(s)
	ctx := NewTaskContext("limited")
	for n := 1; n <= 7; n++ {
		require.NoError(t, c.Request("GET", stepURL(site, "limited", n), nil, ctx, nil))
	}
	v := flow.visitor("limited")
	assert.Len(t, v.ips, 3, "three sessions of at most 3 requests each: %v", v.ips)
	assert.Equal(t, 2, v.fresh, "each new session came without the old cookies")
	assert.Equal(t, 3, SessionOf(ctx).Generation)
	assert.Equal(t, 1, SessionOf(ctx).Requests)
	assert.Equal(t, SessionMaxRequests, SessionOf(ctx).Previous.Reason)
	mu.Lock()
	assert.Equal(t, []string{"max_requests/3", "max_requests/3"}, reasons)
	reasons = nil
	mu.Unlock()

	flow, site, _, s = sessionShop(t, 3, WithSessions(Sessions{MaxAge: time.Second}), report)
	c = attached(s)
	ctx = NewTaskContext("aged")
	require.NoError(t, c.Request("GET", stepURL(site, "aged", 1), nil, ctx, nil))
	require.NoError(t, c.Request("GET", stepURL(site, "aged", 2), nil, ctx, nil))
	time.Sleep(1100 * time.Millisecond)
	require.NoError(t, c.Request("GET", stepURL(site, "aged", 3), nil, ctx, nil))
	assert.Len(t, flow.visitor("aged").ips, 2)
	mu.Lock()
	assert.Equal(t, []string{"max_age/2"}, reasons)
	mu.Unlock()
	assert.Empty(t, flow.errors())
}

// A task keeps its IP across sites: its session leases the same proxy on
// each site it reaches, waiting for it there like any lease, and fails
// (closed) when another session holds it there.
func TestSessionAcrossSites(t *testing.T) {
	flowB := newShopFlow()
	flowB.sid, flowB.cart = "b_sid", "b_cart" // both sites are 127.0.0.1: cookies ignore ports
	siteB := testbed.NewSite(t, "shop-b", flowB)
	flow, site, proxies, s := sessionShop(t, 2, WithTimeouts(Timeouts{MaxWait: 5 * time.Second}))
	c := attached(s)
	ctx := NewTaskContext("wanderer")
	require.NoError(t, c.Request("GET", stepURL(site, "wanderer", 1), nil, ctx, nil))
	require.NoError(t, c.Request("GET", stepURL(siteB, "wanderer", 1), nil, ctx, nil))
	require.NoError(t, c.Request("GET", stepURL(site, "wanderer", 2), nil, ctx, nil))
	ip := flow.visitor("wanderer").ips
	require.Len(t, ip, 1)
	assert.Equal(t, ip, flowB.visitor("wanderer").ips, "one IP on both sites")

	// On a third site a request of no task holds wanderer's proxy for a
	// moment: wanderer waits for it rather than change IP.
	flowC := newShopFlow()
	flowC.sid, flowC.cart = "c_sid", "c_cart"
	siteC := testbed.NewSite(t, "shop-c", flowC)
	var held *Lease
	for range proxies {
		l, err := s.Lease(context.Background(), siteC.Host())
		require.NoError(t, err)
		if l.Proxy().URL().Host == proxyHost(t, proxies, ip[0]) {
			held = l
		} else {
			defer l.Release(context.Background())
		}
	}
	require.NotNil(t, held)
	time.AfterFunc(200*time.Millisecond, func() { _ = held.Release(context.Background()) })
	start := time.Now()
	require.NoError(t, c.Request("GET", stepURL(siteC, "wanderer", 1), nil, ctx, nil))
	assert.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond, "it waited for its proxy")
	assert.Equal(t, ip, flowC.visitor("wanderer").ips)

	// blocker's session holds the other proxy on site B; other's session
	// gets it on site A, then reaches site B: it waits for its proxy there,
	// then fails rather than change IP.
	require.NoError(t, c.Request("GET", stepURL(siteB, "blocker", 1), nil, NewTaskContext("blocker"), nil))
	require.NoError(t, c.Request("GET", stepURL(site, "other", 1), nil, NewTaskContext("other"), nil))
	assert.Equal(t, flowB.visitor("blocker").ips, flow.visitor("other").ips)
	start = time.Now()
	err := c.Request("GET", stepURL(siteB, "other", 2), nil, NewTaskContext("other"), nil)
	require.ErrorIs(t, err, ErrNoProxy)
	assert.Contains(t, err.Error(), "held by another session or quarantined")
	assert.Less(t, time.Since(start), 4*time.Second, "no use waiting out the 5s: blocker's session holds it for minutes")
	assert.Empty(t, flowB.visitor("other").ips, "no request left from another IP")
	ended, err := s.EndSession(context.Background(), "blocker")
	require.NoError(t, err)
	require.True(t, ended)
	require.NoError(t, c.Request("GET", stepURL(siteB, "other", 2), nil, NewTaskContext("other"), nil))
	assert.Equal(t, flow.visitor("other").ips, flowB.visitor("other").ips)
	assert.Empty(t, flow.errors())
	assert.Empty(t, flowB.errors())
}

// With Rotation.Concurrency above 1 a session still keeps its proxy to itself on
// its sites: no other session and no request of no task shares the IP.
func TestSessionHoldsEverySlot(t *testing.T) {
	ctx := context.Background()
	flow, site, _, s := sessionShop(t, 2, WithRotation(Rotation{Concurrency: 3}), WithTimeouts(Timeouts{MaxWait: 200 * time.Millisecond}))
	c := attached(s)
	require.NoError(t, c.Request("GET", stepURL(site, "first", 1), nil, NewTaskContext("first"), nil))
	require.NoError(t, c.Request("GET", stepURL(site, "second", 1), nil, NewTaskContext("second"), nil))
	assert.NotEqual(t, flow.visitor("first").ips, flow.visitor("second").ips)
	err := c.Request("GET", stepURL(site, "third", 1), nil, NewTaskContext("third"), nil)
	assert.ErrorIs(t, err, ErrNoProxy, "two proxies, two sessions: none left, whatever the concurrency")
	assert.ErrorContains(t, err, "2 live sticky sessions hold their proxies", "the error says who holds them")
	err = c.Visit(site.URL() + "/bulk")
	assert.ErrorIs(t, err, ErrNoProxy, "nor for a request of no task")
	assert.ErrorContains(t, err, "EndSession ends them")
	st, err := s.Stats(ctx, site.Host())
	require.NoError(t, err)
	assert.Equal(t, 2, st.Leased)
	assert.Zero(t, st.FreeSlots)

	ended, err := s.EndSession(ctx, "first")
	require.NoError(t, err)
	require.True(t, ended)
	st, err = s.Stats(ctx, site.Host())
	require.NoError(t, err)
	assert.Equal(t, 3, st.FreeSlots, "every slot of the ended session's proxy is back")
	require.NoError(t, c.Request("GET", stepURL(site, "third", 1), nil, NewTaskContext("third"), nil))
	assert.Equal(t, flow.visitor("first").ips, flow.visitor("third").ips)
}

// Sessions lease from their own pool; requests of no task from the
// Switch's; bans in the session pool count in the Switch's BanCounts.
func TestSessionPool(t *testing.T) {
	ctx := context.Background()
	flow, site, dc, s := sessionShop(t, 2, WithSessions(Sessions{Pool: "residential"}))
	require.NotSame(t, s, s.sessionSwitch(t))
	assert.Equal(t, "residential", s.sessionSwitch(t).Pool())
	resi := testbed.NewProxies(t, 2)
	_, err := s.sessionSwitch(t).Add(ctx, resi[0].URL())
	require.NoError(t, err)
	c := attached(s)
	for n := 1; n <= 3; n++ {
		require.NoError(t, c.Request("GET", stepURL(site, "shopper", n), nil, NewTaskContext("shopper"), nil))
		require.NoError(t, c.Visit(site.URL()+"/bulk"))
	}
	assert.Equal(t, []string{resi[0].SourceIP().String()}, flow.visitor("shopper").ips)
	flow.mu.Lock()
	for _, h := range flow.bulk {
		assert.Contains(t, []string{dc[0].SourceIP().String(), dc[1].SourceIP().String()}, h.ip)
	}
	flow.mu.Unlock()
	info := SessionOf(NewTaskContext("x"))
	assert.Nil(t, info)
	got, err := s.Session(ctx, "shopper")
	require.NoError(t, err)
	assert.Equal(t, "residential", got.Pool)

	// A ban in the session pool: counted where the user looks, and the
	// next session comes from the session pool too.
	_, err = s.sessionSwitch(t).Add(ctx, resi[1].URL())
	require.NoError(t, err)
	flow.Ban(resi[0].SourceIP().String())
	require.NoError(t, c.Request("GET", stepURL(site, "shopper", 4), nil, NewTaskContext("shopper"), nil))
	assert.Equal(t, []string{resi[0].SourceIP().String(), resi[1].SourceIP().String()}, flow.visitor("shopper").ips)
	assert.Equal(t, int64(1), s.BanCounts()[BanKey{site.Host(), "http_403"}])
	st, err := s.sessionSwitch(t).Stats(ctx, site.Host())
	require.NoError(t, err)
	assert.Equal(t, 1, st.Leased)
}

// Session cookies live in the session's jar only: never in the collector's
// jar or its storage backend (storage/), whose cookies never reach a
// session either; a Cookie header the request set itself is kept; a cookie
// set on a redirect is sent on the next hop; and the site's Set-Cookie
// headers do not reach the callbacks (SessionCookies shows them).
func TestSessionCookiesAndCollyStorage(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	var seen []string // "path: Cookie header"
	site := testbed.NewSite(t, "shop", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.URL.Path+": "+r.Header.Get("Cookie"))
		mu.Unlock()
		switch r.URL.Path {
		case "/login": // sets the session cookie on a redirect
			http.SetCookie(w, &http.Cookie{Name: "auth", Value: r.URL.Query().Get("who"), Path: "/"})
			http.Redirect(w, r, "/account", http.StatusFound)
		case "/bulk":
			http.SetCookie(w, &http.Cookie{Name: "bulk", Value: "1", Path: "/"})
		}
	}))
	bed := &testbed.Bed{Sites: []*testbed.Site{site}, Proxies: testbed.NewProxies(t, 3)}
	s := newSwitch(t, shared.Client(t))
	_, err := s.Add(ctx, bed.ProxyURLs()...)
	require.NoError(t, err)
	store, err := storage.New(shared.Client(t), storage.WithNamespace(testPrefix()))
	require.NoError(t, err)
	c := attached(s)
	require.NoError(t, c.SetStorage(store))
	var setCookies []string
	c.OnResponse(func(r *colly.Response) { setCookies = append(setCookies, r.Headers.Values("Set-Cookie")...) })

	require.NoError(t, c.Visit(site.URL()+"/bulk")) // the collector's own cookie, in storage
	for _, who := range []string{"alice", "bob"} {
		hdr := http.Header{"Cookie": {"region=77"}}
		require.NoError(t, c.Request("GET", site.URL()+"/login?who="+who, nil, NewTaskContext(who), hdr))
		require.NoError(t, c.Request("GET", site.URL()+"/cart", nil, NewTaskContext(who), nil))
	}
	require.NoError(t, c.Visit(site.URL()+"/bulk"))
	mu.Lock()
	assert.Equal(t, []string{
		"/bulk: ",
		"/login: region=77", "/account: auth=alice; region=77", "/cart: auth=alice",
		"/login: region=77", "/account: auth=bob; region=77", "/cart: auth=bob",
		"/bulk: bulk=1",
	}, seen)
	mu.Unlock()
	assert.Equal(t, []string{"bulk=1; Path=/", "bulk=1; Path=/"}, setCookies, "session Set-Cookies stay out of the callbacks")
	var names []string
	for _, ck := range c.Cookies(site.URL() + "/") {
		names = append(names, ck.Name)
	}
	assert.Equal(t, []string{"bulk"}, names, "the storage backend holds the collector's cookie only")
	cookies, err := s.SessionCookies(ctx, "bob", mustURL(t, site.URL()+"/"))
	require.NoError(t, err)
	require.Len(t, cookies, 1)
	assert.Equal(t, "auth=bob", cookies[0].String())
}

// Redis keys of sessions live under the pool's hash tag and expire with the
// session; the jar is bounded.
func TestSessionKeysAndBounds(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	const ttl = 5 * time.Second
	var big []string
	for i := range maxSessionCookies + 20 {
		big = append(big, (&http.Cookie{Name: fmt.Sprintf("c%03d", i), Value: strings.Repeat("v", 30), Path: "/"}).String())
	}
	site := testbed.NewSite(t, "shop", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, line := range big {
			w.Header().Add("Set-Cookie", line)
		}
		w.Header().Add("Set-Cookie", "huge="+strings.Repeat("h", maxSessionCookieBytes)+"; Path=/")
	}))
	p := testbed.NewProxy(t, testbed.SourceIP(0))
	s := newSwitch(t, rdb, WithSessions(Sessions{TTL: ttl}))
	_, err := s.Add(ctx, p.URL())
	require.NoError(t, err)
	c := attached(s)
	require.NoError(t, c.Request("GET", site.URL()+"/", nil, NewTaskContext("t"), nil))
	info, err := s.Session(ctx, "t")
	require.NoError(t, err)
	require.NotNil(t, info)
	jar, err := rdb.HKeys(ctx, s.keys.sessionJar(info.ID)).Result()
	require.NoError(t, err)
	assert.Len(t, jar, maxSessionCookies, "the jar keeps its bound")
	assert.NotContains(t, strings.Join(jar, ","), "huge", "an oversized cookie is dropped")
	assert.NotContains(t, strings.Join(jar, ","), ";/;c000", "the oldest went first")
	for _, key := range []string{s.keys.session("t"), s.keys.sessionJar(info.ID)} {
		assert.True(t, strings.HasPrefix(key, s.keys.base+":"), key)
		d, err := rdb.PTTL(ctx, key).Result()
		require.NoError(t, err)
		assert.True(t, d > 0 && d <= ttl, "%s TTL %v", key, d)
	}
	ended, err := s.EndSession(ctx, "t")
	require.NoError(t, err)
	require.True(t, ended)
	n, err := rdb.Exists(ctx, s.keys.sessionJar(info.ID)).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the jar goes with the session")
	d, err := rdb.PTTL(ctx, s.keys.session("t")).Result()
	require.NoError(t, err)
	assert.True(t, d > 0 && d <= ttl, "the tombstone expires too: %v", d)
	assertNoLeases(t, s, site)
}

// Proxy and Redis passwords never reach the session's errors, logs,
// reports or state in Redis.
func TestSessionNeverLeaksSecrets(t *testing.T) {
	const proxyPW, redisPW = "Canary-proxy-pw", "Canary-redis-pw"
	ctx := context.Background()
	srv := redistest.Start(t, "--requirepass", redisPW)
	flow := newShopFlow()
	site := testbed.NewSite(t, "shop", flow)
	proxies := testbed.NewProxies(t, 3)
	var urls []string
	for _, p := range proxies {
		p.SetCredentials("crawler", proxyPW)
		urls = append(urls, p.URL())
	}
	var logs testlog.Buffer
	var reports []string
	rdb := srv.Client(t)
	s := newSwitch(t, rdb, WithLogger(logs.Logger()),
		WithTimeouts(Timeouts{Redis: 500 * time.Millisecond}), WithSessions(Sessions{Retired: func(r SessionRetirement) { reports = append(reports, fmt.Sprintf("%+v", r)) }}))
	_, err := s.Add(ctx, urls...)
	require.NoError(t, err)
	c := attached(s)
	tctx := NewTaskContext("secretive")
	var out []string
	for n := 1; n <= 3; n++ {
		require.NoError(t, c.Request("GET", stepURL(site, "secretive", n), nil, tctx, nil))
	}
	flow.Ban(flow.visitor("secretive").ips[0])
	require.NoError(t, c.Request("GET", stepURL(site, "secretive", 4), nil, tctx, nil))
	require.Len(t, reports, 1)
	out = append(out, fmt.Sprintf("%+v", *SessionOf(tctx)), fmt.Sprintf("%+v", *SessionOf(tctx).Previous))
	assert.Contains(t, SessionOf(tctx).Proxy, "xxxxx:xxxxx@")
	keys, err := rdb.Keys(ctx, s.keys.base+"*").Result()
	require.NoError(t, err)
	for _, k := range keys {
		if k == s.keys.proxies() {
			continue // where the URL must be kept to dial
		}
		out = append(out, k)
		switch rdb.Type(ctx, k).Val() {
		case "hash":
			for f, v := range rdb.HGetAll(ctx, k).Val() {
				out = append(out, f, v)
			}
		case "zset":
			out = append(out, rdb.ZRange(ctx, k, 0, -1).Val()...)
		}
	}
	// A session while Redis is down fails closed, and says why.
	require.NoError(t, srv.Kill())
	err = c.Request("GET", stepURL(site, "secretive", 5), nil, tctx, nil)
	require.ErrorIs(t, err, ErrNoProxy)
	require.ErrorIs(t, err, ErrRedis)
	out = append(out, err.Error(), fmt.Sprintf("%+v", err))
	all := strings.Join(append(append(out, reports...), logs.String()), "\n")
	assert.Contains(t, all, "xxxxx:xxxxx@")
	assert.NotContains(t, all, proxyPW)
	assert.NotContains(t, all, redisPW)
	assert.Len(t, flow.visitor("secretive").ips, 2, "nothing left while Redis was down")
}

// Sessions on a 3-master Redis Cluster: the session scripts touch keys
// they derive under the pool's hash tag (one slot).
func TestSessionsOnRedisCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	flow := newShopFlow()
	site := testbed.NewSite(t, "shop", flow)
	bed := &testbed.Bed{Sites: []*testbed.Site{site}, Proxies: testbed.NewProxies(t, 4)}
	s := newSwitch(t, cl.Client(t))
	_, err := s.Add(context.Background(), bed.ProxyURLs()...)
	require.NoError(t, err)
	cs := []*colly.Collector{attached(s), attached(sibling(t, s, cl.Client(t)))}
	for k := range 3 {
		task := fmt.Sprintf("t%d", k)
		for n := 1; n <= 4; n++ {
			require.NoError(t, cs[n%2].Request("GET", stepURL(site, task, n), nil, NewTaskContext(task), nil))
		}
		assert.Len(t, flow.visitor(task).ips, 1)
	}
	flow.Ban(flow.visitor("t0").ips[0])
	require.NoError(t, cs[0].Request("GET", stepURL(site, "t0", 5), nil, NewTaskContext("t0"), nil))
	assert.Len(t, flow.visitor("t0").ips, 2)
	for k := range 3 {
		ended, err := s.EndSession(context.Background(), fmt.Sprintf("t%d", k))
		require.NoError(t, err)
		assert.True(t, ended)
	}
	assert.Empty(t, flow.errors())
	assertNoLeases(t, s, site)
}

// proxyHost returns the host:port of the proxy whose source IP is ip.
func proxyHost(t *testing.T, proxies []*testbed.Proxy, ip string) string {
	t.Helper()
	for _, p := range proxies {
		if p.SourceIP().String() == ip {
			return mustURL(t, p.URL()).Host
		}
	}
	t.Fatalf("no proxy with source IP %s", ip)
	return ""
}

// BenchmarkSessionUse measures the Redis side of one request of a task:
// continuing (and renewing) a live session, with 50 workers over 1,000
// sessions and a 3-cookie jar each, in one round trip (session_use.lua).
//
//	go test -run '^$' -bench BenchmarkSessionUse -benchtime 2s .
func BenchmarkSessionUse(b *testing.B) {
	if shared.Server == nil {
		b.Skip("single-node benchmark; the shared Redis is a cluster")
	}
	const sessions = 1000
	ctx := context.Background()
	s := newSwitch(b, shared.Server.Client(b, func(o *redis.Options) { o.PoolSize = benchWorkers }))
	_, err := s.Add(ctx, proxyURLs(sessions)...)
	require.NoError(b, err)
	u := &url.URL{Scheme: "https", Host: "bench.example", Path: "/"}
	sp, err := s.sessionPool()
	require.NoError(b, err)
	for k := range sessions {
		task := fmt.Sprintf("t%d", k)
		rep, err := sp.useSession(ctx, task, u.Host)
		require.NoError(b, err)
		require.NoError(b, sp.storeCookies(ctx, &sessionUse{sw: sp, task: task, id: rep.info.ID, url: u},
			[]string{"sid=1; Path=/", "cart=2; Path=/", "region=77; Path=/"}, time.Now()))
	}
	var seq atomic.Int64
	b.SetParallelism(benchWorkers / max(1, runtimeProcs()))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			task := fmt.Sprintf("t%d", seq.Add(1)%sessions)
			rep, err := sp.useSession(ctx, task, u.Host)
			if err != nil || len(cookiesFor(rep.jar, u, time.Now())) != 3 {
				b.Error(err)
				return
			}
		}
	})
}

// A retired session's proxy stays out for the lease TTL: the session's other
// requests may still be under way through it. EndSession frees it at once.
func TestSessionRetirementWaitsForRequestsUnderWay(t *testing.T) {
	flow, site, _, s := sessionShop(t, 1, WithSessions(Sessions{MaxRequests: 1}), WithTimeouts(Timeouts{LeaseTTL: time.Second, MaxWait: Off}))
	c := attached(s)
	ctx := NewTaskContext("brief")
	require.NoError(t, c.Request("GET", stepURL(site, "brief", 1), nil, ctx, nil))
	err := c.Request("GET", stepURL(site, "brief", 2), nil, ctx, nil)
	require.ErrorIs(t, err, ErrNoProxy, "the retired session's proxy is not free yet")
	time.Sleep(1500 * time.Millisecond)
	require.NoError(t, c.Request("GET", stepURL(site, "brief", 3), nil, ctx, nil))
	assert.Equal(t, 2, SessionOf(ctx).Generation)

	ended, err := s.EndSession(context.Background(), "brief")
	require.NoError(t, err)
	require.True(t, ended)
	require.NoError(t, c.Request("GET", stepURL(site, "other", 1), nil, NewTaskContext("other"), nil), "EndSession frees it at once")
	assert.Equal(t, flow.visitor("brief").ips, flow.visitor("other").ips)
}

// A task goes on in another OS process, with its own Redis client, and
// back: one IP and one cookie jar throughout.
func TestSessionContinuedInAnotherProcess(t *testing.T) {
	flow, site, _, s := sessionShop(t, 4)
	c := attached(s)
	const task = "roaming"
	ctx := NewTaskContext(task)
	steps := func(from, to int) []string {
		var urls []string
		for n := from; n <= to; n++ {
			urls = append(urls, stepURL(site, task, n))
		}
		return urls
	}
	for _, u := range steps(1, 3) {
		require.NoError(t, c.Request("GET", u, nil, ctx, nil))
	}
	out, err := startWorker(t, workerSpec{Mode: "crawl", Redis: shared.Addr(), Prefix: s.cfg.prefix, URLs: steps(4, 6),
		Threads: 1, Task: task}).Output()
	require.NoError(t, err)
	res, err := parseWorkerResult(out)
	require.NoError(t, err)
	assert.Equal(t, workerResult{OK: 3}, res)
	for _, u := range steps(7, 9) {
		require.NoError(t, c.Request("GET", u, nil, ctx, nil))
	}
	v := flow.visitor(task)
	assert.Len(t, v.ips, 1, "one IP across the processes")
	assert.Equal(t, 9, v.steps)
	assert.Empty(t, flow.errors(), "the cookies went along")
	assert.Equal(t, 9, SessionOf(ctx).Requests, "the other process's requests count in the same session")
}

// A task whose requests ask for labels (UseLabels on the collector's
// context) gets a session whose proxy carries them, and keeps it; when a
// Replace takes the label off its proxy, the session is retired
// (SessionLabels) and the next step leaves from another matching proxy.
func TestSessionHonoursLabels(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	var retired []SessionRetirement
	flow, site, proxies, s := sessionShop(t, 6, WithTimeouts(Timeouts{MaxWait: 2 * time.Second}),
		WithSessions(Sessions{Retired: func(r SessionRetirement) {
			mu.Lock()
			retired = append(retired, r)
			mu.Unlock()
		}}))
	country := map[string]string{} // source IP -> country
	lines := func(relabel string) []string {
		var out []string
		for i, p := range proxies {
			c := "de"
			if i >= 3 { // the last in the rotation order: a lease of no label would take a de one first
				c = "ru"
			}
			if p.SourceIP().String() == relabel {
				c = "kz"
			}
			country[p.SourceIP().String()] = c
			out = append(out, p.URL()+" country="+c)
		}
		return out
	}
	_, err := s.Replace(ctx, lines(""))
	require.NoError(t, err)
	c := attached(s)
	c.Context = UseLabels(ctx, "country=ru")
	tasks := map[string]*colly.Context{"a": NewTaskContext("a"), "b": NewTaskContext("b")}
	for n := 1; n <= 4; n++ {
		for task, tc := range tasks {
			require.NoError(t, c.Request("GET", stepURL(site, task, n), nil, tc, nil))
		}
	}
	for task := range tasks {
		v := flow.visitor(task)
		require.Len(t, v.ips, 1, "task %s keeps its IP", task)
		assert.Equal(t, "ru", country[v.ips[0]], "task %s left from a %s proxy", task, country[v.ips[0]])
	}
	assert.NotEqual(t, flow.visitor("a").ips[0], flow.visitor("b").ips[0])

	// a's proxy is no longer ru.
	old := flow.visitor("a").ips[0]
	_, err = s.Replace(ctx, lines(old))
	require.NoError(t, err)
	rp := s.own.redis()
	rp.labelIdx.mu.Lock()
	rp.labelIdx.at = time.Time{} // the copy of the labels is read again (else within labelIndexAge)
	rp.labelIdx.mu.Unlock()
	first := SessionOf(tasks["a"])
	require.NoError(t, c.Request("GET", stepURL(site, "a", 5), nil, tasks["a"], nil))
	v := flow.visitor("a")
	require.Len(t, v.ips, 2)
	assert.Equal(t, "ru", country[v.ips[1]])
	assert.Equal(t, 1, v.fresh, "the new IP came without the old cookies")
	info := SessionOf(tasks["a"])
	require.NotNil(t, info.Previous)
	assert.Equal(t, SessionLabels, info.Previous.Reason)
	assert.Equal(t, first.ID, info.Previous.ID)
	mu.Lock()
	require.Len(t, retired, 1)
	assert.Equal(t, SessionLabels, retired[0].Reason)
	mu.Unlock()
	require.NoError(t, c.Request("GET", stepURL(site, "b", 5), nil, tasks["b"], nil))
	assert.Len(t, flow.visitor("b").ips, 1, "b's proxy still carries the label")

	// Labels no proxy carries: the task's request fails at once, through no proxy.
	c2 := attached(s)
	c2.Context = UseLabels(ctx, "country=fr")
	start := time.Now()
	err = c2.Request("GET", stepURL(site, "c", 1), nil, NewTaskContext("c"), nil)
	require.ErrorIs(t, err, ErrNoProxy)
	assert.Less(t, time.Since(start), time.Second)
	assert.Empty(t, flow.visitor("c").ips)
	assert.Empty(t, flow.errors())
}

// asyncTaskCollector returns an async collector attached to s that sends up
// burstTask sends per requests of task at once from an async collector on
// each of sws (a task context per process), waits for them all, and checks
// that every one succeeded.
func burstTask(t *testing.T, base, task string, per int, sws []*Switch) {
	t.Helper()
	var ok atomic.Int64
	var mu sync.Mutex
	var errs []error
	var cs []*colly.Collector
	for _, sw := range sws {
		c := asyncTaskCollector(t, sw, &ok, &mu, &errs)
		tctx := NewTaskContext(task)
		for i := range per {
			require.NoError(t, c.Request("GET", fmt.Sprintf("%s/hello?task=%s&i=%d", base, task, i), nil, tctx, nil))
		}
		cs = append(cs, c)
	}
	for _, c := range cs {
		c.Wait()
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Empty(t, errs, task)
	assert.Equal(t, int64(per*len(sws)), ok.Load(), task)
}

// to 8 requests at once and counts its answers and errors.
func asyncTaskCollector(t *testing.T, s *Switch, ok *atomic.Int64, mu *sync.Mutex, errs *[]error) *colly.Collector {
	t.Helper()
	c := colly.NewCollector(colly.Async(true), colly.AllowURLRevisit())
	require.NoError(t, c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: 8}))
	s.Attach(c)
	c.SetRequestTimeout(30 * time.Second)
	c.OnResponse(func(*colly.Response) { ok.Add(1) })
	c.OnError(func(r *colly.Response, err error) {
		mu.Lock()
		*errs = append(*errs, fmt.Errorf("%s: %w", r.Request.URL, err))
		mu.Unlock()
	})
	return c
}

// A task's first requests sent at once, with one proxy left: one request
// starts the session, the others join it and leave from its IP. In one
// process they wait for the one starting it; in another process they see
// the session appear while they wait for a proxy. Before, those that lost
// the race to start it waited out MaxWait for a proxy of their own, and
// failed.
func TestSessionConcurrentStartOneProxyLeft(t *testing.T) {
	ctx := context.Background()
	flow, site, _, s := sessionShop(t, 3, WithTimeouts(Timeouts{MaxWait: 3 * time.Second}))
	other := sibling(t, s, shared.Client(t))
	require.NoError(t, attached(s).Request("GET", site.URL()+"/hello?task=holder", nil, NewTaskContext("holder"), nil))

	for _, tc := range []struct {
		task string
		sws  []*Switch
		per  int // requests at once per Switch
	}{
		{"solo", []*Switch{s}, 6},       // one process
		{"duo", []*Switch{s, other}, 4}, // two processes
	} {
		burstTask(t, site.URL(), tc.task, tc.per, tc.sws)
		assert.Len(t, flow.visitor(tc.task).ips, 1, "%s: every request from its session's IP", tc.task)
	}
	flow.mu.Lock()
	for ip, byIP := range flow.ips {
		assert.Len(t, byIP.tasks, 1, "IP %s served several tasks", ip)
	}
	flow.mu.Unlock()
	assert.Empty(t, flow.errors())
	st, err := s.Stats(ctx, site.Host())
	require.NoError(t, err)
	assert.Equal(t, 3, st.Leased, "one lease per session, none left by the requests that joined")
	n, err := s.LiveSessions(ctx)
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	for _, task := range []string{"holder", "solo", "duo"} {
		ended, err := s.EndSession(ctx, task)
		require.NoError(t, err)
		assert.True(t, ended, task)
	}
	assertNoLeases(t, s, site)
	assertNoLeases(t, other, site)
}

// A live session's requests reaching a new site at once, from one process
// and from two: they share the session's lease there (exclusivity holds
// between tasks, not within one) rather than take the session's own lease
// for another session's and give up at once.
func TestSessionConcurrentNewSite(t *testing.T) {
	ctx := context.Background()
	flowB := newShopFlow()
	flowB.sid, flowB.cart = "b_sid", "b_cart"
	siteB := testbed.NewSite(t, "shop-b", flowB)
	flow, site, _, s := sessionShop(t, 4, WithTimeouts(Timeouts{MaxWait: 3 * time.Second}))
	other := sibling(t, s, shared.Client(t))
	for _, tc := range []struct {
		task string
		sws  []*Switch
		per  int
	}{
		{"solo", []*Switch{s}, 8},
		{"duo", []*Switch{s, other}, 4},
	} {
		require.NoError(t, attached(s).Request("GET", stepURL(site, tc.task, 1), nil, NewTaskContext(tc.task), nil))
		burstTask(t, siteB.URL(), tc.task, tc.per, tc.sws)
		assert.Equal(t, flow.visitor(tc.task).ips, flowB.visitor(tc.task).ips, "%s: one IP on both sites", tc.task)
		assert.Len(t, flowB.visitor(tc.task).ips, 1, tc.task)
	}
	assert.NotEqual(t, flow.visitor("solo").ips, flow.visitor("duo").ips)
	assert.Empty(t, flow.errors())
	assert.Empty(t, flowB.errors())
	st, err := s.Stats(ctx, siteB.Host())
	require.NoError(t, err)
	assert.Equal(t, 2, st.Leased, "one lease per session on the new site")
	for _, task := range []string{"solo", "duo"} {
		ended, err := s.EndSession(ctx, task)
		require.NoError(t, err)
		assert.True(t, ended, task)
	}
	assertNoLeases(t, s, site, siteB)
}

// A request of a session that runs longer than Sessions.TTL keeps its
// proxy to its session: the session is renewed while the request runs
// (sessionrenew.go), so neither another task nor a request of no task gets
// its IP meanwhile. Once the request is over the session lapses by its TTL
// as before: nothing renews it any longer.
func TestSessionRenewedWhileItsRequestRuns(t *testing.T) {
	ctx := context.Background()
	site := testbed.NewSite(t, "slow", nil) // the default shop: /slow?d=
	proxies := testbed.NewProxies(t, 1)
	const ttl = time.Second
	s := newSwitch(t, shared.Client(t), WithSessions(Sessions{TTL: ttl}), WithTimeouts(Timeouts{MaxWait: 300 * time.Millisecond}))
	_, err := s.Add(ctx, proxies[0].URL())
	require.NoError(t, err)

	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- attached(s).Request("GET", site.URL()+"/slow?d=3s", nil, NewTaskContext("long"), nil) }()
	require.Eventually(t, func() bool { return site.Recorder().InFlight() == 1 }, 5*time.Second, 5*time.Millisecond)
	c := attached(s)
	tries := othersRefusedWhile(t, c, site, done, start)
	assert.Greater(t, time.Since(start), 2*ttl, "the request outlived the TTL")
	assert.Positive(t, tries)
	assert.Zero(t, site.Recorder().Collisions(), "two requests from the one IP at once")
	assert.Equal(t, 1, site.Recorder().Count(), "only the long request reached the site")

	// Over: the session lapses within its TTL and the IP serves others.
	require.Eventually(t, func() bool {
		return c.Request("GET", site.URL()+"/echo", nil, NewTaskContext("other"), nil) == nil
	}, 5*ttl, 50*time.Millisecond)
	s.sessHolds.mu.Lock()
	assert.Empty(t, s.sessHolds.m, "no session renewed once its requests are over")
	s.sessHolds.mu.Unlock()
	ended, err := s.EndSession(ctx, "other")
	require.NoError(t, err)
	assert.True(t, ended)
	assert.Zero(t, site.Recorder().Collisions())
	assertNoLeases(t, s, site)
}

// othersRefusedWhile asserts, round after round until the long request's
// error arrives on done (and is nil), that a request of another task and
// one of no task through c fail with ErrNoProxy; it returns the rounds.
func othersRefusedWhile(t *testing.T, c *colly.Collector, site *testbed.Site, done <-chan error, start time.Time) int {
	t.Helper()
	for tries := 0; ; tries++ {
		select {
		case err := <-done:
			require.NoError(t, err)
			return tries
		default:
		}
		err := c.Request("GET", site.URL()+"/echo", nil, NewTaskContext("other"), nil)
		require.ErrorIs(t, err, ErrNoProxy, "another task, %v after the start", time.Since(start))
		err = c.Visit(site.URL() + "/echo?no-task")
		require.ErrorIs(t, err, ErrNoProxy, "a request of no task, %v after the start", time.Since(start))
	}
}

// A fallback's write-back over a session's slot: the Switch that leased from
// its local shard while Redis was unreachable writes its running lease of
// the session's proxy back (fallback_writeback.lua sets the lease entry and
// keeps the higher score, the session's). Once that lease is released the
// slot is still the session's, whose next use goes on with its IP and
// cookies. While it still runs, the session's next use retires it
// (lease_lost) and the proxy comes back after that lease and the
// retirement's hold (the lease TTL), not when the session would have
// lapsed (10 minutes later, held by nobody).
func TestSessionAfterFallbackWriteback(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	var retired []string
	flow, site, _, s := sessionShop(t, 2, WithTimeouts(Timeouts{MaxWait: 300 * time.Millisecond, LeaseTTL: time.Second}), WithSessions(Sessions{
		Retired: func(r SessionRetirement) { mu.Lock(); retired = append(retired, r.Task+":"+r.Reason); mu.Unlock() }}))
	c := attached(s)
	rdb := shared.Client(t)
	p, err := s.sessionPool()
	require.NoError(t, err)
	scope := s.scopeOf(site.Host())
	visit := func(task string, n int) error {
		return c.Request("GET", stepURL(site, task, n), nil, NewTaskContext(task), nil)
	}
	require.NoError(t, visit("kept", 1))
	member, err := rdb.HGet(ctx, p.keys.session("kept"), "s:"+scope).Result()
	require.NoError(t, err)
	k := p.keys
	writeBack := func(token string, ms int64) {
		t.Helper()
		res, err := fallbackWritebackScript.Run(ctx, rdb, []string{k.proxies(), k.sites(), k.meta(), k.dead(), k.quarantine()},
			k.base, s.cfg.idleTTL.Milliseconds(), s.cfg.slots, s.cfg.maxQuarantine.Milliseconds(), "lease", scope, member, token, ms).Int64Slice()
		require.NoError(t, err)
		require.Equal(t, []int64{0, 1}, res)
	}

	// Written back, then released: the session goes on.
	writeBack("local-1", 2000)
	_, err = p.releaseMember(ctx, scope, member, "local-1", "")
	require.NoError(t, err)
	require.NoError(t, visit("kept", 2))
	info, err := s.Session(ctx, "kept")
	require.NoError(t, err)
	require.NotNil(t, info)
	assert.Equal(t, 1, info.Generation, "the same session")
	assert.Len(t, flow.visitor("kept").ips, 1, "the same IP")
	assert.Equal(t, 2, flow.visitor("kept").steps)

	// Written back and still running: the session retires, and its proxy
	// is back once that lease ends.
	ip := flow.visitor("kept").ips[0]
	writeBack("local-2", 1000)
	require.NoError(t, visit("kept", 3), "a new session on the other proxy")
	assert.Len(t, flow.visitor("kept").ips, 2)
	mu.Lock()
	assert.Equal(t, []string{"kept:" + SessionLeaseLost}, retired)
	mu.Unlock()
	require.Eventually(t, func() bool { return visit("after", 1) == nil }, 10*time.Second, 50*time.Millisecond,
		"the retired session's proxy comes back when the written-back lease ends")
	assert.Equal(t, []string{ip}, flow.visitor("after").ips)
	_, err = p.releaseMember(ctx, scope, member, "local-2", "") // late: it expired, and is owner-checked
	require.NoError(t, err)
	assert.Empty(t, flow.errors())
	for _, task := range []string{"kept", "after"} {
		ended, err := s.EndSession(ctx, task)
		require.NoError(t, err)
		assert.True(t, ended, task)
	}
	assertNoLeases(t, s, site)
}

// TestSessionStartFlightPerSite: two requests of one task with no session
// yet, at once, to two sites: the one to site A (every proxy quarantined
// there) fails after MaxWait; the one to site B, which has free proxies,
// does not wait on A's start and does not share its failure (a review found
// B failing with A's error).
func TestSessionStartFlightPerSite(t *testing.T) {
	ctx := context.Background()
	siteA := testbed.NewSite(t, "a", nil)
	siteB := testbed.NewSite(t, "b", nil)
	proxies := testbed.NewProxies(t, 2)
	s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: time.Second}))
	for _, p := range proxies {
		_, err := s.Add(ctx, p.URL())
		require.NoError(t, err)
		require.NoError(t, s.Ban(ctx, p.URL(), siteA.Host(), time.Minute))
	}
	errA := make(chan error, 1)
	go func() { errA <- attached(s).Request("GET", siteA.URL()+"/echo", nil, NewTaskContext("T"), nil) }()
	time.Sleep(150 * time.Millisecond)
	require.NoError(t, attached(s).Request("GET", siteB.URL()+"/echo", nil, NewTaskContext("T"), nil), "site B has free proxies")
	require.ErrorIs(t, <-errA, ErrNoProxy, "site A: every proxy quarantined")
	_, err := s.EndSession(ctx, "T")
	require.NoError(t, err)
}

// A request of a session still running when a sibling request retires the
// session (here MaxRequests) keeps its IP to itself until it ends, however
// long past the lease TTL: the retirement put the proxy back after a lease
// TTL, and the renewal tick keeps it out for the request still under way
// (sessionrenew.go, session_use.lua's afterlife), whether the sibling runs
// in the same process or another. Without that, another task leased the IP
// 500 ms into a 3-second request.
func TestSessionRetiredWhileItsRequestRuns(t *testing.T) {
	for _, by := range []string{"same", "other"} {
		t.Run("sibling in the "+by+" process", func(t *testing.T) { testRetiredWhileItsRequestRuns(t, by == "other") })
	}
}

func testRetiredWhileItsRequestRuns(t *testing.T, otherProcess bool) {
	ctx := context.Background()
	site := testbed.NewSite(t, "slow", nil)
	proxies := testbed.NewProxies(t, 2)
	const leaseTTL = 500 * time.Millisecond
	var mu sync.Mutex
	var retired []string
	prefix := testPrefix()
	newSw := func() *Switch {
		return newSwitch(t, shared.Client(t), WithPrefix(prefix), WithTimeouts(Timeouts{LeaseTTL: leaseTTL, MaxWait: 200 * time.Millisecond}),
			WithSessions(Sessions{MaxRequests: 1, Retired: func(r SessionRetirement) { mu.Lock(); retired = append(retired, r.Reason); mu.Unlock() }}))
	}
	s, sibling := newSw(), (*Switch)(nil)
	if sibling = s; otherProcess {
		sibling = newSw()
	}
	for _, p := range proxies {
		_, err := s.Add(ctx, p.URL())
		require.NoError(t, err)
	}

	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- attached(s).Request("GET", site.URL()+"/slow?d=3s", nil, NewTaskContext("long"), nil) }()
	require.Eventually(t, func() bool { return site.Recorder().InFlight() == 1 }, 5*time.Second, 5*time.Millisecond)
	c := attached(s)
	// The task's next request retires the session (one request each) and
	// starts another on the other proxy: now both are the task's.
	require.NoError(t, attached(sibling).Request("GET", site.URL()+"/echo", nil, NewTaskContext("long"), nil))
	mu.Lock()
	assert.Equal(t, []string{"max_requests"}, retired)
	mu.Unlock()
	tries := othersRefusedWhile(t, c, site, done, start)
	assert.Greater(t, time.Since(start), 4*leaseTTL, "the request outlived the hold of the retirement")
	assert.Positive(t, tries)
	assert.Zero(t, site.Recorder().Collisions(), "two requests from the one IP at once")

	// Over: the retired session's proxy comes back within a lease TTL.
	ended := time.Now()
	require.Eventually(t, func() bool {
		return c.Request("GET", site.URL()+"/echo", nil, NewTaskContext("other"), nil) == nil
	}, 4*leaseTTL, 20*time.Millisecond)
	assert.Less(t, time.Since(ended), 2*leaseTTL)
	require.Eventually(t, func() bool {
		s.sessHolds.mu.Lock()
		defer s.sessHolds.mu.Unlock()
		return len(s.sessHolds.m) == 0
	}, time.Second, 10*time.Millisecond, "no session renewed once its requests are over")
	endTasksClean(t, s, site, "long", "other")
}

// endTasksClean ends the sessions of tasks and asserts that the site saw no
// collision and that no lease is left on it.
func endTasksClean(t *testing.T, s *Switch, site *testbed.Site, tasks ...string) {
	t.Helper()
	for _, task := range tasks {
		_, err := s.EndSession(context.Background(), task)
		require.NoError(t, err)
	}
	assert.Zero(t, site.Recorder().Collisions())
	assertNoLeases(t, s, site)
}

// EndSession while a request of the session runs, from this Switch or
// another: the request keeps its IP until it ends (the record's h:<tag>
// fields hold the proxy until the running Switch's next tick, which then
// keeps it out: session_use.lua's afterlife), also once a lease on the
// site pruned the slot's passed score. An idle session ended by the
// Switch that ran it frees its proxy at once, as EndSession promises.
func TestSessionEndedWhileItsRequestRuns(t *testing.T) {
	for _, by := range []string{"same", "other"} {
		t.Run("EndSession in the "+by+" process", func(t *testing.T) {
			ctx := context.Background()
			site := testbed.NewSite(t, "slow", nil)
			proxies := testbed.NewProxies(t, 2)
			const leaseTTL = 500 * time.Millisecond
			prefix := testPrefix()
			newSw := func() *Switch {
				return newSwitch(t, shared.Client(t), WithPrefix(prefix), WithTimeouts(Timeouts{LeaseTTL: leaseTTL, MaxWait: 200 * time.Millisecond}))
			}
			s, ender := newSw(), (*Switch)(nil)
			if ender = s; by == "other" {
				ender = newSw()
			}
			for _, p := range proxies {
				_, err := s.Add(ctx, p.URL())
				require.NoError(t, err)
			}
			c := attached(s)
			done := make(chan error, 2)
			go func() { done <- c.Request("GET", site.URL()+"/slow?d=3s", nil, NewTaskContext("long"), nil) }()
			require.Eventually(t, func() bool { return site.Recorder().InFlight() == 1 }, 5*time.Second, 5*time.Millisecond)
			ended, err := ender.EndSession(ctx, "long")
			require.NoError(t, err)
			require.True(t, ended)
			// A request of no task right after takes the other proxy (and its
			// lease call prunes passed scores on the site).
			go func() { done <- c.Request("GET", site.URL()+"/slow?d=2s", nil, nil, nil) }()
			require.Eventually(t, func() bool { return site.Recorder().InFlight() == 2 }, 5*time.Second, 5*time.Millisecond)
			for range 3 {
				err := c.Request("GET", site.URL()+"/echo", nil, NewTaskContext("other"), nil)
				require.ErrorIs(t, err, ErrNoProxy, "another task got the IP of a request still running")
				time.Sleep(leaseTTL)
			}
			require.NoError(t, <-done)
			require.NoError(t, <-done)
			assert.Zero(t, site.Recorder().Collisions(), "two requests from the one IP at once")

			// An idle session, ended by the Switch that ran it: its proxy is
			// free at once (the other is a request of no task's, still cooling
			// or free: both are asked for).
			require.Eventually(t, func() bool {
				return c.Request("GET", site.URL()+"/echo", nil, NewTaskContext("idle"), nil) == nil
			}, 4*leaseTTL, 20*time.Millisecond)
			require.Eventually(t, func() bool {
				s.sessHolds.mu.Lock()
				defer s.sessHolds.mu.Unlock()
				return len(s.sessHolds.m) == 0
			}, 2*time.Second, 10*time.Millisecond)
			_, err = s.EndSession(ctx, "other")
			require.NoError(t, err)
			time.Sleep(leaseTTL) // the long request's slot, kept out up to a lease TTL after its last tick
			blocker := make(chan error, 1)
			go func() { blocker <- c.Request("GET", site.URL()+"/slow?d=1s", nil, NewTaskContext("blocker"), nil) }()
			require.Eventually(t, func() bool { return site.Recorder().InFlight() == 1 || len(blocker) == 1 }, 5*time.Second, 5*time.Millisecond)
			if len(blocker) == 1 {
				t.Fatalf("the blocker's request: %v", <-blocker)
			}
			ended, err = s.EndSession(ctx, "idle")
			require.NoError(t, err)
			require.True(t, ended)
			assert.NoError(t, c.Request("GET", site.URL()+"/echo", nil, NewTaskContext("next"), nil), "the idle session's proxy, at once")
			require.NoError(t, <-blocker)
			endTasksClean(t, s, site, "blocker", "next")
		})
	}
}

// A request of a session that is over, whose slot another holder leased
// before the Switch's tick came (a tick late past the hold: here its timer
// is held back), fails with ErrLeaseLost rather than pass for exclusive,
// as a plain lease's request does.
func TestSessionOverAndItsSlotTakenFailsTheRequest(t *testing.T) {
	ctx := context.Background()
	site := testbed.NewSite(t, "slow", nil)
	proxies := testbed.NewProxies(t, 1)
	const leaseTTL = 400 * time.Millisecond
	s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{LeaseTTL: leaseTTL, MaxWait: 200 * time.Millisecond}))
	_, err := s.Add(ctx, proxies[0].URL())
	require.NoError(t, err)
	c := attached(s)
	done := make(chan error, 1)
	go func() { done <- c.Request("GET", site.URL()+"/slow?d=3s", nil, NewTaskContext("long"), nil) }()
	require.Eventually(t, func() bool { return site.Recorder().InFlight() == 1 }, 5*time.Second, 5*time.Millisecond)
	var e *sessionHold
	s.sessHolds.mu.Lock()
	for _, ee := range s.sessHolds.m {
		e = ee
		e.timer.Stop() // the tick is late
	}
	s.sessHolds.mu.Unlock()
	require.NotNil(t, e)
	ended, err := s.EndSession(ctx, "long")
	require.NoError(t, err)
	require.True(t, ended)
	// Past the request's hold (the record's h:<tag>), another holder leases the IP.
	var l *Lease
	require.Eventually(t, func() bool {
		l, err = s.Lease(ctx, site.Host())
		return err == nil
	}, 5*leaseTTL, 20*time.Millisecond)
	s.sessHolds.mu.Lock()
	e.timer.Reset(time.Millisecond) // the tick comes
	s.sessHolds.mu.Unlock()
	err = <-done
	assert.ErrorIs(t, err, ErrLeaseLost, "the request ran on while another held its IP")
	require.NoError(t, l.Release(ctx))
}

// The afterlife of a session that is over puts its request's slot back out
// of rotation also after a lease on the site pruned the slot's passed score
// (lease.lua drops passed scores: a tick late past the hold), and reports
// the slot lost when its proxy left the pool (nothing put back).
func TestSessionAfterlifeAfterPrune(t *testing.T) {
	ctx := context.Background()
	site := testbed.NewSite(t, "slow", nil)
	proxies := testbed.NewProxies(t, 2)
	const leaseTTL = 500 * time.Millisecond
	s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{LeaseTTL: leaseTTL, MaxWait: 200 * time.Millisecond}))
	for _, p := range proxies {
		_, err := s.Add(ctx, p.URL())
		require.NoError(t, err)
	}
	done := make(chan error, 1)
	go func() { done <- attached(s).Request("GET", site.URL()+"/slow?d=2s", nil, NewTaskContext("long"), nil) }()
	require.Eventually(t, func() bool { return site.Recorder().InFlight() == 1 }, 5*time.Second, 5*time.Millisecond)
	var k sessionHoldKey
	var slot heldSlot
	s.sessHolds.mu.Lock()
	for kk, e := range s.sessHolds.m {
		k = kk
		e.timer.Stop() // ticks by hand below
		for sl := range e.slots {
			slot = sl
		}
	}
	s.sessHolds.mu.Unlock()
	require.NotEmpty(t, slot.member)
	ended, err := s.EndSession(ctx, "long")
	require.NoError(t, err)
	require.True(t, ended)
	rdb := shared.Client(t)
	free := k.p.keys.free(slot.scope)
	require.NoError(t, rdb.ZRem(ctx, free, slot.member).Err()) // what lease.lua's prune does to a passed score

	res, err := k.p.runUseMode(ctx, k.task, globalSite, "renew", k.id, slot.scope, slot.member)
	require.NoError(t, err)
	assert.Equal(t, []any{int64(7), int64(1), int64(0), int64(0)}, res, "kept, none lost")
	sc, err := rdb.ZScore(ctx, free, slot.member).Result()
	require.NoError(t, err, "the slot is out of rotation again")
	assert.Greater(t, int64(sc), time.Now().UnixMilli()+int64(leaseTTL/2/time.Millisecond))
	err = attached(s).Request("GET", site.URL()+"/echo", nil, NewTaskContext("other"), nil)
	require.NoError(t, err, "another task gets the other proxy")

	// The proxy leaves the pool: lost, and not put back.
	p, err := s.proxyFor(proxies[0].URL())
	require.NoError(t, err)
	if !strings.HasPrefix(slot.member, p.id+":") {
		p, err = s.proxyFor(proxies[1].URL())
		require.NoError(t, err)
	}
	_, err = s.Remove(ctx, p.String())
	require.NoError(t, err)
	require.NoError(t, rdb.ZRem(ctx, free, slot.member).Err())
	res, err = k.p.runUseMode(ctx, k.task, globalSite, "renew", k.id, slot.scope, slot.member)
	require.NoError(t, err)
	assert.Equal(t, []any{int64(7), int64(0), int64(1), int64(1)}, res, "lost")
	_, err = rdb.ZScore(ctx, free, slot.member).Result()
	assert.ErrorIs(t, err, redis.Nil, "a removed proxy's slot is not put back")
	require.NoError(t, <-done)
	_, err = s.EndSession(ctx, "other")
	require.NoError(t, err)
}

// A task's wait for a proxy on a paused site whose request deadline comes
// while one of the wait's Redis calls runs (a slow Redis, a loaded
// machine) fails naming the pause, as when it comes between calls, not
// with the call's "context deadline exceeded" as a Redis error.
func TestSessionWaitEndingInARedisCallNamesThePause(t *testing.T) {
	ctx := context.Background()
	site := testbed.NewSite(t, "paused-slow-redis", nil)
	rdb := shared.Client(t)
	hook := &slowOnce{delay: time.Second}
	rdb.AddHook(hook)
	s := newSwitch(t, rdb, WithTimeouts(Timeouts{MaxWait: time.Minute}))
	_, err := s.Add(ctx, testbed.NewProxies(t, 1)[0].URL())
	require.NoError(t, err)
	_, err = s.PauseSite(ctx, site.Host(), 30*time.Second)
	require.NoError(t, err)
	// Once the wait has met the pause (the Switch's breaker saw it since
	// the request began), every script call is slow: the request's
	// deadline comes in one.
	began := time.Now()
	hook.when.Store(func() bool { st := s.brk.state(site.Host()); return st.state != 0 && st.seen.After(began) })
	c := colly.NewCollector(colly.AllowURLRevisit())
	c.SetRequestTimeout(600 * time.Millisecond)
	s.Attach(c)
	err = c.Request("GET", site.URL()+"/p/1", nil, NewTaskContext("shopper"), nil)
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrSitePaused, "%v", err)
	assert.NotErrorIs(t, err, ErrRedis, "%v", err)
	assert.Positive(t, hook.n.Load(), "the wait ended in a slow call")
}

// slowOnce is a redis.Hook that delays every script call once when says so
// (until the call's context ends), counting the calls it delayed.
type slowOnce struct {
	n     atomic.Int64
	when  atomic.Value // func() bool
	delay time.Duration
}

func (h *slowOnce) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *slowOnce) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *slowOnce) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		when, _ := h.when.Load().(func() bool)
		if name := strings.ToLower(cmd.Name()); (name == "evalsha" || name == "eval") && when != nil && when() {
			h.n.Add(1)
			select {
			case <-time.After(h.delay):
			case <-ctx.Done():
			}
		}
		return next(ctx, cmd)
	}
}
