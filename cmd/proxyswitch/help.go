package main

import (
	"flag"
	"fmt"
	"io"
)

// commandHelp is what "proxyswitch COMMAND -h" prints on stdout (exit code
// 0): the command's usage line and what it does. The global flags come
// before the command; "proxyswitch -h" lists them.
var commandHelp = map[string]string{
	"load": `usage: proxyswitch [flags] load FILE

Replaces the pool with the proxies in FILE ("-" for stdin), atomically up to 500 proxies:
workers see the old set or the new one. One proxy a line, # comments:
URLs (http, https, socks5, socks5h, with host and port), or host:port,
user:pass@host:port and host:port:user:pass, meaning http.`,
	"add": `usage: proxyswitch [flags] add URL...

Adds proxies to the pool (the forms load accepts).`,
	"remove": `usage: proxyswitch [flags] remove ID|URL...

Removes proxies from the pool, by ID (as list shows it) or URL, and says
how many were in it.`,
	"list": `usage: proxyswitch [flags] list [SITE]

Without SITE: every proxy of the pool, ID, URL (user info masked) and
state: ok, dead (since when, and the failure that killed it) or drained;
its labels (key=value,...); and for a session of a gateway entry, whose
masked URLs are alike, GATEWAY tells them apart: the first 8 hex digits of
the SHA-1 of its template (as the pool's key gw:<SHA-1> names it; the
template, which holds credentials, is never printed), # its place among
the template's sessions by ID / their number.
With SITE (as the workers' site function names it, host[:port] by default;
"*" for a pool leased with ScopeGlobal): each proxy's state there: free,
leased (and how many of its slots), cooling, quarantined (noting a ban on
every site), dead or drained; until when; its bans in a row there.`,
	"stats": `usage: proxyswitch [flags] stats [SITE...]

A table of proxy slots by state per site (default: every site leased
recently), the sites paused by their circuit breaker (or by pause), and
the live sticky sessions. A proxy has one slot per site, or
k with Rotation{Concurrency: k}. BUSY is every slot not FREE: LEASED + COOLING +
QUARANTINED + DEAD (drained included).`,
	"ban": `usage: proxyswitch [flags] ban ID|URL SITE [DURATION]

Quarantines a proxy on SITE, cluster-wide, for at least DURATION (default
1h): no worker leases it for SITE until then.`,
	"unban": `usage: proxyswitch [flags] unban ID|URL SITE

Ends a proxy's quarantine on SITE now and starts its backoff over, and
lifts the hold of its exit IP on SITE (what a proxy that left that IP
earned there); says so when it was not quarantined there.`,
	"pause": `usage: proxyswitch [flags] pause SITE [DURATION]

Pauses SITE on every server at once: no worker leases a proxy for it for
DURATION (default: until resume); its requests wait up to their max wait,
then fail with ErrSitePaused. When the pause ends the site's circuit
breaker half-opens: a few probe requests go, and close it when they
succeed. stats lists the paused sites.`,
	"resume": `usage: proxyswitch [flags] resume SITE

Ends SITE's pause now on every server, whether an operator or its ban rate
(the circuit breaker) paused it.`,
	"drain": `usage: proxyswitch [flags] drain ID|URL...

Takes proxies out of every site's rotation (requests under way finish)
until revive brings them back.`,
	"revive": `usage: proxyswitch [flags] revive ID|URL...

Brings dead or drained proxies back into rotation.`,
	"clear": `usage: proxyswitch [flags] clear -yes

Deletes every key of the pool (proxies, leases, bans, members) under the
prefix; other pools are left alone. Sticky sessions and their cookie jars
are not deleted: they lapse with their TTL (a task whose proxy is gone
starts a new session). Without -yes it only says what it would delete.`,
	"queue": `usage: proxyswitch [flags] queue NS [stats | dead [N] | requeue ID...]

The request queue of storage namespace NS (package storage):
  stats        ready, in flight and dead counts (the default)
  dead [N]     the oldest N dead letters (default 20): ID, URL (password
               redacted), deliveries, since, reason
  requeue ID   move dead letters back into the queue`,
	"serve": `usage: proxyswitch [flags] serve [-addr A] [-queue NS,...] [-scrape-timeout D] [POOL...]

Serves, on A until interrupted, for POOLs (default: -pool):
  /metrics  the pools' state (and the request queues of the storage
            namespaces NS), read from Redis at each scrape, for Prometheus
  /         a read-only status page: each pool, its sites' free, leased,
            cooling, quarantined and dead slots, the quarantined proxies
            with the time they have left, dead and drained proxies, live
            sticky sessions; it refreshes itself every 5s
Passwords are redacted everywhere. A scrape's or a page's Redis reads take
at most D, so both answer within a second even with Redis down (then
proxyswitch_state_up is 0, and the page says Redis is unreachable).`,
}

// commandFlags returns the flag set of a command that has flags of its own
// (clear, serve), for parsing and for its help; nil for the others.
func commandFlags(cmd string) *flag.FlagSet {
	var fs *flag.FlagSet
	switch cmd {
	case "clear":
		fs = flag.NewFlagSet("clear", flag.ContinueOnError)
		fs.Bool("yes", false, "really delete")
	case "serve":
		fs = flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.String("addr", DefaultMetricsAddr, "listen address")
		fs.String("queue", "", "storage namespaces whose request queue to export, comma-separated")
		fs.Duration("scrape-timeout", DefaultScrapeTimeout, "bound on the Redis reads of one scrape, and of one render of the status page")
	default:
		return nil
	}
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// isHelp says whether args ask for a command's help: its first argument is
// -h, -help or --help, as the flag package reads them.
func isHelp(args []string) bool {
	if len(args) == 0 {
		return false
	}
	switch args[0] {
	case "-h", "--h", "-help", "--help":
		return true
	}
	return false
}

// printCommandHelp writes cmd's help, and its flags if it has any, to w.
func printCommandHelp(w io.Writer, cmd string) error {
	if _, err := fmt.Fprintln(w, commandHelp[cmd]); err != nil {
		return err
	}
	if fs := commandFlags(cmd); fs != nil {
		if _, err := fmt.Fprintf(w, "\n%s's flags:\n", cmd); err != nil {
			return err
		}
		fs.SetOutput(w)
		fs.PrintDefaults()
	}
	return nil
}

// flagValue is the value of the flag name of fs, parsed or default.
func flagValue[T any](fs *flag.FlagSet, name string) T {
	return fs.Lookup(name).Value.(flag.Getter).Get().(T)
}
