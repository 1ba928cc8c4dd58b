package proxyswitchtest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// ProxyMode selects the behaviour of a fake [Proxy].
type ProxyMode int32

const (
	// ProxyOK forwards requests (the default).
	ProxyOK ProxyMode = iota
	// ProxyDead closes the listener and all connections (in-flight requests
	// and tunnels included): new clients get "connection refused". Leaving
	// this mode listens again on the same address (best effort: should the
	// port have been taken meanwhile, SetMode reports it with tb.Errorf, or
	// the standard logger for a proxy made by [StartProxy]).
	ProxyDead
	// ProxyHang accepts requests and never answers until the client gives
	// up or the proxy is closed.
	ProxyHang
	// ProxySlow waits [Proxy.SetDelay] before forwarding.
	ProxySlow
	// Proxy407 always answers 407 Proxy Authentication Required.
	Proxy407
	// Proxy502 always answers 502 Bad Gateway without contacting the target.
	Proxy502
)

// String returns the mode's name: "ok", "dead", "hang", "slow", "407" or "502".
func (m ProxyMode) String() string {
	switch m {
	case ProxyOK:
		return "ok"
	case ProxyDead:
		return "dead"
	case ProxyHang:
		return "hang"
	case ProxySlow:
		return "slow"
	case Proxy407:
		return "407"
	case Proxy502:
		return "502"
	}
	return "ProxyMode(" + strconv.Itoa(int(m)) + ")"
}

// closeWait bounds how long Close waits for handlers and tunnels to finish.
const closeWait = 5 * time.Second

var errNotLoopback = errors.New("proxyswitchtest: refusing to dial non-loopback address")

// Proxy is a fake HTTP forward proxy listening on 127.0.0.1:PORT. It serves
// absolute-form requests ("GET http://host:port/path") and CONNECT tunnels,
// and dials every target from its own source IP so that sites can tell
// proxies apart. Only loopback targets are allowed.
//
// A proxy also accounts in-flight forwarded requests per target host (see
// [Proxy.Collisions]). For plain HTTP the interval runs from arrival (before
// any ProxySlow delay) until the upstream body has been read completely,
// before anything is written to the client. For CONNECT it runs from arrival
// until the upstream connection is established, before "200 Connection
// Established" is sent; requests inside a tunnel are invisible to the proxy
// and are accounted by the site's [Recorder].
//
// All methods are safe for concurrent use.
type Proxy struct {
	rep       reporter
	addr      string // "127.0.0.1:PORT", stable across ProxyDead
	sourceIP  net.IP
	via       string
	srv       *http.Server
	transport *http.Transport
	dialer4   *net.Dialer // binds sourceIP
	dialer6   *net.Dialer // for IPv6 loopback targets (cannot bind an IPv4 source)
	done      chan struct{}

	mode     atomic.Int32
	delay    atomic.Int64
	creds    atomic.Pointer[credentials]
	requests atomic.Int64
	accepted atomic.Int64 // client connections accepted
	open     atomic.Int64 // client connections open (tunnels included)

	mu     sync.Mutex // lifecycle: ln, conns, closed; active.Add
	ln     net.Listener
	conns  map[net.Conn]struct{}
	closed bool
	active sync.WaitGroup // serve loops, handlers (incl. tunnels)

	statMu sync.Mutex
	fl     inflight
	hosts  map[string]int
}

type credentials struct{ user, pass string }

// reporter is where a proxy reports trouble after it started: the test's
// testing.TB, or the standard logger for programs ([StartProxy]).
type reporter interface {
	Errorf(format string, args ...any)
	Logf(format string, args ...any)
}

// stdReporter reports through the standard logger.
type stdReporter struct{}

func (stdReporter) Errorf(format string, args ...any) { log.Printf(format, args...) }
func (stdReporter) Logf(format string, args ...any)   { log.Printf(format, args...) }

// NewProxy starts a proxy that dials targets from sourceIP, which must be an
// IPv4 loopback address (nil means SourceIP(0) = 127.0.1.1). Avoid 127.0.0.1:
// sites count it as a direct hit. tb.Cleanup closes the proxy.
func NewProxy(tb testing.TB, sourceIP net.IP) *Proxy {
	tb.Helper()
	p, err := startProxy(tb, sourceIP)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Close)
	return p
}

// StartProxy is [NewProxy] for programs without a testing.TB (demos,
// examples): it returns an error instead of failing a test, reports later
// trouble through the standard logger, and the caller must Close the proxy.
func StartProxy(sourceIP net.IP) (*Proxy, error) {
	return startProxy(stdReporter{}, sourceIP)
}

func startProxy(rep reporter, sourceIP net.IP) (*Proxy, error) {
	if sourceIP == nil {
		sourceIP = SourceIP(0)
	}
	ip4 := sourceIP.To4()
	if ip4 == nil || !ip4.IsLoopback() {
		return nil, fmt.Errorf("proxyswitchtest: proxy source IP %v is not an IPv4 loopback address", sourceIP)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxyswitchtest: proxy listen: %w", err)
	}
	p := &Proxy{
		rep:      rep,
		addr:     ln.Addr().String(),
		sourceIP: append(net.IP(nil), ip4...),
		via:      "1.1 proxyswitchtest-proxy-" + ip4.String(),
		done:     make(chan struct{}),
		conns:    make(map[net.Conn]struct{}),
		fl:       newInflight(),
		hosts:    make(map[string]int),
	}
	p.dialer4 = &net.Dialer{
		LocalAddr: &net.TCPAddr{IP: p.sourceIP},
		Timeout:   10 * time.Second,
		Control:   loopbackOnly,
	}
	p.dialer6 = &net.Dialer{Timeout: 10 * time.Second, Control: loopbackOnly}
	p.transport = &http.Transport{
		Proxy:                  nil,
		DialContext:            p.dial,
		DisableKeepAlives:      true,
		DisableCompression:     true, // pass Accept-Encoding/Content-Encoding through untouched
		TLSClientConfig:        &tls.Config{InsecureSkipVerify: true},
		MaxResponseHeaderBytes: 1 << 20,
	}
	p.srv = &http.Server{
		Handler:           http.HandlerFunc(p.serveHTTP),
		ConnState:         p.connState,
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	p.mu.Lock()
	p.serveLocked(ln)
	p.mu.Unlock()
	return p, nil
}

// URL returns "http://127.0.0.1:PORT", or "http://user:pass@127.0.0.1:PORT"
// when credentials are set.
func (p *Proxy) URL() string {
	u := url.URL{Scheme: "http", Host: p.addr}
	if c := p.creds.Load(); c != nil {
		u.User = url.UserPassword(c.user, c.pass)
	}
	return u.String()
}

// Addr returns the listen address "127.0.0.1:PORT".
func (p *Proxy) Addr() string { return p.addr }

// SourceIP returns the IP the proxy dials targets from.
func (p *Proxy) SourceIP() net.IP { return append(net.IP(nil), p.sourceIP...) }

// Via returns the value the proxy appends to the Via header of forwarded
// requests and responses, e.g. "1.1 proxyswitchtest-proxy-127.0.1.1".
func (p *Proxy) Via() string { return p.via }

// SetCredentials requires Basic proxy authentication with user/pass;
// requests without a matching Proxy-Authorization header get 407. An empty
// user removes the requirement.
func (p *Proxy) SetCredentials(user, pass string) {
	if user == "" {
		p.creds.Store(nil)
		return
	}
	p.creds.Store(&credentials{user: user, pass: pass})
}

// Mode returns the current mode.
func (p *Proxy) Mode() ProxyMode { return ProxyMode(p.mode.Load()) }

// SetMode switches the proxy's behaviour. Requests already being handled
// keep the mode they arrived with, except that entering ProxyDead closes all
// connections.
func (p *Proxy) SetMode(m ProxyMode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := ProxyMode(p.mode.Swap(int32(m)))
	if p.closed || old == m {
		return
	}
	switch {
	case m == ProxyDead:
		if p.ln != nil {
			p.ln.Close()
			p.ln = nil
		}
		p.closeConnsLocked()
	case old == ProxyDead:
		// The port may be held for a moment by a socket of another test
		// (an outgoing connection's ephemeral port): try for a second.
		ln, err := net.Listen("tcp", p.addr)
		for i := 0; err != nil && i < 40; i++ {
			time.Sleep(25 * time.Millisecond)
			ln, err = net.Listen("tcp", p.addr)
		}
		if err != nil {
			p.rep.Errorf("proxyswitchtest: proxy %s: re-listen after ProxyDead: %v", p.addr, err)
			return
		}
		p.serveLocked(ln)
	}
}

// SetDelay sets the delay applied before forwarding in ProxySlow mode.
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// Requests returns the total number of requests received (a CONNECT tunnel
// counts once, whatever travels through it).
func (p *Proxy) Requests() int { return int(p.requests.Load()) }

// Conns returns how many client connections the proxy accepted since it
// started, and how many of them are open now (a CONNECT tunnel's included
// until it ends): with keep-alives, requests reuse connections, and a
// client that closes its idle connections shows here.
func (p *Proxy) Conns() (accepted, open int) {
	return int(p.accepted.Load()), int(p.open.Load())
}

// MaxConcurrentPerHost returns the maximum number of simultaneously
// in-flight forwarded requests to a single target host.
func (p *Proxy) MaxConcurrentPerHost() int {
	p.statMu.Lock()
	defer p.statMu.Unlock()
	return p.fl.max
}

// Collisions returns the number of forwarded requests that arrived while
// another request of this proxy to the same target host was in flight.
func (p *Proxy) Collisions() int {
	p.statMu.Lock()
	defer p.statMu.Unlock()
	return p.fl.collisions
}

// Hosts returns the number of forwarded requests (and tunnels) per target
// "host:port".
func (p *Proxy) Hosts() map[string]int {
	p.statMu.Lock()
	defer p.statMu.Unlock()
	return copyMap(p.hosts)
}

// Close stops the proxy, closes all client and upstream connections
// (including hung requests and tunnels) and waits briefly for handlers to
// return. It is safe to call more than once.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	close(p.done)
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	p.closeConnsLocked()
	p.mu.Unlock()
	p.srv.Close()

	finished := make(chan struct{})
	go func() { p.active.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(closeWait):
		p.rep.Logf("proxyswitchtest: proxy %s: handlers still running %v after Close", p.addr, closeWait)
	}
}

// ---- lifecycle helpers ----

func (p *Proxy) serveLocked(ln net.Listener) {
	p.ln = ln
	p.active.Add(1)
	go func() {
		defer p.active.Done()
		p.srv.Serve(ln) // returns when ln is closed
	}()
}

func (p *Proxy) closeConnsLocked() {
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// track registers c so that Close/ProxyDead close it; it reports false (and
// closes c) if the proxy is closed or dead.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.Mode() == ProxyDead {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

func (p *Proxy) connState(c net.Conn, s http.ConnState) {
	switch s {
	case http.StateNew:
		p.accepted.Add(1)
		p.open.Add(1)
		p.track(c)
	case http.StateClosed:
		p.open.Add(-1)
		p.untrack(c)
	}
	// Hijacked (CONNECT) connections stay tracked until the tunnel ends.
}

// enter registers a running handler; false if the proxy is closed.
func (p *Proxy) enter() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.active.Add(1)
	return true
}

// begin starts an in-flight interval for target host; call the returned
// function exactly once to end it.
func (p *Proxy) begin(host string) (end func()) {
	p.statMu.Lock()
	p.fl.begin(host)
	p.hosts[host]++
	p.statMu.Unlock()
	return func() {
		p.statMu.Lock()
		p.fl.end(host)
		p.statMu.Unlock()
	}
}

// ---- request handling ----

// serveHTTP is the proxy's request handler.
func (p *Proxy) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if !p.enter() {
		abort()
	}
	defer p.active.Done()
	p.requests.Add(1)

	mode := p.Mode()
	switch mode {
	case ProxyDead: // raced with SetMode(ProxyDead): drop the connection
		abort()
	case ProxyHang:
		select {
		case <-r.Context().Done():
		case <-p.done:
		}
		abort() // never answer, not even with an implicit 200
	case Proxy407:
		p.deny(w)
		return
	}
	if !p.authorized(r) {
		p.deny(w)
		return
	}
	if mode == Proxy502 {
		http.Error(w, "502 bad gateway (proxyswitchtest proxy in Proxy502 mode)", http.StatusBadGateway)
		return
	}

	target, err := targetOf(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if host, _, _ := net.SplitHostPort(target); !allowedHost(host) {
		http.Error(w, "proxyswitchtest proxy: target "+host+" is not loopback", http.StatusForbidden)
		return
	}
	if r.Method == http.MethodConnect {
		p.tunnel(w, r, target, mode)
	} else {
		p.forward(w, r, target, mode)
	}
}

func (p *Proxy) deny(w http.ResponseWriter) {
	w.Header().Set("Proxy-Authenticate", `Basic realm="proxyswitchtest"`)
	http.Error(w, "407 proxy authentication required", http.StatusProxyAuthRequired)
}

func (p *Proxy) authorized(r *http.Request) bool {
	c := p.creds.Load()
	if c == nil {
		return true
	}
	user, pass, ok := proxyAuth(r)
	return ok && user == c.user && pass == c.pass
}

// slowDelay waits the configured delay in ProxySlow mode; false if the
// request was cancelled or the proxy closed meanwhile.
func (p *Proxy) slowDelay(ctx context.Context, mode ProxyMode) bool {
	d := time.Duration(p.delay.Load())
	if mode != ProxySlow || d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
	case <-p.done:
	}
	return false
}

// forward handles an absolute-form request. The upstream body is read
// completely and the in-flight interval ended before the response is written.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, target string, mode ProxyMode) {
	end := p.begin(target)
	ended := false
	finish := func() {
		if !ended {
			ended = true
			end()
		}
	}
	defer finish()

	ctx := r.Context()
	if !p.slowDelay(ctx, mode) {
		abort()
	}
	out := r.Clone(ctx)
	out.RequestURI = ""
	out.Close = false
	if r.ContentLength == 0 {
		out.Body = nil
	}
	removeHopHeaders(out.Header)
	appendVia(out.Header, p.via)

	resp, err := p.transport.RoundTrip(out)
	if err != nil {
		finish()
		if ctx.Err() != nil {
			abort()
		}
		http.Error(w, "proxyswitchtest proxy: upstream: "+err.Error(), http.StatusBadGateway)
		return
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	finish() // before the first byte goes to the client
	if err != nil {
		if ctx.Err() != nil {
			abort()
		}
		http.Error(w, "proxyswitchtest proxy: upstream body: "+err.Error(), http.StatusBadGateway)
		return
	}

	h := w.Header()
	for k, vs := range resp.Header {
		h[k] = append([]string(nil), vs...)
	}
	removeHopHeaders(h)
	appendVia(h, p.via)
	if r.Method != http.MethodHead && bodyAllowed(resp.StatusCode) {
		h.Set("Content-Length", strconv.Itoa(len(body)))
	}
	w.WriteHeader(resp.StatusCode)
	w.Write(body)
}

// tunnel handles CONNECT.
func (p *Proxy) tunnel(w http.ResponseWriter, r *http.Request, target string, mode ProxyMode) {
	end := p.begin(target)
	if !p.slowDelay(r.Context(), mode) {
		end()
		abort()
	}
	up, err := p.dial(r.Context(), "tcp", target)
	end()
	if err != nil {
		http.Error(w, "proxyswitchtest proxy: dial: "+err.Error(), http.StatusBadGateway)
		return
	}
	if !p.track(up) { // closed or dead meanwhile
		abort()
	}
	defer p.untrack(up)
	defer up.Close()

	client, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		http.Error(w, "proxyswitchtest proxy: hijack: "+err.Error(), http.StatusInternalServerError)
		return
	}
	defer p.open.Add(-1) // hijacked: the server reports no StateClosed
	defer p.untrack(client)
	defer client.Close()
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection Established\r\n\r\n"); err != nil {
		return
	}
	// Bytes the client sent after the CONNECT header may already be buffered.
	if n := brw.Reader.Buffered(); n > 0 {
		buf, _ := brw.Reader.Peek(n)
		if _, err := up.Write(buf); err != nil {
			return
		}
	}

	errc := make(chan error, 2)
	go func() { _, err := io.Copy(up, client); errc <- err }()
	go func() { _, err := io.Copy(client, up); errc <- err }()
	select {
	case <-errc:
	case <-p.done:
	}
	// Closing both ends unblocks the other copier.
	client.Close()
	up.Close()
	<-errc
}

// abort drops the client connection without writing a response (the
// server's implicit 200 for a handler that returns silently must not happen).
func abort() { panic(http.ErrAbortHandler) }

// dial connects to a loopback target from the proxy's source IP.
func (p *Proxy) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if !allowedHost(host) {
		return nil, fmt.Errorf("%w: %s", errNotLoopback, addr)
	}
	d := p.dialer4
	if ip := net.ParseIP(host); ip != nil && ip.To4() == nil {
		d = p.dialer6
	}
	// With an IPv4 LocalAddr the dialer only tries IPv4 addresses of
	// "localhost".
	return d.DialContext(ctx, "tcp", addr)
}

// loopbackOnly is a net.Dialer Control hook re-checking the resolved address.
func loopbackOnly(network, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%w: %s", errNotLoopback, address)
	}
	return nil
}

// allowedHost reports whether host (without port) is a loopback IP literal
// or "localhost". Other names are never resolved.
func allowedHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	if i := strings.IndexByte(host, '%'); i >= 0 { // IPv6 zone
		host = host[:i]
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// targetOf returns the canonical lower-case "host:port" of a proxy request.
func targetOf(r *http.Request) (string, error) {
	if r.Method == http.MethodConnect {
		host, port, err := net.SplitHostPort(r.Host)
		if err != nil || host == "" || port == "" {
			return "", fmt.Errorf("proxyswitchtest proxy: bad CONNECT target %q", r.Host)
		}
		return net.JoinHostPort(strings.ToLower(host), port), nil
	}
	u := r.URL
	if u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return "", fmt.Errorf("proxyswitchtest proxy: not a proxy request (need absolute http URL): %q", r.RequestURI)
	}
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	return net.JoinHostPort(strings.ToLower(u.Hostname()), port), nil
}

// hopHeaders are removed when forwarding (RFC 9110 section 7.6.1, plus the
// proxy-specific ones that must never reach the target or the client).
var hopHeaders = []string{
	"Connection",
	"Proxy-Connection",
	"Keep-Alive",
	"Proxy-Authenticate",
	"Proxy-Authorization",
	"Te",
	"Trailer",
	"Transfer-Encoding",
	"Upgrade",
}

func removeHopHeaders(h http.Header) {
	for _, v := range h["Connection"] {
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
}

func appendVia(h http.Header, via string) {
	if prior := h.Get("Via"); prior != "" {
		via = prior + ", " + via
	}
	h.Set("Via", via)
}

func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}
