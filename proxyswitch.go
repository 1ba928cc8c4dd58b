package proxyswitch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/redis/go-redis/v9"
)

// Every go-redis client kind fits: single node and Sentinel (*redis.Client),
// Cluster (*redis.ClusterClient), Ring.
var (
	_ redis.Scripter = (*redis.Client)(nil)
	_ redis.Scripter = (*redis.ClusterClient)(nil)
	_ redis.Scripter = (*redis.Ring)(nil)
	_ redis.Scripter = redis.UniversalClient(nil)
)

// Switch leases proxies from a Redis-backed pool to Colly requests. One
// Switch serves any number of collectors and goroutines: it is safe for
// concurrent use. It holds no connection of its own (close the Redis client
// when you are done). The leases of running requests are renewed while they
// run; call Close once the collectors are done, before the process exits.
type Switch struct {
	rdb  redis.Scripter
	cfg  config
	keys keyspace // the own pool's

	own   backend   // the pool of WithPool: Redis, behind the fallback when there is one
	pools sync.Map  // pool name -> backend: the other pools routes and sessions name
	fb    *fallback // WithFallback or WithSharding (fallback.go); nil without
	sess  sessions  // the backend sessions lease from (session.go)

	sessHolds sessionHolds // the sessions with requests under way, renewed while they run (sessionrenew.go)

	reg          registry
	bans         banCounters
	pageRuns     pageRuns // page verdicts in a row per site, for the storm guard (ban.go)
	parsed       sync.Map // proxy URL as stored -> *Proxy
	tokenPrefix  string
	tokenSeq     atomic.Uint64
	warnUnhooked sync.Once
	trOnce       sync.Once
	tr           *transport                     // the transport Attach installs (transport.go)
	forward      atomic.Pointer[http.Transport] // its forward transport, once built, for Close
	warnedRoute  atomic.Bool                    // warnRouteIgnored said it
	observer     atomic.Pointer[observerBox]    // SetObserver; nil: none
	renew        renewer                        // the live leases: renewed while their request runs, released by Close (renew.go)
	brk          breaker                        // the site circuit breaker's counts and states (breaker.go)
	clients      clientCache                    // the per-proxy clients of WithClient (client.go)
	waiters      waiters                        // the leases waiting for a busy site, woken by this Switch's releases (waiters.go)
	doubts       doubts                         // lease calls of unknown outcome, whose leases go back once Redis answers (reclaim.go)
}

// NewSwitch returns a Switch for the pool opts name ("default" under the
// prefix "proxyswitch"). rdb may be any go-redis client (single, Sentinel,
// Cluster, Ring). It does no I/O and fails with ErrConfig on a nil client or
// an invalid option.
func NewSwitch(rdb redis.Scripter, opts ...Option) (*Switch, error) {
	if rdb == nil || isNilPointer(rdb) {
		return nil, fmt.Errorf("%w: nil redis client", ErrConfig)
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	s := &Switch{rdb: rdb, cfg: cfg, tokenPrefix: hex.EncodeToString(b[:]) + "-"}
	s.renew.s, s.brk.s, s.clients.s, s.doubts.s = s, s, s, s
	if err := s.build(); err != nil {
		return nil, err
	}
	return s, nil
}

// build makes the Switch's backends from its config: its own pool in
// Redis, behind the fallback when there is one.
func (s *Switch) build() error {
	rp, err := newRedisPool(s, s.cfg.pool)
	if err != nil {
		return err
	}
	s.fb = newFallback(s)
	s.keys, s.own = rp.keys, s.fb.wrap(rp)
	return nil
}

// New returns a Colly proxy function backed by the pool in Redis:
//
//	c.SetProxyFunc(proxyswitch.New(rdb))
//
// It never lets two requests share an IP on one site, but a proxy stays
// taken until its request's context ends, and nothing is classified: prefer
// NewSwitch and Attach. Invalid options fail every request with ErrConfig.
func New(rdb redis.Scripter, opts ...Option) colly.ProxyFunc {
	s, err := NewSwitch(rdb, opts...)
	if err != nil {
		err = fmt.Errorf("%w: %w", ErrNoProxy, err)
		return func(*http.Request) (*url.URL, error) { return nil, err }
	}
	return s.ProxyFunc
}

// Attach installs the whole extension on c: the proxy function, ban
// detection with retries (Bans), sticky sessions, and hooks that release
// each lease as soon as its response is in, keep one proxy for a redirect
// chain and set Request.ProxyURL (masked). Call it before registering your
// own callbacks, on every collector and clone; a clone may be attached by
// another Switch (another pool) than its original, and each collector's
// requests keep to the Switch that attached it and its own MaxBodySize,
// though Colly's clones share one HTTP client. Calling c.WithTransport or
// c.SetProxyFunc afterwards turns ban detection off. Attach collectors
// before they crawl: Colly sets the transport of a client a clone shares
// without a lock. Colly fetches robots.txt past its hooks: through the
// transport of the last Attach on the client, with that Switch's pool. A
// request is sent again through another proxy only when
// that cannot make the site act on it twice (Bans.Retries): a POST goes
// again after a ban, or after a failure before it could reach the site,
// never after a timeout or a broken connection once it was written.
func (s *Switch) Attach(c *colly.Collector) {
	noteAttached(s)
	c.WithTransport(s.transport())
	c.OnRequestHeaders(func(r *colly.Request) { s.onRequestHeaders(r, c) })
	c.OnRequestHeaders(s.sessionRequestHeaders) // the task in r.Ctx, for sticky sessions (session.go)
	c.OnResponseHeaders(s.onResponseHeaders)
	c.OnResponse(func(r *colly.Response) { s.finish(r.Request) })
	c.OnError(func(r *colly.Response, err error) { s.finishAfter(r.Request, err) })
}

// ProxyFunc is the proxy function for every hop of every request: a leased
// proxy or an error wrapping ErrNoProxy, never (nil, nil). It is safe for
// concurrent use.
func (s *Switch) ProxyFunc(req *http.Request) (*url.URL, error) {
	if req == nil || req.URL == nil {
		return nil, fmt.Errorf("%w: request without URL", ErrNoProxy)
	}
	if s.renew.isClosed() {
		return nil, errClosed
	}
	site := s.cfg.siteFunc(req.URL)
	if site == "" {
		return nil, fmt.Errorf("%w: no site for URL host %q", ErrNoProxy, req.URL.Host)
	}
	s.sweep()
	b := s.reg.lookup(req.Header)
	if b == nil && req.Response != nil && req.Response.Request != nil {
		// A redirect hop of a hooked request: the new hop joins its chain.
		if prev := s.reg.lookup(req.Response.Request.Header); prev != nil && prev.hooked && s.reg.add(req.Header, prev) {
			b = prev
		}
	}
	if b == nil || !b.hooked {
		return s.unhookedProxy(req, site)
	}
	if b.taskState() != nil {
		return s.sessionProxy(b, site) // a request of a task: its session's proxy (session.go)
	}
	return s.hookedProxy(req, b, site)
}

// hookedProxy serves a request whose release the hooks take care of. A
// redirect chain keeps its lease while it stays on one site; a hop to another
// site leases there, preferring the same proxy, and releases the old lease.
func (s *Switch) hookedProxy(req *http.Request, b *binding, site string) (*url.URL, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		return nil, fmt.Errorf("%w: request already finished", ErrNoProxy)
	}
	b.calls++
	prefer := ""
	if old := b.lease; old != nil {
		if old.scope == s.scopeOf(site) {
			return old.proxy.URL(), nil
		}
		prefer = old.proxy.id
		b.lease = nil
		s.releaseQuietly(old)
	}
	l, err := s.acquireBy(req.Context(), site, prefer, true, b.waitBy)
	if err != nil {
		return nil, err
	}
	b.lease, b.proxy = l, l.proxy
	b.touched.Store(time.Now().UnixNano())
	return l.proxy.URL(), nil
}

// unhookedProxy serves a request that came without the hooks (the proxy
// function set alone, or a cloned collector). Its lease is released when the
// hop's context ends, which under Colly's default request timeout happens as
// soon as the response body is closed, and is renewed until then; a context
// that can never end (no deadline, no cancellation) leaves it unrenewed, to
// expire with its TTL.
func (s *Switch) unhookedProxy(req *http.Request, site string) (*url.URL, error) {
	if req.URL.Path != "/robots.txt" { // Colly fetches robots.txt past its hooks, attached or not
		s.warnUnhooked.Do(func() {
			s.cfg.logger.Warn("proxyswitch: requests arrive without the release hooks; call Switch.Attach(collector). " +
				"Leases are released when a request's context ends, or else expire after the lease TTL.")
		})
	}
	prefer := ""
	if req.Response != nil && req.Response.Request != nil {
		if prev := s.reg.lookup(req.Response.Request.Header); prev != nil {
			if p := prev.lastProxy(); p != nil {
				prefer = p.id
			}
		}
	}
	l, err := s.acquire(req.Context(), site, prefer, req.Context().Done() != nil)
	if err != nil {
		return nil, err
	}
	b := newBinding(false)
	b.lease, b.proxy = l, l.proxy
	registered := s.reg.add(req.Header, b)
	context.AfterFunc(req.Context(), func() {
		if registered {
			s.reg.drop(b)
		}
		s.endBinding(b)
	})
	return l.proxy.URL(), nil
}

// onRequestHeaders runs right before Colly hands the request to net/http. It
// gives the request a header map of its own and registers the binding the
// ProxyFunc will fill.
func (s *Switch) onRequestHeaders(r *colly.Request, c *colly.Collector) {
	if r.IsAbort() || r.Headers == nil {
		return
	}
	h := r.Headers.Clone()
	if h == nil {
		h = http.Header{}
	}
	*r.Headers = h
	b := newBinding(true)
	b.coll = c
	s.reg.add(h, b)
}

// onResponseHeaders fills Request.ProxyURL as early as Colly allows.
func (s *Switch) onResponseHeaders(r *colly.Response) {
	if r.Request == nil || r.Request.Headers == nil {
		return
	}
	if b := s.reg.lookup(*r.Request.Headers); b != nil {
		if p := b.lastProxy(); p != nil {
			r.Request.ProxyURL = p.String()
		}
	}
}

// finish ends a request's binding from OnResponse or OnError: its lease is
// released and Request.ProxyURL names the proxy (user info masked). Colly
// may report one request twice (an OnHTML error after OnResponse); the second
// call finds nothing to do.
func (s *Switch) finish(r *colly.Request) { s.finishAfter(r, nil) }

// abandonHold is how long a proxy stays out after a request that was given
// up while the proxy may still carry it (a timeout, a cancellation, an abort
// after the headers): the site may still be answering the abandoned request,
// and a new one from the same IP at that moment would look like two at once.
const abandonHold = 2 * time.Second

// finishAfter is finish for a request that ended with err.
func (s *Switch) finishAfter(r *colly.Request, err error) {
	if r == nil || r.Headers == nil {
		return
	}
	b := s.reg.take(*r.Headers)
	if b == nil {
		return
	}
	if abandoned(err) {
		b.mu.Lock()
		if b.lease != nil {
			b.lease.hold.Store(int64(abandonHold))
		}
		b.mu.Unlock()
	}
	if p := s.endBinding(b); p != nil {
		r.ProxyURL = p.String()
	}
}

// abandoned reports whether err means the request was given up while it may
// still be under way upstream.
func abandoned(err error) bool {
	if err == nil {
		return false
	}
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		errors.Is(err, colly.ErrAbortedAfterHeaders) || (errors.As(err, &ne) && ne.Timeout())
}

// endBinding marks b finished, releases its lease and returns its proxy.
func (s *Switch) endBinding(b *binding) *Proxy {
	b.mu.Lock()
	l, p := b.lease, b.proxy
	b.lease, b.done = nil, true
	held := b.takeSessionHold()
	b.mu.Unlock()
	if held != nil {
		held() // its session is renewed no more for it (sessionrenew.go)
	}
	if l != nil {
		s.releaseQuietly(l)
	}
	return p
}

// releaseQuietly releases l on a context of its own (the request's may be
// over) and logs a failure: the lease then expires by its TTL.
func (s *Switch) releaseQuietly(l *Lease) {
	err := l.Release(context.Background())
	switch {
	case err == nil:
	case errors.Is(err, ErrLeaseLost):
		// Another holder may have the proxy there now: its idle connections
		// of this Switch there close (client.go), as on a loss found while
		// the request ran (transport.go).
		site := l.scope
		if site == globalSite {
			site = ""
		}
		s.clients.closeProxy(l.proxy.id, site)
		if l.taken.Load() {
			return // the renewer or Close said so already
		}
		s.cfg.logger.Warn("proxyswitch: a request outlived its lease (not renewed in time: Redis unreachable or slow, "+
			"or the pool was cleared)", "proxy", l.proxy.String(), "site", l.scope)
	default:
		// Renewed no more: the lease expires by its TTL, as said (a lease
		// the renewer kept extending after a failed release would hold its
		// proxy for good).
		s.renew.drop(l)
		s.cfg.logger.Warn("proxyswitch: release failed; the lease will expire by its TTL",
			"proxy", l.proxy.String(), "site", l.scope, "err", err)
	}
}

// sweepInterval is how often, at most, sweep looks for stale bindings.
const sweepInterval = time.Second

// sweep forgets bindings no hook will finish (a Colly path that skips the
// callbacks) once they are older than any lease they could hold.
func (s *Switch) sweep() {
	maxAge := s.cfg.maxWait + s.cfg.maxLeaseTTL + time.Minute
	if stale := s.reg.sweep(time.Now(), sweepInterval, maxAge); len(stale) > 0 {
		go func() {
			for _, l := range stale {
				s.releaseQuietly(l)
			}
		}()
	}
}

func isNilPointer(v any) bool {
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return rv.IsNil()
	}
	return false
}
