package metrics

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/probe"
)

var (
	_ prometheus.Collector   = (*Collector)(nil)
	_ proxyswitch.Observer   = (*Collector)(nil)
	_ probe.Observer         = (*Collector)(nil)
	_ prometheus.Collector   = (*StateCollector)(nil)
	_ func(members []string) = (*Collector)(nil).ObserveMembers // fits shard.MemberConfig.Changed (proxyswitch.WithMembership)
)

// Label values the package makes up.
const (
	// OtherSite labels the sites beyond WithMaxSites.
	OtherSite = "_other"
	// noSite labels an event without a site (none comes from a Switch).
	noSite = "_none"
)

const (
	// maxPending bounds the quarantines waiting for a recovery; a
	// quarantine beyond it is not timed.
	maxPending = 100_000
	// pendingTTL: a quarantine whose proxy never answered well again on its
	// site through this server within this long is forgotten.
	pendingTTL = 48 * time.Hour
	// maxLabelLen bounds a site label, in bytes.
	maxLabelLen = 200
)

var (
	latencyBuckets    = []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}
	quarantineBuckets = []float64{1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 43200, 86400}
	sessionReqBuckets = []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000}
)

// Collector turns what one Switch sees and does in this process (attempts
// and their verdicts, quarantines, sticky sessions started and ended, member
// joins) into Prometheus metrics. It
// reads nothing from Redis: every worker exports its own share, with its own
// "server" label, and Prometheus adds the workers up. Pool-wide state read
// from Redis is the StateCollector's.
//
// A Collector is safe for concurrent use by multiple goroutines. It starts
// no goroutine and holds no connection: it needs no Close (to stop
// observing, call sw.SetObserver(nil)).
type Collector struct {
	cfg   config
	now   func() time.Time // the clock; tests set it
	sites siteLabels

	attempts   *prometheus.CounterVec
	byLabel    *prometheus.CounterVec // attempts by proxy label
	labels     siteLabels             // the label values byLabel knows (bounded like sites)
	bans       *prometheus.CounterVec
	latency    *prometheus.HistogramVec
	quarantine *prometheus.HistogramVec
	deadMarked *prometheus.CounterVec
	recovery   *prometheus.HistogramVec

	evidence *prometheus.CounterVec

	probes      *prometheus.CounterVec
	probeTime   *prometheus.HistogramVec
	exitChanges prometheus.Counter

	sessionsStarted prometheus.Counter
	sessionsEnded   *prometheus.CounterVec
	sessionRequests prometheus.Histogram
	sessionAge      prometheus.Histogram

	pendingN atomic.Int64 // len(pending), read without the lock on every attempt
	pendMu   sync.Mutex
	pending  map[siteProxy]time.Time // quarantines waiting for a good answer

	proxies *proxyStats // nil without WithTopProxies
	joins   joinTracker

	proxySuccess, proxyLatency, proxyAttempts, trackedProxies  *prometheus.Desc
	members, memberJoins, lastJoin, joinBanRatio, joinBanSpike *prometheus.Desc
}

type siteProxy struct{ site, proxy string }

// New returns a Collector for sw and makes it sw's observer
// (sw.SetObserver), replacing any observer set before (to keep one of your
// own too: sw.SetObserver(col, yours)). Register it
// with a Prometheus registry:
//
//	col := metrics.New(sw, metrics.WithServer("crawler-1"))
//	prometheus.MustRegister(col)
//
// Its series carry the constant labels pool (sw.Pool()) and server
// (WithServer), so the Collectors of several pools, or of several servers,
// never clash. New does no I/O. It panics on a nil Switch.
func New(sw *proxyswitch.Switch, opts ...Option) *Collector {
	if sw == nil {
		panic("metrics: New with a nil *proxyswitch.Switch")
	}
	c := newCollector(sw.Pool(), newConfig(opts))
	sw.SetObserver(c)
	return c
}

func newCollector(pool string, cfg config) *Collector {
	cl := prometheus.Labels{"pool": pool, "server": cfg.server}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: cl}, labels)
	}
	histogram := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, ConstLabels: cl, Buckets: buckets}, labels)
	}
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, cl)
	}
	c := &Collector{
		cfg:     cfg,
		now:     time.Now,
		sites:   siteLabels{max: cfg.maxSites},
		labels:  siteLabels{max: cfg.maxSites},
		pending: make(map[siteProxy]time.Time),
		joins:   joinTracker{window: cfg.joinWindow},

		attempts: counter("proxyswitch_attempts_total",
			"Attempts sent through a proxy and classified, by site and outcome (ok, neutral, unchecked, ban, proxy_failure; unchecked: a 2xx page the content checks could not read, a neutral one); a retried request counts once per attempt.",
			"site", "outcome"),
		byLabel: counter("proxyswitch_label_attempts_total",
			"Attempts as proxyswitch_attempts_total counts them, by a label of the proxy they went through (\"country=ru\", \"type=residential\": each label of the proxy counts the attempt once) and outcome; proxies without labels count in none. At most WithMaxSites distinct labels, the rest as _other.",
			"label", "outcome"),
		bans: counter("proxyswitch_bans_total",
			"Attempts classified as a ban or a proxy failure, by site, kind (ban, proxy_failure) and reason (http_403, missing_selector, proxy_connect...).",
			"site", "kind", "reason"),
		latency: histogram("proxyswitch_attempt_duration_seconds",
			"Time from sending an attempt through a proxy to its verdict, by site.",
			latencyBuckets, "site"),
		quarantine: histogram("proxyswitch_quarantine_duration_seconds",
			"Quarantines applied (site bans, proxy failures, operator bans), by site and kind, with their length.",
			quarantineBuckets, "site", "kind"),
		deadMarked: counter("proxyswitch_proxies_marked_dead_total",
			"Proxies this server marked dead (out of every site's rotation until revived), by the reason of the last failure.",
			"reason"),
		recovery: histogram("proxyswitch_recovery_duration_seconds",
			"Time from a proxy's quarantine on a site to its next good answer there (ok or neutral) through this server.",
			quarantineBuckets, "site"),

		evidence: counter("proxyswitch_evidence_total",
			"Steps of the ban evidence and the sessions' error score, by site and what: confirmed (a first strike became a ban), lifted (a first strike taken back: the page refuses everyone), page_refused (a request failed with ErrPageRefused), session_kept (a soft refusal a sticky session survived), session_spent (a soft refusal that spent a session's error score: it retires).",
			"site", "what"),

		probes: counter("proxyswitch_probes_total",
			"Probes the health checker (package probe) sent from this server, by site, kind (echo, site) and result (ok, fail).",
			"site", "kind", "result"),
		probeTime: histogram("proxyswitch_probe_duration_seconds",
			"Time of a probe from sending it to the end of the answer, by kind (echo, site).",
			latencyBuckets, "kind"),
		exitChanges: prometheus.NewCounter(prometheus.CounterOpts{Name: "proxyswitch_exit_changes_total",
			Help: "Proxies whose exit IP, as the health checker with Exits found it, differed from the one recorded before (probe.Checker.Exits).", ConstLabels: cl}),

		sessionsStarted: prometheus.NewCounter(prometheus.CounterOpts{Name: "proxyswitch_sessions_started_total",
			Help: "Sticky sessions this server started (a task's first request, or its next one after a retirement).", ConstLabels: cl}),
		sessionsEnded: counter("proxyswitch_sessions_ended_total",
			"Sticky sessions this server retired or ended, by reason: a verdict's (http_403, proxy_connect...), a limit (max_requests, max_age), proxy_removed, proxy_dead, quarantined, lease_lost, or ended (EndSession). Lapsed sessions are not counted.",
			"reason"),
		sessionRequests: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "proxyswitch_session_requests",
			Help:    "Requests a sticky session served, observed when this server retired or ended it.",
			Buckets: sessionReqBuckets, ConstLabels: cl}),
		sessionAge: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "proxyswitch_session_duration_seconds",
			Help:    "Age of a sticky session (from its start) when this server retired or ended it.",
			Buckets: quarantineBuckets, ConstLabels: cl}),

		proxySuccess: desc("proxyswitch_proxy_success_ratio",
			"Share of the proxy's latest attempts (see proxyswitch_proxy_window_attempts) that were neither a ban nor a proxy failure; only the worst proxies (WithTopProxies).",
			"proxy"),
		proxyLatency: desc("proxyswitch_proxy_latency_seconds",
			"Mean time to a verdict over the proxy's latest attempts; only the worst proxies (WithTopProxies).",
			"proxy"),
		proxyAttempts: desc("proxyswitch_proxy_window_attempts",
			"Attempts the proxy's success ratio and latency cover (at most the proxy window); only the worst proxies (WithTopProxies).",
			"proxy"),
		trackedProxies: desc("proxyswitch_tracked_proxies",
			"Proxies this server keeps a window of latest attempts for (WithTopProxies)."),
		members: desc("proxyswitch_members",
			"Servers in the pool's member list as this server last saw it (ObserveMembers)."),
		memberJoins: desc("proxyswitch_member_joins_total",
			"Servers that joined the member list since this server first saw it."),
		lastJoin: desc("proxyswitch_last_member_join_timestamp_seconds",
			"When this server last saw the member list grow (Unix time)."),
		joinBanRatio: desc("proxyswitch_join_ban_ratio",
			"Bans per attempt through this server in the join window before (window=before) and after (window=after) the member list last grew.",
			"window"),
		joinBanSpike: desc("proxyswitch_join_ban_spike",
			"1 while bans spike after the member list grew (the sign that shards overlap), else 0; see the metrics package documentation for the rule."),
	}
	if cfg.topProxies > 0 {
		c.proxies = &proxyStats{window: cfg.proxyWindow, m: make(map[string]*proxyWindow)}
	}
	return c
}

// ObserveAttempt counts one classified attempt. The Switch calls it (the
// Collector is its Observer); it is fast, never blocks and never panics.
func (c *Collector) ObserveAttempt(ev proxyswitch.AttemptEvent) {
	now := c.now()
	site, kind := c.sites.label(ev.Site), kindLabel(ev.Kind)
	outcome := kind
	if ev.Kind == ban.Neutral && ev.Reason == ban.ReasonUnchecked {
		outcome = ban.ReasonUnchecked // a page the content checks could not read
	}
	if m, err := c.attempts.GetMetricWithLabelValues(site, outcome); err == nil {
		m.Inc()
	}
	if ev.Labels != "" {
		for _, l := range strings.Split(ev.Labels, ",") {
			if m, err := c.byLabel.GetMetricWithLabelValues(c.labels.label(l), outcome); err == nil {
				m.Inc()
			}
		}
	}
	if m, err := c.latency.GetMetricWithLabelValues(site); err == nil {
		m.Observe(max(ev.Latency, 0).Seconds())
	}
	bad := ev.Kind == ban.Ban || ev.Kind == ban.ProxyFailure
	if bad {
		if m, err := c.bans.GetMetricWithLabelValues(site, kind, reasonLabel(ev.Reason)); err == nil {
			m.Inc()
		}
	} else if c.pendingN.Load() > 0 {
		c.recovered(siteProxy{ev.Site, ev.ProxyID}, site, now)
	}
	if c.proxies != nil {
		c.proxies.add(ev.ProxyID, ev.Latency, bad, now)
	}
	c.joins.attempt(now, ev.Kind == ban.Ban)
}

// ObserveQuarantine counts one quarantine (or dead-marking) the Switch
// applied. The Switch calls it; it is fast, never blocks and never panics.
func (c *Collector) ObserveQuarantine(ev proxyswitch.QuarantineEvent) {
	now := c.now()
	site := c.sites.label(ev.Site)
	if ev.Dead {
		if m, err := c.deadMarked.GetMetricWithLabelValues(reasonLabel(ev.Reason)); err == nil {
			m.Inc()
		}
	} else if m, err := c.quarantine.GetMetricWithLabelValues(site, kindLabel(ev.Kind)); err == nil {
		m.Observe(max(ev.Duration, 0).Seconds())
	}
	// The recovery is timed from the first quarantine of a run: a ban met
	// again while quarantined does not restart the clock.
	k := siteProxy{ev.Site, ev.ProxyID}
	c.pendMu.Lock()
	if _, ok := c.pending[k]; !ok && len(c.pending) < maxPending {
		c.pending[k] = now
		c.pendingN.Store(int64(len(c.pending)))
	}
	c.pendMu.Unlock()
}

// ObserveSession counts a sticky session started, retired or ended. The
// Switch calls it; it is fast, never blocks and never panics.
func (c *Collector) ObserveSession(ev proxyswitch.SessionEvent) {
	if !ev.Ended {
		c.sessionsStarted.Inc()
		return
	}
	if m, err := c.sessionsEnded.GetMetricWithLabelValues(reasonLabel(ev.Reason)); err == nil {
		m.Inc()
	}
	c.sessionRequests.Observe(float64(max(ev.Requests, 0)))
	c.sessionAge.Observe(max(ev.Age, 0).Seconds())
}

// ObserveEvidence counts a step of the ban evidence or of a session's
// error score. The Switch calls it; it is fast, never blocks and never
// panics.
func (c *Collector) ObserveEvidence(ev proxyswitch.EvidenceEvent) {
	what := ev.What
	switch what {
	case "confirmed", "lifted", "page_refused", "session_kept", "session_spent":
	default:
		what = "other" // bounded label values, whatever a future Switch reports
	}
	if m, err := c.evidence.GetMetricWithLabelValues(c.sites.label(ev.Site), what); err == nil {
		m.Inc()
	}
}

// ObserveProbe counts one probe of the health checker (package probe,
// which calls it when the Collector is its Switch's observer); it is fast,
// never blocks and never panics.
func (c *Collector) ObserveProbe(ev probe.Event) {
	kind, result := "site", "fail"
	if ev.Echo {
		kind = "echo"
	}
	if ev.OK {
		result = "ok"
	}
	if m, err := c.probes.GetMetricWithLabelValues(c.sites.label(ev.Site), kind, result); err == nil {
		m.Inc()
	}
	if m, err := c.probeTime.GetMetricWithLabelValues(kind); err == nil {
		m.Observe(max(ev.Latency, 0).Seconds())
	}
	if ev.ExitChanged {
		c.exitChanges.Inc()
	}
}

// ObserveMembers tells the Collector the pool's member list, for the
// ban-spike signal. Wire it to the Membership of this server:
//
//	shard.NewMembership(rdb, shard.MemberConfig{Prefix: prefix, Pool: sw.Pool(), Self: self, Changed: col.ObserveMembers})
//
// or, for the Membership of WithFallback or WithSharding, give it to
// NewSwitch with proxyswitch.WithMembership(shard.MemberConfig{Changed: col.ObserveMembers}).
//
// The first list is the starting point; each later list naming a server the
// previous one did not is a join. It is safe for concurrent use.
func (c *Collector) ObserveMembers(members []string) { c.joins.observe(members, c.now()) }

func (c *Collector) recovered(k siteProxy, site string, now time.Time) {
	c.pendMu.Lock()
	start, ok := c.pending[k]
	if ok {
		delete(c.pending, k)
		c.pendingN.Store(int64(len(c.pending)))
	}
	c.pendMu.Unlock()
	if !ok {
		return
	}
	if m, err := c.recovery.GetMetricWithLabelValues(site); err == nil {
		m.Observe(max(now.Sub(start), 0).Seconds())
	}
}

// Describe sends the descriptors of every metric the Collector exports.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, v := range c.vectors() {
		v.Describe(ch)
	}
	for _, d := range []*prometheus.Desc{c.proxySuccess, c.proxyLatency, c.proxyAttempts, c.trackedProxies,
		c.members, c.memberJoins, c.lastJoin, c.joinBanRatio, c.joinBanSpike} {
		ch <- d
	}
}

// Collect sends the current values. Per-proxy series are computed here:
// scrape cost grows with the proxies tracked, never with traffic.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	now := c.now()
	for _, v := range c.vectors() {
		v.Collect(ch)
	}
	c.prunePending(now)
	if c.proxies != nil {
		c.collectProxies(ch, now)
	}
	c.collectJoins(ch, now)
}

func (c *Collector) vectors() []prometheus.Collector {
	return []prometheus.Collector{c.attempts, c.byLabel, c.bans, c.latency, c.quarantine, c.deadMarked, c.recovery, c.evidence,
		c.sessionsStarted, c.sessionsEnded, c.sessionRequests, c.sessionAge, c.probes, c.probeTime, c.exitChanges}
}

func (c *Collector) prunePending(now time.Time) {
	c.pendMu.Lock()
	defer c.pendMu.Unlock()
	for k, t := range c.pending {
		if now.Sub(t) > pendingTTL {
			delete(c.pending, k)
		}
	}
	c.pendingN.Store(int64(len(c.pending)))
}

func (c *Collector) collectProxies(ch chan<- prometheus.Metric, now time.Time) {
	worst, tracked := c.proxies.worst(c.cfg.topProxies, now)
	ch <- prometheus.MustNewConstMetric(c.trackedProxies, prometheus.GaugeValue, float64(tracked))
	for _, p := range worst {
		ch <- prometheus.MustNewConstMetric(c.proxySuccess, prometheus.GaugeValue, p.success, p.id)
		ch <- prometheus.MustNewConstMetric(c.proxyLatency, prometheus.GaugeValue, p.latency.Seconds(), p.id)
		ch <- prometheus.MustNewConstMetric(c.proxyAttempts, prometheus.GaugeValue, float64(p.attempts), p.id)
	}
}

func (c *Collector) collectJoins(ch chan<- prometheus.Metric, now time.Time) {
	s := c.joins.snapshot(now)
	if !s.seen {
		return
	}
	ch <- prometheus.MustNewConstMetric(c.members, prometheus.GaugeValue, float64(s.members))
	ch <- prometheus.MustNewConstMetric(c.memberJoins, prometheus.CounterValue, float64(s.joins))
	spike := 0.0
	if s.spike {
		spike = 1
	}
	ch <- prometheus.MustNewConstMetric(c.joinBanSpike, prometheus.GaugeValue, spike)
	if s.joins == 0 {
		return
	}
	ch <- prometheus.MustNewConstMetric(c.lastJoin, prometheus.GaugeValue, float64(s.lastJoin.UnixMilli())/1e3)
	ch <- prometheus.MustNewConstMetric(c.joinBanRatio, prometheus.GaugeValue, s.before.ratio(), "before")
	ch <- prometheus.MustNewConstMetric(c.joinBanRatio, prometheus.GaugeValue, s.after.ratio(), "after")
}

// kindLabel names a verdict kind: ok, neutral, ban, proxy_failure.
func kindLabel(k ban.Kind) string {
	switch k {
	case ban.OK, ban.Neutral, ban.Ban, ban.ProxyFailure:
		return k.String()
	}
	return "other"
}

// reasonLabel passes the Switch's reasons (short tokens of [a-z0-9_.:-],
// validated by the Switch: ban.ValidReason) and turns anything else into
// "custom", so that a label value is always short and valid.
func reasonLabel(r string) string {
	if !ban.ValidReason(r) {
		return ban.ReasonCustom
	}
	return r
}

// siteLabels hands out site label values: the first max sites by name, the
// rest OtherSite. It is safe for concurrent use.
type siteLabels struct {
	max   int
	mu    sync.RWMutex
	known map[string]string // site -> its label
}

func (s *siteLabels) label(site string) string {
	s.mu.RLock()
	l, ok := s.known[site]
	s.mu.RUnlock()
	if ok {
		return l
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if l, ok := s.known[site]; ok {
		return l
	}
	if len(s.known) >= s.max {
		return OtherSite
	}
	if s.known == nil {
		s.known = make(map[string]string)
	}
	l = siteValue(site)
	s.known[site] = l
	return l
}

// siteValue makes a site name a valid, bounded label value.
func siteValue(site string) string {
	if site == "" {
		return noSite
	}
	if len(site) > maxLabelLen {
		site = site[:maxLabelLen]
	}
	return strings.ToValidUTF8(site, "\uFFFD")
}
