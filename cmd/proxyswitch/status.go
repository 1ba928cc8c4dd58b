package main

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"html/template"
	"log/slog"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/proxyswitch/proxyswitch"
)

// The bounds of one render of the status page: what it reads from Redis
// does not grow with the pool beyond these.
const (
	// statusRefresh is how often the page reloads itself (meta refresh).
	statusRefresh = 5 * time.Second
	// statusMaxSites is how many sites (the most recently leased) get their
	// counts read: one round trip each (a few more for a site of a large
	// pool: SiteState reads it in pages of bounded work).
	statusMaxSites = 50
	// statusMaxDetailSites is how many of those sites, with proxies
	// quarantined, get their quarantined proxies listed.
	statusMaxDetailSites = 10
	// statusMaxRows bounds every list of proxies on the page.
	statusMaxRows = 50
	// statusMaxDetailPool is the largest pool whose proxies are walked one
	// by one (ProxyStates) to list the quarantined ones; a larger pool
	// shows its counts only.
	statusMaxDetailPool = 10_000
	// statusRenders is how many renders may read Redis at once; a request
	// beyond them waits for one to end, up to the read timeout.
	statusRenders = 2
)

//go:embed status.html
var statusHTML string

var statusTemplate = template.Must(template.New("status").Funcs(template.FuncMap{
	"utc": func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
}).Parse(statusHTML))

// statusPage is serve's read-only page at /: what each pool holds in Redis,
// read at each request within a bounded time, redacted as every output of
// the command (proxies by ID and by their URL with user info masked).
// It is safe for concurrent use.
type statusPage struct {
	pools   []*proxyswitch.Switch
	timeout time.Duration // bound on all the Redis reads of one render
	logger  *slog.Logger
	limits  statusLimits
	renders chan struct{}
}

// statusLimits are the bounds of one render (the statusMax constants; the
// tests lower them).
type statusLimits struct {
	sites, detailSites, rows, detailPool int
}

func newStatusPage(pools []*proxyswitch.Switch, timeout time.Duration, logger *slog.Logger) *statusPage {
	return &statusPage{pools: pools, timeout: timeout, logger: logger,
		limits:  statusLimits{sites: statusMaxSites, detailSites: statusMaxDetailSites, rows: statusMaxRows, detailPool: statusMaxDetailPool},
		renders: make(chan struct{}, statusRenders)}
}

// The page's data.
type (
	statusData struct {
		Now     time.Time
		Refresh int           // seconds
		Timeout time.Duration // the bound on the Redis reads
		Busy    bool          // too many renders at once: nothing read
		Pools   []poolStatus
	}
	poolStatus struct {
		Name string
		// Err says why the reads of the pool stopped (Redis unreachable,
		// too slow): what was read before is shown.
		Err          string
		Proxies      int
		Members      []string
		LiveSessions int
		SitesTotal   int // leased within the idle TTL
		Sites        []siteStatus
		DetailNote   string // why quarantined proxies are not listed, if they are not
		Dead         []proxyRow
		DeadTotal    int
		Paused       []pausedRow // sites whose circuit breaker is open or half-open
		PausedTotal  int
		// Read says which of the counts above were read (a failed read
		// leaves them out rather than show a 0).
		Read map[string]bool
	}
	siteStatus struct {
		proxyswitch.SiteState
		Listed           bool // its quarantined proxies were read
		Quarantine       []proxyRow
		QuarantinedTotal int // proxies (not slots) quarantined, when Listed
	}
	pausedRow struct {
		proxyswitch.SiteBreaker
		Left time.Duration // of an open breaker's pause
	}
	proxyRow struct {
		ID, Proxy, Reason string
		Strikes           int
		Until             time.Time
		Left              time.Duration
		Since             time.Time
	}
)

func (sp *statusPage) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), sp.timeout)
	defer cancel()
	data := statusData{Now: time.Now(), Refresh: int(statusRefresh / time.Second), Timeout: sp.timeout}
	failed := false
	select {
	case sp.renders <- struct{}{}:
		for _, sw := range sp.pools {
			ps := sp.readPool(ctx, sw)
			failed = failed || ps.Err != ""
			data.Pools = append(data.Pools, ps)
		}
		<-sp.renders
	case <-ctx.Done():
		data.Busy, failed = true, true
	}
	var buf bytes.Buffer
	if err := statusTemplate.Execute(&buf, data); err != nil {
		sp.logger.Error("proxyswitch: rendering the status page", "err", err)
		http.Error(w, "proxyswitch: the status page failed to render", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if failed {
		// The page still shows what it could read, and why the rest is
		// missing; the status tells a probe.
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = w.Write(buf.Bytes())
}

// readPool reads what the page shows of sw's pool, stopping at the first
// failed read (with Redis down or hung every further one would fail the
// same way, and the render's time is shared by all pools).
func (sp *statusPage) readPool(ctx context.Context, sw *proxyswitch.Switch) poolStatus {
	ps := poolStatus{Name: sw.Pool(), Read: map[string]bool{}}
	fail := func(what string, err error) poolStatus {
		if errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
			ps.Err = "Redis did not answer within " + sp.timeout.String() + " (reading " + what + "): the rest of this pool is not shown"
		} else {
			ps.Err = "Redis failed reading " + what + ": " + message(err)
		}
		return ps
	}
	used, err := sw.Sites(ctx)
	if err != nil {
		return fail("the sites", err)
	}
	ps.SitesTotal = len(used)
	ps.Read["sites"] = true
	st, err := sw.Stats(ctx, "*")
	if err != nil {
		return fail("the pool size", err)
	}
	ps.Proxies = st.Proxies
	ps.Read["proxies"] = true
	if ps.LiveSessions, err = sw.LiveSessions(ctx); err != nil {
		return fail("the live sessions", err)
	}
	ps.Read["sessions"] = true
	if ps.Members, err = sw.Members(ctx); err != nil {
		return fail("the member list", err)
	}
	ps.Read["members"] = true
	sort.Strings(ps.Members)

	// Counts per site, the most recently leased first.
	used = used[:min(len(used), sp.limits.sites)]
	for _, u := range used {
		s, err := sw.SiteState(ctx, u.Site)
		if err != nil {
			return fail("site "+u.Site, err)
		}
		ps.Sites = append(ps.Sites, siteStatus{SiteState: s})
	}
	// The quarantined proxies, of a bounded number of sites.
	detailed := 0
	for i := range ps.Sites {
		s := &ps.Sites[i]
		if s.Quarantined == 0 {
			continue
		}
		if ps.Proxies > sp.limits.detailPool {
			ps.DetailNote = "the pool has more than " + strconv.Itoa(sp.limits.detailPool) +
				" proxies: its quarantined proxies are not listed here on every refresh (proxyswitch list SITE lists them)"
			break
		}
		if detailed == sp.limits.detailSites {
			ps.DetailNote = "quarantined proxies are listed for the first " + strconv.Itoa(sp.limits.detailSites) +
				" sites with quarantines only (proxyswitch list SITE lists the others)"
			break
		}
		states, err := sw.ProxyStates(ctx, s.Site)
		if err != nil {
			return fail("the proxies on site "+s.Site, err)
		}
		detailed++
		s.Listed = true
		for _, p := range states {
			if p.State != proxyswitch.StateQuarantined {
				continue
			}
			s.QuarantinedTotal++
			s.Quarantine = append(s.Quarantine, proxyRow{ID: p.Proxy.ID(), Proxy: p.Proxy.String(), Reason: quarantineReason(p),
				Strikes: p.Strikes, Until: p.Until, Left: time.Until(p.Until).Round(time.Second)})
		}
		// The quarantines that end last first: those are the ones to look at.
		sort.SliceStable(s.Quarantine, func(a, b int) bool { return s.Quarantine[a].Until.After(s.Quarantine[b].Until) })
		s.Quarantine = s.Quarantine[:min(len(s.Quarantine), sp.limits.rows)]
	}
	// Paused sites: their circuit breaker is open or half-open.
	paused, err := sw.PausedSites(ctx)
	if err != nil {
		return fail("the paused sites", err)
	}
	ps.PausedTotal = len(paused)
	ps.Read["paused"] = true
	for _, p := range paused[:min(len(paused), sp.limits.rows)] {
		ps.Paused = append(ps.Paused, pausedRow{SiteBreaker: p, Left: max(time.Until(p.Until).Round(time.Second), 0)})
	}

	dead, err := sw.Dead(ctx)
	if err != nil {
		return fail("the dead proxies", err)
	}
	ps.DeadTotal = len(dead)
	ps.Read["dead"] = true
	for _, d := range dead[:min(len(dead), sp.limits.rows)] {
		ps.Dead = append(ps.Dead, proxyRow{ID: d.Proxy.ID(), Proxy: d.Proxy.String(), Reason: d.Reason, Since: d.Since})
	}
	return ps
}

// quarantineReason says what holds a quarantined proxy out: the reason
// Redis keeps for it if any, else whether the ban is on this site or on
// every site.
func quarantineReason(p proxyswitch.ProxyState) string {
	switch {
	case p.Reason != "":
		return p.Reason
	case p.BanAllSites:
		return "ban on every site"
	}
	return "ban on this site"
}
