package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/probe"
	"github.com/proxyswitch/proxyswitch/source"
)

// The sync and probe commands: the CLI faces of packages source and probe.

func init() {
	commandHelp["sync"] = `usage: proxyswitch [flags] sync (-url URL | -file FILE) [-every D] [-once] [options]

Keeps the pool equal to a proxy list: a provider's HTTP API (-url) or a
file (-file), read every D (default 5m) until interrupted, or once with
-once. Each sync writes only when the list changed: one atomic replace
while the pool and the list hold up to 500 proxies (a gateway entry
counting its N sessions), in steps of bounded work beyond (meanwhile
workers see the sets in between: the old one shrinking to the proxies both
share, even to none, then growing); it prints what it did. A list that
fails (HTTP error, time-out, an invalid line, garbage) or that holds fewer
than -min-fraction of the pool's proxies (an empty one included) changes
nothing (-no-guard lets it through).
Lines are URLs, host:port, user:pass@host:port or host:port:user:pass.

  -url URL            GET the list from URL (its query and user info are never printed)
  -file FILE          read the list from FILE
  -header 'K: V'      a request header (repeatable)
  -token-file FILE    send "Authorization: Bearer <the file's first line>"
  -json PATH          the body is JSON: a list of strings at PATH (dot-separated
                      object keys; "." for the body itself); default: lines
  -timeout D          bound on one HTTP fetch (default 30s)
  -every D            interval (default 5m)
  -once               one sync, then exit (1 if it failed or was refused)
  -min-fraction F     the guard's threshold (default 0.5)
  -no-guard           accept any list, an empty one too`
	commandHelp["probe"] = `usage: proxyswitch [flags] probe -echo URL [-site URL]... [-every D] [options]

Probes the pool's idle proxies through the echo URL (it must answer the
client's IP): reachability, latency, exit IP. A proxy that fails is marked
dead (reason "probe"); one the probe marked dead that passes is revived;
drained proxies are left alone. Each live proxy is leased on the echo
site for its probe, so it never meets a crawl request there. With -site, a
proxy that passes is also probed on each site URL and quarantined on that
site only if it cannot reach it (status other than 2xx/3xx); a site that
every proxy fails (two at least) is taken for down, and nobody is quarantined on it; a
proxy quarantined so is probed there again, and lifted when it passes.
Likewise, when every echo probe of a round fails (two proxies at least;
one that refuses the connection or answers 407 is dead whatever the echo
URL, and does not count), the echo URL is taken for down: nobody is
marked dead, the summary says "echo URL down", and without -every the
command exits 1. A malformed -echo or -site URL (a port that is empty,
not a number or out of range) is a usage error (exit 2).
Without -every: one round, a line per proxy, and a summary; it takes no
lock, and warns on stderr when a probe -every holds the fleet's lock (its
rounds and this one then probe the pool at once). With -every: a round
every D until interrupted, by one process of the fleet at a time (a lock
in Redis); it prints each round's summary.
With -exits, each passing proxy's exit IP (the echo's answer) is recorded
in the pool: entries that leave from one IP then share one proxy's slots on
every site (never two requests at once to a site from one exit address; a
ban of one holds the IP there). A changed exit is printed ("was ...") and
counted; with -every, proxies without a recorded exit (new ones) are also
probed every -new-every. With -strict too, no lease takes a proxy whose exit
is not recorded yet until a probe records it (the hold lapses three -every
after the last strict round).

  -echo URL           the echo URL (required)
  -site URL           a site to probe (repeatable)
  -timeout D          bound on each probe (default 10s)
  -concurrency N      probes at once (default 8)
  -site-quarantine D  how long a site probe's failure keeps the proxy off it (default 10m)
  -every D            run every D, as the fleet's one checker
  -exits              record exit IPs: exclusivity and quarantine per exit IP
  -new-every D        with -exits and -every: probe proxies without an exit this often (default 5s)
  -strict             with -exits: hold proxies whose exit is not recorded yet`
}

// multiFlag is a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func (a *app) syncCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("sync", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	rawURL := fs.String("url", "", "")
	file := fs.String("file", "", "")
	var headers multiFlag
	fs.Var(&headers, "header", "")
	tokenFile := fs.String("token-file", "", "")
	jsonPath := fs.String("json", "", "")
	timeout := fs.Duration("timeout", source.DefaultHTTPTimeout, "")
	every := fs.Duration("every", source.DefaultEvery, "")
	once := fs.Bool("once", false, "")
	minFrac := fs.Float64("min-fraction", source.DefaultMinFraction, "")
	noGuard := fs.Bool("no-guard", false, "")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: sync: %v", errUsage, err)
	}
	if fs.NArg() > 0 || (*rawURL == "") == (*file == "") {
		return fmt.Errorf("%w: sync takes -url URL or -file FILE", errUsage)
	}
	if *every <= 0 || *timeout <= 0 || !(*minFrac > 0 && *minFrac <= 1) { // NaN too
		return fmt.Errorf("%w: sync: -every and -timeout must be positive, -min-fraction in (0, 1]", errUsage)
	}
	var src source.Source = source.File{Path: *file}
	if *rawURL != "" {
		h := &source.HTTP{URL: *rawURL, Header: http.Header{}, Client: &http.Client{Timeout: *timeout, Transport: &http.Transport{}}}
		for _, kv := range headers {
			k, v, ok := strings.Cut(kv, ":")
			if !ok || strings.TrimSpace(k) == "" {
				return fmt.Errorf("%w: sync: -header wants 'Name: value'", errUsage)
			}
			h.Header.Add(strings.TrimSpace(k), strings.TrimSpace(v))
		}
		if *tokenFile != "" {
			b, err := os.ReadFile(*tokenFile)
			if err != nil {
				return err
			}
			line, _, _ := strings.Cut(string(b), "\n")
			h.Token = strings.TrimSpace(line)
		}
		switch *jsonPath {
		case "":
		case ".":
			h.Extract = source.JSON()
		default:
			h.Extract = source.JSON(strings.Split(*jsonPath, ".")...)
		}
		src = h
	} else if len(headers) > 0 || *tokenFile != "" || *jsonPath != "" {
		return fmt.Errorf("%w: sync: -header, -token-file and -json go with -url", errUsage)
	}
	sy := &source.Syncer{Switch: a.sw, Source: src, Every: *every, MinFraction: *minFrac, NoGuard: *noGuard,
		Logger: slog.New(slog.DiscardHandler),
		OnSync: func(r source.Result) { printSync(a.out, r) }}
	if *once {
		_, err := sy.Sync(ctx)
		return err
	}
	err := sy.Run(ctx)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func printSync(w io.Writer, r source.Result) {
	at := r.At.UTC().Format(time.RFC3339)
	switch {
	case r.Err != nil:
		// No size: a sync that failed before it read the pool (the source
		// failed) does not know it; the guard's error says it.
		fmt.Fprintf(w, "%s %s: failed, pool unchanged: %s\n", at, r.Source, message(r.Err))
	case r.Written:
		fmt.Fprintf(w, "%s %s: added %d, removed %d, pool size %d\n", at, r.Source, r.Added, r.Removed, r.Size)
	default:
		fmt.Fprintf(w, "%s %s: unchanged, pool size %d\n", at, r.Source, r.Size)
	}
}

func (a *app) probeCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("probe", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	echo := fs.String("echo", "", "")
	var sites multiFlag
	fs.Var(&sites, "site", "")
	timeout := fs.Duration("timeout", probe.DefaultTimeout, "")
	conc := fs.Int("concurrency", probe.DefaultConcurrency, "")
	siteQ := fs.Duration("site-quarantine", probe.DefaultSiteQuarantine, "")
	every := fs.Duration("every", 0, "")
	exits := fs.Bool("exits", false, "")
	strict := fs.Bool("strict", false, "")
	newEvery := fs.Duration("new-every", probe.DefaultNewEvery, "")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: probe: %v", errUsage, err)
	}
	if fs.NArg() > 0 || *echo == "" {
		return fmt.Errorf("%w: probe takes -echo URL", errUsage)
	}
	if *strict && !*exits {
		return fmt.Errorf("%w: probe: -strict needs -exits", errUsage)
	}
	if *timeout <= 0 || *conc <= 0 || *siteQ <= 0 || *every < 0 || *newEvery <= 0 {
		return fmt.Errorf("%w: probe: -timeout, -concurrency, -site-quarantine and -new-every must be positive", errUsage)
	}
	c := &probe.Checker{Switch: a.sw, EchoURL: *echo, Timeout: *timeout, Concurrency: *conc, SiteQuarantine: *siteQ,
		Every: *every, Redis: a.rdb, Logger: slog.New(slog.DiscardHandler), Exits: *exits, Strict: *strict, NewEvery: *newEvery}
	for _, s := range sites {
		c.Sites = append(c.Sites, probe.SiteProbe{URL: s})
	}
	if *every == 0 {
		if err := a.warnProbeLock(ctx, c); err != nil {
			return err
		}
		rep, err := c.Check(ctx)
		if err != nil && rep.Start.IsZero() && errors.Is(err, proxyswitch.ErrConfig) {
			return fmt.Errorf("%w: %s", errUsage, message(err)) // a flag's value (-echo, -site): no round ran
		}
		if err != nil && !errors.Is(err, probe.ErrEchoDown) {
			return err
		}
		// The echo URL down: the round's lines and summary, then exit 1.
		tw := tabwriter.NewWriter(a.out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tURL\tSITE\tRESULT\tLATENCY\tEXIT IP\tACTION\tERROR")
		for _, r := range rep.Results {
			res, errText := "ok", ""
			if !r.OK {
				res, errText = "FAIL", message(r.Err)
			}
			exit := r.ExitIP
			if r.ExitChanged {
				exit += " (was " + r.OldExitIP + ")"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Proxy.ID(), r.Proxy, r.Site, res,
				r.Latency.Round(time.Millisecond), exit, r.Action, errText)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		printRound(a.out, rep)
		return err
	}
	c.OnReport = func(r probe.Report) { printRound(a.out, r) }
	err := c.Run(ctx)
	switch {
	case errors.Is(err, context.Canceled):
		return nil
	case errors.Is(err, proxyswitch.ErrConfig): // before any round: a flag's value
		return fmt.Errorf("%w: %s", errUsage, message(err))
	}
	return err
}

// warnProbeLock warns, before a one-shot round (Checker.Check takes no
// lock), when a checker's Run holds the pool's probe lock: both would
// probe the pool at once. Only a failed write to stderr is an error.
func (a *app) warnProbeLock(ctx context.Context, c *probe.Checker) error {
	held, err := c.LockHeld(ctx)
	switch {
	case err != nil:
		_, err = fmt.Fprintf(a.errOut, "proxyswitch: warning: could not tell whether a probe -every holds the probe lock of pool %q: %s\n",
			a.sw.Pool(), message(err))
	case held:
		_, err = fmt.Fprintf(a.errOut, "proxyswitch: warning: a probe -every (a probe.Checker's Run) holds the probe lock of pool %q: "+
			"this round runs beside its rounds\n", a.sw.Pool())
	}
	return err
}

func printRound(w io.Writer, r probe.Report) {
	fmt.Fprintf(w, "%s probed %d, skipped %d (busy), marked dead %d, revived %d, quarantined %d, in %v\n",
		r.Start.UTC().Format(time.RFC3339), r.Probed, r.Skipped, r.Dead, r.Revived, r.Quarantined, r.End.Sub(r.Start).Round(time.Millisecond))
	if r.ExitChanges > 0 {
		fmt.Fprintf(w, "  exit IPs changed: %d\n", r.ExitChanges)
	}
	if r.Lifted > 0 {
		fmt.Fprintf(w, "  site quarantines lifted (the site probe passed again): %d\n", r.Lifted)
	}
	if r.EchoDown {
		fmt.Fprintln(w, "  echo URL down (every echo probe failed; nobody marked dead)")
	}
	if len(r.SitesDown) > 0 {
		fmt.Fprintf(w, "  sites down (every proxy failed their probe; nobody quarantined): %s\n", strings.Join(r.SitesDown, ", "))
	}
}
