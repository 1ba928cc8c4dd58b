// Package probe is an active health checker for a proxyswitch pool: it
// probes the pool's idle proxies through an echo URL (reachability,
// latency, exit IP), marks those that fail dead before a request finds
// them, and revives them when they recover; optionally it probes sites
// too, quarantining a proxy that cannot reach a site on that site only.
// When every proxy probed fails the echo URL (two at least), the echo URL
// is taken for down rather than the pool: nobody is marked dead, and the
// round fails with ErrEchoDown (Report.EchoDown).
//
// Every probe of a live proxy runs under a lease of that proxy for the
// probed site (Switch.LeaseProxy): a probe never collides with a crawl
// request on the echo site, or on a probed site, and a proxy busy there is
// skipped (it is not idle). The one exception is a proxy a site probe
// quarantined on a site: no request uses it there meanwhile, and it is
// probed there again under that quarantine, which ends early if it passes. The checker marks with a reason of its own
// (Switch.Drain with its reason) and revives only what it marked
// (Switch.Revive with that reason): a proxy an operator drained, or one dead
// of its failures, is left alone.
//
// With Checker.Exits the checker also records each proxy's exit IP, the
// echo URL's answer, in the pool (see Exits): entries that leave from one
// IP then share one proxy's slots on every site, so two requests never
// reach a site from one exit address, and a ban of one holds the IP. A
// change of a proxy's exit IP is noticed at its next probe and counted
// (Result.ExitChanged, Report.ExitChanges, the metric
// proxyswitch_exit_changes_total).
//
// Checker.Check runs one round (the CLI's "proxyswitch probe"); Checker.Run
// runs a round every interval on one member of the fleet at a time: the
// holder of a lock in Redis (a TTL, owner-checked, renewed), so any number
// of processes may run it and the probe load stays one checker's.
package probe

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/engine"
	"github.com/proxyswitch/proxyswitch/internal/hooks"
	"github.com/proxyswitch/proxyswitch/internal/redact"
	"github.com/redis/go-redis/v9"
)

// Defaults of a Checker's zero fields.
const (
	DefaultEvery          = time.Minute
	DefaultTimeout        = 10 * time.Second
	DefaultConcurrency    = 8
	DefaultSiteQuarantine = 10 * time.Minute
	DefaultLockTTL        = 30 * time.Second
	DefaultReason         = "probe"
	DefaultNewEvery       = 5 * time.Second
)

// ErrEchoDown is the error of a round in which every echo probe failed
// (Report.EchoDown): the echo URL, not the proxies, is taken for down, and
// no proxy is marked dead for it. Test it with errors.Is; the error's text
// names the echo site and the first failure, never a password.
var ErrEchoDown = errors.New("probe: echo URL down: every echo probe failed")

// SiteProbe is a site a proxy must reach: a GET of URL through the proxy
// passes with a status from 200 to 399. Site is the site's name as the
// Switch's site function names it; empty is URL's host[:port], lower-cased
// (the default site function's).
type SiteProbe struct {
	URL  string
	Site string
}

// Result is one probe of one proxy.
type Result struct {
	Proxy *proxyswitch.Proxy
	// Site is the probed site: the echo URL's, or a SiteProbe's.
	Site string
	// Echo is true for the echo probe, false for a site probe.
	Echo    bool
	OK      bool
	Latency time.Duration // from sending the request to the end of the answer
	// ExitIP is the address the echo URL saw the request come from (its
	// answer), when it is an IP address; echo probes only.
	ExitIP string
	// ExitChanged is true when Exits is on and the pool had recorded
	// another exit IP for the proxy, OldExitIP; the new one is ExitIP.
	ExitChanged bool
	OldExitIP   string
	// Err is why the probe failed, without the proxy's password.
	Err error
	// Action is what the checker did: "dead" (marked dead), "revived",
	// "quarantined" (on Site), "lifted" (the quarantine on Site a site
	// probe had put it under ended: the probe passed again), or ""
	// (nothing).
	Action string

	own bool // the failure is the proxy's own, whatever the echo URL (ownFault)
}

// Observer is an optional interface of a proxyswitch.Observer: an
// observer set on the Checker's Switch (Switch.SetObserver) that also
// implements it gets every probe the Checker sends (package metrics'
// Collector does). ObserveProbe is called from the goroutine that ran the
// probe, concurrently: it must be fast, must not block and must not panic.
type Observer interface {
	ObserveProbe(Event)
}

// Event is one probe, as an Observer gets it: IDs, never URLs.
type Event struct {
	Pool, Site, ProxyID string
	Echo, OK            bool          // as in Result
	Latency             time.Duration // as in Result
	ExitIP              string        // the echo probe's answer, "" for none
	// ExitChanged: Exits is on and the pool had recorded another exit IP
	// for the proxy.
	ExitChanged bool
}

// Report is what one round did.
type Report struct {
	// Start and End are when the round started and ended: set on the
	// report of every round that started, a failed one's too (zero only
	// when Check failed on its configuration, before any round).
	Start, End  time.Time
	Probed      int // probes sent
	Skipped     int // live proxies not idle on the echo site (leased, cooling or quarantined there)
	Dead        int // proxies marked dead this round
	Revived     int // proxies revived this round
	Quarantined int // (proxy, site) pairs quarantined this round
	Lifted      int // (proxy, site) quarantines of site probes lifted this round: the site probe passed again
	ExitChanges int // proxies whose recorded exit IP changed this round (Exits)
	// SitesDown are the probed sites that every proxy probed there this
	// round failed, two at least: the site is taken for down, and nobody
	// is quarantined on it.
	SitesDown []string
	// EchoDown is true when every echo probe of the round failed, through
	// two distinct proxies at least (those marked dead before included)
	// that were reached: a 5xx of the proxy, an error status of the echo
	// URL, a time-out count; a refused connection to the proxy itself, or
	// its 407, is the proxy's own fault and does not. The echo URL is
	// then taken for down (unreachable from the proxies, mistyped, or
	// failing): nobody is marked dead or revived for it, and the round
	// fails with ErrEchoDown. False by default.
	EchoDown bool
	Results  []Result
}

// Checker probes the proxies of one Switch's pool. Set the fields before
// the first Check or Run and leave them; Check and Run are safe for
// concurrent use (rounds of one Checker are serialised).
type Checker struct {
	// Switch is the pool to check (required).
	Switch *proxyswitch.Switch
	// EchoURL answers a GET with the client's address (an IP, alone on
	// the body's first line) and a 2xx status (required): http or https,
	// with a host, and a port, if given, from 1 to 65535 (else ErrConfig).
	// A proxy whose echo probe fails is marked dead, unless the echo URL
	// itself looks down: when every echo probe of a round fails, through
	// two distinct proxies at least, nobody is marked dead for it
	// (Report.EchoDown, ErrEchoDown). A proxy whose probe fails before any
	// other's passed is marked when the first passes (or at the round's
	// end): it may serve requests meanwhile. A proxy that refuses the
	// connection, or answers 407, is marked at once: its own fault.
	EchoURL string
	// EchoSite names the echo URL's site for leases; empty is its
	// host[:port], lower-cased.
	EchoSite string
	// Sites are optional per-site probes, run for proxies that pass the
	// echo probe; a failure quarantines the proxy on that site only, for
	// SiteQuarantine (a ban with proxyswitch.ReasonSiteProbe: it counts for
	// the site's backoff, and stays on the site whatever Bans.AllSites, the
	// site's circuit breaker or the proxy being a gateway's session). When
	// every proxy probed on a site in a round fails there, two at least,
	// the site is taken for down: nobody is quarantined (Report.SitesDown,
	// a warning).
	// A proxy a site probe quarantined is probed there again in the next
	// rounds (without a lease: its quarantine keeps requests off it there)
	// and, when it passes, its quarantine is lifted (Switch.Unban's
	// effect; Report.Lifted), unless another ban lengthened it since.
	// A failure quarantines at once (no request uses the proxy there
	// meanwhile); a site found down at the round's end has those lifted.
	// Under ScopeGlobal a site probe's quarantine holds the proxy on every
	// site (one scope), its echo probe finds it busy, and it runs out
	// rather than being lifted early.
	Sites []SiteProbe
	// Every is Run's interval; 0 is DefaultEvery.
	Every time.Duration
	// Timeout bounds each probe; 0 is DefaultTimeout.
	Timeout time.Duration
	// Concurrency bounds the probes in flight; 0 is DefaultConcurrency.
	Concurrency int
	// SiteQuarantine is how long a site probe's failure keeps the proxy
	// off the site; 0 is DefaultSiteQuarantine.
	SiteQuarantine time.Duration
	// Exits, when true, records the exit IP of each proxy whose echo probe
	// passes (the answer's IP) in the pool, in Redis: the hash
	// "{prefix:pool}:exit" (proxy ID -> IP) and a set of entries per IP.
	// Leases then treat the entries of one exit IP as one proxy on each
	// site: at most Rotation.Concurrency of their slots out there at once,
	// so a lease, a cooldown or a quarantine of one holds them all (dead
	// entries hold nothing; a quarantine on every site, a proxy failure's
	// too, holds the IP everywhere). When an entry's exit changes, it takes its own
	// state (leases, cooldowns, quarantines) to its new IP, and the old IP
	// stays held as long as the entry would have held it (the IP's hold,
	// not its entries': one left there that moves on is not held); the
	// change is counted (Result.ExitChanged, the pool's meta field
	// "exit_changes"). Exits of proxies no longer in the pool are forgotten
	// at the end of each round. Run also probes, every NewEvery, the live
	// proxies whose exit is not recorded yet (those just added). Off (the
	// default), nothing is recorded, and exits recorded before still apply
	// until their proxies leave the pool. The local shard of WithFallback does not
	// know exits: while it serves, exclusivity is per entry.
	Exits bool
	// Strict (with Exits) closes the window in which an entry's exit is not
	// known yet (just added, a gateway's new session, an echo probe that
	// failed): until a probe records its exit, leases by rotation, sessions
	// and labelled requests do not take it on any site, so it cannot share
	// an IP unseen with an entry in use. Run probes such entries every
	// NewEvery (and whenever the pool changed); the probe's own lease
	// (Switch.LeaseProxy) still takes them. Rounds write the hold, the
	// pool's meta field "strict" (exit_strict.lua), for 3 × Every, a day
	// at most (3 minutes by default, also after a one-shot Check): before a round
	// once some exit is recorded, and after a round that recorded some
	// (a first round holds nothing until it ends). When no strict checker
	// runs any more the hold lapses, and such entries are leased again
	// rather than held for good. A round in which no passing echo answer
	// holds an IP fails with ErrConfig (with Exits, strict or not) and
	// writes no hold; a few such answers (a captive page) leave their
	// proxies' exits unknown, with a warning.
	// While held, an entry shows as free in ProxyStates, and a wait for
	// it reports a proxy freeing within a second. Not held by: Switches
	// of versions before Strict, and the local shard of WithFallback
	// (while it serves, exclusivity is per entry). The fleet's checkers
	// should agree on Strict. Off (the default): an entry with no
	// recorded exit is its own IP until a probe says otherwise.
	Strict bool
	// NewEvery is how often Run looks for proxies without a recorded exit
	// (Exits); 0 is DefaultNewEvery; it is at most Every.
	NewEvery time.Duration
	// Reason is the dead mark's reason (see Switch.Drain); empty is
	// DefaultReason. Checkers that share a reason revive each other's marks.
	Reason string
	// Redis holds Run's lock (required by Run and LockHeld; Check does not use it):
	// the Switch's Redis. The lock's key is beside the pool's keys.
	Redis redis.Scripter
	// LockTTL is the lock's TTL, renewed every third of it; 0 is
	// DefaultLockTTL. A checker that dies hands over within it.
	LockTTL time.Duration
	// Transport, when set, makes the round tripper of each probe through
	// proxy (the default is an http.Transport with the proxy, no
	// keep-alive, no environment proxy).
	Transport func(proxy *url.URL) http.RoundTripper
	// OnResult, when set, gets every probe's Result, from the goroutine
	// that ran it (concurrently).
	OnResult func(Result)
	// OnReport, when set, gets every round's Report (also the rounds of
	// NewEvery that probed something).
	OnReport func(Report)
	// Logger gets a line per proxy marked, revived or quarantined (info)
	// and per failed round (warn); nil is slog.Default(). Nothing logged
	// holds a password.
	Logger *slog.Logger

	mu       sync.Mutex // one round at a time
	isLeader atomic.Bool
	newSeen  atomic.Int64 // the pool's generation at the last round of new proxies
}

type settings struct {
	echoSite string
	sites    []SiteProbe
	every    time.Duration
	timeout  time.Duration
	conc     int
	siteQ    time.Duration
	reason   string
	lockTTL  time.Duration
	newEvery time.Duration
	log      *slog.Logger
}

func (c *Checker) settings() (settings, error) {
	s := settings{every: or(c.Every, DefaultEvery), timeout: or(c.Timeout, DefaultTimeout),
		siteQ: or(c.SiteQuarantine, DefaultSiteQuarantine), lockTTL: or(c.LockTTL, DefaultLockTTL),
		conc: c.Concurrency, reason: c.Reason, log: c.Logger, newEvery: or(c.NewEvery, DefaultNewEvery)}
	s.newEvery = min(s.newEvery, s.every)
	if s.conc == 0 {
		s.conc = DefaultConcurrency
	}
	if s.reason == "" {
		s.reason = DefaultReason
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: probe: "+format, append([]any{proxyswitch.ErrConfig}, a...)...)
	}
	if c.Switch == nil {
		return s, bad("Checker needs a Switch")
	}
	if s.every < 0 || s.timeout < 0 || s.siteQ < 0 || s.lockTTL < 0 || s.conc < 0 || s.newEvery < 0 {
		return s, bad("negative interval, timeout, quarantine, lock TTL or concurrency")
	}
	if c.Strict && !c.Exits {
		return s, bad("Strict needs Exits")
	}
	site, err := siteOf(c.EchoURL, c.EchoSite)
	if err != nil {
		return s, bad("echo URL: %v", err)
	}
	s.echoSite = site
	for i, sp := range c.Sites {
		site, err := siteOf(sp.URL, sp.Site)
		if err != nil {
			return s, bad("site #%d: %v", i+1, err)
		}
		s.sites = append(s.sites, SiteProbe{URL: sp.URL, Site: site})
	}
	return s, nil
}

func or(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// siteOf checks a probe URL and returns its site.
func siteOf(raw, site string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || u.User != nil {
		return "", errors.New("want an http or https URL with a host and no user info")
	}
	// url.Parse takes "host:" (an empty port), which the transport would
	// dial as port 80 or fail on; a port must be a number in range.
	if i := strings.LastIndexByte(u.Host, ':'); i > strings.LastIndexByte(u.Host, ']') {
		if n, err := strconv.Atoi(u.Host[i+1:]); err != nil || n < 1 || n > 65535 {
			return "", fmt.Errorf("port %q of %q: want a number from 1 to 65535", u.Host[i+1:], u.Host)
		}
	}
	if site == "" {
		site = strings.ToLower(u.Host)
	}
	return site, nil
}

// Check runs one round now: it probes every proxy of the pool idle on the
// echo site (leasing it there first; a busy one is skipped) and every
// proxy this checker's Reason marked dead (those are out of every
// rotation: no lease is taken, and one still leased on the echo site by a
// request that started before the mark is skipped), marks dead the live
// ones that fail, revives the marked ones that pass, and runs the site
// probes on the proxies that passed. Drained proxies and those dead of
// their failures are not probed. At most Concurrency probes run at once,
// each within Timeout. The error is the round's (Redis, configuration
// before any probe, with a zero Report; ErrEchoDown when every echo probe
// failed: then nobody was marked dead): a probe's failure is in its
// Result. The Report is complete, End included, also with an error.
func (c *Checker) Check(ctx context.Context) (Report, error) {
	s, err := c.settings()
	if err != nil {
		return Report{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	rep, err := c.round(ctx, s, false)
	if err != nil {
		s.log.Warn("proxyswitch probe: round failed", "pool", c.Switch.Pool(), "err", err.Error())
	}
	if c.OnReport != nil {
		c.OnReport(rep)
	}
	return rep, err
}

// checkNew runs a round of the live proxies idle on the echo site whose
// exit IP is not recorded yet (Exits): those just added; none when the
// pool records as many exits as it has proxies (two HLENs). It reports a
// Report to OnReport only when it probed something.
func (c *Checker) checkNew(ctx context.Context) error {
	s, err := c.settings()
	if err != nil {
		return err
	}
	// As many exits as proxies, and the pool unchanged since the last
	// such round: nothing new to probe. (The count alone would miss a
	// proxy that replaced one whose stale exit the next full round
	// forgets, as a gateway's rotated session does.)
	base, err := c.keyBase()
	if err != nil {
		return err
	}
	n, err := exitListScript.Run(ctx, hooks.Redis(c.Switch), []string{base + ":exit", base + ":proxies", base + ":meta"}, "count").Int64Slice()
	if err != nil {
		return fmt.Errorf("probe: count exit IPs: %w", err)
	}
	if len(n) != 3 {
		return fmt.Errorf("%w: probe: exit_list count answered %d items", proxyswitch.ErrCorrupt, len(n))
	}
	if n[1] >= n[0] && n[2] == c.newSeen.Load() {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	rep, err := c.round(ctx, s, true)
	if err == nil {
		c.newSeen.Store(n[2])
	}
	if err != nil {
		s.log.Warn("proxyswitch probe: round of new proxies failed", "pool", c.Switch.Pool(), "err", err.Error())
	}
	if c.OnReport != nil && rep.Probed > 0 {
		c.OnReport(rep)
	}
	return err
}

// round probes the pool (fresh: only the live proxies without a recorded
// exit IP). The report is named: its End, set when the round returns,
// reaches the caller.
func (c *Checker) round(ctx context.Context, s settings, fresh bool) (rep Report, err error) {
	rep = Report{Start: time.Now()}
	defer func() { rep.End = time.Now() }()
	states, err := c.Switch.ProxyStates(ctx, s.echoSite)
	if err != nil {
		return rep, err
	}
	known, err := c.exits(ctx)
	if err != nil {
		return rep, err
	}
	// Strict: the hold is renewed before a round (a long round does not
	// outlive it) once exits are known, and after a round that recorded
	// some; a first round over a pool with none holds nothing until its
	// end.
	strict := c.Strict && !fresh
	if strict && len(known) > 0 {
		if err := c.holdUnknown(ctx, strictHold(s)); err != nil {
			return rep, err
		}
	}
	type job struct {
		p      *proxyswitch.Proxy
		marked bool // marked dead by this checker's reason
	}
	var jobs []job
	for _, st := range states {
		if fresh {
			if _, ok := known[st.Proxy.ID()]; ok || st.State == proxyswitch.StateDead || st.State == proxyswitch.StateDrained {
				continue
			}
		}
		switch {
		case st.State == proxyswitch.StateDead && st.Reason == s.reason:
			if st.LeasedSlots == 0 {
				jobs = append(jobs, job{p: st.Proxy, marked: true})
			}
		case st.State == proxyswitch.StateDead || st.State == proxyswitch.StateDrained:
		case st.FreeSlots > 0:
			jobs = append(jobs, job{p: st.Proxy})
		default:
			rep.Skipped++
		}
	}
	var mu sync.Mutex
	obs := c.observers()
	add := func(r Result) {
		if c.OnResult != nil {
			c.OnResult(r)
		}
		if len(obs) > 0 {
			ev := Event{Pool: c.Switch.Pool(), Site: r.Site, ProxyID: r.Proxy.ID(), Echo: r.Echo, OK: r.OK,
				Latency: r.Latency, ExitIP: r.ExitIP, ExitChanged: r.ExitChanged}
			for _, o := range obs {
				o.ObserveProbe(ev)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		rep.Results = append(rep.Results, r)
		rep.Probed++
		if r.ExitChanged {
			rep.ExitChanges++
		}
		switch r.Action {
		case "dead":
			rep.Dead++
		case "revived":
			rep.Revived++
		case "quarantined":
			rep.Quarantined++
		case "lifted":
			rep.Lifted++
		}
	}
	sv := &siteVerdicts{passed: map[string]int{}, failed: map[string][]siteFailure{}}
	ev := &echoVerdicts{failed: map[string]bool{}}
	if err := c.heldOnSites(ctx, s, sv); err != nil {
		return rep, err
	}
	var firstErr error
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if firstErr == nil {
			firstErr = err
		}
	}
	// The proxies of one recorded exit IP are probed one after the other
	// (their leases on a site exclude each other), the rest at once, at
	// most s.conc probes in flight. With Exits, the live proxies found
	// busy on the echo site get one more pass, grouped by the exits known
	// then: an entry whose twin's exit this round recorded meanwhile
	// found the IP busy with the twin's probe.
	pass := func(jobs []job) (busy []job) {
		var groups [][]job
		byExit := map[string]int{}
		for _, j := range jobs {
			if ip, ok := known[j.p.ID()]; ok {
				if g, ok := byExit[ip]; ok {
					groups[g] = append(groups[g], j)
					continue
				}
				byExit[ip] = len(groups)
			}
			groups = append(groups, []job{j})
		}
		var busyMu sync.Mutex
		sem := make(chan struct{}, s.conc)
		var wg sync.WaitGroup
		for _, g := range groups {
			if ctx.Err() != nil {
				break
			}
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				for _, j := range g {
					if ctx.Err() != nil {
						return
					}
					ok, skipped, err := c.checkOne(ctx, s, j.p, j.marked, add, ev)
					if err != nil {
						fail(err)
						return
					}
					if skipped {
						busyMu.Lock()
						busy = append(busy, j)
						busyMu.Unlock()
					}
					if ok {
						for _, sp := range s.sites {
							if err := c.checkSite(ctx, s, j.p, sp, add, sv); err != nil {
								fail(err)
							}
						}
					}
				}
			}()
		}
		wg.Wait()
		return busy
	}
	busy := pass(jobs)
	if c.Exits && len(busy) > 0 && ctx.Err() == nil {
		if known, err = c.exits(ctx); err != nil {
			fail(err)
		} else {
			busy = pass(busy)
		}
	}
	mu.Lock()
	rep.Skipped += len(busy)
	mu.Unlock()
	echoDown, err := c.settleEcho(ctx, s, ev, add)
	if err != nil {
		fail(err)
	}
	rep.EchoDown = echoDown != nil
	down, err := c.settleSites(ctx, s, sv, add)
	rep.SitesDown = down
	if err != nil {
		fail(err)
	}
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	if firstErr == nil {
		firstErr = echoDown
	}
	if firstErr == nil && c.Exits {
		// An echo answer with no IP records nothing: under Strict its
		// proxy would be held for good while the round looked fine.
		noIP, withIP := 0, 0
		for _, r := range rep.Results {
			switch {
			case !r.Echo || !r.OK:
			case r.ExitIP == "":
				noIP++
			default:
				withIP++
			}
		}
		switch {
		case noIP > 0 && withIP == 0:
			firstErr = fmt.Errorf("%w: probe: the echo URL's answer held no IP address for any of %d passing proxies (Exits needs the client's IP alone on the first line)",
				proxyswitch.ErrConfig, noIP)
		case noIP > 0: // a few proxies answer for the echo (a captive page, say): theirs stay unknown
			s.log.Warn("proxyswitch probe: echo answers with no IP address: their exits stay unknown",
				"pool", c.Switch.Pool(), "proxies", noIP)
		}
		if firstErr == nil && strict && len(known)+withIP > 0 {
			firstErr = c.holdUnknown(ctx, strictHold(s))
		}
	}
	if firstErr == nil && c.Exits && !fresh {
		// Forget the exits of proxies no longer in the pool.
		in := make(map[string]bool, len(states))
		for _, st := range states {
			in[st.Proxy.ID()] = true
		}
		var gone []string
		for id := range known {
			if !in[id] {
				gone = append(gone, id)
			}
		}
		for len(gone) > 0 && firstErr == nil {
			n := min(len(gone), forgetBatch)
			args := make([]string, 0, 2*n)
			for _, id := range gone[:n] {
				args = append(args, id, "")
			}
			_, firstErr = c.noteExits(ctx, args...)
			gone = gone[n:]
		}
	}
	return rep, firstErr
}

// checkOne runs the echo probe of p and acts on it. It reports whether p
// is alive, and whether it was skipped (busy on the echo site); the error
// is Redis'. A live proxy's failure that may be the echo URL's, before any
// probe of the round passed, is held in ev: the first pass marks the held
// ones dead (here), or settleEcho does at the round's end.
func (c *Checker) checkOne(ctx context.Context, s settings, p *proxyswitch.Proxy, marked bool, add func(Result), ev *echoVerdicts) (ok, skipped bool, err error) {
	var l *proxyswitch.Lease
	if !marked {
		if l, err = c.lease(ctx, s, s.echoSite, p); l == nil {
			return false, err == nil, err
		}
		defer l.Release(context.WithoutCancel(ctx))
	}
	r := c.probe(ctx, s, p, c.EchoURL, true)
	r.Site = s.echoSite
	if r.OK && c.Exits && r.ExitIP != "" {
		res, err := c.noteExits(ctx, p.ID(), r.ExitIP)
		if err != nil {
			return false, false, err
		}
		if res[0].code == 2 {
			r.ExitChanged, r.OldExitIP = true, res[0].old
			s.log.Info("proxyswitch probe: exit IP changed", "pool", c.Switch.Pool(), "proxy", p.String(),
				"old", res[0].old, "new", r.ExitIP)
		}
	}
	var flush []Result
	if r.OK {
		flush = ev.pass()
	} else if ctx.Err() == nil && !r.own && ev.fail(r, marked) {
		return false, false, nil // held until the echo URL is known up (settleEcho)
	}
	var flushErr error
	for _, f := range flush {
		if flushErr == nil && ctx.Err() == nil {
			flushErr = c.markDead(ctx, s, &f)
		}
		add(f)
	}
	if flushErr != nil {
		return false, false, flushErr
	}
	switch {
	case !r.OK && !marked:
		if ctx.Err() != nil {
			return false, false, nil // the round ended, not the proxy
		}
		if err := c.markDead(ctx, s, &r); err != nil {
			return false, false, err
		}
	case r.OK && marked:
		n, err := c.Switch.Revive(ctx, s.reason, p.ID())
		if err != nil {
			return false, false, err
		}
		if n > 0 {
			r.Action = "revived"
			s.log.Info("proxyswitch probe: proxy revived", "pool", c.Switch.Pool(), "proxy", p.String(), "latency", r.Latency)
		}
	}
	add(r)
	return r.OK, false, nil
}

// markDead marks r's proxy dead with the checker's reason (it failed its
// echo probe) and sets r.Action when it was marked. The error is Redis'.
func (c *Checker) markDead(ctx context.Context, s settings, r *Result) error {
	n, err := c.Switch.Drain(ctx, s.reason, r.Proxy.ID())
	if err != nil {
		return err
	}
	if n > 0 {
		r.Action = "dead"
		s.log.Info("proxyswitch probe: proxy marked dead", "pool", c.Switch.Pool(), "proxy", r.Proxy.String(), "err", r.Err.Error())
	}
	return nil
}

// ownFault reports whether a round trip's error through a proxy is the
// proxy's own, whatever the target: the proxy could not be reached (a
// refused connection, no route, a dial timeout: the transport's
// "proxyconnect"), or refused the credentials of a CONNECT (407). Such a
// failure is no sign of the echo URL being down (nor is a plain request's
// answer 407: Result.own), and marks the proxy dead at once.
func ownFault(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "proxyconnect" ||
		strings.HasSuffix(err.Error(), http.StatusText(http.StatusProxyAuthRequired))
}

// echoVerdicts are a round's echo probes as they bear on the echo URL:
// whether any passed, the distinct proxies whose failure may be the echo
// URL's, and the live ones among those held unmarked until a pass shows
// the echo URL up (or the round ends: settleEcho).
type echoVerdicts struct {
	mu      sync.Mutex
	passed  int
	failed  map[string]bool // proxy ID -> failed (marked ones too)
	pending []Result        // live proxies' failures, not marked yet
	first   error           // the first failure, for the round's error
}

// pass notes a passing echo probe; the first returns the failures held
// until then, to be marked dead.
func (ev *echoVerdicts) pass() []Result {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	ev.passed++
	held := ev.pending
	ev.pending = nil
	return held
}

// fail notes a failed echo probe that may be the echo URL's fault; for a
// live proxy, before any probe passed, it holds r and reports true (the
// caller leaves it unmarked for now).
func (ev *echoVerdicts) fail(r Result, marked bool) (held bool) {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	ev.failed[r.Proxy.ID()] = true
	if ev.first == nil {
		ev.first = r.Err
	}
	if ev.passed > 0 || marked {
		return false
	}
	ev.pending = append(ev.pending, r)
	return true
}

// settleEcho settles the echo probes held at the round's end: when no echo
// probe passed and two distinct proxies at least failed it (not of their
// own fault), the echo URL is taken for down: nobody is marked, it is
// logged, and down is an ErrEchoDown. Otherwise the held proxies are marked
// dead (one proxy alone cannot tell its own fault from the echo URL's). A
// round that ended (ctx) marks nobody. The error is Redis'.
func (c *Checker) settleEcho(ctx context.Context, s settings, ev *echoVerdicts, add func(Result)) (down, err error) {
	ev.mu.Lock()
	held, votes, passed, first := ev.pending, len(ev.failed), ev.passed, ev.first
	ev.pending = nil
	ev.mu.Unlock()
	switch {
	case passed == 0 && votes >= 2 && ctx.Err() == nil:
		s.log.Warn("proxyswitch probe: every echo probe failed; taking the echo URL for down, marking nobody dead",
			"pool", c.Switch.Pool(), "site", s.echoSite, "proxies", votes, "err", first.Error())
		down = fmt.Errorf("%w (%s, through %d proxies); nobody marked dead; first failure: %v",
			ErrEchoDown, s.echoSite, votes, first)
	case ctx.Err() == nil:
		for i := range held {
			if err = c.markDead(ctx, s, &held[i]); err != nil {
				break
			}
		}
	}
	for _, r := range held {
		add(r)
	}
	return down, err
}

// lease leases p on site for one probe, long enough for it: nil with no
// error when p is not free there.
func (c *Checker) lease(ctx context.Context, s settings, site string, p *proxyswitch.Proxy) (*proxyswitch.Lease, error) {
	l, err := c.Switch.LeaseProxy(ctx, site, p.ID())
	if errors.Is(err, proxyswitch.ErrNoProxy) || errors.Is(err, proxyswitch.ErrEmptyPool) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if time.Until(l.Expiry()) < s.timeout+time.Second {
		if err := l.Extend(ctx, s.timeout+time.Second); err != nil {
			_ = l.Release(context.WithoutCancel(ctx))
			return nil, err
		}
	}
	return l, nil
}

// siteVerdicts are a round's site probes: passes counted per site, the
// failures held (with their leases) until the round ends, when
// settleSites tells a site down from proxies that cannot reach it; and
// held, the proxies under a quarantine a site probe put them under, by
// site, as the round started (heldOnSites).
type siteVerdicts struct {
	mu     sync.Mutex
	passed map[string]int
	failed map[string][]siteFailure
	held   map[string]map[string]bool
}

// heldOnSites reads, for each probed site, the proxies still under the
// quarantine a site probe put them under there (site_hold.lua): those are
// probed again without a lease, and lifted if they pass.
func (c *Checker) heldOnSites(ctx context.Context, s settings, sv *siteVerdicts) error {
	sv.held = map[string]map[string]bool{}
	for _, sp := range s.sites {
		if sv.held[sp.Site] != nil {
			continue
		}
		ids, err := hooks.SiteHold(ctx, c.Switch, "list", sp.Site, nil, 0)
		if err != nil {
			return err
		}
		sv.held[sp.Site] = map[string]bool{}
		for _, id := range ids {
			sv.held[sp.Site][id] = true
		}
	}
	return nil
}

// ledgerMargin is how long the ledger of a site's probe quarantines
// outlives the latest of them.
const ledgerMargin = time.Minute

// recheckSite probes p on a site it is quarantined on by a site probe:
// without a lease (none is to be had), which the quarantine makes safe: no
// request uses p on the site meanwhile. A pass lifts the quarantine, if it
// is still the probe's (site_hold.lua), and counts for the site being up;
// a failure leaves it to run out.
func (c *Checker) recheckSite(ctx context.Context, s settings, p *proxyswitch.Proxy, sp SiteProbe, add func(Result), sv *siteVerdicts) error {
	// The list was read as the round started: the quarantine may have run
	// out, or been lifted, since (and a request may hold the proxy there
	// now). Without a lease, probe only under a quarantine that outlasts
	// the probe.
	still, err := hooks.SiteHold(ctx, c.Switch, "held", sp.Site, []string{p.ID()}, s.timeout+time.Second)
	if err != nil || len(still) == 0 {
		return err
	}
	r := c.probe(ctx, s, p, sp.URL, false)
	r.Site = sp.Site
	if r.OK {
		sv.mu.Lock()
		sv.passed[sp.Site]++
		sv.mu.Unlock()
		ids, err := hooks.SiteHold(ctx, c.Switch, "lift", sp.Site, []string{p.ID()}, 0)
		if err != nil {
			return err
		}
		if len(ids) == 1 {
			r.Action = "lifted"
			s.log.Info("proxyswitch probe: site probe passed again; quarantine lifted", "pool", c.Switch.Pool(),
				"proxy", p.String(), "site", sp.Site)
		}
	}
	add(r)
	return nil
}

// siteFailure is a failed site probe: its result, and whether its
// proxy was quarantined on the site for it (and noted in the ledger).
type siteFailure struct {
	r           Result
	quarantined bool
}

// checkSite runs one site probe of p under a lease on the site. A pass is
// counted and its lease released. A failure quarantines p on the site at
// once (the lease ends with it: p serves no request there meanwhile) and
// is noted in the ledger and kept in sv for settleSites, which lifts it
// again if the site turns out down.
func (c *Checker) checkSite(ctx context.Context, s settings, p *proxyswitch.Proxy, sp SiteProbe, add func(Result), sv *siteVerdicts) error {
	l, err := c.lease(ctx, s, sp.Site, p)
	if l == nil {
		if err == nil && sv.held[sp.Site][p.ID()] {
			return c.recheckSite(ctx, s, p, sp, add, sv)
		}
		return err
	}
	r := c.probe(ctx, s, p, sp.URL, false)
	r.Site = sp.Site
	if r.OK || ctx.Err() != nil {
		if r.OK {
			sv.mu.Lock()
			sv.passed[sp.Site]++
			sv.mu.Unlock()
		}
		add(r)
		return l.Release(context.WithoutCancel(ctx))
	}
	f := siteFailure{r: r}
	defer func() {
		sv.mu.Lock()
		sv.failed[sp.Site] = append(sv.failed[sp.Site], f)
		sv.mu.Unlock()
	}()
	if err := l.Report(ctx, ban.Verdict{Kind: ban.Ban, Reason: proxyswitch.ReasonSiteProbe, RetryAfter: s.siteQ}); err != nil {
		_ = l.Release(context.WithoutCancel(ctx))
		return err
	}
	f.quarantined = true
	// The ledger a later round lifts it from when it passes again.
	_, err = hooks.SiteHold(ctx, c.Switch, "note", sp.Site, []string{p.ID()}, ledgerMargin)
	return err
}

// settleSites settles the round's failed site probes: a site that every
// proxy probed there failed, two at least, is down: the quarantines its
// probes put are lifted again (nobody stays quarantined for it; liftChunk
// proxies per site_hold.lua call), and it is logged and returned. One proxy alone cannot tell its own fault from the
// site's: it stays quarantined. On the other sites each proxy that failed
// stays quarantined on that site only, for SiteQuarantine
// (proxyswitch.ReasonSiteProbe). A round that ended (ctx) lifts nothing.
// The error is the first Redis error.
func (c *Checker) settleSites(ctx context.Context, s settings, sv *siteVerdicts, add func(Result)) ([]string, error) {
	var down []string
	var firstErr error
	for _, sp := range s.sites {
		fails := sv.failed[sp.Site]
		if len(fails) == 0 {
			continue
		}
		delete(sv.failed, sp.Site) // a site probed twice (two SiteProbes of one site) is settled once
		proxies := map[string]bool{}
		for _, f := range fails {
			proxies[f.r.Proxy.ID()] = true
		}
		lifted := map[string]bool{}
		if ctx.Err() == nil && sv.passed[sp.Site] == 0 && len(proxies) >= 2 {
			down = append(down, sp.Site)
			s.log.Warn("proxyswitch probe: every proxy failed the site probe; taking the site for down, quarantining nobody",
				"pool", c.Switch.Pool(), "site", sp.Site, "proxies", len(proxies), "err", fails[0].r.Err.Error())
			all := slices.Collect(maps.Keys(proxies))
			for chunk := range slices.Chunk(all, liftChunk) {
				ids, err := hooks.SiteHold(ctx, c.Switch, "lift", sp.Site, chunk, 0)
				if err != nil {
					if firstErr == nil {
						firstErr = err
					}
					break
				}
				for _, id := range ids {
					lifted[id] = true
				}
			}
		}
		for _, f := range fails {
			if f.quarantined && !lifted[f.r.Proxy.ID()] {
				f.r.Action = "quarantined"
				s.log.Info("proxyswitch probe: proxy quarantined on a site", "pool", c.Switch.Pool(), "proxy", f.r.Proxy.String(),
					"site", sp.Site, "for", s.siteQ, "err", f.r.Err.Error())
			}
			add(f.r)
		}
	}
	return down, firstErr
}

// forgetBatch is how many exits of proxies gone from the pool one
// exit_note.lua call forgets. Each still looks at the proxy's slots on the
// pool's 256 last sites (what it would carry: nothing, for a proxy that
// left), about 0.24 ms per proxy per slot there: 50 keep a call near
// 12 ms per slot of Rotation.Concurrency (100 took 24 ms at one slot).
const forgetBatch = 50

// liftChunk is how many proxies one site_hold.lua "lift" call takes when a
// site is found down: its work is per proxy, so a large pool's lift goes
// in calls of bounded work. A test sets it smaller.
var liftChunk = 500

// maxEcho bounds the echo answer read.
const maxEcho = 1 << 10

// probe sends one GET of target through p within the timeout.
func (c *Checker) probe(ctx context.Context, s settings, p *proxyswitch.Proxy, target string, echo bool) Result {
	r := Result{Proxy: p, Echo: echo}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var rt http.RoundTripper
	if c.Transport != nil {
		rt = c.Transport(p.URL())
	} else {
		tr := &http.Transport{Proxy: http.ProxyURL(p.URL()), DisableKeepAlives: true}
		defer tr.CloseIdleConnections()
		rt = tr
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		r.Err = errors.New("probe: bad URL")
		return r
	}
	start := time.Now()
	resp, err := rt.RoundTrip(req)
	if err != nil {
		r.own = ownFault(err)
		r.Err = redactErr(err, p)
		r.Latency = time.Since(start)
		return r
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxEcho))
	resp.Body.Close()
	r.Latency = time.Since(start)
	if err != nil {
		r.Err = redactErr(err, p)
		return r
	}
	if echo && (resp.StatusCode < 200 || resp.StatusCode > 299) || !echo && (resp.StatusCode < 200 || resp.StatusCode > 399) {
		r.Err = fmt.Errorf("probe via %s: answered %s", p, resp.Status)
		r.own = resp.StatusCode == http.StatusProxyAuthRequired
		return r
	}
	if echo {
		line, _, _ := strings.Cut(string(body), "\n")
		if ip := net.ParseIP(strings.TrimSpace(line)); ip != nil {
			r.ExitIP = ip.String()
		}
	}
	r.OK = true
	return r
}

// redactErr is err's text without p's user info: a transport's error may
// quote the proxy's URL.
func redactErr(err error, p *proxyswitch.Proxy) error {
	return fmt.Errorf("probe via %s: %s", p, redact.Credentials(err.Error(), p.URL(), p.String()))
}

// leaderKey is the lock's key: beside the pool's keys, in its hash tag.
func (c *Checker) leaderKey() (string, error) {
	base, err := c.keyBase()
	if err != nil {
		return "", err
	}
	return base + ":probe-leader", nil
}

// keyBase is the pool's "{prefix:pool}".
func (c *Checker) keyBase() (string, error) {
	if c.Switch == nil {
		return "", fmt.Errorf("%w: probe: Checker needs a Switch", proxyswitch.ErrConfig)
	}
	base, err := engine.KeyBase(hooks.Prefix(c.Switch), c.Switch.Pool())
	if err != nil {
		return "", fmt.Errorf("%w: probe: %v", proxyswitch.ErrConfig, err)
	}
	return base, nil
}

var (
	leaderScript     = engine.Root.Script("leader")
	exitNoteScript   = engine.Root.Script("exit_note")
	exitListScript   = engine.Root.Script("exit_list")
	exitStrictScript = engine.Root.Script("exit_strict")
)

// exitNote is exit_note.lua's answer for one proxy: 0 unchanged, 1 first
// recorded, 2 changed, 3 forgotten, -1 not in the pool; old is the IP
// recorded before ("" for none).
type exitNote struct {
	code int64
	old  string
}

// noteExits records the exit IPs of pairs (proxy ID, IP; IP "" forgets).
func (c *Checker) noteExits(ctx context.Context, pairs ...string) ([]exitNote, error) {
	base, err := c.keyBase()
	if err != nil {
		return nil, err
	}
	args := make([]any, 0, 1+len(pairs))
	args = append(args, base)
	for _, p := range pairs {
		args = append(args, p)
	}
	res, err := exitNoteScript.Run(ctx, hooks.Redis(c.Switch), []string{base + ":exit", base + ":sites", base + ":meta", base + ":proxies"}, args...).Slice()
	if err != nil {
		return nil, fmt.Errorf("probe: record exit IPs: %w", err)
	}
	if len(res) != len(pairs) {
		return nil, fmt.Errorf("%w: probe: exit_note answered %d items for %d", proxyswitch.ErrCorrupt, len(res), len(pairs))
	}
	out := make([]exitNote, len(res)/2)
	for i := range out {
		out[i].code, _ = res[2*i].(int64)
		out[i].old, _ = res[2*i+1].(string)
	}
	return out, nil
}

// strictHold is how long a strict round's hold lasts: three rounds, at
// most a day (exit_strict.lua's bound), whatever Every is (3 × Every
// would overflow beyond about 97 years).
func strictHold(s settings) time.Duration {
	const most = 24 * time.Hour
	if s.every >= most/3 {
		return most
	}
	return 3 * s.every
}

// holdUnknown makes leases hold the entries with no recorded exit for d
// (Strict).
func (c *Checker) holdUnknown(ctx context.Context, d time.Duration) error {
	base, err := c.keyBase()
	if err != nil {
		return err
	}
	if err := exitStrictScript.Run(ctx, hooks.Redis(c.Switch), []string{base + ":meta"}, d.Milliseconds()).Err(); err != nil {
		return fmt.Errorf("probe: strict exits: %w", err)
	}
	return nil
}

// exits reads the recorded exit IPs: proxy ID -> IP.
func (c *Checker) exits(ctx context.Context) (map[string]string, error) {
	base, err := c.keyBase()
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	cursor := "0"
	for first := true; first || cursor != "0"; first = false {
		res, err := exitListScript.Run(ctx, hooks.Redis(c.Switch), []string{base + ":exit"}, "page", cursor, exitPage).StringSlice()
		if err != nil {
			return nil, fmt.Errorf("probe: read exit IPs: %w", err)
		}
		if len(res)%2 != 1 {
			return nil, fmt.Errorf("%w: probe: exit_list page of %d items", proxyswitch.ErrCorrupt, len(res))
		}
		cursor = res[0]
		for i := 1; i+1 < len(res); i += 2 {
			out[res[i]] = res[i+1]
		}
	}
	return out, nil
}

// exitPage is the HSCAN count of one exit_list.lua page: the exit IPs are
// read in calls of bounded work, whatever the pool's size (issue 14). A
// test sets it smaller.
var exitPage = 500

// ExitIPs returns the exit IP recorded for each proxy of the pool (proxy
// ID -> IP), as the checkers with Exits found them, read 500 proxies per
// call (a large pool's read is not one instant: an exit recorded or
// changed meanwhile may be read or not). It is safe for concurrent use.
func (c *Checker) ExitIPs(ctx context.Context) (map[string]string, error) { return c.exits(ctx) }

// observers returns the Switch's observers that implement Observer.
func (c *Checker) observers() []Observer {
	var out []Observer
	for _, o := range hooks.Observers(c.Switch) {
		if po, ok := o.(Observer); ok {
			out = append(out, po)
		}
	}
	return out
}

// Leader reports whether this Checker's Run holds the lock now.
func (c *Checker) Leader() bool { return c.isLeader.Load() }

// Run checks the pool every Every while this process holds the lock,
// until ctx ends; then it gives the lock up and returns ctx's error (or a
// configuration error at once). Every third of LockTTL it takes the lock
// if it is free or renews it; a holder that cannot renew (Redis down, or
// the lock found taken over), or whose last renewal is three quarters of
// the TTL old, stops its round at once: two processes never probe at once. A round's failure is
// logged and the next comes at the next tick. Run a Checker's Run once at
// a time.
func (c *Checker) Run(ctx context.Context) error {
	s, err := c.settings()
	if err != nil {
		return err
	}
	if c.Redis == nil {
		return fmt.Errorf("%w: probe: Run needs Redis for its lock", proxyswitch.ErrConfig)
	}
	key, err := c.leaderKey()
	if err != nil {
		return err
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	token := hex.EncodeToString(b[:])
	// hold takes or renews the lock; it reports whether this process
	// holds it, and when it was sent (the lock lives ttl from a moment
	// after that).
	hold := func() (bool, time.Time) {
		sent := time.Now()
		cctx, cancel := context.WithTimeout(ctx, s.lockTTL/3)
		defer cancel()
		n, err := leaderScript.Run(cctx, c.Redis, []string{key}, "hold", token, s.lockTTL.Milliseconds()).Int64()
		if err != nil && ctx.Err() == nil {
			s.log.Warn("proxyswitch probe: lock", "pool", c.Switch.Pool(), "err", err.Error())
		}
		return err == nil && n == 1, sent
	}
	defer func() {
		c.isLeader.Store(false)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = leaderScript.Run(rctx, c.Redis, []string{key}, "release", token, 0).Err()
	}()

	// Leadership ends when a hold fails, or when the last successful one
	// is three quarters of a TTL old (renewals late under load): the
	// running round is cancelled then, a quarter TTL before another
	// process may take the lock.
	var roundMu sync.Mutex
	var cancelRound context.CancelFunc
	lose := func() {
		c.isLeader.Store(false)
		roundMu.Lock()
		if cancelRound != nil {
			cancelRound()
		}
		roundMu.Unlock()
	}
	expire := time.AfterFunc(time.Hour, lose)
	expire.Stop()
	defer expire.Stop()
	setLeader := func(ok bool, sent time.Time) {
		if !ok {
			expire.Stop()
			lose()
			return
		}
		left := time.Until(sent.Add(s.lockTTL * 3 / 4))
		if left <= 0 {
			lose()
			return
		}
		expire.Reset(left)
		c.isLeader.Store(true)
	}
	setLeader(hold())
	keeper := make(chan struct{})
	go func() {
		defer close(keeper)
		t := time.NewTicker(s.lockTTL / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				setLeader(hold())
			}
		}
	}()
	defer func() { <-keeper }()
	t := time.NewTicker(s.every)
	defer t.Stop()
	// With Exits, the proxies without a recorded exit (new ones) are
	// probed every newEvery between the rounds.
	var fresh <-chan time.Time
	if c.Exits && s.newEvery < s.every {
		ft := time.NewTicker(s.newEvery)
		defer ft.Stop()
		fresh = ft.C
	}
	full := true
	for {
		if c.isLeader.Load() {
			rctx, cancel := context.WithCancel(ctx)
			roundMu.Lock()
			cancelRound = cancel
			roundMu.Unlock()
			if c.isLeader.Load() { // not lost between the check and the registration
				if full {
					_, _ = c.Check(rctx)
				} else {
					_ = c.checkNew(rctx)
				}
			}
			roundMu.Lock()
			cancelRound = nil
			roundMu.Unlock()
			cancel()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			full = true
		case <-fresh:
			full = false
		}
	}
}
