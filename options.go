package proxyswitch

import (
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"
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
	prefix, pool  string
	leaseTTL      time.Duration
	maxLeaseTTL   time.Duration
	maxWait       time.Duration
	cooldown      time.Duration
	redisTimeout  time.Duration
	idleTTL       time.Duration
	scope         Scope
	slots         int
	siteFunc      func(*url.URL) string
	logger        *slog.Logger
	backoffMin    time.Duration
	backoffMax    time.Duration
	sweepInterval time.Duration
}

func defaultConfig() config {
	return config{
		prefix:        "proxyswitch",
		pool:          "default",
		leaseTTL:      30 * time.Second,
		maxWait:       30 * time.Second,
		redisTimeout:  2 * time.Second,
		idleTTL:       24 * time.Hour,
		scope:         ScopeSite,
		slots:         1,
		siteFunc:      DefaultSite,
		backoffMin:    5 * time.Millisecond,
		backoffMax:    250 * time.Millisecond,
		sweepInterval: time.Second,
	}
}

func (c *config) validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrConfig}, a...)...)
	}
	switch {
	case c.leaseTTL < 100*time.Millisecond:
		return bad("lease TTL %v is below 100ms", c.leaseTTL)
	case c.maxWait < 0:
		return bad("negative max wait %v", c.maxWait)
	case c.cooldown < 0:
		return bad("negative cooldown %v", c.cooldown)
	case c.redisTimeout <= 0:
		return bad("redis timeout %v must be positive", c.redisTimeout)
	case c.idleTTL < time.Minute || c.idleTTL < 2*c.leaseTTL:
		return bad("idle TTL %v must be at least a minute and twice the lease TTL", c.idleTTL)
	case c.slots < 1 || c.slots > 1000:
		return bad("concurrency %d per proxy per site is outside 1..1000", c.slots)
	case c.scope != ScopeSite && c.scope != ScopeGlobal:
		return bad("unknown scope %d", c.scope)
	case c.siteFunc == nil:
		return bad("nil site function")
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	c.maxLeaseTTL = 10 * c.leaseTTL
	return nil
}

// WithPrefix sets the first part of every Redis key, so several projects can
// share one Redis. It must not contain braces or spaces. The default is
// "proxyswitch".
func WithPrefix(prefix string) Option { return func(c *config) { c.prefix = prefix } }

// WithPool names the proxy pool to lease from (for instance "datacenter" or
// "residential"); pools are independent sets of proxies under one prefix.
// The default is "default".
func WithPool(name string) Option { return func(c *config) { c.pool = name } }

// WithLeaseTTL sets how long a lease lives if it is never released (its
// holder crashed, or the release hooks are not installed). A request whose
// context deadline lies further out gets a lease long enough to cover it, up
// to ten times this TTL, so a slow request never outlives its lease. The
// default is 30s; the minimum 100ms.
func WithLeaseTTL(d time.Duration) Option { return func(c *config) { c.leaseTTL = d } }

// WithMaxWait bounds how long a request waits for a free proxy before it
// fails with ErrNoProxy. The request's own context (Colly's request timeout,
// 10s by default, counts the wait too) can end the wait earlier. Zero means
// do not wait at all. The default is 30s.
func WithMaxWait(d time.Duration) Option { return func(c *config) { c.maxWait = d } }

// WithCooldown sets the minimum pause, cluster-wide, between two requests from
// one proxy to one site (counted from the end of one to the start of the
// next; with WithConcurrency above 1, also between two starts). The default is
// 0: a released proxy is free at once.
func WithCooldown(d time.Duration) Option { return func(c *config) { c.cooldown = d } }

// WithScope chooses what a proxy is exclusive for: ScopeSite (the default) or
// ScopeGlobal. All workers of one pool must use the same scope.
func WithScope(s Scope) Option { return func(c *config) { c.scope = s } }

// WithConcurrency allows k simultaneous requests per proxy per site (per
// proxy overall with ScopeGlobal). All workers of one pool must agree: the
// first lease fixes the value in Redis and a worker asking for another one
// gets ErrConfig. The default is 1.
func WithConcurrency(k int) Option { return func(c *config) { c.slots = k } }

// WithSiteFunc sets how a request URL maps to the site a lease is exclusive
// for, e.g. to treat "www.ozon.ru" and "api.ozon.ru" as one site. The
// function must be fast, must not block and must not panic. The default is
// DefaultSite.
func WithSiteFunc(f func(*url.URL) string) Option { return func(c *config) { c.siteFunc = f } }

// WithLogger sets where the Switch logs. It logs warnings (a missing hook, a
// failed release) and, at debug level, lease traffic; never passwords. The
// default is slog.Default().
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithRedisTimeout bounds every single Redis round trip (go-redis retries
// included). The default is 2s.
func WithRedisTimeout(d time.Duration) Option { return func(c *config) { c.redisTimeout = d } }

// WithIdleTTL sets how long the per-site keys of a site nobody crawls any
// more are kept in Redis. It must be at least a minute and twice the lease
// TTL. The default is 24h.
func WithIdleTTL(d time.Duration) Option { return func(c *config) { c.idleTTL = d } }

// DefaultSite is the default site function: the lower-cased host of the URL,
// with its port when the URL names one ("ozon.ru", "127.0.0.1:8080").
func DefaultSite(u *url.URL) string { return strings.ToLower(u.Host) }
