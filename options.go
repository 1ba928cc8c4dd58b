package proxyswitch

import (
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/proxyswitch/proxyswitch/ban"
)

// Option configures a Switch. Options are applied in order; invalid values
// are reported by NewSwitch (and by every lease of a ProxyFunc made by New).
type Option func(*config)

// Scope says what a lease makes a proxy exclusive for.
type Scope int

const (
	// ScopeSite (the default) makes a proxy exclusive per target site: it may
	// serve Ozon and Avito at once, never two requests to Ozon at once.
	ScopeSite Scope = iota
	// ScopeGlobal makes a proxy exclusive across all sites: one request at a
	// time, whatever the target.
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

// WithPrefix sets the first part of every Redis key, so several projects can
// share one Redis. It must not contain braces or spaces. The default is
// "proxyswitch". Two distinct (prefix, pool) pairs never share a key, ':' in
// either name notwithstanding (the pool name is escaped in the keys, see
// ARCHITECTURE.md).
func WithPrefix(prefix string) Option { return func(c *config) { c.prefix = prefix } }

// WithPool names the proxy pool to lease from (for instance "datacenter" or
// "residential"); pools are independent sets of proxies under one prefix.
// The default is "default". A ':' or '%' in the name is escaped in the keys
// ("%3A", "%25").
func WithPool(name string) Option { return func(c *config) { c.pool = name } }

// WithSiteFunc sets how a request URL maps to the site a lease is exclusive
// for, e.g. to treat "www.ozon.ru" and "api.ozon.ru" as one site. The
// function must be fast, must not block and must not panic. The default is
// the lower-cased host of the URL, with its port when the URL names one
// ("ozon.ru", "127.0.0.1:8080").
func WithSiteFunc(f func(*url.URL) string) Option { return func(c *config) { c.siteFunc = f } }

// WithLogger sets where the Switch logs. It logs warnings (a missing hook, a
// failed release) and, at debug level, lease traffic; never passwords. The
// default is slog.Default().
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

// WithBaseTransport sets the transport Attach clones for its requests (TLS
// settings, timeouts, dialer); Attach replaces its Proxy with the Switch's
// ProxyFunc and turns keep-alives off, as Colly's SetProxyFunc does
// (WithClient can keep them, or replace the transport by any
// RoundTripper). The default is a clone of http.DefaultTransport.
func WithBaseTransport(t *http.Transport) Option { return func(c *config) { c.baseTransport = t } }

// WithBanStatus sets the HTTP status codes that mean a site bans the proxy,
// for site (as the site function names it; "" sets the default for every
// site without a rule of its own). No codes means none is a ban there. The
// default is 403, 429 and 503 for every site (ban.DefaultBanStatus).
func WithBanStatus(site string, codes ...int) Option {
	return func(c *config) {
		if c.banRules.BanStatus == nil {
			c.banRules.BanStatus = make(map[string][]int)
		}
		c.banRules.BanStatus[site] = append([]int{}, codes...)
	}
}

// WithChallengeURLs sets the regular expressions (Go syntax, matching the
// whole URL) that name captcha, login and block pages. A redirect to one is
// a ban (ban.ReasonChallenge) of the redirecting site: the challenge page
// is never requested and the hop is retried through another proxy. No
// patterns turns the check off. The default is ban.DefaultChallengeURLs.
func WithChallengeURLs(patterns ...string) Option {
	return func(c *config) { c.banRules.ChallengeURLs = append([]string{}, patterns...) }
}

// WithExpect names CSS selectors (goquery syntax) that every 2xx page of
// site ("" = every site) whose path and query match urlPattern (a Go
// regular expression; "" = every page) must contain; a page without one is a
// soft ban (ban.ReasonSelector). A page that cannot be checked reaches
// Colly as ban.ReasonUnchecked, never as a ban. The default is no rule.
func WithExpect(site, urlPattern string, selectors ...string) Option {
	return func(c *config) {
		c.banRules.Expect = append(c.banRules.Expect, ban.Expect{Site: site, URL: urlPattern, Selectors: append([]string{}, selectors...)})
	}
}

// WithSizeDrop makes a 2xx body below ratio times the median size of the
// site's recent OK pages of its media type a soft ban (ban.ReasonSizeDrop).
// Each Switch learns its own baselines. Zero turns the check off. The
// default is 0.25.
func WithSizeDrop(ratio float64) Option { return func(c *config) { c.banRules.SizeDrop = ratio } }

// WithClassifier adds a classifier that runs before the built-in checks: it
// can turn a response into a ban or a proxy failure, or overrule the
// built-in checks with ban.OK or ban.Neutral; with ban.Pass it leaves the
// decision to them. Classifiers run in the order they were added. Package ban
// documents the order of the checks and what a Classifier may do.
func WithClassifier(f ban.Classifier) Option {
	return func(c *config) { c.banRules.Classifiers = append(c.banRules.Classifiers, f) }
}

// Off, given to a numeric field of Rotation, Timeouts, Bans or Sessions,
// sets it to zero (the field's documented "Off" meaning), where a zero field
// keeps the value as it is. NewSwitch rejects Off where zero is invalid
// (LeaseTTL, Quarantine...) and any other negative value.
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

// Rotation says what a lease makes a proxy exclusive for and how long a
// proxy rests on a site between two requests. A zero field keeps the
// default (or what an earlier WithRotation set); Off sets a numeric field
// to zero.
type Rotation struct {
	// Scope chooses what a proxy is exclusive for: ScopeSite (the default)
	// or ScopeGlobal. All workers of one pool must use the same scope.
	Scope Scope

	// Concurrency allows that many simultaneous requests per proxy per
	// site (per proxy overall with ScopeGlobal). All workers of one pool
	// must agree: the first lease fixes the value in Redis and a worker
	// asking for another one gets ErrConfig. The default is 1; at most 1000.
	Concurrency int

	// Cooldown is the minimum pause, cluster-wide, between two requests
	// from one proxy to one site (counted from the end of one to the start
	// of the next; with Concurrency above 1, also between two starts). The
	// default is 0: a released proxy is free at once.
	Cooldown time.Duration

	// LearnedPacing is the most the learned cooldown may reach. The fleet
	// learns each site's pace per IP, in Redis: a rate-limit refusal (429,
	// or any ban with a Retry-After) lengthens the cooldown between two
	// requests from one proxy to the site, healthy answers shorten it
	// again, never below Cooldown nor above LearnedPacing. A refusal that
	// is the site's pace only holds the proxy for the cooldown (no strike,
	// no quarantine, no breaker count); one of a proxy that had rested is a
	// refusal like any other (Bans). Off makes every rate-limit refusal a
	// refusal like any other. The default is 1m; the most 24h.
	LearnedPacing time.Duration

	// FlakyDelay holds a proxy back on a site by its recent failure rate
	// there, r in 0..1 (shared by every worker): each release makes it free
	// again after the cooldown plus r × FlakyDelay, so a flaky proxy is
	// served less, yet at least once per turn of the pool plus FlakyDelay.
	// Off turns it off. The default is 10s; the most 24h.
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
// default (or what an earlier WithTimeouts set); Off sets a field to zero.
type Timeouts struct {
	// LeaseTTL is how long a lease lives unless released or renewed: at
	// most this long after its holder crashed, a proxy is free again. The
	// leases of running requests (ProxyFunc's) are renewed while their
	// request runs, however long; those of Switch.Lease are not
	// (Lease.Extend). The default is 30s; the minimum 100ms.
	LeaseTTL time.Duration

	// MaxWait bounds how long a request waits for a free proxy before it
	// fails with ErrNoProxy. The request's own context (Colly's request
	// timeout, 10s by default, counts the wait too) can end the wait
	// earlier. Off means do not wait at all. The default is 30s.
	MaxWait time.Duration

	// Attempt bounds each attempt through one proxy, from its lease until
	// its body is read, so that a hanging proxy is dropped
	// (ban.ReasonProxyTimeout) and the request retried through another
	// one. Set it well below the collector's request timeout. Off (the
	// default) means no bound: a request that outlives its own timeout
	// fails and no proxy is blamed.
	Attempt time.Duration

	// Redis bounds every single Redis round trip (go-redis retries
	// included). The default is 2s.
	Redis time.Duration

	// IdleTTL is how long the per-site keys of a site nobody crawls any
	// more are kept in Redis. It must be at least a minute and twice the
	// lease TTL. The default is 24h.
	IdleTTL time.Duration

	// Fallback is, with WithFallback or WithSharding, how long a Redis call
	// may go unanswered before the Switch counts Redis as unreachable. The
	// default is 1s (Off and zero both mean it); the minimum 20ms.
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

// Bans says what a refusal or a proxy failure costs a proxy: quarantines,
// the evidence a refusal needs, when a proxy is dead, how often a request is
// retried. They act through Attach's transport (New alone classifies
// nothing); the state they produce lives in Redis, shared by every worker of
// the pool. A zero field keeps the default (or what an earlier WithBans
// set); Off sets a numeric field to zero.
type Bans struct {
	// Quarantine and QuarantineMax set how long a proxy proven banned by a
	// site stays out of that site's rotation, cluster-wide: Quarantine,
	// doubling for each further ban in a row, jittered, capped at
	// QuarantineMax, never shorter than the site's Retry-After. The
	// defaults are 30m and 12h; 0 < Quarantine <= QuarantineMax.
	Quarantine, QuarantineMax time.Duration

	// FailureQuarantine and FailureQuarantineMax are the same for a proxy
	// failure (ban.ProxyFailure). The defaults are 1m and 30m.
	FailureQuarantine, FailureQuarantineMax time.Duration

	// EvidenceFirst is how long a first refusal (a strike) keeps the proxy
	// off the site; it becomes a ban when the same proxy is refused again
	// there or the refusal is confirmed (the request then succeeded through
	// another proxy). A redirect to a challenge page is a ban at once. It is
	// at most Quarantine; Off makes every refusal a ban. The local shard
	// (WithFallback, WithSharding) always uses Quarantine.
	//
	// PageProxies: a URL refused through that many proxies healthy on the
	// site's other pages is the page's answer, not theirs: the request
	// fails at once with a *BlockedError wrapping ErrPageRefused and the
	// strikes it cost are taken back. Off never blames the page; otherwise
	// it is 2..100.
	//
	// The defaults are 1m and 2.
	EvidenceFirst time.Duration
	PageProxies   int

	// DeadAfter is how many proxy failures in a row mark a proxy dead: out
	// of every site's rotation until Revive or probe.CheckDead. Failures
	// that could be one site's outage (timeouts, 502s) count only once seen
	// on two sites. Off never marks a proxy dead. The default is 5.
	DeadAfter int

	// Retries is how many times, at most, a request is sent again through
	// another proxy after a ban or a proxy failure; then it fails with a
	// *BlockedError (ErrBanned or ErrProxyFailed). Attempts share the
	// request's timeout; a body without GetBody is not retried. Off never
	// retries. The default is 2; at most 100.
	Retries int

	// AllSites makes a ban take the proxy out of every site's rotation,
	// not only the banning site's. The default is false.
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
