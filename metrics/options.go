package metrics

import (
	"log/slog"
	"os"
	"time"
)

// Option configures a Collector, a StateCollector or a QueueCollector. Each
// option says which it applies to; the others ignore it. Out-of-range values fall
// back to the default.
type Option func(*config)

type config struct {
	server        string
	topProxies    int
	proxyWindow   int
	maxSites      int
	joinWindow    time.Duration
	scrapeTimeout time.Duration
	logger        *slog.Logger
}

const (
	defaultProxyWindow   = 50
	maxProxyWindow       = 1000
	defaultMaxSites      = 100
	defaultJoinWindow    = time.Minute
	defaultScrapeTimeout = 10 * time.Second
)

func newConfig(opts []Option) config {
	c := config{
		proxyWindow:   defaultProxyWindow,
		maxSites:      defaultMaxSites,
		joinWindow:    defaultJoinWindow,
		scrapeTimeout: defaultScrapeTimeout,
	}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.server == "" {
		c.server, _ = os.Hostname()
		if c.server == "" {
			c.server = "unknown"
		}
	}
	if c.proxyWindow < 1 || c.proxyWindow > maxProxyWindow {
		c.proxyWindow = defaultProxyWindow
	}
	if c.topProxies < 0 {
		c.topProxies = 0
	}
	if c.maxSites < 1 {
		c.maxSites = defaultMaxSites
	}
	if c.joinWindow <= 0 {
		c.joinWindow = defaultJoinWindow
	}
	if c.scrapeTimeout <= 0 {
		c.scrapeTimeout = defaultScrapeTimeout
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	return c
}

// WithServer names this server (process) in the "server" label of every
// series of a Collector; use the member ID it registers under
// (shard.MemberConfig Self, or proxyswitch.WithFallback's), so that load and bans line up with the
// member list. The default is the host name.
func WithServer(name string) Option { return func(c *config) { c.server = name } }

// WithTopProxies makes a Collector export per-proxy series (success ratio,
// mean latency, attempts, over each proxy's last attempts; see
// WithProxyWindow) for the k proxies doing worst: lowest success ratio
// first, then slowest. Per-proxy tracking costs a few hundred bytes per
// proxy used and a lock per attempt, and a series per proxy is what makes a
// Prometheus server slow: keep k small (10 to 50). The default is 0: no
// per-proxy series and no per-proxy tracking.
func WithTopProxies(k int) Option { return func(c *config) { c.topProxies = k } }

// WithProxyWindow sets how many of each proxy's latest attempts its
// success ratio and mean latency cover (Collector, with WithTopProxies).
// The default is 50, at most 1000.
func WithProxyWindow(n int) Option { return func(c *config) { c.proxyWindow = n } }

// WithMaxSites bounds the sites that get a "site" label value of their own:
// a Collector labels the first n sites it sees by name and every later one
// "_other"; a StateCollector reads the n sites leased most recently. The
// default is 100.
func WithMaxSites(n int) Option { return func(c *config) { c.maxSites = n } }

// WithJoinWindow sets the window of the ban-spike signal (Collector): the
// ban share of attempts in this long before the member list grew is
// compared with the ban share in this long after. The default is 1m.
func WithJoinWindow(d time.Duration) Option { return func(c *config) { c.joinWindow = d } }

// WithScrapeTimeout bounds the Redis reads of one StateCollector or
// QueueCollector scrape. The default is 10s.
func WithScrapeTimeout(d time.Duration) Option { return func(c *config) { c.scrapeTimeout = d } }

// WithLogger sets where a StateCollector or a QueueCollector logs a failed
// read of Redis (a warning, once per run of failures; never a password).
// The default is slog.Default().
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }
