package metrics

import (
	"context"
	"errors"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/proxyswitch/proxyswitch"
)

// stateReaders bounds the per-site reads of one scrape running at once.
const stateReaders = 8

// StateCollector reads the state of one pool from Redis at scrape time:
// the pool's size, dead and drained proxies, the live member list, the
// live sticky sessions, the sites whose circuit breaker is open (paused) or
// half-open and, per
// site leased recently, how many proxy slots are free, leased, cooling down,
// quarantined or dead, and the cooldown learned for it. The numbers are cluster-wide, the same whichever
// process reads them: run one, in the standalone exporter (proxyswitch
// serve) or in one worker, not in every worker.
//
// A scrape costs a few Redis round trips plus one per site (at most
// WithMaxSites), bounded as a whole by WithScrapeTimeout. When Redis fails
// the scrape still answers, with proxyswitch_state_up 0.
//
// A StateCollector is safe for concurrent use; it starts no goroutine.
type StateCollector struct {
	sw     *proxyswitch.Switch
	cfg    config
	health readHealth

	poolProxies, deadProxies, sites, siteSlots, siteCooldown, poolMembers, sessions, up, duration *prometheus.Desc
	sitesPaused, siteBreaker                                                                      *prometheus.Desc
}

// NewState returns a StateCollector for sw's pool. Its series carry the
// constant label pool. It does no I/O. It panics on a nil Switch.
func NewState(sw *proxyswitch.Switch, opts ...Option) *StateCollector {
	if sw == nil {
		panic("metrics: NewState with a nil *proxyswitch.Switch")
	}
	cfg := newConfig(opts)
	cl := prometheus.Labels{"pool": sw.Pool()}
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, cl)
	}
	return &StateCollector{
		sw:  sw,
		cfg: cfg,
		poolProxies: desc("proxyswitch_pool_proxies",
			"Proxies in the pool."),
		deadProxies: desc("proxyswitch_dead_proxies",
			"Proxies marked dead or drained (out of every site's rotation until revived), by reason (drained, proxy_connect...).",
			"reason"),
		sites: desc("proxyswitch_sites",
			"Sites leased from the pool within its idle TTL (only the latest WithMaxSites get proxyswitch_site_slots)."),
		siteSlots: desc("proxyswitch_site_slots",
			"Proxy slots of the pool by site and state (free, leased, cooling, quarantined, dead); slots are proxies when the concurrency is 1.",
			"site", "state"),
		siteCooldown: desc("proxyswitch_site_learned_cooldown_seconds",
			"The cooldown between two requests from one proxy to the site that the fleet learned from its answers (Rotation.LearnedPacing); 0 for none.",
			"site"),
		poolMembers: desc("proxyswitch_pool_members",
			"Servers registered in the pool's member list (heartbeat alive)."),
		sessions: desc("proxyswitch_sessions_live",
			"Live sticky sessions of the pool's tasks on every server (leasing from its session pool, Sessions.Pool): started and not yet retired, ended or lapsed."),
		sitesPaused: desc("proxyswitch_sites_paused",
			"Sites whose circuit breaker holds them, by state: open (paused: no lease) or half-open (probe requests decide).",
			"state"),
		siteBreaker: desc("proxyswitch_site_breaker",
			"1 for each site whose circuit breaker is open (paused) or half-open, by site and state; closed sites have no series.",
			"site", "state"),
		up: desc("proxyswitch_state_up",
			"1 if the last read of the pool's state from Redis succeeded, else 0."),
		duration: desc("proxyswitch_state_read_duration_seconds",
			"How long the last read of the pool's state from Redis took."),
	}
}

// Describe sends the descriptors of every metric the StateCollector exports.
func (s *StateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{s.poolProxies, s.deadProxies, s.sites, s.siteSlots, s.siteCooldown, s.poolMembers, s.sessions, s.up, s.duration,
		s.sitesPaused, s.siteBreaker} {
		ch <- d
	}
}

// Collect reads the pool's state from Redis and sends it.
func (s *StateCollector) Collect(ch chan<- prometheus.Metric) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.scrapeTimeout)
	defer cancel()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	err := s.collect(ctx, gauge)
	up, recovered := s.health.report(s.cfg.logger, err, "proxyswitch metrics: reading the pool state from Redis failed", "pool", s.sw.Pool())
	if recovered {
		s.cfg.logger.Debug("proxyswitch metrics: reading the pool state from Redis works again", "pool", s.sw.Pool())
	}
	gauge(s.up, up)
	gauge(s.duration, time.Since(start).Seconds())
}

// collect sends what it could read and returns the first error.
func (s *StateCollector) collect(ctx context.Context, gauge func(*prometheus.Desc, float64, ...string)) error {
	var errs []error
	used, err := s.sw.Sites(ctx)
	if err != nil {
		errs = append(errs, err)
	} else {
		gauge(s.sites, float64(len(used)))
		used = used[:min(len(used), s.cfg.maxSites)]
		states, err := s.siteStates(ctx, used)
		if err != nil {
			errs = append(errs, err)
		}
		for _, st := range states {
			site := siteValue(st.Site)
			for _, v := range []struct {
				state string
				n     int
			}{{"free", st.Free}, {"leased", st.Leased}, {"cooling", st.Cooling}, {"quarantined", st.Quarantined}, {"dead", st.Dead}} {
				gauge(s.siteSlots, float64(v.n), site, v.state)
			}
			gauge(s.siteCooldown, st.Learned.Seconds(), site)
		}
	}
	// Once the scrape's time is up, every further read would fail the
	// same way: answer with what was read.
	if ctx.Err() != nil {
		return errors.Join(append(errs, ctx.Err())...)
	}
	if n, err := s.poolSize(ctx, used); err != nil {
		errs = append(errs, err)
	} else {
		gauge(s.poolProxies, float64(n))
	}
	if dead, err := s.sw.Dead(ctx); err != nil {
		errs = append(errs, err)
	} else {
		byReason := make(map[string]int)
		for _, d := range dead {
			byReason[reasonLabel(d.Reason)]++
		}
		for r, n := range byReason {
			gauge(s.deadProxies, float64(n), r)
		}
	}
	if n, err := s.sw.LiveSessions(ctx); err != nil {
		errs = append(errs, err)
	} else {
		gauge(s.sessions, float64(n))
	}
	if paused, err := s.sw.PausedSites(ctx); err != nil {
		errs = append(errs, err)
	} else {
		n := map[string]int{proxyswitch.BreakerOpen: 0, proxyswitch.BreakerHalfOpen: 0}
		for i, p := range paused {
			n[p.State]++
			if i < s.cfg.maxSites {
				gauge(s.siteBreaker, 1, siteValue(p.Site), p.State)
			}
		}
		for state, k := range n {
			gauge(s.sitesPaused, float64(k), state)
		}
	}
	if list, err := s.sw.Members(ctx); err != nil {
		errs = append(errs, err)
	} else {
		gauge(s.poolMembers, float64(len(list)))
	}
	return errors.Join(errs...)
}

// siteStates reads the state of every site, a few at a time; the states
// read are returned (sorted by site) along with the first error.
func (s *StateCollector) siteStates(ctx context.Context, used []proxyswitch.SiteUse) ([]proxyswitch.SiteState, error) {
	var (
		mu     sync.Mutex
		out    []proxyswitch.SiteState
		first  error
		wg     sync.WaitGroup
		tokens = make(chan struct{}, stateReaders)
	)
	for _, u := range used {
		wg.Add(1)
		tokens <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-tokens }()
			st, err := s.sw.SiteState(ctx, u.Site)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if first == nil {
					first = err
				}
				return
			}
			out = append(out, st)
		}()
	}
	wg.Wait()
	sort.Slice(out, func(i, j int) bool { return out[i].Site < out[j].Site })
	return out, first
}

// poolSize counts the pool's proxies: one HLEN through Stats when a site is
// known, else the list itself (a pool no one leases from yet).
func (s *StateCollector) poolSize(ctx context.Context, used []proxyswitch.SiteUse) (int, error) {
	if len(used) > 0 {
		st, err := s.sw.Stats(ctx, used[0].Site)
		return st.Proxies, err
	}
	ps, err := s.sw.List(ctx)
	return len(ps), err
}
