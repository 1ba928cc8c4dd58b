// Command scenarios drives proxyswitch's ban evidence through the
// scenarios a crawler meets (tools/scenarios/run.sh runs them all and
// prints the table). One scenario run per process:
//
//	scenarios -redis 127.0.0.1:PORT -s S1 [-run N]  -> one JSON line on stdout
//	scenarios -summarize FILE                       -> table with medians
//
// It uses the public API only, so that run.sh can build it against another
// clone of the library to compare versions: ErrSiteStorm and
// BlockedError.Storm are found by reflection and message, not by name.
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/proxyswitchtest"
	"github.com/redis/go-redis/v9"
)

var (
	flagRedis = flag.String("redis", "127.0.0.1:7311", "redis addr")
	flagScen  = flag.String("s", "", "scenario")
	flagRun   = flag.Int("run", 1, "run number (label only)")
	flagSum   = flag.String("summarize", "", "JSON-lines file to summarize")
	flagVerb  = flag.Bool("v", false, "print errors")
	flagPar   = flag.Int("par", 0, "override the scenario's Colly parallelism (0: the scenario's)")
)

// ---------------------------------------------------------------- results

type Result struct {
	Scenario string         `json:"scenario"`
	Run      int            `json:"run"`
	Vals     map[string]any `json:"vals"`
	Keys     []string       `json:"keys"`
	Notes    []string       `json:"notes,omitempty"`
}

func (r *Result) set(k string, v any) {
	if r.Vals == nil {
		r.Vals = map[string]any{}
	}
	if _, ok := r.Vals[k]; !ok {
		r.Keys = append(r.Keys, k)
	}
	r.Vals[k] = v
}
func (r *Result) note(f string, a ...any) { r.Notes = append(r.Notes, fmt.Sprintf(f, a...)) }

// ---------------------------------------------------------------- error kinds

const stormMsg = "proxyswitch: site storm"

func walk(err error, f func(error) bool) bool {
	if err == nil {
		return false
	}
	if f(err) {
		return true
	}
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if walk(e, f) {
				return true
			}
		}
	case interface{ Unwrap() error }:
		return walk(u.Unwrap(), f)
	}
	return false
}

func isStorm(err error) bool {
	return walk(err, func(e error) bool {
		if e.Error() == stormMsg {
			return true
		}
		if be, ok := e.(*proxyswitch.BlockedError); ok {
			v := reflect.ValueOf(be).Elem().FieldByName("Storm")
			return v.IsValid() && v.Kind() == reflect.Bool && v.Bool()
		}
		return false
	})
}

func kindOf(err error) string {
	switch {
	case isStorm(err):
		return "storm"
	case errors.Is(err, proxyswitch.ErrPageRefused):
		return "page"
	case errors.Is(err, proxyswitch.ErrSitePaused):
		return "paused"
	case errors.Is(err, proxyswitch.ErrBanned):
		return "banned"
	case errors.Is(err, proxyswitch.ErrProxyFailed):
		return "pfail"
	case errors.Is(err, proxyswitch.ErrNoProxy):
		return "noproxy"
	}
	return "other"
}

var kinds = []string{"page", "banned", "pfail", "paused", "storm", "noproxy", "other"}

// ---------------------------------------------------------------- sites

// behave answers one request; ip is the client IP, el the time since the
// crawl's t0. It returns after writing.
type behave func(w http.ResponseWriter, r *http.Request, ip string, el time.Duration)

type site struct {
	*proxyswitchtest.Site
	tls *httptest.Server
	rec *proxyswitchtest.Recorder
	t0  atomic.Int64
	fn  behave
	key string // the Switch's site name
}

func newSite(fn behave) *site {
	s := &site{fn: fn}
	s.t0.Store(time.Now().UnixNano())
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ip, _, _ := net.SplitHostPort(r.RemoteAddr)
		s.fn(w, r, ip, time.Duration(time.Now().UnixNano()-s.t0.Load()))
	})
	if useTLS {
		s.rec = proxyswitchtest.NewRecorder()
		s.tls = httptest.NewUnstartedServer(s.rec.Wrap(h))
		s.tls.StartTLS()
		s.key = strings.ToLower(strings.TrimPrefix(s.tls.URL, "https://"))
		return s
	}
	s.Site = proxyswitchtest.StartSite("h3", h)
	s.rec = s.Site.Recorder()
	s.key = strings.ToLower(s.Host())
	return s
}

// useTLS: the next sites are HTTPS (reached through CONNECT tunnels).
var useTLS bool

func (s *site) URL() string {
	if s.tls != nil {
		return s.tls.URL
	}
	return s.Site.URL()
}
func (s *site) Recorder() *proxyswitchtest.Recorder { return s.rec }
func (s *site) Close() {
	if s.tls != nil {
		s.tls.Close()
		return
	}
	s.Site.Close()
}

func (s *site) start()            { s.t0.Store(time.Now().UnixNano()) }
func (s *site) u(p string) string { return s.URL() + p }
func (s *site) el() time.Duration { return time.Duration(time.Now().UnixNano() - s.t0.Load()) }
func good(w http.ResponseWriter, p string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	var b strings.Builder
	b.WriteString("<html><head><title>" + p + "</title></head><body><div class=\"product\"><h1>Product " + p + "</h1>")
	for i := 0; i < 40; i++ {
		b.WriteString("<p>Lorem ipsum dolor sit amet, consectetur adipiscing elit.</p>")
	}
	b.WriteString("</div></body></html>")
	io.WriteString(w, b.String())
}

// deletedPages is a site whose /deleted/ pages answer 403 to everyone and
// whose other pages are served.
func deletedPages(w http.ResponseWriter, r *http.Request, ip string, el time.Duration) {
	if strings.HasPrefix(r.URL.Path, "/deleted/") {
		status(w, 403)
		return
	}
	good(w, r.URL.Path)
}

func status(w http.ResponseWriter, code int) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	fmt.Fprintf(w, "<html><body><h1>%d %s</h1></body></html>", code, http.StatusText(code))
}

// ---------------------------------------------------------------- proxies

type farm struct {
	urls []string          // pool, in order
	ip   map[string]string // proxy URL (as shown) -> source IP
	kit  []*proxyswitchtest.Proxy
	bad  []*http.Server
}

// startFarm: n good kit proxies on SourceIP(0..n-1), then nbad broken
// proxies (502 for everything) listening on SourceIP(n..).
func startFarm(n, nbad int) *farm {
	f := &farm{ip: map[string]string{}}
	for i := 0; i < n; i++ {
		p, err := proxyswitchtest.StartProxy(proxyswitchtest.SourceIP(i))
		if err != nil {
			log.Fatal(err)
		}
		f.kit = append(f.kit, p)
		f.urls = append(f.urls, p.URL())
		f.ip[p.URL()] = p.SourceIP().String()
	}
	for j := 0; j < nbad; j++ {
		ip := proxyswitchtest.SourceIP(n + j).String()
		ln, err := net.Listen("tcp", ip+":0")
		if err != nil {
			log.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusBadGateway)
			io.WriteString(w, "<html><body>502 Bad Gateway (broken proxy)</body></html>")
		}), ErrorLog: log.New(io.Discard, "", 0)}
		go srv.Serve(ln)
		f.bad = append(f.bad, srv)
		u := "http://" + ln.Addr().String()
		f.urls = append(f.urls, u)
		f.ip[u] = "BAD:" + ip
	}
	return f
}

// ---------------------------------------------------------------- crawl

type page struct {
	url          string
	good         bool
	visit        time.Duration
	end          time.Duration
	ok           bool
	kind         string
	err          error
	status       int
	hasStatusMsg bool
}

type env struct {
	rdb  *redis.Client
	sw   *proxyswitch.Switch
	c    *colly.Collector
	s    *site
	f    *farm
	mu   sync.Mutex
	page map[string]*page
	t0   time.Time
	// breaker monitor
	bmu        sync.Mutex
	openTotal  time.Duration
	halfTotal  time.Duration
	opened     bool
	firstOpen  time.Duration
	openEvents int
	wasOpen    bool
	stopMon    chan struct{}
	monDone    chan struct{}
}

type opts struct {
	parallel   int
	reqTimeout time.Duration
	swOpts     []proxyswitch.Option
}

func setup(s *site, f *farm, o opts) *env {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: *flagRedis, ContextTimeoutEnabled: true})
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		log.Fatal("flushall: ", err)
	}
	if useTLS {
		o.swOpts = append(o.swOpts, proxyswitch.WithBaseTransport(&http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}))
	}
	sw, err := proxyswitch.NewSwitch(rdb, o.swOpts...)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := sw.Add(ctx, f.urls...); err != nil {
		log.Fatal("add: ", err)
	}
	c := colly.NewCollector(colly.Async(true))
	sw.Attach(c)
	if o.parallel == 0 {
		o.parallel = 8
	}
	if *flagPar > 0 {
		o.parallel = *flagPar
	}
	c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: o.parallel})
	if o.reqTimeout > 0 {
		c.SetRequestTimeout(o.reqTimeout)
	}
	e := &env{rdb: rdb, sw: sw, c: c, s: s, f: f, page: map[string]*page{}}
	c.OnResponse(func(r *colly.Response) {
		e.mu.Lock()
		defer e.mu.Unlock()
		if p := e.page[r.Request.URL.String()]; p != nil {
			p.end, p.ok = time.Since(e.t0), true
		} else if p := e.orig(r.Request); p != nil {
			p.end, p.ok = time.Since(e.t0), true
		}
	})
	c.OnError(func(r *colly.Response, err error) {
		e.mu.Lock()
		defer e.mu.Unlock()
		p := e.page[r.Request.URL.String()]
		if p == nil {
			p = e.orig(r.Request)
		}
		if p == nil {
			return
		}
		p.end, p.ok, p.err, p.kind = time.Since(e.t0), false, err, kindOf(err)
		var be *proxyswitch.BlockedError
		if errors.As(err, &be) {
			p.status = be.Status
		}
		p.hasStatusMsg = strings.Contains(err.Error(), "403")
		if *flagVerb {
			fmt.Fprintf(os.Stderr, "%6.2fs %s %s: %v\n", p.end.Seconds(), p.kind, p.url, err)
		}
	})
	return e
}

// orig finds the page of a request by its Ctx "u" (redirects change URL).
func (e *env) orig(r *colly.Request) *page {
	if u := r.Ctx.Get("u"); u != "" {
		return e.page[u]
	}
	return nil
}

func (e *env) begin() {
	e.t0 = time.Now()
	e.s.start()
	e.stopMon, e.monDone = make(chan struct{}), make(chan struct{})
	go e.monitor()
}

func (e *env) visit(u string, goodPage bool) {
	e.mu.Lock()
	e.page[u] = &page{url: u, good: goodPage, visit: time.Since(e.t0), kind: "pending"}
	e.mu.Unlock()
	ctx := colly.NewContext()
	ctx.Put("u", u)
	if err := e.c.Request("GET", u, nil, ctx, nil); err != nil {
		e.mu.Lock()
		e.page[u].kind, e.page[u].err = "visiterr", err
		e.mu.Unlock()
	}
}

// wait waits for the collector at most d; it reports whether it finished.
func (e *env) wait(d time.Duration) bool {
	done := make(chan struct{})
	go func() { e.c.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

func (e *env) monitor() {
	defer close(e.monDone)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-e.stopMon:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		bs, err := e.sw.PausedSites(ctx)
		cancel()
		now := time.Now()
		dt := now.Sub(last)
		last = now
		if err != nil {
			continue
		}
		isOpen, isHalf := false, false
		for _, b := range bs {
			if b.Site == e.s.key {
				isOpen = b.State == proxyswitch.BreakerOpen
				isHalf = b.State == proxyswitch.BreakerHalfOpen
			}
		}
		e.bmu.Lock()
		if isOpen {
			e.openTotal += dt
			if !e.opened {
				e.opened, e.firstOpen = true, now.Sub(e.t0)
			}
			if !e.wasOpen {
				e.openEvents++
			}
		}
		if isHalf {
			e.halfTotal += dt
		}
		e.wasOpen = isOpen
		e.bmu.Unlock()
	}
}

type qstat struct {
	quar, ban, strike, dead int
	ips                     map[string]string // ip -> "ban"/"strike"/"dead"
}

func (e *env) quarantined() qstat {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := e.sw.ProxyStates(ctx, e.s.key)
	q := qstat{ips: map[string]string{}}
	if err != nil {
		q.quar = -1
		return q
	}
	now := time.Now()
	for _, ps := range st {
		ip := e.f.ip[ps.Proxy.String()]
		if ip == "" {
			ip = ps.Proxy.String()
		}
		switch ps.State {
		case proxyswitch.StateQuarantined:
			q.quar++
			if ps.Until.Sub(now) > 5*time.Minute {
				q.ban++
				q.ips[ip] = "ban"
			} else {
				q.strike++
				q.ips[ip] = "strike"
			}
		case proxyswitch.StateDead:
			q.dead++
			q.ips[ip] = "dead"
		}
	}
	return q
}

func (e *env) finish(r *Result, waitMax time.Duration) {
	fin := e.wait(waitMax)
	close(e.stopMon)
	<-e.monDone
	if !fin {
		r.note("crawl not finished after wait cap %v", waitMax)
	}
	q := e.quarantined()
	r.set("q_end", q.quar)
	r.set("q_ban", q.ban)
	r.set("q_strike", q.strike)
	r.set("dead", q.dead)
	e.bmu.Lock()
	r.set("brk_opened", e.opened)
	if e.opened {
		r.set("brk_first_open_s", round(e.firstOpen.Seconds()))
	}
	r.set("paused_s", round(e.openTotal.Seconds()))
	r.set("halfopen_s", round(e.halfTotal.Seconds()))
	r.set("brk_opens", e.openEvents)
	e.bmu.Unlock()
	r.set("site_reqs", e.s.Recorder().Count())
	if len(q.ips) > 0 {
		var l []string
		for ip, s := range q.ips {
			l = append(l, ip+"="+s)
		}
		sort.Strings(l)
		r.note("out: %s", strings.Join(l, " "))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	_ = e.sw.Close(ctx)
	cancel()
}

// tally fills ok / fail-by-kind counts for good and bad pages, over pages
// matching sel (nil: all).
func (e *env) tally(r *Result, prefix string, sel func(*page) bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	gOK, gN, bOK, bN := 0, 0, 0, 0
	gf, bf := map[string]int{}, map[string]int{}
	for _, p := range e.page {
		if sel != nil && !sel(p) {
			continue
		}
		if p.good {
			gN++
			if p.ok {
				gOK++
			} else {
				gf[p.kind]++
			}
		} else {
			bN++
			if p.ok {
				bOK++
			} else {
				bf[p.kind]++
			}
		}
	}
	r.set(prefix+"good_ok", fmt.Sprintf("%d/%d", gOK, gN))
	if len(gf) > 0 {
		r.set(prefix+"good_fail", fmtKinds(gf))
	}
	if bN > 0 {
		r.set(prefix+"bad_ok", fmt.Sprintf("%d/%d", bOK, bN))
		r.set(prefix+"bad_fail", fmtKinds(bf))
	}
}

func fmtKinds(m map[string]int) string {
	var l []string
	seen := map[string]bool{}
	for _, k := range kinds {
		if m[k] > 0 {
			l = append(l, fmt.Sprintf("%s:%d", k, m[k]))
		}
		seen[k] = true
	}
	var rest []string
	for k, v := range m {
		if !seen[k] && v > 0 {
			rest = append(rest, fmt.Sprintf("%s:%d", k, v))
		}
	}
	sort.Strings(rest)
	l = append(l, rest...)
	if len(l) == 0 {
		return "-"
	}
	return strings.Join(l, ",")
}

func round(f float64) float64 { return math.Round(f*100) / 100 }

// firstOKAfter: seconds from t to the first success ending after t (-1: none).
func (e *env) firstOKAfter(t time.Duration) float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	best := time.Duration(-1)
	for _, p := range e.page {
		if p.ok && p.end >= t && (best < 0 || p.end < best) {
			best = p.end
		}
	}
	if best < 0 {
		return -1
	}
	return round((best - t).Seconds())
}

// ---------------------------------------------------------------- scenarios

func sDeleted(r *Result, nProxies int, interleave bool) {
	s := newSite(deletedPages)
	defer s.Close()
	f := startFarm(nProxies, 0)
	par := 8
	if !interleave {
		par = 5 // the 5 deleted pages go out first, together, on a cold site
	}
	e := setup(s, f, opts{parallel: par})
	e.begin()
	if !interleave {
		for i := 0; i < 5; i++ {
			e.visit(s.u(fmt.Sprintf("/deleted/%d", i)), false)
		}
		for i := 0; i < 30; i++ {
			e.visit(s.u(fmt.Sprintf("/p/%d", i)), true)
		}
	} else {
		d := 0
		for i := 0; i < 30; i++ {
			if i%6 == 2 && d < 5 {
				e.visit(s.u(fmt.Sprintf("/deleted/%d", d)), false)
				d++
			}
			e.visit(s.u(fmt.Sprintf("/p/%d", i)), true)
		}
	}
	e.finish(r, 35*time.Second)
	e.tally(r, "", nil)
}

func s2(r *Result) {
	s := newSite(deletedPages)
	defer s.Close()
	f := startFarm(12, 0)
	e := setup(s, f, opts{})
	e.begin()
	for i := 0; i < 30; i++ {
		e.visit(s.u(fmt.Sprintf("/warm/%d", i)), true)
	}
	e.wait(20 * time.Second)
	for i := 0; i < 12; i++ {
		e.visit(s.u(fmt.Sprintf("/deleted/%d", i)), false)
	}
	for i := 0; i < 20; i++ {
		e.visit(s.u(fmt.Sprintf("/p/%d", i)), true)
	}
	e.finish(r, 30*time.Second)
	e.tally(r, "", func(p *page) bool { return !strings.Contains(p.url, "/warm/") })
	e.tally(r, "warm_", func(p *page) bool { return strings.Contains(p.url, "/warm/") })
}

func s3(r *Result) {
	victim := proxyswitchtest.SourceIP(3).String()
	s := newSite(func(w http.ResponseWriter, r *http.Request, ip string, el time.Duration) {
		switch {
		case r.URL.Path == "/login":
			good(w, "login form")
		case r.URL.Path == "/session/refresh":
			http.Redirect(w, r, "/login", http.StatusFound)
		case ip == victim:
			http.Redirect(w, r, "/session/refresh?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusFound)
		default:
			good(w, r.URL.Path)
		}
	})
	defer s.Close()
	sequence(r, s, 12, 40, "/p/%d")
	r.set("victim_out", victimOut(r, victim))
}

// victimOut is "yes" when the run's notes list the IP victim among the
// proxies out of rotation at the end, else "no".
func victimOut(r *Result, victim string) string {
	for _, n := range r.Notes {
		if strings.Contains(n, victim+"=") {
			return "yes"
		}
	}
	return "no"
}

func s4(r *Result) {
	s := newSite(func(w http.ResponseWriter, r *http.Request, ip string, el time.Duration) {
		if r.URL.Path == "/login" {
			good(w, "login form")
			return
		}
		http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusFound)
	})
	defer s.Close()
	f := startFarm(24, 0)
	e := setup(s, f, opts{})
	e.begin()
	for i := 0; i < 30; i++ {
		e.visit(s.u(fmt.Sprintf("/p/%d", i)), false)
	}
	e.finish(r, 35*time.Second)
	e.tally(r, "", nil)
}

// storm: continuous crawl, the site misbehaves for everyone in [from,to).
func sStorm(r *Result, mode string, nProxies int, nBad int, from, to, feedUntil time.Duration, o opts, opPause time.Duration) {
	s := newSite(nil)
	s.fn = func(w http.ResponseWriter, r *http.Request, ip string, el time.Duration) {
		if el >= from && el < to {
			switch mode {
			case "502":
				status(w, 502)
			case "403":
				status(w, 403)
			case "503":
				status(w, 503)
			case "stall":
				select {
				case <-r.Context().Done():
				case <-time.After(8 * time.Second):
				}
				status(w, 504)
			}
			return
		}
		good(w, r.URL.Path)
	}
	defer s.Close()
	f := startFarm(nProxies, nBad)
	e := setup(s, f, o)
	e.begin()
	var qAt atomic.Value
	go func() {
		time.Sleep(to + 500*time.Millisecond)
		q := e.quarantined()
		qAt.Store(q)
	}()
	if opPause > 0 {
		go func() {
			time.Sleep(from)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if _, err := e.sw.PauseSite(ctx, s.key, opPause); err != nil {
				r.note("PauseSite: %v", err)
			}
		}()
	}
	i := 0
	tick := time.NewTicker(50 * time.Millisecond) // 20 pages/s
	for time.Since(e.t0) < feedUntil {
		<-tick.C
		e.visit(s.u(fmt.Sprintf("/p/%d", i)), true)
		i++
	}
	tick.Stop()
	e.finish(r, 38*time.Second-feedUntil)
	if v := qAt.Load(); v != nil {
		q := v.(qstat)
		r.set(fmt.Sprintf("q_at_%.1fs", (to+500*time.Millisecond).Seconds()), q.quar)
	}
	r.set("first_ok_after_storm_s", e.firstOKAfter(to))
	e.tally(r, "pre_", func(p *page) bool { return p.visit < from })
	e.tally(r, "during_", func(p *page) bool { return p.visit >= from && p.visit < to })
	e.tally(r, "after_", func(p *page) bool { return p.visit >= to })
	// refused-page labels of everything
	e.mu.Lock()
	all := map[string]int{}
	for _, p := range e.page {
		if !p.ok {
			all[p.kind]++
		}
	}
	e.mu.Unlock()
	r.set("all_fail", fmtKinds(all))
}

func r1(r *Result, nGood, nBad, pages int) {
	s := newSite(func(w http.ResponseWriter, r *http.Request, ip string, el time.Duration) { good(w, r.URL.Path) })
	defer s.Close()
	f := startFarm(nGood, nBad)
	e := setup(s, f, opts{})
	e.begin()
	for i := 0; i < pages; i++ {
		e.visit(s.u(fmt.Sprintf("/p/%d", i)), true)
	}
	e.finish(r, 35*time.Second)
	e.tally(r, "", nil)
	n := 0
	for _, note := range r.Notes {
		n += strings.Count(note, "BAD:")
	}
	r.set("bad_proxies_out", fmt.Sprintf("%d/%d", n, nBad))
}

// sequence crawls pages URLs of s (pathf with 0, 1, ...) through a farm of
// proxies with default options, waits for the crawl (35 s at most) and
// tallies r; it returns the run's env for the scenario's own counts.
func sequence(r *Result, s *site, proxies, pages int, pathf string) *env {
	f := startFarm(proxies, 0)
	e := setup(s, f, opts{})
	e.begin()
	for i := 0; i < pages; i++ {
		e.visit(s.u(fmt.Sprintf(pathf, i)), true)
	}
	e.finish(r, 35*time.Second)
	e.tally(r, "", nil)
	return e
}

// banningSite is a site that answers 403 to every page from the source
// IPs of the proxies numbered idx (proxyswitchtest.SourceIP), and serves
// everyone else; it returns those IPs too.
func banningSite(idx ...int) (*site, map[string]bool) {
	banned := map[string]bool{}
	for _, i := range idx {
		banned[proxyswitchtest.SourceIP(i).String()] = true
	}
	return newSite(func(w http.ResponseWriter, r *http.Request, ip string, el time.Duration) {
		if banned[ip] {
			status(w, 403)
			return
		}
		good(w, r.URL.Path)
	}), banned
}

func r2(r *Result) {
	s, banned := banningSite(0, 1, 2, 4, 5, 7, 9, 10)
	defer s.Close()
	e := sequence(r, s, 12, 30, "/p/%d")
	q := e.quarantined() // after Close: states persist in Redis
	ips := s.Recorder().IPs()
	touched, notOut, untouched := 0, 0, 0
	for ip := range banned {
		if ips[ip] == 0 {
			untouched++
			continue
		}
		touched++
		if q.ips[ip] == "" {
			notOut++
		}
	}
	r.set("banned_touched", touched)
	r.set("banned_touched_not_out", notOut)
	r.set("banned_untouched", untouched)
	healthyOut := 0
	for ip := range q.ips {
		if !banned[ip] {
			healthyOut++
		}
	}
	r.set("healthy_out", healthyOut)
}

func r4(r *Result) {
	victim := proxyswitchtest.SourceIP(2).String()
	s := newSite(func(w http.ResponseWriter, r *http.Request, ip string, el time.Duration) {
		switch {
		case strings.HasPrefix(r.URL.Path, "/old/"):
			http.Redirect(w, r, "/new/"+strings.TrimPrefix(r.URL.Path, "/old/"), http.StatusMovedPermanently)
		case r.URL.Path == "/captcha":
			good(w, "captcha")
		case ip == victim:
			http.Redirect(w, r, "/captcha?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusFound)
		default:
			good(w, r.URL.Path)
		}
	})
	defer s.Close()
	sequence(r, s, 10, 30, "/old/%d")
	r.set("victim_out", victimOut(r, victim))
	r.set("victim_reqs", s.Recorder().IPs()[victim])
}

func a1(r *Result) {
	s := newSite(deletedPages)
	defer s.Close()
	f := startFarm(20, 0)
	e := setup(s, f, opts{parallel: 20})
	e.begin()
	for i := 0; i < 400; i++ {
		if i%10 == 9 {
			e.visit(s.u(fmt.Sprintf("/deleted/%d", i)), false)
		} else {
			e.visit(s.u(fmt.Sprintf("/p/%d", i)), true)
		}
	}
	e.finish(r, 38*time.Second)
	e.tally(r, "", nil)
	e.mu.Lock()
	named, nbad := 0, 0
	for _, p := range e.page {
		if !p.good && !p.ok {
			nbad++
			if p.status == 403 && p.hasStatusMsg {
				named++
			}
		}
	}
	okGood := 0
	for _, p := range e.page {
		if p.good && p.ok {
			okGood++
		}
	}
	e.mu.Unlock()
	r.set("refused_named_403", fmt.Sprintf("%d/%d", named, nbad))
	r.set("good_pct", round(100*float64(okGood)/360))
}

func a2(r *Result) {
	s, burnt := banningSite(0, 5, 10, 15)
	defer s.Close()
	sequence(r, s, 20, 100, "/p/%d")
	ips := s.Recorder().IPs()
	var l []string
	mx := 0
	for ip := range burnt {
		l = append(l, strconv.Itoa(ips[ip]))
		mx = max(mx, ips[ip])
	}
	sort.Strings(l)
	r.set("burnt_reqs", strings.Join(l, ","))
	r.set("burnt_max", mx)
}

func main() {
	flag.Parse()
	log.SetFlags(0)
	if *flagSum != "" {
		summarize(*flagSum)
		return
	}
	r := &Result{Scenario: *flagScen, Run: *flagRun}
	t := time.Now()
	switch *flagScen {
	case "S1":
		sDeleted(r, 10, false)
	case "S1i":
		sDeleted(r, 20, true)
	case "S2":
		s2(r)
	case "S3":
		s3(r)
	case "S4":
		s4(r)
	case "S5":
		sStorm(r, "502", 20, 0, 2*time.Second, 6*time.Second, 18*time.Second, opts{}, 0)
	case "S5b":
		sStorm(r, "stall", 20, 0, 2*time.Second, 6*time.Second, 18*time.Second, opts{reqTimeout: 2 * time.Second}, 0)
	case "S5c":
		// S5b with the library's own per-attempt bound (Timeouts.Attempt 1s,
		// Colly timeout 4s), so that a stalled attempt is a proxy failure
		sStorm(r, "stall", 20, 0, 2*time.Second, 6*time.Second, 18*time.Second,
			opts{reqTimeout: 4 * time.Second, swOpts: []proxyswitch.Option{proxyswitch.WithTimeouts(proxyswitch.Timeouts{Attempt: time.Second})}}, 0)
	case "S6-403":
		sStorm(r, "403", 20, 0, 2*time.Second, 6*time.Second, 18*time.Second, opts{}, 0)
	case "S6-503":
		sStorm(r, "503", 20, 0, 2*time.Second, 6*time.Second, 18*time.Second, opts{}, 0)
	case "R1":
		r1(r, 12, 3, 30)
	case "R1t":
		useTLS = true
		r1(r, 12, 3, 30)
	case "R1x":
		// a larger share of broken proxies: 6 good + 4 broken, 60 pages
		r1(r, 6, 4, 60)
	case "R2":
		r2(r)
	case "R2p2":
		*flagPar = 2
		r2(r)
	case "R3":
		// 10 proxies, 4 broken; a short 503 storm opens the breaker; the
		// crawl goes on through the half-open phase.
		sStorm(r, "503", 6, 4, 1*time.Second, 3*time.Second, 28*time.Second, opts{}, 0)
	case "R3b":
		// 10 proxies, 4 broken; a short site-side 502 storm (t=1..3s), which
		// EVID counts as storm evidence: does the half-open breaker meet the
		// broken proxies again?
		sStorm(r, "502", 6, 4, 1*time.Second, 3*time.Second, 28*time.Second, opts{}, 0)
	case "X1":
		// beyond the brief: a small healthy pool (6 proxies, fewer than
		// Breaker.Burst) meets a 2 s 503 storm; does the crawl resume when
		// the site does (t=3s)?
		sStorm(r, "503", 6, 0, 1*time.Second, 3*time.Second, 20*time.Second, opts{}, 0)
	case "R3p":
		// same pool, breaker forced open by an operator pause of 3s at t=2s
		// (storm window empty): half-open probes meet the broken proxies?
		sStorm(r, "none", 6, 4, 2*time.Second, 2*time.Second, 20*time.Second, opts{}, 3*time.Second)
	case "R4":
		r4(r)
	case "A1":
		a1(r)
	case "A2":
		a2(r)
	default:
		log.Fatalf("unknown scenario %q", *flagScen)
	}
	r.set("wall_s", round(time.Since(t).Seconds()))
	json.NewEncoder(os.Stdout).Encode(r)
}

// ---------------------------------------------------------------- summary

func summarize(file string) {
	b, err := os.ReadFile(file)
	if err != nil {
		log.Fatal(err)
	}
	type agg struct {
		keys  []string
		vals  map[string][]any
		notes []string
	}
	var order []string
	m := map[string]*agg{}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var r Result
		if json.Unmarshal([]byte(line), &r) != nil {
			continue
		}
		a := m[r.Scenario]
		if a == nil {
			a = &agg{vals: map[string][]any{}}
			m[r.Scenario] = a
			order = append(order, r.Scenario)
		}
		for _, k := range r.Keys {
			if _, ok := a.vals[k]; !ok {
				a.keys = append(a.keys, k)
			}
			a.vals[k] = append(a.vals[k], r.Vals[k])
		}
		for _, n := range r.Notes {
			a.notes = append(a.notes, fmt.Sprintf("run%d: %s", r.Run, n))
		}
	}
	for _, sc := range order {
		a := m[sc]
		var parts []string
		for _, k := range a.keys {
			parts = append(parts, k+"="+med(a.vals[k]))
		}
		fmt.Printf("%-7s %s\n", sc, strings.Join(parts, " "))
		for _, n := range a.notes {
			fmt.Printf("          %s\n", n)
		}
	}
}

// med: the median of numbers (with all runs in brackets), else runs joined by |.
func med(vs []any) string {
	var fs []float64
	var ss []string
	num := true
	for _, v := range vs {
		ss = append(ss, fmt.Sprint(v))
		if f, ok := v.(float64); ok {
			fs = append(fs, f)
		} else {
			num = false
		}
	}
	if !num || len(vs) == 1 {
		return strings.Join(ss, "|")
	}
	sort.Float64s(fs)
	var md float64
	if len(fs)%2 == 1 {
		md = fs[len(fs)/2]
	} else {
		md = (fs[len(fs)/2-1] + fs[len(fs)/2]) / 2
	}
	return fmt.Sprintf("%g(%s)", round(md), strings.Join(ss, "|"))
}
