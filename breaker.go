package proxyswitch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/engine"
)

// The site circuit breaker, fleet-wide.
//
// A ban is a verdict on a proxy; a storm (a site that rate-limits,
// challenges or refuses every client for a while) is the site's. The
// breaker tells them apart by the ban rate of a site as a whole, counted in
// Redis and shared by every server of the pool: above the threshold the
// site is paused (open: no lease for it on any server, requests wait up to
// the max wait or fail with ErrSitePaused), instead of burning the pool one
// proxy at a time; when the pause ends the site half-opens and lets a few
// probe requests through; they close the breaker when they succeed, or open
// it again for twice the pause when one is refused.
//
// What it counts as a ban is evidence against the site, not every refusal:
// a verdict on a proxy (a repeat, an unambiguous refusal, a first strike
// confirmed when its URL is then served through another proxy), the first
// strikes of a request that ends refused through every proxy it tried
// (neither served nor a page refusing everyone), and a rate-limit refusal
// of a proxy that had rested (in a storm even rested proxies are refused;
// penalty.evidence). A first strike still awaiting its evidence, a page's
// refusals and the pace's refusals while learned pacing learns count as
// attempts only. A proxy failure the site may have caused (siteFailure,
// storm.go: a plain-HTTP proxy's 502, a refused CONNECT, a broken
// connection, an attempt past Timeouts.Attempt; not a proxy that cannot be
// reached or refuses its credentials) of a proxy that worked on the site
// since its last failure there counts as a ban at once, with its proxy: it
// still quarantines the proxy, but many distinct proxies failing on the
// site in a row (Burst) or at the rate are the site's storm, not the
// proxies', and the breaker opens and lifts their quarantines. One bad
// proxy, quarantined at its first failure, opens nothing; a failure of a
// proxy that had not worked there is an attempt only, and is quarantined
// even while the breaker holds the site (it reopens nothing).
//
// Cost: nothing per page on the healthy path but a counter in memory. Each
// Switch counts attempts and healthy answers per site and reports them in
// one breaker.lua call per pool at most every Breaker.Flush; a ban is
// reported at once (it is a round trip of its own already, the
// quarantine). The reply carries each site's state, which the Switch keeps.
// lease.lua refuses a paused site with one HGET of the pool's breaker hash,
// so a pause taken on one server stops leases on every server at once.
//
// While a site's breaker is open or half-open, its bans (and its proxy
// failures of the site's kind, of proxies that had worked there: storm.go)
// are counted but quarantine no proxy, and
// when the breaker opens the quarantines its storm gave within the window
// are lifted (the proxies were not at fault). A request that ends refused
// or failed while the breaker holds its site fails with ErrSiteStorm,
// never ErrPageRefused (storm.go).

// ErrSitePaused means the site's circuit breaker (or an operator) paused its
// requests. It comes with ErrNoProxy, in a *SitePausedError.
var ErrSitePaused = errors.New("proxyswitch: site paused")

// SitePausedError is the error of a request that found its site paused by
// the circuit breaker or by PauseSite. It wraps ErrSitePaused and ErrNoProxy.
type SitePausedError struct {
	Site     string
	Until    time.Time // when the pause ends (Redis clock); zero while half-open
	HalfOpen bool      // the pause ended and probe requests are out: their answers decide
	// Local: paused by this Switch alone (this process's clock), on its
	// storm guard's guess: many pages in a row refused everyone, and no
	// page was served through it meanwhile (see the README's Bans).
	// PausedSites does not list it; ResumeSite ends it.
	Local bool
}

func (e *SitePausedError) Error() string {
	switch {
	case e.Local:
		return fmt.Sprintf("proxyswitch: site %s paused on this Switch alone until %s: many pages in a row refused every proxy and none was served (a storm's sign)", e.Site, e.Until.UTC().Format(time.RFC3339Nano))
	case e.HalfOpen:
		return fmt.Sprintf("proxyswitch: site %s paused by its circuit breaker: half-open, waiting for its probe requests", e.Site)
	case time.Until(e.Until) > indefinitely/2:
		return fmt.Sprintf("proxyswitch: site %s paused until resumed (PauseSite)", e.Site)
	}
	// A breaker's pause or an operator's (PauseSite): the state is the same.
	return fmt.Sprintf("proxyswitch: site %s paused (circuit breaker or PauseSite) until %s", e.Site, e.Until.UTC().Format(time.RFC3339Nano))
}

// Unwrap returns ErrSitePaused and ErrNoProxy.
func (e *SitePausedError) Unwrap() []error { return []error{ErrSitePaused, ErrNoProxy} }

// Breaker configures the site circuit breaker (WithBreaker), which pauses
// a site on every server when its ban rate spikes, then lets a few probe
// requests through (half-open) before it closes. A zero field takes its
// default.
type Breaker struct {
	// Disabled turns the breaker off (PauseSite still works).
	Disabled bool
	// Window is the sliding window of the ban rate. Default 10s.
	Window time.Duration
	// MinAttempts is the fewest attempts in the window (all servers) the
	// rate needs. Default 20.
	MinAttempts int
	// BanRate opens the breaker when bans / attempts reach it. Default 0.5.
	BanRate float64
	// MinProxies is the fewest distinct proxies quarantined in the window
	// the rate needs. Default 3.
	MinProxies int
	// Burst opens the breaker when this many distinct proxies are banned
	// (or fail in a way the site may cause: a gateway error, a timeout) in
	// a row on the site, whatever the rate. Default 8. When fewer than
	// Burst proxies (and fewer than 32) answered the site healthily in the
	// window (a small pool, a slow crawl), but more than one request tries
	// (Bans.Retries + 2, 4 by default), the breaker also opens once every
	// one of them was banned or failed there since its last healthy
	// answer was asked for, two at least in such a row and the others no
	// more than a second before it: a storm then pauses the site instead
	// of quarantining the whole of a pool too small to make a burst. (With
	// Retries + 2 >= Burst that rule never holds.)
	Burst int
	// Pause is the first pause, doubled on each reopening up to MaxPause.
	// Defaults 10s and 5m.
	Pause, MaxPause time.Duration
	// Probes is how many healthy answers the half-open breaker needs to
	// close. Default 3.
	Probes int
	// Flush is how long a Switch may keep its counts before reporting them.
	// Default 250ms.
	Flush time.Duration
}

// Defaults of Breaker.
const (
	DefaultBreakerWindow      = 10 * time.Second
	DefaultBreakerMinAttempts = 20
	DefaultBreakerBanRate     = 0.5
	DefaultBreakerMinProxies  = 3
	DefaultBreakerBurst       = 8
	DefaultBreakerPause       = 10 * time.Second
	DefaultBreakerMaxPause    = 5 * time.Minute
	DefaultBreakerProbes      = 3
	DefaultBreakerFlush       = 250 * time.Millisecond
)

// WithBreaker configures the site circuit breaker, on by default (Breaker).
func WithBreaker(b Breaker) Option { return func(c *config) { c.breaker = b } }

// withDefaults fills b's zero fields and checks the others.
func (b Breaker) withDefaults() (Breaker, error) {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	defInt := func(n *int, v int) {
		if *n == 0 {
			*n = v
		}
	}
	def(&b.Window, DefaultBreakerWindow)
	def(&b.Pause, DefaultBreakerPause)
	def(&b.MaxPause, max(DefaultBreakerMaxPause, b.Pause))
	def(&b.Flush, DefaultBreakerFlush)
	defInt(&b.MinAttempts, DefaultBreakerMinAttempts)
	defInt(&b.MinProxies, DefaultBreakerMinProxies)
	defInt(&b.Burst, DefaultBreakerBurst)
	defInt(&b.Probes, DefaultBreakerProbes)
	if b.BanRate == 0 {
		b.BanRate = DefaultBreakerBanRate
	}
	switch {
	case b.Window < 100*time.Millisecond:
		return b, configErr("breaker window %v: at least 100ms", b.Window)
	case b.Pause < 10*time.Millisecond || b.MaxPause < b.Pause:
		return b, configErr("breaker pause %v, at most %v: at least 10ms, and the max no less", b.Pause, b.MaxPause)
	case b.Flush < time.Millisecond || b.Flush > b.Window:
		return b, configErr("breaker flush %v: from 1ms to the window", b.Flush)
	case b.MinAttempts < 1 || b.MinProxies < 1 || b.Burst < 1 || b.Probes < 1:
		return b, configErr("breaker counts must be positive (min attempts %d, min proxies %d, burst %d, probes %d)",
			b.MinAttempts, b.MinProxies, b.Burst, b.Probes)
	case !(b.BanRate > 0 && b.BanRate <= 1):
		return b, configErr("breaker ban rate %v: above 0, at most 1", b.BanRate)
	}
	return b, nil
}

// Breaker states, as SiteBreaker reports them.
const (
	BreakerOpen     = "open"      // paused: no lease for the site until Until
	BreakerHalfOpen = "half-open" // the pause ended: probe requests decide
)

// SiteBreaker is the state of one site whose circuit breaker is not closed.
type SiteBreaker struct {
	Site   string
	State  string        // BreakerOpen or BreakerHalfOpen
	Until  time.Time     // the end of the pause (Redis clock); in the past when half-open
	Pause  time.Duration // the current pause: the next reopening doubles it
	Probes int           // probe requests granted in this half-open period
	Passed int           // of which answered healthily
}

// breaker is a Switch's side of the circuit breaker: the counts not yet
// reported, and the last state it learnt of each site. Safe for concurrent
// use.
type breaker struct {
	s        *Switch
	mu       sync.Mutex
	pending  map[brKey]*brCount
	states   map[string]brState // by site
	last     time.Time          // the last report
	flushing atomic.Bool
	closed   bool           // Switch.Close: no background report starts (under mu)
	flushes  sync.WaitGroup // the background report running (kick)
}

type brKey struct {
	rp   *redisPool
	site string
}

type brCount struct {
	att, bans, ok int64
	okAt          time.Time   // when the last request answered healthily was sent
	healthy       []string    // ids of proxies that answered healthily, at most brHealthyIDs
	healthyAt     []time.Time // when the last request of each answered healthily was sent
}

// brHealthyIDs is how many distinct proxies with a healthy answer one
// report names per site (the window keeps more, from report to report:
// breaker.lua's few rule).
const brHealthyIDs = 16

type brState struct {
	state int       // 0 closed, 1 open, 2 half-open
	until time.Time // of an open breaker
	seen  time.Time // when this Switch learnt it
}

func (b *breaker) cfg() *Breaker { return &b.s.cfg.breaker }

// on reports whether the breaker works for this Switch.
func (b *breaker) on() bool { return !b.s.cfg.breaker.Disabled }

// attempt counts one classified attempt through l on site (transport.go),
// sent at sent: a healthy answer ends the few rule's row of bans on the
// site only for the bans reported before its request was sent
// (breaker.lua), so that an answer the site gave before a storm, judged
// after the storm's first failures, does not end the storm's row.
// Bans, and proxy failures the site may have caused (siteFailure), are
// counted by their own report (absorb, reportBan), not here.
func (b *breaker) attempt(l *Lease, site string, v ban.Verdict, sent time.Time) {
	if !b.on() || l == nil || v.Kind == ban.Ban || v.Kind == ban.Pass || siteFailure(v) {
		return
	}
	rp := l.be.redis()
	if rp == nil {
		return
	}
	b.mu.Lock()
	c := b.count(brKey{rp, site})
	c.att++
	if v.Kind == ban.OK || v.Kind == ban.Neutral {
		c.ok++
		if sent.After(c.okAt) {
			c.okAt = sent
		}
		if i := slices.Index(c.healthy, l.proxy.id); i >= 0 {
			if sent.After(c.healthyAt[i]) {
				c.healthyAt[i] = sent
			}
		} else if len(c.healthy) < brHealthyIDs {
			c.healthy = append(c.healthy, l.proxy.id)
			c.healthyAt = append(c.healthyAt, sent)
		}
	}
	b.mu.Unlock()
	b.kick()
}

// due reports whether the pending counts are to be reported now: the last
// report is Flush old, or a site with counts is not closed (its probes'
// answers decide). b.mu is held.
func (b *breaker) due() bool {
	if len(b.pending) == 0 {
		return false
	}
	if time.Since(b.last) >= b.cfg().Flush {
		return true
	}
	for k := range b.pending {
		if b.states[k.site].state != 0 {
			return true
		}
	}
	return false
}

// kick reports the pending counts in the background when they are due: one
// goroutine at a time, which goes on while counts that came meanwhile are
// due (no count of a half-open site is left behind for want of traffic).
func (b *breaker) kick() {
	for {
		b.mu.Lock()
		due := !b.closed && b.due()
		if !due || !b.flushing.CompareAndSwap(false, true) {
			b.mu.Unlock()
			return
		}
		b.flushes.Add(1)
		b.mu.Unlock()
		go func() {
			defer b.kick()
			defer b.flushes.Done()
			defer b.flushing.Store(false)
			b.flush(context.Background(), nil, "", nil)
		}()
		return
	}
}

// refused counts a ban on site through l that quarantined nothing (a soft
// refusal a session survived, sessionscore.go): it weighs in the site's ban
// rate, reported with the other counts.
func (b *breaker) refused(l *Lease, site string) {
	if !b.on() || l == nil || l.be.redis() == nil {
		return
	}
	b.mu.Lock()
	c := b.count(brKey{l.be.redis(), site})
	c.att++
	c.bans++
	b.mu.Unlock()
	b.kick()
}

// count is the pending count of k; b.mu is held.
func (b *breaker) count(k brKey) *brCount {
	if b.pending == nil {
		b.pending = map[brKey]*brCount{}
	}
	c := b.pending[k]
	if c == nil {
		c = &brCount{}
		b.pending[k] = c
	}
	return c
}

// state is the last state this Switch learnt of site.
func (b *breaker) state(site string) brState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.states[site]
}

// holds reports whether site's breaker is open or half-open, as this
// Switch last learnt it (an open breaker whose pause has ended counts as
// half-open until the next report says otherwise).
func (b *breaker) holds(site string) bool { return b.state(site).state != 0 }

// absorb takes a ban on site while its breaker is open or half-open: l
// ends without quarantine. A ban while half-open is reported at once (a
// failed probe reopens the breaker); one while open is not counted at all
// (a request leased before the pause: counted later, it would fail the
// probes). ok is false when the breaker is closed: the ban is the proxy's,
// and penalize quarantines it.
func (b *breaker) absorb(ctx context.Context, site string, be backend, l *Lease) (penalty, bool) {
	if !b.on() || !b.holds(site) {
		return penalty{}, false
	}
	rp := be.redis()
	if rp == nil {
		return penalty{}, false
	}
	b.mu.Lock()
	half := b.states[site].state == 2 || !time.Now().Before(b.states[site].until)
	if half {
		c := b.count(brKey{rp, site})
		c.att++
		c.bans++
	}
	b.mu.Unlock()
	if half {
		b.flush(ctx, rp, site, nil)
	}
	ended := false
	if l != nil && l.scope == b.s.scopeOf(site) {
		ended = true
		b.s.releaseQuietly(l)
	}
	b.s.cfg.logger.Debug("proxyswitch: ban during a site pause: no quarantine", "site", site)
	return penalty{ended: ended}, true
}

// reportBan reports at once a ban on site through rp that quarantined p,
// with att attempts (0 when the attempt was counted before: a first strike
// confirmed) and the Switch's pending counts of the site: the reply may
// open the breaker, and lift the quarantines of the storm, p's among them.
func (b *breaker) reportBan(ctx context.Context, site string, rp *redisPool, p *Proxy, att int64) {
	if !b.on() || rp == nil {
		return
	}
	b.mu.Lock()
	c := b.count(brKey{rp, site})
	c.att += att
	c.bans++
	b.mu.Unlock()
	b.flush(ctx, rp, site, p)
}

// tally counts att refused attempts on site through rp that are no
// evidence yet (a first strike, the pace's refusal: penalty.evidence):
// they weigh in the site's ban rate as attempts, reported with the other
// counts.
func (b *breaker) tally(rp *redisPool, site string, att int64) {
	if !b.on() || rp == nil {
		return
	}
	b.mu.Lock()
	b.count(brKey{rp, site}).att += att
	b.mu.Unlock()
	b.kick()
}

// close stops the background reports and waits for the one running, if
// any (Switch.Close: nothing of the Switch runs after it returns).
func (b *breaker) close(ctx context.Context) {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	done := make(chan struct{})
	go func() { b.flushes.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// flush reports the pending counts: of every site (rp nil), or of site on
// rp with quarantined p (may be nil). One breaker.lua call per pool.
func (b *breaker) flush(ctx context.Context, rp *redisPool, site string, p *Proxy) {
	b.mu.Lock()
	batch := map[*redisPool]map[string]*brCount{}
	for k, c := range b.pending {
		if rp != nil && (k.rp != rp || k.site != site) {
			continue
		}
		if batch[k.rp] == nil {
			batch[k.rp] = map[string]*brCount{}
		}
		batch[k.rp][k.site] = c
		delete(b.pending, k)
	}
	if rp == nil {
		b.last = time.Now()
	}
	b.mu.Unlock()
	for pool, sites := range batch {
		ids := map[string]string{}
		if p != nil {
			ids[site] = p.id
		}
		if err := b.report(ctx, pool, sites, ids); err != nil {
			b.s.cfg.logger.Debug("proxyswitch: breaker report failed; its counts are dropped", "pool", pool.name, "err", err)
		}
	}
}

// report runs breaker.lua on rp for sites and keeps the states it returns;
// then again, with zero counts, for each site whose window holds more
// quarantines to lift (a page per call), until none does.
func (b *breaker) report(ctx context.Context, rp *redisPool, sites map[string]*brCount, ids map[string]string) error {
	for len(sites) > 0 {
		more, err := b.reportOnce(ctx, rp, sites, ids)
		if err != nil {
			return err
		}
		sites, ids = map[string]*brCount{}, nil
		for _, site := range more {
			sites[site] = &brCount{}
		}
	}
	return nil
}

// reportOnce is one breaker.lua call of report: it returns the sites with
// more quarantines to lift.
func (b *breaker) reportOnce(ctx context.Context, rp *redisPool, sites map[string]*brCount, ids map[string]string) ([]string, error) {
	c := b.cfg()
	bucket := max(c.Window/20, time.Millisecond)
	keys := []string{rp.keys.breaker()}
	argv := []any{c.Window.Milliseconds(), c.MinAttempts, int64(c.BanRate*1000 + 0.5), c.Burst,
		c.Pause.Milliseconds(), c.MaxPause.Milliseconds(), c.Probes, rp.cfg.slots, bucket.Milliseconds(), c.MinProxies,
		b.s.cfg.retries + 2}
	order := make([]string, 0, len(sites))
	for site, n := range sites {
		scope := b.s.scopeOf(site)
		keys = append(keys, rp.keys.breakerWindow(site), rp.keys.free(scope), rp.keys.leases(scope), rp.keys.strikes(scope))
		var okAge int64
		if n.ok > 0 {
			okAge = time.Since(n.okAt).Milliseconds()
		}
		healthy := make([]string, 0, 2*len(n.healthy))
		for i, id := range n.healthy {
			var age int64
			if i < len(n.healthyAt) {
				age = max(time.Since(n.healthyAt[i]).Milliseconds(), 0)
			}
			healthy = append(healthy, id, strconv.FormatInt(age, 10))
		}
		argv = append(argv, site, n.att, n.bans, n.ok, ids[site], strings.Join(healthy, " "), okAge)
		order = append(order, site)
	}
	sent := time.Now()
	res, err := roundTrip(ctx, rp.timeout, func(ctx context.Context) ([]any, error) {
		return breakerScript.Run(ctx, rp.rdb, keys, argv...).Slice()
	}, nil)
	if err != nil {
		return nil, redisErr("breaker", err)
	}
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.states == nil {
		b.states = map[string]brState{}
	}
	if len(res) != len(order) {
		return nil, fmt.Errorf("%w: breaker reply of %d items for %d sites", ErrCorrupt, len(res), len(order))
	}
	var more []string
	for i, site := range order {
		r, _ := res[i].([]any)
		if len(r) != 4 {
			return nil, fmt.Errorf("%w: breaker reply item %d of %d values", ErrCorrupt, i, len(r))
		}
		st, _ := intAt(r, 0)
		until, _ := intAt(r, 1)
		lifted, _ := intAt(r, 2)
		if m, _ := intAt(r, 3); m == 1 {
			more = append(more, site)
		}
		prev := b.states[site]
		if prev.seen.After(sent) {
			continue // a newer word on the site came meanwhile (a lease refused, another report)
		}
		b.states[site] = brState{state: int(st), until: time.UnixMilli(until), seen: now}
		switch {
		case st == 1 && newPause(prev, until):
			b.s.cfg.logger.Warn("proxyswitch: site paused by its circuit breaker", "pool", rp.name, "site", site,
				"until", time.UnixMilli(until), "quarantines_lifted", lifted)
		case st == 0 && prev.state != 0:
			b.s.cfg.logger.Info("proxyswitch: site resumed: its circuit breaker closed", "pool", rp.name, "site", site)
		}
	}
	return more, nil
}

// paused is lease.lua's {-3, wait ms, until ms}: the site's breaker holds it.
func (b *breaker) paused(site string, until int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.setPaused(site, until)
}

// gateRefused is paused for a lease of pool refused by the site's breaker
// (lease.lua's {-3, wait ms, until ms}). A pause this Switch learns so, if
// it is news and not over, is logged as reportOnce logs one: the refusal of
// a lease often comes before the reply of the report that opened the
// breaker, which then finds the pause known (or the pause is another
// server's, an operator's, or a failed probe's reopening, which no report
// of this Switch opened).
func (b *breaker) gateRefused(pool, site string, until int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	end := time.UnixMilli(until)
	if prev := b.setPaused(site, until); until != 0 && newPause(prev, until) && end.After(time.Now()) {
		b.s.cfg.logger.Warn("proxyswitch: site paused (circuit breaker or PauseSite)", "pool", pool, "site", site, "until", end)
	}
}

// setPaused records site as paused until (0: half-open) and returns the
// state it replaces; b.mu is held.
func (b *breaker) setPaused(site string, until int64) brState {
	if b.states == nil {
		b.states = map[string]brState{}
	}
	prev := b.states[site]
	st := brState{state: 1, until: time.UnixMilli(until), seen: time.Now()}
	if until == 0 {
		st.state = 2
	}
	b.states[site] = st
	return prev
}

// newPause reports whether a pause until (ms) is news to a Switch whose
// last word on the site was prev: the site was not known paused, or paused
// until an earlier end (a reopening).
func newPause(prev brState, until int64) bool {
	return prev.state != 1 || until > prev.until.UnixMilli()
}

// stillPaused reports whether site's breaker is open as this Switch last
// learnt it, with the pause's end ahead: the local shard of the fallback
// honours it while Redis is away, the pause renewed as news (pausedErr
// names it). wait is what is left of the pause.
func (b *breaker) stillPaused(site string) (wait time.Duration, paused bool) {
	st := b.state(site)
	if st.state != 1 {
		return 0, false
	}
	if wait = time.Until(st.until); wait <= 0 {
		return 0, false
	}
	b.paused(site, st.until.UnixMilli())
	return wait, true
}

// pausedErr is the error of a request for site that gave up (or will,
// the pause outlasting deadline) waiting for a paused site, when lease.lua
// said so since t0; nil otherwise.
func (b *breaker) pausedErr(site string, t0, deadline time.Time) error {
	st := b.state(site)
	if st.state == 0 || st.seen.Before(t0) {
		return nil
	}
	if st.state == 2 || !st.until.After(time.Now()) {
		if time.Now().Before(deadline) {
			return nil
		}
		return &SitePausedError{Site: site, HalfOpen: true}
	}
	if st.until.Before(deadline) {
		return nil
	}
	return &SitePausedError{Site: site, Until: st.until}
}

// leaseArgs are the breaker's arguments of lease.lua (ARGV[9], ARGV[10]).
// A site paused by hand is refused with the breaker disabled too.
func (b *breaker) leaseArgs(site string) []any { return []any{site, b.s.cfg.breaker.Probes} }

// checkSite is a site name an operator action accepts.
func checkSite(site string) error {
	if site == "" || len(site) > 256 || !utf8.ValidString(site) || strings.IndexFunc(site, unicode.IsControl) >= 0 {
		return configErr("invalid site name %q: 1 to 256 bytes of UTF-8 without control characters", clip(site))
	}
	return nil
}

// indefinitely is the pause of PauseSite with no duration: until ResumeSite.
const indefinitely = 100 * 365 * 24 * time.Hour

// PauseSite pauses site on every server for d (d <= 0: until ResumeSite):
// its requests fail with ErrSitePaused after the max wait. It returns the
// pause's end and works with the breaker disabled too.
func (s *Switch) PauseSite(ctx context.Context, site string, d time.Duration) (time.Time, error) {
	if err := checkSite(site); err != nil {
		return time.Time{}, err
	}
	if d <= 0 {
		d = indefinitely
	}
	until, err := s.setBreaker(ctx, site, max(d.Milliseconds(), 1))
	if err != nil {
		return time.Time{}, err
	}
	s.brk.paused(site, until)
	return time.UnixMilli(until), nil
}

// ResumeSite closes site's breaker on every server and forgets its ban rate.
// It is safe for concurrent use.
func (s *Switch) ResumeSite(ctx context.Context, site string) error {
	if err := checkSite(site); err != nil {
		return err
	}
	s.pageRuns.served(site) // this Switch's own pause (its storm guard), whatever Redis says
	if _, err := s.setBreaker(ctx, site, 0); err != nil {
		return err
	}
	s.brk.mu.Lock()
	delete(s.brk.states, site)
	s.brk.mu.Unlock()
	return nil
}

func (s *Switch) setBreaker(ctx context.Context, site string, ms int64) (int64, error) {
	rp := s.own.redis()
	n, err := roundTrip(ctx, s.cfg.redisTimeout, func(ctx context.Context) (int64, error) {
		return breakerSetScript.Run(ctx, s.rdb, []string{rp.keys.breaker(), rp.keys.breakerWindow(site)}, site, ms).Int64()
	}, nil)
	if err != nil {
		return 0, redisErr("pause site", err)
	}
	return n, nil
}

// PausedSites lists the sites whose circuit breaker is open or half-open. It
// is safe for concurrent use.
func (s *Switch) PausedSites(ctx context.Context) ([]SiteBreaker, error) {
	rp := s.own.redis()
	res, err := roundTrip(ctx, s.cfg.redisTimeout, func(ctx context.Context) ([]any, error) {
		return breakerListScript.Run(ctx, s.rdb, []string{rp.keys.breaker()}).Slice()
	}, nil)
	if err != nil {
		return nil, redisErr("paused sites", err)
	}
	now, _ := intAt(res, 0)
	var out []SiteBreaker
	for i := 1; i+4 < len(res); i += 5 {
		site, _ := res[i].(string)
		u, _ := intAt(res, i+1)
		p, _ := intAt(res, i+2)
		g, _ := intAt(res, i+3)
		o, _ := intAt(res, i+4)
		sb := SiteBreaker{Site: site, State: BreakerOpen, Until: time.UnixMilli(u), Pause: time.Duration(p) * time.Millisecond,
			Probes: int(g), Passed: int(o)}
		if u <= now {
			sb.State = BreakerHalfOpen
		}
		out = append(out, sb)
	}
	slices.SortFunc(out, func(a, b SiteBreaker) int { return strings.Compare(a.Site, b.Site) })
	return out, nil
}

// The breaker's scripts (internal/engine/lua/breaker*.lua).
var (
	breakerScript     = engine.Root.Script("breaker")
	breakerSetScript  = engine.Root.Script("breaker_set")
	breakerListScript = engine.Root.Script("breaker_list")
)
