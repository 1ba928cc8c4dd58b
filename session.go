package proxyswitch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/ban"
)

// Sticky sessions: one task, one IP, its own cookies.
//
// A task is a flow of requests that must look like one visitor: catalog,
// product card, cart, next page. Its requests name the task in their
// colly.Context (TaskKey); requests made from a response with
// Request.Visit, Post or a queue inherit the context, hence the task.
//
// The bridge. The ProxyFunc sees only the *http.Request net/http hands the
// transport, never Colly's context. The OnRequestHeaders hook Attach
// installs does see it: it reads the task (WithTaskFunc) and stores it in
// the request's binding (binding.go), which the transport and the ProxyFunc
// find by the request's header map.
//
// The session. The task's first request leases a proxy with lease.lua (the
// one place that picks a free proxy) under the owner token "s:<session ID>"
// and the session TTL, and session_bind.lua records the lease in the task's
// session record, {prefix:pool}:session:<task>. Any worker of the pool can
// then continue the session: session_use.lua checks the record and its
// leases, renews every lease and the record to now + TTL, counts the
// request and returns the proxy and the session's cookies, in one round
// trip. While the session lives, its proxy's slots on each site it visited
// stay out of rotation for everyone else (with Rotation.Concurrency above 1, all
// of them: one live session per IP per site); concurrent requests of the
// task share the IP. A session nobody uses lapses after its TTL: the record
// expires and the slots' scores pass, with no reaper. A request of the task
// to another site leases the same proxy there (lease.lua's preferred proxy,
// nothing else) and waits for it like any lease.
//
// Requests of a task at once. Several requests of one task may find no
// session (or none on their site) at the same moment. In one process they
// coalesce (sessionFlights): one starts (or extends) the session, the others
// wait for it, then use it. Across processes, a request waiting for a proxy
// to start the session (or for the session's proxy on a new site) looks at
// the task's record at each round of its wait (session_use.lua's "join") and
// joins the session a sibling request started, rather than wait out MaxWait
// for a proxy of its own; a slot held by the session's own lease, which a
// sibling is binding, is waited for, never taken for another session's.
//
// Cookies. http.CookieJar sees only URLs, so the collector's jar cannot
// tell tasks apart. For a request of a task the transport sets the Cookie
// header itself (the cookies the request carried before the collector's jar
// added its own, then the session's), and takes every Set-Cookie out of the
// response into the session's jar in Redis ({prefix:pool}:sjar:<session
// ID>), before net/http hands the response to the collector's jar: session
// cookies never reach the collector's jar or a storage backend, and the
// collector's never reach a session.
//
// Retirement. A ban or a proxy failure met through a session's proxy
// quarantines the proxy as for any request (ban.go), then ends the session:
// its proxy comes back a lease TTL later, or up to a lease TTL after the
// requests of the task still under way through it are over, whichever is
// later (the server running such a request keeps the proxy out:
// sessionrenew.go), its jar is deleted and its record
// becomes a tombstone saying why. The request's retry, or the task's next request on
// any worker, starts a new session with another proxy and an empty jar.
// Limits (Sessions.MaxRequests, Sessions.MaxAge), a proxy removed from
// the pool or marked dead, and a lease lost while the session lived retire
// it the same way at its next use. Sessions.Retired reports each
// retirement once, on the worker that made it; SessionOf shows the task's
// session and what ended the one before.
//
// Labels. A request of a task that asks for labels (UseLabels on the
// collector's Context) starts the task's session only on a proxy that
// carries them, and continues a live session only while its proxy does: a
// session whose proxy lost them (a Replace changed its labels; seen within
// the 2 seconds the Switch trusts its copy of the labels) is retired with
// SessionLabels, and the request starts a new one on a matching proxy.

// TaskKey is the colly.Context key naming a request's task: a string of 1
// to 256 bytes of printable UTF-8 (unicode.IsPrint: no control, format or
// invisible characters, no space but ASCII's). Requests whose context has
// no TaskKey lease a proxy each. Any other value (an empty string, an int,
// a []byte) fails the request with ErrInvalidTask (wrapped in ErrNoProxy)
// rather than send it through any proxy with the collector's cookies. A
// task's requests share its session's proxy, also those in flight at once:
// send them one after another where a site must not see two at once from
// one IP.
const TaskKey = "proxyswitch.task"

// SessionKey is the colly.Context key where each request of a task leaves
// its *SessionInfo (SessionOf).
const SessionKey = "proxyswitch.session"

// Reasons a session is retired for, besides verdict reasons ("http_403"...).
const (
	SessionMaxRequests  = "max_requests"  // it served Sessions.MaxRequests requests
	SessionMaxAge       = "max_age"       // it grew older than Sessions.MaxAge
	SessionProxyRemoved = "proxy_removed" // its proxy left the pool
	SessionProxyDead    = "proxy_dead"    // its proxy was marked dead or drained
	SessionQuarantined  = "quarantined"   // its proxy was banned on one of its sites by someone else
	SessionLeaseLost    = "lease_lost"    // one of its leases was lost
	SessionLabels       = "labels"        // its proxy lacks the labels a request asks for (UseLabels)
	SessionEnded        = "ended"         // EndSession ended it
)

const (
	// DefaultSessionTTL is how long a session lives after its last use.
	DefaultSessionTTL = 10 * time.Minute
	maxTaskLen        = 256
	// maxSessionSites bounds the sites (scopes) one session holds its proxy on.
	maxSessionSites = 16
	// maxSessionRounds bounds the rounds one request spends on a session
	// that other requests keep changing (a race to start one, a retirement).
	maxSessionRounds = 8
)

// NewTaskContext returns a new colly.Context whose requests, and those made
// from their responses, belong to task.
func NewTaskContext(task string) *colly.Context {
	ctx := colly.NewContext()
	ctx.Put(TaskKey, task)
	return ctx
}

// taskOfCtx returns the task ctx names, or "" for none (ctx nil, or no
// TaskKey in it). A TaskKey value that is not a non-empty string is an
// error wrapping ErrInvalidTask: a request meant to be sticky must not go
// out as one of no task.
func taskOfCtx(ctx *colly.Context) (string, error) {
	if ctx == nil {
		return "", nil
	}
	switch v := ctx.GetAny(TaskKey).(type) {
	case nil:
		return "", nil
	case string:
		if v == "" {
			return "", fmt.Errorf("%w: TaskKey holds an empty task ID (leave TaskKey out of the context for no task)", ErrInvalidTask)
		}
		return v, nil
	default:
		return "", fmt.Errorf("%w: TaskKey holds a value of type %T, not a string", ErrInvalidTask, v)
	}
}

// SessionOf returns the session the latest request of ctx's task in this
// process went out with, or nil. Read it in OnResponse or OnError.
func SessionOf(ctx *colly.Context) *SessionInfo {
	if ctx == nil {
		return nil
	}
	info, _ := ctx.GetAny(SessionKey).(*SessionInfo)
	return info
}

// SessionInfo describes a task's session at one request: a snapshot value.
type SessionInfo struct {
	Task       string
	ID         string // random, new for each session of the task
	Generation int    // the task's sessions in a row: 1 for its first, 2 after one retirement...
	Pool       string // the pool the session leases from (Sessions.Pool)
	Proxy      string // the session's proxy, user info masked
	ProxyID    string // its ID (Proxy.ID): what Switch.Ban, Drain... take
	Requests   int    // requests sent through the session so far, this one included
	Started    time.Time
	Expires    time.Time // when it lapses unless used again (Redis clock)
	// Previous tells why the task's previous session was retired or
	// ended, if it was within a TTL; nil otherwise.
	Previous *SessionRetirement
}

// SessionRetirement tells how a session ended.
type SessionRetirement struct {
	Task     string
	ID       string // the session that ended
	Proxy    string // its proxy, user info masked (its ID if it left the pool)
	ProxyID  string // its proxy's ID (Proxy.ID)
	Reason   string // a verdict's reason ("http_403"...) or one of the Session... reasons
	Site     string // the site where the reason showed; "" for limits and EndSession
	Requests int    // requests it served
	Started  time.Time
	At       time.Time // Redis clock
}

// sessionConfig holds the session options.
type sessionConfig struct {
	ttl         time.Duration
	maxRequests int
	maxAge      time.Duration
	pool        string // Sessions.Pool; "" for the Switch's own pool
	retired     func(SessionRetirement)
	taskFunc    func(*colly.Request) string // nil: TaskKey in the request's context (taskOfCtx)

	maxErrors, errorDecay float64 // Sessions.MaxErrorScore, ErrorDecay (sessionscore.go)
}

// Sessions configures the sticky sessions of tasks (TaskKey), which need
// Attach and Redis: with Redis unreachable, or under WithSharding, a request
// of a task fails with ErrNoProxy rather than leave from another IP. A zero
// field keeps the default; Off sets a numeric field to zero.
type Sessions struct {
	// TTL is how long a session lives after its last request, its proxy
	// serving no one else on its sites; within the idle TTL. While one of
	// its requests runs the session is renewed (every quarter of the TTL
	// or of the lease TTL, whichever is shorter), so a request longer than
	// the TTL keeps the proxy to its session. The default is 10 minutes.
	TTL time.Duration

	// MaxRequests retires a session once it has sent that many requests
	// (redirect hops count). The default is 0: no limit.
	MaxRequests int

	// MaxAge retires a session once it is older than that. The default is
	// 0: no limit.
	MaxAge time.Duration

	// Pool makes sessions lease from another pool (routes apply to
	// requests of no task only). The default is the Switch's own pool.
	Pool string

	// Retired is told once of every session retired (not lapsed or ended),
	// on a request goroutine: it must be fast. The default is none.
	Retired func(SessionRetirement)

	// MaxErrorScore and ErrorDecay: each soft refusal (429, 503) adds 1 to
	// a session's error score, each healthy request takes ErrorDecay off,
	// and reaching MaxErrorScore retires it. The defaults are 3 and 0.5.
	MaxErrorScore, ErrorDecay float64
}

// WithSessions configures the sticky sessions of tasks (Sessions). Zero
// fields keep their values.
func WithSessions(ss Sessions) Option {
	return func(c *config) {
		sc := &c.session
		setField(&sc.ttl, ss.TTL)
		setField(&sc.maxRequests, ss.MaxRequests)
		setField(&sc.maxAge, ss.MaxAge)
		if ss.Pool != "" {
			sc.pool = ss.Pool
		}
		if ss.Retired != nil {
			sc.retired = ss.Retired
		}
		setField(&sc.maxErrors, ss.MaxErrorScore)
		setField(&sc.errorDecay, ss.ErrorDecay)
	}
}

// WithTaskFunc sets how a request names its task ("" for none), in Attach's
// hook. It must be fast. The default reads TaskKey from the request's
// context.
func WithTaskFunc(f func(*colly.Request) string) Option {
	return func(c *config) { c.session.taskFunc = f }
}

func (sc *sessionConfig) validate(c *config) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrConfig}, a...)...)
	}
	if sc.ttl == 0 {
		sc.ttl = min(DefaultSessionTTL, c.idleTTL)
	}
	if err := sc.validateErrorScore(); err != nil {
		return err
	}
	switch {
	case sc.ttl < 100*time.Millisecond || sc.ttl > c.idleTTL:
		return bad("Sessions.TTL %v outside 100ms..the idle TTL (%v)", sc.ttl, c.idleTTL)
	case sc.maxRequests < 0:
		return bad("Sessions.MaxRequests %d is negative (Off for no limit)", sc.maxRequests)
	case sc.maxAge < 0:
		return bad("Sessions.MaxAge %v is negative (Off for no limit)", sc.maxAge)
	}
	if sc.pool != "" {
		if _, err := newKeyspace(c.prefix, sc.pool); err != nil {
			return fmt.Errorf("session pool: %w", err)
		}
	}
	return nil
}

// sessions is the Switch's session state: the backend sessions lease from.
type sessions struct {
	once sync.Once
	be   backend
	err  error
}

// sessionBackend returns the backend sessions lease from: the Switch's own
// pool, or the one Sessions.Pool names (made on first use).
func (s *Switch) sessionBackend() (backend, error) {
	s.sess.once.Do(func() {
		name := s.cfg.session.pool
		if name == "" {
			name = s.cfg.pool
		}
		s.sess.be, s.sess.err = s.backendFor(name)
	})
	return s.sess.be, s.sess.err
}

// sessionPool returns the Redis pool sessions live in.
func (s *Switch) sessionPool() (*redisPool, error) {
	be, err := s.sessionBackend()
	if err != nil {
		return nil, err
	}
	return be.redis(), nil
}

// Session returns the live session of task, or nil, changing nothing. It is
// safe for concurrent use.
func (s *Switch) Session(ctx context.Context, task string) (*SessionInfo, error) {
	rep, err := s.peekSession(ctx, task)
	if rep == nil {
		return nil, err
	}
	return rep.info, nil
}

// peekSession reads the live session of task, changing nothing: nil (and
// no error) when there is none.
func (s *Switch) peekSession(ctx context.Context, task string) (*useReply, error) {
	if err := checkTask(task); err != nil {
		return nil, err
	}
	ss, err := s.sessionPool()
	if err != nil {
		return nil, err
	}
	rep, err := ss.runUse(ctx, task, globalSite, "peek")
	if err != nil || rep.status != useLive {
		return nil, err
	}
	return rep, nil
}

// SessionCookies returns the cookies the live session of task would send to
// u (they never reach Colly's jar), or none without a live session. It is
// safe for concurrent use.
func (s *Switch) SessionCookies(ctx context.Context, task string, u *url.URL) ([]*http.Cookie, error) {
	if err := checkTask(task); err != nil {
		return nil, err // before the URL, as always
	}
	if u == nil {
		return nil, fmt.Errorf("%w: nil URL", ErrConfig)
	}
	rep, err := s.peekSession(ctx, task)
	if rep == nil {
		return nil, err
	}
	return cookiesFor(rep.jar, u, time.Now()), nil
}

// LiveSessions counts the live sessions of the Switch's session pool on every
// server. It is one round trip and safe for concurrent use.
func (s *Switch) LiveSessions(ctx context.Context) (int, error) {
	ss, err := s.sessionPool()
	if err != nil {
		return 0, err
	}
	n, err := roundTrip(ctx, ss.cfg.redisTimeout, func(ctx context.Context) (int64, error) {
		return sessionCountScript.Run(ctx, ss.rdb, []string{ss.keys.liveSessions()}).Int64()
	}, nil)
	if err != nil {
		return 0, redisErr("live sessions", err)
	}
	return int(n), nil
}

// sessionsHint is what a wait for a proxy of pool that ran out adds to its
// error when live sticky sessions of pool hold proxies (until they lapse, or
// EndSession ends them): "" when none do, or when they could not be counted
// within a short bound (the error goes out anyway).
func (s *Switch) sessionsHint(ctx context.Context, pool string) string {
	sb, err := s.sessionBackend()
	if err != nil {
		return ""
	}
	ss, err := sb.broker() // not while a fallback leases from its local shard
	if err != nil || ss == nil || ss.name != pool {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, min(s.cfg.redisTimeout, 250*time.Millisecond))
	defer cancel()
	n, err := sessionCountScript.Run(ctx, ss.rdb, []string{ss.keys.liveSessions()}).Int64()
	switch {
	case err != nil || n <= 0:
		return ""
	case n == 1:
		return "; 1 live sticky session holds its proxy until it lapses (Sessions.TTL after its last request) or EndSession ends it"
	}
	return fmt.Sprintf("; %d live sticky sessions hold their proxies until they lapse (Sessions.TTL after their last request) or EndSession ends them", n)
}

// EndSession ends the live session of task (its proxy is freed, its cookies
// deleted) and reports whether there was one. A request of the session
// still under way keeps the proxy until it ends; one another Switch sent
// in the last two renewal ticks (a quarter of the shorter of Sessions.TTL
// and the lease TTL each: 15s by default) may still be, so the proxy frees
// once that passed. It also deletes a corrupt session record. It is safe
// for concurrent use.
func (s *Switch) EndSession(ctx context.Context, task string) (bool, error) {
	if err := checkTask(task); err != nil {
		return false, err
	}
	ss, err := s.sessionPool()
	if err != nil {
		return false, err
	}
	_, ended, err := ss.endSession(ctx, task, "", SessionEnded, "", true)
	return ended, err
}

// checkTask validates a task ID: 1 to 256 bytes of printable UTF-8
// (unicode.IsPrint).
func checkTask(task string) error {
	switch {
	case task == "":
		return fmt.Errorf("%w: empty task ID", ErrInvalidTask)
	case len(task) > maxTaskLen:
		return fmt.Errorf("%w: task ID of %d bytes (at most %d)", ErrInvalidTask, len(task), maxTaskLen)
	case !utf8.ValidString(task):
		return fmt.Errorf("%w: task ID is not valid UTF-8", ErrInvalidTask)
	case strings.ContainsFunc(task, func(r rune) bool { return !unicode.IsPrint(r) }):
		return fmt.Errorf("%w: task ID %q contains characters that are not printable (control, format or invisible ones, or a space other than ASCII's)", ErrInvalidTask, task)
	}
	return nil
}

// taskState is what the OnRequestHeaders hook learnt about a request of a
// task; the binding (binding.go) carries it to the transport.
type taskState struct {
	task    string
	err     error          // the task ID is invalid: the request fails with it
	ctx     *colly.Context // where the request leaves its SessionInfo
	cookies string         // the Cookie header before the collector's jar added to it
}

// taskState returns the task of the request b binds, nil for none.
func (b *binding) taskState() *taskState {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.task
}

// sessionRequestHeaders is the hook that bridges Colly's context to the
// transport: it runs after onRequestHeaders registered the request's
// binding, and records the request's task in it.
func (s *Switch) sessionRequestHeaders(r *colly.Request) {
	if r.IsAbort() || r.Headers == nil {
		return
	}
	task, err := s.taskOf(r)
	if task == "" && err == nil {
		return
	}
	b := s.reg.lookup(*r.Headers)
	if b == nil {
		return
	}
	if err == nil {
		err = checkTask(task)
	}
	ts := &taskState{task: task, err: err, ctx: r.Ctx, cookies: strings.Join(r.Headers.Values("Cookie"), "; ")}
	b.mu.Lock()
	b.task = ts
	b.mu.Unlock()
}

// taskOf runs the task function, turning a panic into an error.
func (s *Switch) taskOf(r *colly.Request) (task string, err error) {
	defer func() {
		if p := recover(); p != nil {
			task, err = "", fmt.Errorf("%w: the task function panicked: %v", ErrInvalidTask, p)
		}
	}()
	if s.cfg.session.taskFunc == nil {
		return taskOfCtx(r.Ctx)
	}
	return s.cfg.session.taskFunc(r), nil
}

// sessionProxy is the ProxyFunc for a request of a task: the proxy of the
// session lease the transport installed for this hop.
func (s *Switch) sessionProxy(b *binding, site string) (*url.URL, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		return nil, fmt.Errorf("%w: request already finished", ErrNoProxy)
	}
	l := b.lease
	if l == nil || !l.sticky() || l.scope != s.scopeOf(site) {
		return nil, fmt.Errorf("%w: a request of task %q reached the proxy function without its session: "+
			"sessions need the transport Attach installs (c.WithTransport or c.SetProxyFunc after Attach replace it)", ErrNoProxy, b.task.task)
	}
	b.calls++
	return l.proxy.URL(), nil
}

// sticky reports whether l is a session's lease: released only with its
// session, never by the request that used it.
func (l *Lease) sticky() bool { return strings.HasPrefix(l.token, sessionTokenPrefix) }

// sessionUse is one attempt of a request through its task's session.
type sessionUse struct {
	sw   *redisPool // the pool the session leases from
	task string
	id   string
	url  *url.URL // the hop's URL: the default domain and path of its cookies
}

// waitEnded is the error of a wait for a session proxy (begun at start)
// that failed with err: when its context ended while one of its Redis
// calls ran (a slow Redis, a loaded machine), what the wait met (a paused
// site) or that it gave up, as when the context ends between calls,
// rather than the call's context error as a Redis error; else err.
func waitEnded(s *Switch, ctx context.Context, site string, start time.Time, err error) error {
	if ctx.Err() == nil || !errors.Is(err, ErrRedis) {
		return err
	}
	if perr := s.brk.pausedErr(site, start, time.Now()); perr != nil {
		return withCause(perr, ctx.Err())
	}
	return withCause(fmt.Errorf("%w: gave up waiting for a session proxy on site %s", ErrNoProxy, site), ctx.Err())
}

// sessionAttempt prepares one attempt of a request of a task (a no-op for
// other requests): it takes or continues the task's session for the hop's
// site, installs the session's lease in the binding (the ProxyFunc returns
// its proxy), and gives the attempt a header map of its own whose Cookie
// header holds the request's own cookies and the session's.
func (s *Switch) sessionAttempt(req *http.Request, a *attempt) (*sessionUse, error) {
	b := s.reg.lookup(req.Header)
	if b == nil && req.Response != nil && req.Response.Request != nil {
		// A redirect hop: it joins its chain, as in ProxyFunc.
		if prev := s.reg.lookup(req.Response.Request.Header); prev.taskState() != nil && s.reg.add(req.Header, prev) {
			b = prev
		}
	}
	ts := b.taskState()
	if ts == nil || !b.hooked {
		return nil, nil
	}
	if ts.err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoProxy, ts.err)
	}
	site := s.cfg.siteFunc(req.URL)
	if site == "" {
		return nil, nil // the ProxyFunc fails the request
	}
	sb, err := s.sessionBackend()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoProxy, err)
	}
	// The wait for the session's proxy ends before the request's deadline,
	// as leaseEarly's does: its ErrNoProxy survives net/http's Client.Timeout.
	ctx, cancel := leaseContext(req.Context())
	defer cancel()
	ss, err := waitBroker(ctx, sb, s.cfg.maxWait) // a Switch resuming after an outage: wait, as plain requests do
	if err != nil {
		return nil, err
	}
	s.warnRouteIgnored(req.Context(), site)
	var want []string // the labels the request asks for (UseLabels): its session's proxy carries them
	if sel := selectorOf(req.Context()); sel != nil {
		if sel.err != nil {
			return nil, fmt.Errorf("%w: %w", ErrNoProxy, sel.err)
		}
		want = sel.want
	}
	start := time.Now()
	cur, err := ss.useSessionLabelled(ctx, ts.task, site, want)
	if err != nil {
		return nil, waitEnded(s, ctx, site, start, err)
	}
	identity, err := s.cfg.client.identity(cur.info.ID)
	if err != nil {
		return nil, err
	}
	cur.lease.be = sb // its quarantine goes where its pool's do
	k := sessionHoldKey{p: ss, task: ts.task, id: cur.info.ID}
	slot := heldSlot{scope: cur.lease.scope, member: cur.lease.member}
	var ended func()
	b.mu.Lock()
	prev := b.lease
	b.lease, b.proxy = cur.lease, cur.lease.proxy
	b.touched.Store(time.Now().UnixNano()) // the hop goes now, after the wait for its session
	if !b.done && (b.sessEnd == nil || b.sessKey != k || b.sessSlot != slot || prev != cur.lease) {
		// The session is renewed while the request runs (sessionrenew.go);
		// a retry through a new session, or a hop to another site, moves
		// the renewal to it, and each attempt's lease is the one failed if
		// the session's end loses the slot (afterlifeLost).
		ended = b.takeSessionHold()
		b.sessKey, b.sessSlot, b.sessEnd = k, slot, s.holdSession(k, slot, cur.lease)
	}
	b.mu.Unlock()
	if ended != nil {
		ended()
	}

	h := req.Header.Clone()
	applyIdentity(h, identity) // the session's client identity (WithClient, client.go)
	h.Del("Cookie")
	own := ts.cookies
	if from, to := strings.ToLower(chainOrigin(req).URL.Hostname()), strings.ToLower(req.URL.Hostname()); to != from && !strings.HasSuffix(to, "."+from) {
		own = "" // a redirect to another domain: net/http would not forward them either
	}
	if c := cookieHeader(own, cookiesFor(cur.jar, req.URL, time.Now())); c != "" {
		h.Set("Cookie", c)
	}
	if a.req == req {
		a.req = req.WithContext(req.Context()) // a shallow copy: Colly's map stays as it was
	}
	a.req.Header = h
	s.reg.add(h, b)
	if ts.ctx != nil {
		ts.ctx.Put(SessionKey, cur.info)
	}
	return &sessionUse{sw: ss, task: ts.task, id: cur.info.ID, url: req.URL}, nil
}

// finish stores the cookies the site set in the session's jar and takes
// them out of the response, so that the collector's jar never sees them. A
// failure to store them fails the request: the session would go on without
// a cookie the site expects.
func (u *sessionUse) finish(resp *http.Response, err error) (*http.Response, error) {
	if u == nil || resp == nil {
		return resp, err
	}
	lines := resp.Header.Values("Set-Cookie")
	if len(lines) == 0 {
		return resp, err
	}
	resp.Header.Del("Set-Cookie")
	if serr := u.sw.storeCookies(context.Background(), u, lines, time.Now()); serr != nil {
		closeBody(resp)
		return nil, serr
	}
	return resp, err
}

// penalizeLease quarantines l's proxy after a Ban or ProxyFailure verdict,
// as Switch.penalize does, and retires the session l belongs to, if any.
func (s *Switch) penalizeLease(ctx context.Context, b *binding, site string, l *Lease, v ban.Verdict) (penalty, error) {
	ts := b.taskState()
	if !l.sticky() || ts == nil {
		return s.penalize(ctx, site, l.proxy, l, v)
	}
	if s.keepSession(ctx, l, ts.task, v) {
		s.brk.refused(l, site)          // the site's circuit breaker still counts it (breaker.go)
		return penalty{kept: true}, nil // a soft refusal the session survives (sessionscore.go)
	}
	l.released.Store(false) // the quarantine ends the session's lease on its site (owner-checked)
	pen, err := s.penalize(ctx, site, l.proxy, l, v)
	l.released.Store(true)
	if _, _, rerr := l.be.redis().endSession(ctx, ts.task, strings.TrimPrefix(l.token, sessionTokenPrefix), v.Reason, site, true); rerr != nil {
		err = errors.Join(err, rerr)
	}
	return pen, err
}

// warnRouteIgnored tells the logger, once per Switch, that a request of a
// task goes to a site routed to other pools (WithRoute, UsePools) while no
// Sessions.Pool names the sessions' pool: sessions lease from the
// Switch's own pool, which may not be what the route meant (residential
// proxies for a shop, say).
func (s *Switch) warnRouteIgnored(ctx context.Context, site string) {
	if s.cfg.session.pool != "" || s.warnedRoute.Load() {
		return
	}
	r := s.routeFor(ctx, site)
	if r == nil || (len(r.pools) == 1 && r.pools[0] == s.cfg.pool) {
		return
	}
	if s.warnedRoute.CompareAndSwap(false, true) {
		s.cfg.logger.Warn("proxyswitch: requests of a task lease from the session pool, not from their route's pools; "+
			"name the sessions' pool with Sessions.Pool", "site", site, "route", r.pools, "session_pool", s.cfg.pool)
	}
}

// sessionEnded tells the observer of a session this process ended, and
// Sessions.Retired's function of a retirement (any reason but
// SessionEnded).
func (s *Switch) sessionEnded(pool string, r SessionRetirement) {
	s.observeSessionEnd(pool, r)
	if r.Reason != SessionEnded {
		s.reportRetired(r)
	}
}

// reportRetired hands a retirement to Sessions.Retired's function.
func (s *Switch) reportRetired(r SessionRetirement) {
	s.cfg.logger.Debug("proxyswitch: session retired", "task", r.Task, "session", r.ID, "proxy", r.Proxy,
		"reason", r.Reason, "site", r.Site, "requests", r.Requests)
	f := s.cfg.session.retired
	if f == nil {
		return
	}
	defer func() {
		if p := recover(); p != nil {
			s.cfg.logger.Warn("proxyswitch: the session retirement function panicked", "task", r.Task, "panic", fmt.Sprint(p))
		}
	}()
	f(r)
}
