package proxyswitch

import (
	"context"
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
	"github.com/proxyswitch/proxyswitch/internal/testbed"
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
	mu     sync.Mutex
	tasks  map[string]*flowVisitor
	ips    map[string]*flowIP
	bulk   []flowHit
	banned map[string]bool
	errs   []string
	seq    int
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
	return &shopFlow{tasks: map[string]*flowVisitor{}, ips: map[string]*flowIP{}, banned: map[string]bool{}}
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
		if len(cookies["sid"])+len(cookies["cart"]) > 0 {
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
		if len(cookies["sid"])+len(cookies["cart"]) > 0 {
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
	want := map[string]string{"sid": v.sid, "cart": v.cart}
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
		http.SetCookie(w, &http.Cookie{Name: "sid", Value: v.sid, Path: "/"})
	}
	v.cart = task + "-" + r.URL.Query().Get("n")
	http.SetCookie(w, &http.Cookie{Name: "cart", Value: v.cart, Path: "/", MaxAge: 3600})
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
	s := newSwitch(t, sharedClient(t), opts...)
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
	flow, site, _, s0 := sessionShop(t, tasks+extra, WithMaxWait(20*time.Second))
	sws := []*Switch{s0, sibling(t, s0, sharedClient(t)), sibling(t, s0, sharedClient(t))}
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
	assert.Equal(t, tasks+extra, st.FreeSlots)
	assertNoLeases(t, s0, site)
}

// A ban in the middle of a session retires it: the next step leaves from
// another IP with none of the old cookies, and the retirement is reported.
func TestSessionRetiredOnBan(t *testing.T) {
	var mu sync.Mutex
	var retired []SessionRetirement
	flow, site, _, s := sessionShop(t, 3, WithSessionRetired(func(r SessionRetirement) {
		mu.Lock()
		retired = append(retired, r)
		mu.Unlock()
	}))
	other := sibling(t, s, sharedClient(t))
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
	const ttl = 1500 * time.Millisecond
	flow, site, _, s := sessionShop(t, 2, WithSessionTTL(ttl), WithMaxWait(0))
	other := sibling(t, s, sharedClient(t))
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
