package proxyswitch

import (
	"container/list"
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"net/textproto"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/proxyswitch/proxyswitch/ban"
)

// The client a request leaves through (WithClient).
//
// Without WithClient, Attach's transport sends every hop through one
// *http.Transport whose Proxy is the Switch's ProxyFunc, with keep-alives
// off, but for the connections to http proxies that carry http:// pages
// (transport.go: forwardable; Client.NoProxyReuse). With it, the transport
// leases the hop's proxy first (the same ProxyFunc), then sends the hop
// through a RoundTripper of that proxy's own: one per (proxy, site), and
// per session for a task's requests (so two sessions that meet on one
// proxy never share a connection), built by Client.New or cloned from the
// base transport, kept in the Switch's clientCache below and closed when
// the proxy leaves this Switch's hands.

// Client configures the client each request leaves through (WithClient).
// A zero field takes its default.
type Client struct {
	// New builds a new RoundTripper (uTLS, say) per (proxy, site, session)
	// that sends every request through proxy (credentials included). A
	// failure fails the request with ErrNoProxy. With KeepAlive it must have
	// CloseIdleConnections. The default clones the base transport.
	New func(proxy *url.URL) (http.RoundTripper, error)

	// KeepAlive reuses connections per (proxy, site, session), only for
	// requests holding that lease. It is off by default because an idle
	// connection outlives its lease.
	KeepAlive bool

	// NoProxyReuse opens a new connection to the proxy for every request,
	// as Colly's SetProxyFunc does. By default, without New and KeepAlive,
	// a request of Attach's hooks for an http:// page that net/http would
	// replay (GET, HEAD, OPTIONS, TRACE, or one with an Idempotency-Key)
	// through an http or https proxy reuses an idle connection to that
	// proxy: such a connection goes to the proxy, carries requests for any
	// site (net/http pools it per proxy, not per site) and holds no tunnel
	// to the site, so it may outlive the lease it was opened under. All
	// else opens a connection per request, closed after it: https:// pages
	// (their CONNECT tunnel is a connection to the site), SOCKS proxies
	// (likewise), a task's requests and requests net/http would not replay.
	// Set it for a proxy that ties its own connection to the site to the
	// client's (the site would see that one open, idle, while another
	// worker uses the IP), or for a rotating gateway added as one plain
	// entry, which would keep the exit IP of a reused connection (a
	// {session:N} template has a sticky exit per entry anyway: gateway.go).
	NoProxyReuse bool

	// MaxPerProxy and MaxTotal bound the connection pools kept per proxy
	// and in all (least recently used out); without New and KeepAlive, the
	// idle connections to http proxies kept per proxy and in all
	// (NoProxyReuse). Defaults 8 and 512.
	MaxPerProxy int
	MaxTotal    int
	// IdleTimeout closes a connection unused for this long. Default 30s.
	IdleTimeout time.Duration

	// Identities are header sets (User-Agent...) for sticky sessions: each
	// session's requests carry one, picked by its ID. Default none.
	Identities []http.Header
	// Identity, instead of Identities, returns a session's headers: the
	// same for the same ID on every worker. It must be fast.
	Identity func(session string) http.Header
}

// Defaults of Client.
const (
	defaultClientPerProxy = 8
	defaultClientTotal    = 512
	defaultClientIdle     = 30 * time.Second
)

// WithClient sets the client Attach's requests leave through (Client). The
// default is Client{}.
func WithClient(cl Client) Option { return func(c *config) { c.client = cl } }

// withDefaults fills cl's zero fields and checks the others.
func (cl Client) withDefaults() (Client, error) {
	switch {
	case cl.MaxPerProxy < 0:
		return cl, configErr("client pools per proxy %d is negative", cl.MaxPerProxy)
	case cl.MaxTotal < 0:
		return cl, configErr("client pools in all %d is negative", cl.MaxTotal)
	case cl.IdleTimeout < 0:
		return cl, configErr("client idle timeout %v is negative", cl.IdleTimeout)
	case cl.Identity != nil && len(cl.Identities) > 0:
		return cl, configErr("client: set Identities or Identity, not both")
	}
	for i, h := range cl.Identities {
		if len(h) == 0 {
			return cl, configErr("client identity #%d is empty", i+1)
		}
	}
	if cl.MaxPerProxy == 0 {
		cl.MaxPerProxy = defaultClientPerProxy
	}
	if cl.MaxTotal == 0 {
		cl.MaxTotal = defaultClientTotal
	}
	cl.MaxPerProxy = min(cl.MaxPerProxy, cl.MaxTotal)
	if cl.IdleTimeout == 0 {
		cl.IdleTimeout = defaultClientIdle
	}
	cl.Identities = slices.Clone(cl.Identities)
	return cl, nil
}

// perProxy reports whether requests go through clients of their proxy's own
// (a New function, or keep-alives): else through the one inner transport.
func (cl *Client) perProxy() bool { return cl.New != nil || cl.KeepAlive }

// identity returns the identity of session id, or nil.
func (cl *Client) identity(id string) (h http.Header, err error) {
	switch {
	case cl.Identity != nil:
		defer func() {
			if p := recover(); p != nil {
				h, err = nil, fmt.Errorf("%w: the client identity function panicked: %v", ErrNoProxy, p)
			}
		}()
		return cl.Identity(id), nil
	case len(cl.Identities) > 0:
		f := fnv.New64a()
		f.Write([]byte(id))
		return cl.Identities[f.Sum64()%uint64(len(cl.Identities))], nil
	}
	return nil, nil
}

// applyIdentity sets the headers of identity on h, replacing h's own of
// the same names.
func applyIdentity(h, identity http.Header) {
	for k, vs := range identity {
		if len(vs) > 0 {
			h[textproto.CanonicalMIMEHeaderKey(k)] = slices.Clone(vs)
		}
	}
}

// clientKey names one connection pool: a proxy, a site, and the session
// (its lease token) for a task's requests.
type clientKey struct{ proxy, site, session string }

type clientEntry struct {
	key  clientKey
	rt   http.RoundTripper
	used time.Time
	elem *list.Element
}

// clientCache is a Switch's RoundTrippers per (proxy, site, session),
// least recently used first out. Safe for concurrent use.
type clientCache struct {
	s  *Switch
	mu sync.Mutex
	m  map[clientKey]*clientEntry
	by map[string]map[clientKey]*clientEntry // proxy ID -> its pools
	// lru holds *clientEntry, most recently used in front.
	lru       list.List
	closed    bool
	lastSweep time.Time
}

// clientSweep is how often, at most, the cache looks for unused pools.
const clientSweep = time.Second

// get returns the RoundTripper for req's hop through the leased proxy p (u
// its URL) on site, building it on first use. session is the session's
// lease token, "" for a request of no task. Every error wraps ErrNoProxy:
// nothing was sent.
func (c *clientCache) get(req *http.Request, p *Proxy, u *url.URL, site, session string) (http.RoundTripper, error) {
	k := clientKey{proxy: p.id, site: site, session: session}
	now := time.Now()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, errClosed
	}
	if e := c.m[k]; e != nil {
		e.used = now
		c.lru.MoveToFront(e.elem)
		gone := c.evictLocked(now, k.proxy) // the sweep of unused pools, when due
		c.mu.Unlock()
		closeAll(gone)
		return e.rt, nil
	}
	c.mu.Unlock()

	rt, err := c.build(req, p, u)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		closeIdle(rt)
		return nil, errClosed
	}
	if e := c.m[k]; e != nil { // built by another request meanwhile
		e.used = now
		c.lru.MoveToFront(e.elem)
		c.mu.Unlock()
		closeIdle(rt)
		return e.rt, nil
	}
	e := &clientEntry{key: k, rt: rt, used: now}
	e.elem = c.lru.PushFront(e)
	if c.m == nil {
		c.m, c.by = make(map[clientKey]*clientEntry), make(map[string]map[clientKey]*clientEntry)
	}
	c.m[k] = e
	mine := c.by[k.proxy]
	if mine == nil {
		mine = make(map[clientKey]*clientEntry)
		c.by[k.proxy] = mine
	}
	mine[k] = e
	gone := c.evictLocked(now, k.proxy)
	c.mu.Unlock()
	closeAll(gone)
	return rt, nil
}

// evictLocked drops the pools beyond the bounds (proxy's first, then in
// all) and, at most every clientSweep, those unused for the idle timeout.
func (c *clientCache) evictLocked(now time.Time, proxy string) []*clientEntry {
	cl := &c.s.cfg.client
	var gone []*clientEntry
	for len(c.by[proxy]) > cl.MaxPerProxy {
		var oldest *clientEntry
		for _, e := range c.by[proxy] {
			if oldest == nil || e.used.Before(oldest.used) {
				oldest = e
			}
		}
		gone = append(gone, c.dropLocked(oldest))
	}
	for c.lru.Len() > cl.MaxTotal {
		gone = append(gone, c.dropLocked(c.lru.Back().Value.(*clientEntry)))
	}
	if now.Sub(c.lastSweep) >= clientSweep {
		c.lastSweep = now
		for c.lru.Len() > 0 {
			e := c.lru.Back().Value.(*clientEntry)
			if now.Sub(e.used) < cl.IdleTimeout {
				break
			}
			gone = append(gone, c.dropLocked(e))
		}
	}
	return gone
}

func (c *clientCache) dropLocked(e *clientEntry) *clientEntry {
	c.lru.Remove(e.elem)
	delete(c.m, e.key)
	if mine := c.by[e.key.proxy]; mine != nil {
		delete(mine, e.key)
		if len(mine) == 0 {
			delete(c.by, e.key.proxy)
		}
	}
	return e
}

// closeProxy closes the idle connections of proxy id's pools on site ("":
// every site) and forgets them: the next request through the proxy there
// connects anew.
func (c *clientCache) closeProxy(id, site string) {
	c.mu.Lock()
	var gone []*clientEntry
	for k, e := range c.by[id] {
		if site == "" || k.site == site {
			gone = append(gone, e)
		}
	}
	for _, e := range gone {
		c.dropLocked(e)
	}
	c.mu.Unlock()
	closeAll(gone)
}

// close closes every pool's idle connections; get fails from then on.
func (c *clientCache) close() {
	c.mu.Lock()
	c.closed = true
	var gone []*clientEntry
	for _, e := range c.m {
		gone = append(gone, e)
	}
	c.m, c.by = nil, nil
	c.lru.Init()
	c.mu.Unlock()
	closeAll(gone)
}

// size returns the number of pools kept.
func (c *clientCache) size() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

func closeAll(es []*clientEntry) {
	for _, e := range es {
		closeIdle(e.rt)
	}
}

// idleCloser is a RoundTripper that can close its idle connections, as
// *http.Transport and *http2.Transport can.
type idleCloser interface{ CloseIdleConnections() }

// closeIdle closes rt's idle connections, if it can say so.
func closeIdle(rt http.RoundTripper) {
	if ci, ok := rt.(idleCloser); ok {
		ci.CloseIdleConnections()
	}
}

// build makes the RoundTripper of proxy p (u its URL) for req's hop: New's,
// or a clone of the base transport.
func (c *clientCache) build(req *http.Request, p *Proxy, u *url.URL) (http.RoundTripper, error) {
	s := c.s
	cl := &s.cfg.client
	if cl.New == nil {
		t := s.baseTransport()
		t.Proxy = http.ProxyURL(u)
		t.DisableKeepAlives = !cl.KeepAlive
		t.MaxIdleConnsPerHost = s.cfg.slots
		t.IdleConnTimeout = cl.IdleTimeout
		tunnelFailures(t)
		return t, nil
	}
	rt, err := callNew(cl.New, p.URL())
	if err != nil {
		return nil, fmt.Errorf("%w: building the client of proxy %s: %w", ErrNoProxy, p, redactErr(err, p))
	}
	if rt == nil || isNilPointer(rt) {
		return nil, fmt.Errorf("%w: the client built for proxy %s is nil", ErrNoProxy, p)
	}
	if _, ok := rt.(idleCloser); !ok && cl.KeepAlive {
		// Its idle connections could not be closed on a quarantine or a lost
		// lease: a connection banned on a site would be reused there.
		return nil, fmt.Errorf("%w: %w: the client built for proxy %s (%T) has no CloseIdleConnections method: "+
			"with Client.KeepAlive its idle connections could not be closed on a ban", ErrNoProxy, ErrConfig, p, rt)
	}
	if t, ok := rt.(*http.Transport); ok {
		if err := checkTransport(t, req, u, p); err != nil {
			return nil, err
		}
		if !cl.KeepAlive {
			t.DisableKeepAlives = true
		}
		tunnelFailures(t)
	}
	return rt, nil
}

// callNew calls a Client.New function, turning a panic into an error.
func callNew(f func(*url.URL) (http.RoundTripper, error), u *url.URL) (rt http.RoundTripper, err error) {
	defer func() {
		if p := recover(); p != nil {
			rt, err = nil, fmt.Errorf("the client function panicked: %v", p)
		}
	}()
	return f(u)
}

// checkTransport refuses an *http.Transport built for proxy p that would
// not send req through it: its Proxy names another proxy, or it has none
// and no dialer of its own (it would connect directly).
func checkTransport(t *http.Transport, req *http.Request, u *url.URL, p *Proxy) error {
	if t.Proxy == nil {
		if t.DialContext == nil && t.DialTLSContext == nil && t.Dial == nil && t.DialTLS == nil { //nolint:staticcheck // a user's transport may set the old ones
			return fmt.Errorf("%w: the *http.Transport built for proxy %s has no Proxy and no dialer: it would connect directly", ErrNoProxy, p)
		}
		return nil // its own dialer: a SOCKS dialer, say
	}
	got, err := t.Proxy(req)
	if err != nil || got == nil || got.String() != u.String() {
		return fmt.Errorf("%w: the *http.Transport built for proxy %s sends through another proxy, or none", ErrNoProxy, p)
	}
	return nil
}

// tunnelFailures makes a CONNECT the proxy refuses a *ban.TunnelError (a
// proxy failure), after t's own hook.
func tunnelFailures(t *http.Transport) {
	userHook := t.OnProxyConnectResponse
	t.OnProxyConnectResponse = func(ctx context.Context, u *url.URL, req *http.Request, resp *http.Response) error {
		if userHook != nil {
			if err := userHook(ctx, u, req, resp); err != nil {
				return err
			}
		}
		if resp.StatusCode != http.StatusOK {
			return &ban.TunnelError{StatusCode: resp.StatusCode}
		}
		return nil
	}
}

// baseTransport returns a clone of the transport requests are built from:
// WithBaseTransport's, or http.DefaultTransport.
func (s *Switch) baseTransport() *http.Transport {
	if s.cfg.baseTransport != nil {
		return s.cfg.baseTransport.Clone()
	}
	if dt, ok := http.DefaultTransport.(*http.Transport); ok {
		return dt.Clone()
	}
	return &http.Transport{}
}

// sendPerProxy sends req's hop through a client of its proxy's own: it
// leases the proxy with the ProxyFunc, as net/http would, then picks the
// proxy's client for the hop's site (and session). Errors before the send
// wrap ErrNoProxy: nothing left.
func (t *transport) sendPerProxy(a *attempt) (*http.Response, error) {
	s, req := t.s, a.req
	u, err := s.ProxyFunc(req)
	if err != nil {
		return nil, err
	}
	if u == nil {
		return nil, fmt.Errorf("%w: no proxy for the request", ErrNoProxy)
	}
	var l *Lease
	if b := s.reg.lookup(req.Header); b != nil {
		l = b.currentLease()
	}
	var p *Proxy
	session := ""
	if l != nil && l.proxy.raw() == u.String() {
		p = l.proxy
		if l.sticky() {
			session = l.token
		}
	} else if p, err = s.proxyFor(u.String()); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoProxy, err)
	}
	rt, err := s.clients.get(req, p, u, s.cfg.siteFunc(req.URL), session)
	if err != nil {
		return nil, err
	}
	a.startTimer(s.cfg.attemptTimeout) // the proxy is leased: Timeouts.Attempt's bound starts
	_, a.traced = rt.(*http.Transport) // its GotConn tells a request that never left (transport.go: unsent)
	resp, err := rt.RoundTrip(req)
	if resp != nil && resp.Request != req {
		// The RoundTripper sent a copy (one that sets headers of its own
		// must, as a RoundTripper leaves its request unmodified): the
		// response names the request it was given, as net/http's does.
		// Colly and the hooks find the request's binding, and so its lease,
		// by that request's header map; a redirect's next hop finds its
		// chain by it.
		resp.Request = req
	}
	if _, ok := rt.(*http.Transport); ok || s.cfg.client.KeepAlive {
		return resp, err
	}
	// Keep-alives off, and a RoundTripper that may keep connections: its
	// idle ones close as each response ends.
	if resp == nil || resp.Body == nil {
		closeIdle(rt)
	} else {
		resp.Body = &closeIdleBody{ReadCloser: resp.Body, rt: rt}
	}
	return resp, err
}

// closeIdleBody is a response body that closes its RoundTripper's idle
// connections (its own among them) once closed.
type closeIdleBody struct {
	io.ReadCloser
	rt http.RoundTripper
}

func (b *closeIdleBody) Close() error {
	err := b.ReadCloser.Close()
	closeIdle(b.rt)
	return err
}
