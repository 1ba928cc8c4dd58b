package proxyswitch

import (
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/proxyswitch/proxyswitch/ban"
)

// Option configures a Switch; NewSwitch reports invalid values.
type Option func(*config)

// Scope says what a lease makes a proxy exclusive for.
type Scope int

const (
	// ScopeSite (the default): a proxy is exclusive per target site.
	ScopeSite Scope = iota
	// ScopeGlobal: a proxy serves one request at a time, whatever the site.
	ScopeGlobal
)

type config struct {
	prefix, pool string
	leaseTTL     time.Duration
	maxLeaseTTL  time.Duration // ten lease TTLs: with the max wait and a minute, the age at which sweep ends a binding
	maxWait      time.Duration
	cooldown     time.Duration
	redisTimeout time.Duration
	idleTTL      time.Duration
	scope        Scope
	slots        int
	siteFunc     func(*url.URL) string
	logger       *slog.Logger
	backoffMin   time.Duration
	backoffMax   time.Duration
	readLimit    int64 // bytes of a body classified when the collector sets no MaxBodySize

	// ban detection and quarantine (package ban, ban.go, transport.go)
	quarantine, maxQuarantine         time.Duration
	firstQuarantine                   time.Duration // Bans.EvidenceFirst; at most quarantine once validated
	pageProxies                       int           // Bans.EvidenceFirst: healthy proxies a page must refuse; 0 = never the page
	failQuarantine, maxFailQuarantine time.Duration
	banAllSites                       bool
	flakyDelay                        time.Duration // Rotation.FlakyDelay
	paceMax                           time.Duration // Rotation.LearnedPacing; 0: off
	deadAfter                         int
	retries                           int
	attemptTimeout                    time.Duration
	baseTransport                     *http.Transport
	client                            Client        // WithClient (client.go), defaults filled by validate
	banRules                          ban.Rules     // what the ban options set
	detector                          *ban.Detector // banRules, compiled by validate

	fallback fallbackConfig // WithFallback, WithSharding (fallback.go)
	member   memberConfig   // WithMembership (membership.go)
	session  sessionConfig  // WithSession... options (session.go)
	routes   routeConfig    // WithRoute, WithSpread (routing.go)
	breaker  Breaker        // WithBreaker (breaker.go), defaults filled by validate
}

func defaultConfig() config {
	return config{
		prefix:       "proxyswitch",
		pool:         "default",
		leaseTTL:     30 * time.Second,
		maxWait:      30 * time.Second,
		redisTimeout: 2 * time.Second,
		idleTTL:      24 * time.Hour,
		scope:        ScopeSite,
		slots:        1,
		siteFunc:     defaultSite,
		backoffMin:   5 * time.Millisecond,
		backoffMax:   250 * time.Millisecond,
		readLimit:    defaultReadLimit,

		quarantine:        30 * time.Minute,
		firstQuarantine:   time.Minute,
		pageProxies:       2,
		maxQuarantine:     12 * time.Hour,
		failQuarantine:    time.Minute,
		maxFailQuarantine: 30 * time.Minute,
		deadAfter:         5,
		flakyDelay:        defaultFlakyDelay,
		paceMax:           defaultPaceMax,
		retries:           2,
		banRules:          ban.DefaultRules(),

		member:  defaultMemberConfig(),
		session: sessionConfig{maxErrors: DefaultSessionMaxErrorScore, errorDecay: DefaultSessionErrorDecay},
	}
}

// newConfig applies opts (nil ones skipped) to the defaults and validates
// the result: what NewSwitch (and the tests' newLocalPoolWith) use.
func newConfig(opts []Option) (config, error) {
	cfg := defaultConfig()
	cfg.apply(opts)
	if err := cfg.validate(); err != nil {
		return config{}, err
	}
	return cfg, nil
}

// apply applies opts in order, skipping nil ones.
func (c *config) apply(opts []Option) {
	for _, o := range opts {
		if o != nil {
			o(c)
		}
	}
}

func (c *config) validate() error {
	switch {
	case c.leaseTTL < 100*time.Millisecond:
		return configErr("Timeouts.LeaseTTL %v is below 100ms", c.leaseTTL)
	case c.maxWait < 0:
		return configErr("Timeouts.MaxWait %v is negative (Off for no wait)", c.maxWait)
	case c.cooldown < 0:
		return configErr("Rotation.Cooldown %v is negative (Off for none)", c.cooldown)
	case c.redisTimeout <= 0:
		return configErr("Timeouts.Redis %v must be positive", c.redisTimeout)
	case c.idleTTL < time.Minute || c.idleTTL < 2*c.leaseTTL:
		return configErr("Timeouts.IdleTTL %v must be at least a minute and twice the lease TTL", c.idleTTL)
	case c.slots < 1 || c.slots > 1000:
		return configErr("Rotation.Concurrency %d per proxy per site is outside 1..1000", c.slots)
	case c.scope != ScopeSite && c.scope != ScopeGlobal:
		return configErr("unknown Rotation.Scope %d", c.scope)
	case c.siteFunc == nil:
		return configErr("nil site function")
	case c.flakyDelay < 0 || c.flakyDelay > maxLearned:
		return configErr("Rotation.FlakyDelay %v is outside 0..%v (Off for 0)", c.flakyDelay, maxLearned)
	case c.paceMax < 0 || c.paceMax > maxLearned:
		return configErr("Rotation.LearnedPacing %v is outside 0..%v (Off for 0)", c.paceMax, maxLearned)
	case c.quarantine <= 0 || c.maxQuarantine < c.quarantine:
		return configErr("Bans.Quarantine %v, QuarantineMax %v: want 0 < Quarantine <= QuarantineMax", c.quarantine, c.maxQuarantine)
	case c.firstQuarantine < 0:
		return configErr("Bans.EvidenceFirst %v is negative (Off for 0)", c.firstQuarantine)
	case c.pageProxies < 0 || c.pageProxies == 1 || c.pageProxies > 100:
		return configErr("Bans.PageProxies %d: want Off (never the page) or 2..100", c.pageProxies)
	case c.failQuarantine <= 0 || c.maxFailQuarantine < c.failQuarantine:
		return configErr("Bans.FailureQuarantine %v, FailureQuarantineMax %v: want 0 < FailureQuarantine <= FailureQuarantineMax", c.failQuarantine, c.maxFailQuarantine)
	case c.deadAfter < 0:
		return configErr("Bans.DeadAfter %d is negative (Off for never)", c.deadAfter)
	case c.retries < 0 || c.retries > 100:
		return configErr("Bans.Retries %d outside 0..100 (Off for 0)", c.retries)
	case c.attemptTimeout < 0:
		return configErr("Timeouts.Attempt %v is negative (Off for no bound)", c.attemptTimeout)
	}
	if err := c.member.validate(); err != nil {
		return err
	}
	if err := c.fallback.validate(); err != nil {
		return err
	}
	if err := c.session.validate(c); err != nil {
		return err
	}
	if err := c.routes.validate(c); err != nil {
		return err
	}
	b, err := c.breaker.withDefaults()
	if err != nil {
		return err
	}
	c.breaker = b
	cl, err := c.client.withDefaults()
	if err != nil {
		return err
	}
	c.client = cl
	d, err := ban.NewDetector(c.banRules)
	if err != nil {
		return configErr("%w", err)
	}
	c.detector = d
	if c.logger == nil {
		c.logger = slog.Default()
	}
	c.maxLeaseTTL = 10 * c.leaseTTL
	c.firstQuarantine = min(c.firstQuarantine, c.quarantine)
	return nil
}

// WithPrefix sets the first part of every Redis key (no braces or spaces),
// so several projects can share one Redis: distinct (prefix, pool) pairs
// never share a key. The default is "proxyswitch".
func WithPrefix(prefix string) Option { return func(c *config) { c.prefix = prefix } }

// WithPool names the pool to lease from. The default is "default".
func WithPool(name string) Option { return func(c *config) { c.pool = name } }

// WithSiteFunc sets how a request URL maps to the site a lease is exclusive
// for (to make "www.ozon.ru" and "api.ozon.ru" one site, say); it must be
// fast and must not panic. The default is the lower-cased host with its port.
func WithSiteFunc(f func(*url.URL) string) Option { return func(c *config) { c.siteFunc = f } }

// WithLogger sets where the Switch logs (never passwords). The default is
// slog.Default().
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// defaultSite is the default site function (WithSiteFunc).
func defaultSite(u *url.URL) string { return strings.ToLower(u.Host) }

// Ban detection, quarantine and retries. They act through the transport that
// Attach installs; a collector given only the proxy function (New) does not
// classify responses. Every option below is per Switch; the quarantine, dead
// and backoff state they produce lives in Redis and is shared by every worker
// of the pool.

// Defaults of Rotation.FlakyDelay and Rotation.LearnedPacing, and the most
// either accepts.
const (
	defaultFlakyDelay = 10 * time.Second
	defaultPaceMax    = time.Minute
	maxLearned        = 24 * time.Hour
)

// WithBaseTransport sets the transport Attach clones (TLS, dialer,
// timeouts); its Proxy is replaced and keep-alives turned off, but for
// connections to http proxies that carry http:// pages (Client.NoProxyReuse;
// their idle pool is bounded by the Client's MaxPerProxy, MaxTotal and
// IdleTimeout). The default clones http.DefaultTransport.
func WithBaseTransport(t *http.Transport) Option { return func(c *config) { c.baseTransport = t } }

// WithBanStatus sets the status codes that are a ban on site ("" for every
// site without its own rule). The default is 403, 429 and 503.
func WithBanStatus(site string, codes ...int) Option {
	return func(c *config) {
		if c.banRules.BanStatus == nil {
			c.banRules.BanStatus = make(map[string][]int)
		}
		c.banRules.BanStatus[site] = append([]int{}, codes...)
	}
}

// WithChallengeURLs sets the regular expressions of captcha, login and block
// page URLs: a redirect to one is a ban, and the hop is retried through
// another proxy. The default is ban.DefaultChallengeURLs.
func WithChallengeURLs(patterns ...string) Option {
	return func(c *config) { c.banRules.ChallengeURLs = append([]string{}, patterns...) }
}

// WithExpect names CSS selectors every 2xx page of site ("" = all) whose
// path matches urlPattern ("" = all) must contain; a page without one is a
// soft ban (ban.ReasonSelector). A page that cannot be checked is let
// through. The default is no rule.
func WithExpect(site, urlPattern string, selectors ...string) Option {
	return func(c *config) {
		c.banRules.Expect = append(c.banRules.Expect, ban.Expect{Site: site, URL: urlPattern, Selectors: append([]string{}, selectors...)})
	}
}

// WithSizeDrop makes a 2xx body smaller than ratio times the site's recent
// median a soft ban (ban.ReasonSizeDrop); 0 turns it off. The default is
// 0.25.
func WithSizeDrop(ratio float64) Option { return func(c *config) { c.banRules.SizeDrop = ratio } }

// WithClassifier adds a classifier run before the built-in checks, in the
// order added: it may return a ban, a proxy failure, ban.OK or ban.Neutral,
// or ban.Pass to let the checks decide (see package ban). It sees no body of
// a file type (an image, a PDF, an archive...: ban.Exchange.Body empty,
// Truncated set): judge those by status and headers.
func WithClassifier(f ban.Classifier) Option {
	return func(c *config) { c.banRules.Classifiers = append(c.banRules.Classifiers, f) }
}

// Off, given to a numeric field of Rotation, Timeouts, Bans or Sessions,
// sets it to zero (its "Off" meaning), where zero keeps the current value.
const Off = -1

// setField sets *dst to v: 0 keeps *dst, Off sets 0, any other value is
// taken as is (validate rejects the bad ones).
func setField[T ~int | ~int64 | ~float64](dst *T, v T) {
	switch v {
	case 0:
	case Off:
		*dst = 0
	default:
		*dst = v
	}
}

// Rotation says what a lease makes a proxy exclusive for and how long it
// rests between requests. A zero field keeps the default; Off sets a
// numeric field to zero.
type Rotation struct {
	// Scope: ScopeSite (the default) or ScopeGlobal, the same for all
	// workers of a pool.
	Scope Scope

	// Concurrency is how many requests a proxy serves at once per site;
	// all workers of a pool must agree (else ErrConfig). The default is 1.
	Concurrency int

	// Cooldown is the minimum pause, for every worker, between two requests
	// from one proxy to one site. The default is 0.
	Cooldown time.Duration

	// LearnedPacing caps the cooldown learned per site from rate-limit
	// refusals (429 or Retry-After), which lengthen it while healthy
	// answers shorten it. Such a refusal only holds the proxy for the
	// cooldown, unless the proxy had rested. Off treats it as any refusal.
	// The default is 1m.
	LearnedPacing time.Duration

	// FlakyDelay holds a proxy back on a site after each request by its
	// recent failure rate r there: r × FlakyDelay. Off turns it off. The
	// default is 10s.
	FlakyDelay time.Duration
}

// WithRotation sets what a lease makes a proxy exclusive for and how a proxy
// rests between requests (Rotation). Zero fields keep their values.
func WithRotation(r Rotation) Option {
	return func(c *config) {
		if r.Scope != ScopeSite {
			c.scope = r.Scope
		}
		setField(&c.slots, r.Concurrency)
		setField(&c.cooldown, r.Cooldown)
		setField(&c.paceMax, r.LearnedPacing)
		setField(&c.flakyDelay, r.FlakyDelay)
	}
}

// Timeouts bounds how long things take and last. A zero field keeps the
// default; Off sets a field to zero.
type Timeouts struct {
	// LeaseTTL is how long a lease lives unless released or renewed (a
	// crashed holder's proxies are free after it). Running requests' leases
	// are renewed; Switch.Lease's are not. The default is 30s.
	LeaseTTL time.Duration

	// MaxWait bounds the wait for a free proxy (then ErrNoProxy); the
	// request's context may end it earlier. Off: no wait. The default is
	// 30s.
	MaxWait time.Duration

	// Attempt bounds each attempt through one proxy, so that a hanging
	// proxy is dropped (a proxy failure) and the request retried; set it
	// well below the request timeout. The default is Off: no bound. A
	// request net/http would not replay (a POST without an Idempotency-Key
	// header, say) is retried only if the bound ran out before it was sent
	// (while connecting to the proxy or through it); once written it may be
	// at the site, slow to answer, and it fails with ErrProxyFailed instead
	// (Bans.Retries).
	Attempt time.Duration

	// Redis bounds every Redis round trip. The default is 2s.
	Redis time.Duration

	// IdleTTL is how long Redis keeps the keys of a site nobody crawls. The
	// default is 24h.
	IdleTTL time.Duration

	// Fallback is how long a Redis call may go unanswered before the
	// fallback counts Redis as unreachable. The default is 1s.
	Fallback time.Duration
}

// WithTimeouts sets the Switch's timeouts and TTLs (Timeouts). Zero fields
// keep their values.
func WithTimeouts(t Timeouts) Option {
	return func(c *config) {
		setField(&c.leaseTTL, t.LeaseTTL)
		setField(&c.maxWait, t.MaxWait)
		setField(&c.attemptTimeout, t.Attempt)
		setField(&c.redisTimeout, t.Redis)
		setField(&c.idleTTL, t.IdleTTL)
		setField(&c.fallback.timeout, t.Fallback)
	}
}

// Bans says what a refusal or a proxy failure costs a proxy. They act
// through Attach's transport; their state is shared by every worker in
// Redis. A zero field keeps the default; Off sets a numeric field to zero.
type Bans struct {
	// Quarantine is how long a proxy banned by a site stays out of that
	// site's rotation, for every worker, doubling for each further ban in a
	// row up to QuarantineMax, never shorter than Retry-After. The defaults
	// are 30m and 12h.
	Quarantine, QuarantineMax time.Duration

	// FailureQuarantine and FailureQuarantineMax are the same for a proxy
	// failure (ban.ProxyFailure). The defaults are 1m and 30m.
	FailureQuarantine, FailureQuarantineMax time.Duration

	// EvidenceFirst is how long a first refusal (a strike) keeps the proxy
	// off the site; a repeated or confirmed refusal is a ban. Off makes
	// every refusal a ban. PageProxies: a URL refused through that many
	// proxies healthy on the site, or through one more on the
	// request's last try (none refused on another URL since its last healthy
	// answer), is the page's answer (ErrPageRefused), and their strikes are
	// taken back; Off never blames the page. The defaults are 1m and 2.
	EvidenceFirst time.Duration
	PageProxies   int

	// DeadAfter is how many proxy failures in a row mark a proxy dead: out
	// of every site's rotation until Revive. Off never does. The default
	// is 5.
	DeadAfter int

	// Retries is how many times a request is sent again through another
	// proxy after a ban or a proxy failure. Off never retries. The default
	// is 2.
	//
	// A request goes again only when that cannot make the site act on it
	// twice: always when net/http would replay it (GET, HEAD, OPTIONS,
	// TRACE, or an Idempotency-Key or X-Idempotency-Key header; a body that
	// rewinds); after a ban the site answered (a ban status, a challenge, a
	// soft ban: the site refused it, so a POST banned goes again too); and
	// after a proxy failure before the request could reach the site (the
	// proxy refused the connection, its credentials (407) or the CONNECT
	// tunnel, a SOCKS handshake failed, Timeouts.Attempt ran out before a
	// connection was up). Otherwise (a POST that timed out or whose
	// connection broke once written, a plain-HTTP proxy's 502) the proxy is
	// judged as ever and the request fails with its *BlockedError
	// (ErrProxyFailed, NotResent set). Through a Client.New RoundTripper
	// that is not an *http.Transport only the error tells a failure before
	// the send (a *ban.TunnelError, a *net.OpError "proxyconnect").
	Retries int

	// AllSites makes a ban take the proxy out of every site's rotation.
	AllSites bool
}

// WithBans sets what refusals and proxy failures cost a proxy (Bans). Zero
// fields keep their values.
func WithBans(b Bans) Option {
	return func(c *config) {
		setField(&c.quarantine, b.Quarantine)
		setField(&c.maxQuarantine, b.QuarantineMax)
		setField(&c.failQuarantine, b.FailureQuarantine)
		setField(&c.maxFailQuarantine, b.FailureQuarantineMax)
		setField(&c.firstQuarantine, b.EvidenceFirst)
		setField(&c.pageProxies, b.PageProxies)
		setField(&c.deadAfter, b.DeadAfter)
		setField(&c.retries, b.Retries)
		if b.AllSites {
			c.banAllSites = true
		}
	}
}
