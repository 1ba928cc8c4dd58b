// Command proxyswitch administers a proxyswitch pool in Redis and exports
// its state to Prometheus.
//
//	proxyswitch [flags] <command> [arguments]
//
// Commands:
//
//	load FILE                   replace the pool with the proxies in FILE ("-" for stdin), atomically up to 500 proxies
//	sync -url URL|-file FILE [-every D] [-once] [...]
//	                            keep the pool equal to a provider's list or a file (package source)
//	probe -echo URL [-site URL]... [-every D] [-exits [-strict]] [...]
//	                            probe idle proxies, mark dead and revive them (package probe)
//	add URL...                  add proxies
//	remove ID|URL...            remove proxies
//	list                        list the proxies: ID, URL (user info masked), state (ok, dead, drained),
//	                            labels, and for a gateway's session its template (SHA-1 prefix) and place
//	list SITE                   list the proxies with their state on SITE ("*" for a pool leased with
//	                            ScopeGlobal): free, leased (and how many of its slots), cooling,
//	                            quarantined (noting a ban on every site), dead or drained; until
//	                            when; bans in a row there
//	stats [SITE...]             a table of proxy slots by state per site (default: every site leased recently),
//	                            and the live sticky sessions; BUSY is every slot not FREE
//	                            (LEASED + COOLING + QUARANTINED + DEAD, drained included)
//	ban ID|URL SITE [DURATION]  quarantine a proxy on a site, cluster-wide, for at least DURATION (default 1h)
//	unban ID|URL SITE           end a proxy's quarantine on a site now
//	pause SITE [DURATION]       pause a site on every server: no proxy leased for it for DURATION
//	                            (default: until resume), then its circuit breaker half-opens
//	resume SITE                 close a site's circuit breaker now (a pause by hand or by its ban rate)
//	drain ID|URL...             take proxies out of every site's rotation (requests under way finish)
//	revive ID|URL...            bring dead or drained proxies back
//	clear -yes                  delete every key of the pool (proxies, leases, bans, members) but its
//	                            meta hash, which marks it emptied on purpose (never re-seeded)
//	queue NS [stats|dead [N]|requeue ID...]
//	                            the request queue of storage namespace NS (package storage):
//	                            ready, in flight and dead counts; the oldest N dead letters
//	                            (default 20: ID, URL with user info masked, deliveries,
//	                            since, reason); move dead letters back into the queue
//	serve [-addr A] [-queue NS,...] [-scrape-timeout D] [POOL...]
//	                            serve /metrics (pool state, and the request queues of
//	                            storage namespaces NS, read from Redis at each scrape) on A
//	                            (default 127.0.0.1:9465) for POOLs (default: -pool) until interrupted,
//	                            and a read-only status page at / (each pool's sites with their
//	                            free, leased, cooling, quarantined and dead slots, the quarantined
//	                            proxies and their time left, dead and drained proxies, live
//	                            sticky sessions; passwords redacted; it reloads every 5s);
//	                            a scrape's or a page's Redis reads take at most D (default 700ms),
//	                            so both answer within a second even with Redis down (then
//	                            proxyswitch_state_up is 0 and the page says so)
//
// Flags:
//
//	-redis URL   Redis URL (default $PROXYSWITCH_REDIS_URL, else redis://127.0.0.1:6379/0);
//	             a command that writes first prints the Redis it acts on (host:port/db) on stderr
//	-prefix P    key prefix (default "proxyswitch")
//	-pool NAME   pool (default "default")
//	-timeout D   bound on each Redis round trip (default 5s)
//	-v           log debug messages too (default: warnings and errors only, on stderr)
//
// -h prints this help, and "proxyswitch COMMAND -h" that command's (exit
// code 0); a usage mistake prints one line about it and the usage line
// (exit code 2).
//
// Exit codes: 0 success, 1 the operation failed, 2 bad usage.
// Passwords in proxy and Redis URLs are never printed.
package main

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/internal/engine"
	"github.com/proxyswitch/proxyswitch/internal/redact"
	"github.com/proxyswitch/proxyswitch/metrics"
	"github.com/proxyswitch/proxyswitch/storage"
	"github.com/redis/go-redis/v9"
)

// EnvRedisURL names the environment variable read when -redis is not given.
const EnvRedisURL = "PROXYSWITCH_REDIS_URL"

// DefaultMetricsAddr is where serve listens unless told otherwise.
const DefaultMetricsAddr = "127.0.0.1:9465"

// DefaultScrapeTimeout bounds the Redis reads of one scrape of serve, so
// that it answers (with proxyswitch_state_up 0 when Redis is down) well
// within Prometheus' scrape timeout.
const DefaultScrapeTimeout = 700 * time.Millisecond

func main() {
	// go-redis logs its dial retries straight to stderr; every failure also
	// comes back as an error, which the command reports (or, in serve, the
	// exporter logs once per outage).
	redis.SetLogger(silentRedis{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// errUsage marks a command-line mistake (exit code 2).
var errUsage = errors.New("usage")

// usageLine is what a usage mistake prints after saying what it was.
const usageLine = "usage: proxyswitch [flags] <command> [arguments] (proxyswitch -h for help)"

const usage = `usage: proxyswitch [flags] <command> [arguments]

commands:
  load FILE                   replace the pool with the proxies in FILE ("-" for stdin)
  sync -url URL|-file FILE [-every D] [-once]
                              keep the pool equal to a provider's list (diffed, guarded)
  probe -echo URL [-site URL]... [-every D] [-exits [-strict]]
                              probe idle proxies: mark dead, revive, exit IPs
  add URL...                  add proxies
  remove ID|URL...            remove proxies
  list [SITE]                 list the proxies with their state (pool-wide, or on SITE)
  stats [SITE...]             proxy slots by state per site, live sticky sessions;
                              BUSY = slots not FREE (LEASED+COOLING+QUARANTINED+DEAD)
  ban ID|URL SITE [DURATION]  quarantine a proxy on a site for at least DURATION (default 1h)
  unban ID|URL SITE           end a proxy's quarantine on a site
  pause SITE [DURATION]       pause a site on every server (default: until resume)
  resume SITE                 end a site's pause (close its circuit breaker)
  drain ID|URL...             take proxies out of every site's rotation
  revive ID|URL...            bring dead or drained proxies back
  clear -yes                  delete every key of the pool
  queue NS [stats|dead [N]|requeue ID...]
                              the request queue of storage namespace NS: counts,
                              the oldest N dead letters (default 20), requeue dead letters
  serve [-addr A] [-queue NS,...] [-scrape-timeout D] [POOL...]
                              serve /metrics and a status page at / on A (default
                              ` + DefaultMetricsAddr + `); -queue adds the request queues of storage
                              namespaces; D bounds a scrape's Redis reads (default 700ms)

"proxyswitch COMMAND -h" prints a command's help.

flags:`

// app is what a command works with.
type app struct {
	rdb     *redis.Client
	ropt    *redis.Options      // rdb's, from -redis
	sw      *proxyswitch.Switch // the -pool pool
	prefix  string
	opts    []proxyswitch.Option // prefix, timeout, logger: every pool's
	timeout time.Duration        // -timeout: each Redis round trip
	logger  *slog.Logger
	stdin   io.Reader
	out     io.Writer
	errOut  io.Writer // warnings meant for the operator

	switches []*proxyswitch.Switch // every Switch newSwitch made: closed when the command ends
}

func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("proxyswitch", flag.ContinueOnError)
	fs.SetOutput(stderr)
	redisURL := fs.String("redis", "", "Redis URL (default $"+EnvRedisURL+", else redis://127.0.0.1:6379/0)")
	prefix := fs.String("prefix", "proxyswitch", "key prefix")
	pool := fs.String("pool", "default", "pool name")
	timeout := fs.Duration("timeout", 5*time.Second, "bound on each Redis round trip")
	verbose := fs.Bool("v", false, "log debug messages too (default: warnings and errors only)")
	// The flag package prints what was wrong with a flag: then a short
	// usage line follows; the whole help only for an explicit -h.
	fs.Usage = func() {}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stdout, usage)
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return 0
		}
		fmt.Fprintln(stderr, usageLine)
		return 2
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "proxyswitch: no command")
		fmt.Fprintln(stderr, usageLine)
		return 2
	}
	raw := *redisURL
	if raw == "" {
		raw = getenv(EnvRedisURL)
	}
	if raw == "" {
		raw = "redis://127.0.0.1:6379/0"
	}
	opt, err := parseRedisURL(raw)
	if err != nil {
		fmt.Fprintf(stderr, "proxyswitch: invalid Redis URL %s: %s\n", redactURL(raw), message(err))
		return 2
	}
	if *timeout <= 0 {
		fmt.Fprintf(stderr, "proxyswitch: -timeout %v: want a positive duration\n", *timeout)
		fmt.Fprintln(stderr, usageLine)
		return 2
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	opt.ContextTimeoutEnabled = true // each call bounded by its context (-timeout), on the calling goroutine
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	a := &app{rdb: rdb, ropt: opt, prefix: *prefix, logger: logger, stdin: stdin, out: stdout, errOut: stderr,
		opts:    []proxyswitch.Option{proxyswitch.WithPrefix(*prefix), proxyswitch.WithTimeouts(proxyswitch.Timeouts{Redis: *timeout}), proxyswitch.WithLogger(logger)},
		timeout: *timeout}
	defer a.closeSwitches()
	if a.sw, err = a.newSwitch(*pool); err != nil {
		fmt.Fprintln(stderr, "proxyswitch:", message(err))
		return 2
	}
	cmd, rest := fs.Arg(0), fs.Args()[1:]
	err = a.dispatch(ctx, cmd, rest)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintln(stderr, "proxyswitch:", message(err))
		fmt.Fprintln(stderr, usageLine)
		return 2
	default:
		fmt.Fprintf(stderr, "proxyswitch: %s (Redis %s): %s\n", cmd, opt.Addr, message(err))
		return 1
	}
}

// parseRedisURL parses a Redis URL as go-redis does, but refuses the
// forms go-redis would quietly complete with its defaults: a URL without
// "//" ("redis:pw@host:6379/0" parses with no host at all) or with an empty
// host would reach localhost:6379, some other Redis than the one meant. A
// missing port is 6379, as for redis-cli.
func parseRedisURL(raw string) (*redis.Options, error) {
	const want = "want redis://[user:password@]host:port/db, rediss://... or unix:///path"
	u, err := url.Parse(raw)
	if err != nil {
		return nil, errors.New(want)
	}
	switch u.Scheme {
	case "redis", "rediss":
		if u.Opaque != "" || u.Hostname() == "" {
			return nil, fmt.Errorf("no host: %s", want)
		}
	case "unix":
		if u.Opaque != "" || u.Path == "" {
			return nil, fmt.Errorf("no socket path: %s", want)
		}
	default:
		return nil, errors.New(want)
	}
	opt, err := redis.ParseURL(raw)
	if err != nil {
		return nil, errors.New(want)
	}
	return opt, nil
}

// message is err's text without the "proxyswitch: " prefixes of the
// library's errors: the CLI prints its own once.
func message(err error) string {
	return strings.ReplaceAll(err.Error(), "proxyswitch: ", "")
}

// newSwitch returns a Switch on pool with the flags' options (a.opts) and
// opts.
func (a *app) newSwitch(pool string, opts ...proxyswitch.Option) (*proxyswitch.Switch, error) {
	sw, err := proxyswitch.NewSwitch(a.rdb, append(append([]proxyswitch.Option{proxyswitch.WithPool(pool)}, opts...), a.opts...)...)
	if err == nil {
		a.switches = append(a.switches, sw)
	}
	return sw, err
}

// closeSwitches closes every Switch the command made: their leases (an
// operator's ban probes one) and background reads end before the CLI does.
func (a *app) closeSwitches() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*a.timeout)
	defer cancel()
	for _, sw := range a.switches {
		_ = sw.Close(ctx)
	}
}

// newStorage returns the Storage of namespace ns with the flags' timeout
// and logger.
func (a *app) newStorage(ns string) (*storage.Storage, error) {
	return storage.New(a.rdb, storage.WithNamespace(ns), storage.WithRedisTimeout(a.timeout), storage.WithLogger(a.logger))
}

// matchConcurrency makes a.sw act on every slot of each proxy: the pool's
// recorded concurrency (Rotation.Concurrency of its workers) replaces the
// default of 1, which would ban, unban, drain or revive slot 0 only (or
// be refused).
func (a *app) matchConcurrency(ctx context.Context) error {
	st, err := a.sw.Stats(ctx, "*")
	if err != nil || st.Concurrency <= 1 {
		return err
	}
	k := st.Concurrency
	sw, err := a.newSwitch(a.sw.Pool(), proxyswitch.WithRotation(proxyswitch.Rotation{Concurrency: k}))
	if err != nil {
		return err
	}
	a.sw = sw
	return nil
}

func (a *app) dispatch(ctx context.Context, cmd string, args []string) error {
	if _, known := commandHelp[cmd]; known && isHelp(args) {
		return printCommandHelp(a.out, cmd)
	}
	if err := checkProxyArgs(cmd, args); err != nil {
		return err
	}
	if writes(cmd, args) {
		// Which Redis the write goes to, before it does: the URL may come
		// from the environment or the default, unseen on the command line.
		fmt.Fprintf(a.errOut, "proxyswitch: %s on Redis %s, prefix %q, pool %q\n", cmd, redisAddr(a.ropt), a.prefix, a.sw.Pool())
	}
	switch cmd {
	case "ban", "unban", "drain", "revive":
		if err := a.matchConcurrency(ctx); err != nil {
			return err
		}
	}
	sw, out := a.sw, a.out
	switch cmd {
	case "load":
		if len(args) != 1 {
			return fmt.Errorf("%w: load takes one FILE (or - for stdin)", errUsage)
		}
		return a.load(ctx, args[0])
	case "add":
		if len(args) == 0 {
			return fmt.Errorf("%w: add takes proxy URLs", errUsage)
		}
		ch, err := sw.Add(ctx, args...)
		return report(out, ch, err)
	case "remove":
		if len(args) == 0 {
			return fmt.Errorf("%w: remove takes proxy IDs or URLs", errUsage)
		}
		ch, err := sw.Remove(ctx, args...)
		if err != nil {
			return err
		}
		msg := fmt.Sprintf("removed %d of %d proxies", ch.Removed, len(args))
		if slices.ContainsFunc(args, func(a string) bool { return strings.Contains(a, "{session") }) {
			msg = fmt.Sprintf("removed %d proxies (a gateway template names all its proxies; any other not found was not in the pool)", ch.Removed)
		} else if ch.Removed < len(args) {
			msg += " (the others were not in the pool)"
		}
		_, err = fmt.Fprintf(out, "%s, pool size %d\n", msg, ch.Size)
		return err
	case "list":
		switch len(args) {
		case 0:
			return a.list(ctx)
		case 1:
			return a.listSite(ctx, args[0])
		}
		return fmt.Errorf("%w: list takes at most one SITE", errUsage)
	case "stats":
		return a.stats(ctx, args)
	case "ban":
		return a.ban(ctx, args)
	case "unban":
		if len(args) != 2 {
			return fmt.Errorf("%w: unban takes a proxy (ID or URL) and a SITE", errUsage)
		}
		return a.unban(ctx, args[0], args[1])
	case "drain":
		if len(args) == 0 {
			return fmt.Errorf("%w: drain takes proxy IDs or URLs", errUsage)
		}
		for _, p := range args {
			if _, err := sw.Drain(ctx, "", p); err != nil {
				return err
			}
			if _, err := fmt.Fprintf(out, "drained proxy %s\n", proxyName(p)); err != nil {
				return err
			}
		}
		return nil
	case "revive":
		if len(args) == 0 {
			return fmt.Errorf("%w: revive takes proxy IDs or URLs", errUsage)
		}
		n, err := sw.Revive(ctx, "", args...)
		if err != nil {
			return err
		}
		switch {
		case n == len(args):
			_, err = fmt.Fprintf(out, "revived %d of %d proxies\n", n, len(args))
		case n == 0:
			_, err = fmt.Fprintf(out, "revived 0 of %d proxies (none was dead or drained)\n", len(args))
		default:
			_, err = fmt.Fprintf(out, "revived %d of %d proxies (the others were neither dead nor drained)\n", n, len(args))
		}
		return err
	case "pause":
		return a.pause(ctx, args)
	case "resume":
		if len(args) != 1 {
			return fmt.Errorf("%w: resume takes a SITE", errUsage)
		}
		if err := checkSite(args[0]); err != nil {
			return err
		}
		if err := sw.ResumeSite(ctx, args[0]); err != nil {
			return err
		}
		_, err := fmt.Fprintf(out, "resumed %s: its circuit breaker is closed\n", args[0])
		return err
	case "clear":
		return a.clear(ctx, args)
	case "serve":
		return a.serve(ctx, args)
	case "queue":
		return a.queue(ctx, args)
	case "sync":
		return a.syncCmd(ctx, args)
	case "probe":
		return a.probeCmd(ctx, args)
	}
	return fmt.Errorf("%w: unknown command %q", errUsage, cmd)
}

// writes reports whether cmd with args writes to the pool or a queue in
// Redis: such a command first says on stderr which Redis it acts on (probe
// is not listed: it writes only the verdicts of its probes).
func writes(cmd string, args []string) bool {
	switch cmd {
	case "load", "add", "remove", "ban", "unban", "pause", "resume", "drain", "revive", "clear", "sync":
		return true
	case "queue":
		return len(args) >= 2 && args[1] == "requeue"
	}
	return false
}

// redisAddr names the Redis of o as host:port/db (a Unix socket as its
// path and db), never with its user name or password.
func redisAddr(o *redis.Options) string {
	s := fmt.Sprintf("%s/%d", o.Addr, o.DB)
	switch {
	case o.Network == "unix":
		s = fmt.Sprintf("unix:%s db %d", o.Addr, o.DB)
	case o.TLSConfig != nil:
		s += " (TLS)"
	}
	return s
}

func (a *app) load(ctx context.Context, path string) error {
	r := a.stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		r = f
	}
	ps, err := proxyswitch.ReadProxies(r)
	if err != nil {
		return err
	}
	ch, err := a.sw.ReplaceProxies(ctx, ps)
	return report(a.out, ch, err)
}

func report(out io.Writer, ch proxyswitch.PoolChange, err error) error {
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "added %d, removed %d, pool size %d\n", ch.Added, ch.Removed, ch.Size)
	return err
}

// list prints every proxy with its pool-wide state: ok, dead (with the
// failure that killed it) or drained, and since when.
func (a *app) list(ctx context.Context) error {
	ps, err := a.sw.List(ctx)
	if err != nil {
		return err
	}
	dead, err := a.sw.Dead(ctx)
	if err != nil {
		return err
	}
	out := make(map[string]proxyswitch.ProxyState, len(dead))
	for _, d := range dead {
		out[d.Proxy.ID()] = d
	}
	sessions, err := a.gatewaySessions(ctx)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPROXY\tSTATE\tSINCE\tREASON\tLABELS\tGATEWAY")
	for _, p := range ps {
		state, since, reason := "ok", "-", "-"
		if d, ok := out[p.ID()]; ok {
			state, since, reason = "dead", d.Since.UTC().Format(time.RFC3339), d.Reason
			if d.Reason == "drained" {
				state, reason = "drained", "-"
			}
		}
		gw := sessions[p.ID()]
		if gw == "" {
			gw = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.ID(), p, state, since, reason, labelList(p.Labels()), gw)
	}
	return tw.Flush()
}

// labelList prints a proxy's labels as its list line gives them,
// "key=value" joined by ',' in key order; "-" for none.
func labelList(labels map[string]string) string {
	if len(labels) == 0 {
		return "-"
	}
	kv := make([]string, 0, len(labels))
	for k, v := range labels {
		kv = append(kv, k+"="+v)
	}
	slices.Sort(kv)
	return strings.Join(kv, ",")
}

// gatewaySessions tells apart the virtual proxies of gateway entries, whose
// masked URLs (list's PROXY) are alike: proxy ID -> "<template>#<i>/<n>",
// template the first 8 hex digits of the SHA-1 of the gateway template (as
// the pool's key gw:<SHA-1> names it; the template itself holds
// credentials and is never printed), i the session's place among the
// template's n sessions, by ID. Read from the pool's gateways hash (the
// root API keeps gateway membership unexported), a page at a time.
func (a *app) gatewaySessions(ctx context.Context) (map[string]string, error) {
	base, err := engine.KeyBase(a.prefix, a.sw.Pool())
	if err != nil {
		return nil, err
	}
	byTemplate := map[string][]string{} // SHA-1 prefix -> proxy IDs
	var cursor uint64
	for {
		rctx, cancel := context.WithTimeout(ctx, a.timeout)
		kv, next, err := a.rdb.HScan(rctx, base+":gateways", cursor, "", 500).Result()
		cancel()
		if err != nil {
			return nil, fmt.Errorf("redis error: gateways: %w", err)
		}
		for i := 0; i+1 < len(kv); i += 2 {
			d := sha1.Sum([]byte(kv[i+1]))
			tag := hex.EncodeToString(d[:4])
			byTemplate[tag] = append(byTemplate[tag], kv[i])
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	out := map[string]string{}
	for tag, ids := range byTemplate {
		slices.Sort(ids)
		ids = slices.Compact(ids) // HSCAN may return an entry twice
		for i, id := range ids {
			out[id] = fmt.Sprintf("%s#%d/%d", tag, i+1, len(ids))
		}
	}
	return out, nil
}

// timeLayout prints the times of list SITE: UTC, to the millisecond (a
// cooldown is often shorter than a second).
const timeLayout = "2006-01-02T15:04:05.000Z07:00"

// listSite prints every proxy with its state on site, read in one round
// trip: how many of its slots are leased, until when the state lasts, its
// bans in a row there, and a note (a ban on every site; why and since when
// a proxy is dead or drained).
func (a *app) listSite(ctx context.Context, site string) error {
	if err := checkSite(site); err != nil {
		return err
	}
	ps, err := a.sw.ProxyStates(ctx, site)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPROXY\tSTATE\tLEASED\tUNTIL\tSTRIKES\tNOTE")
	for _, p := range ps {
		until, note := "-", "-"
		if !p.Until.IsZero() {
			until = p.Until.UTC().Format(timeLayout)
		}
		switch {
		case p.BanAllSites:
			note = "banned on every site"
		case p.State == proxyswitch.StateDead || p.State == proxyswitch.StateDrained:
			var why []string
			if p.State == proxyswitch.StateDead && p.Reason != "" {
				why = append(why, p.Reason)
			}
			if !p.Since.IsZero() {
				why = append(why, "since "+p.Since.UTC().Format(time.RFC3339))
			}
			if len(why) > 0 {
				note = strings.Join(why, " ")
			}
		}
		slots := p.FreeSlots + p.LeasedSlots + p.CoolingSlots + p.QuarantinedSlots + p.DeadSlots
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\t%d\t%s\n", p.Proxy.ID(), p.Proxy, p.State, p.LeasedSlots, slots, until, p.Strikes, note)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	used, err := a.siteUsed(ctx, site)
	if err != nil || used {
		return err
	}
	return a.warnUnusedSite(site, "these are the states its first lease would find")
}

// siteUsed reports whether a worker leased on site within the idle TTL
// (Sites).
func (a *app) siteUsed(ctx context.Context, site string) (bool, error) {
	used, err := a.sw.Sites(ctx)
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(used, func(u proxyswitch.SiteUse) bool { return u.Site == site }), nil
}

// warnUnusedSite warns of a site no worker leased on lately (siteUsed): a
// site named unlike the workers' site function names it ("OZON.RU" where
// workers name "ozon.ru") reads as never leased, and a ban or pause of it
// holds no worker back. Say so rather than let it pass; what says what the
// command did under that name.
func (a *app) warnUnusedSite(site, what string) error {
	hint := ""
	if site != strings.ToLower(site) {
		hint = "; the default site function names sites in lower case"
	}
	_, err := fmt.Fprintf(a.errOut, "proxyswitch: warning: site %q was not leased from pool %q within the idle TTL: %s "+
		"(is it named as the workers' site function names it, host[:port] by default%s? stats lists the sites in use)\n",
		site, a.sw.Pool(), what, hint)
	return err
}

// checkSite rejects a SITE argument no site function returns. It never
// echoes a URL's password.
func checkSite(site string) error {
	switch {
	case site == "":
		return fmt.Errorf("%w: empty SITE", errUsage)
	case strings.Contains(site, "://"):
		hint := "such as www.ozon.ru"
		if hp := redactSplit(site).HostPort; hp != "" {
			hint = "for this URL " + strings.ToLower(hp)
		}
		return fmt.Errorf("%w: SITE %s is a URL: give the site as the workers' site function names it, by default the host[:port] (%s)",
			errUsage, redactURL(site), hint)
	case strings.IndexFunc(site, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		if strings.ContainsAny(site, "@:") {
			// Perhaps user:password@host or host:port:user:password.
			return fmt.Errorf("%w: SITE %s holds spaces or control characters: give the site as the workers' site function names it, by default the host[:port]",
				errUsage, redactURL(site))
		}
		return fmt.Errorf("%w: SITE %q holds spaces or control characters: give the site as the workers' site function names it, by default the host[:port]",
			errUsage, site)
	}
	return nil
}

func (a *app) stats(ctx context.Context, sites []string) error {
	if len(sites) == 0 {
		used, err := a.sw.Sites(ctx)
		if err != nil {
			return err
		}
		for _, u := range used {
			sites = append(sites, u.Site)
		}
	}
	// The pool's size is the same on every site: read it once.
	var proxies int
	if len(sites) > 0 {
		st, err := a.sw.Stats(ctx, sites[0])
		if err != nil {
			return err
		}
		proxies = st.Proxies
	}
	tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "SITE\tPROXIES\tFREE\tLEASED\tBUSY\tCOOLING\tQUARANTINED\tDEAD\t")
	for _, site := range sites {
		ss, err := a.sw.SiteState(ctx, site)
		if err != nil {
			return err
		}
		busy := ss.Leased + ss.Cooling + ss.Quarantined + ss.Dead
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", site, proxies, ss.Free, ss.Leased, busy, ss.Cooling, ss.Quarantined, ss.Dead)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(sites) > 0 {
		if _, err := fmt.Fprintln(a.out, "(slots: one per proxy, or k with Rotation{Concurrency: k}; BUSY = every slot not FREE: LEASED + COOLING + QUARANTINED + DEAD)"); err != nil {
			return err
		}
	}
	if err := a.pausedSites(ctx); err != nil {
		return err
	}
	live, err := a.sw.LiveSessions(ctx)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(a.out, "live sticky sessions: %d\n", live)
	return err
}

// pausedSites prints the sites whose circuit breaker is open or half-open,
// if any: "paused sites:" and one line each.
func (a *app) pausedSites(ctx context.Context) error {
	paused, err := a.sw.PausedSites(ctx)
	if err != nil || len(paused) == 0 {
		return err
	}
	if _, err := fmt.Fprintln(a.out, "paused sites (circuit breaker):"); err != nil {
		return err
	}
	for _, p := range paused {
		var err error
		if p.State == proxyswitch.BreakerOpen && p.Until.After(time.Now().AddDate(50, 0, 0)) {
			_, err = fmt.Fprintf(a.out, "  %s open until resumed (paused by hand)\n", p.Site) // pause SITE without a DURATION
		} else if p.State == proxyswitch.BreakerOpen {
			_, err = fmt.Fprintf(a.out, "  %s open until %s (pause %v)\n", p.Site, p.Until.UTC().Format(time.RFC3339), p.Pause)
		} else {
			_, err = fmt.Fprintf(a.out, "  %s half-open: %d probe(s) out, %d passed\n", p.Site, p.Probes, p.Passed)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// pause pauses a site by hand: args are SITE and optionally a DURATION.
func (a *app) pause(ctx context.Context, args []string) error {
	if len(args) != 1 && len(args) != 2 {
		return fmt.Errorf("%w: pause takes a SITE and optionally a DURATION", errUsage)
	}
	if err := checkSite(args[0]); err != nil {
		return err
	}
	var d time.Duration
	if len(args) == 2 {
		var err error
		if d, err = time.ParseDuration(args[1]); err != nil || d <= 0 {
			return fmt.Errorf("%w: pause duration %q: want a positive duration such as 30s or 10m", errUsage, args[1])
		}
	}
	used, err := a.siteUsed(ctx, args[0])
	if err != nil {
		used = true // the warning is a courtesy: an emergency pause goes ahead
	}
	until, err := a.sw.PauseSite(ctx, args[0], d)
	if err != nil {
		return err
	}
	if d == 0 {
		_, err = fmt.Fprintf(a.out, "paused %s until resumed\n", args[0])
	} else {
		_, err = fmt.Fprintf(a.out, "paused %s until %s\n", args[0], until.UTC().Format(time.RFC3339))
	}
	if err != nil {
		return err
	}
	if !used {
		return a.warnUnusedSite(args[0], "the pause holds under that name")
	}
	return nil
}

func (a *app) ban(ctx context.Context, args []string) error {
	if len(args) != 2 && len(args) != 3 {
		return fmt.Errorf("%w: ban takes a proxy (ID or URL), a SITE and optionally a DURATION", errUsage)
	}
	d := time.Hour
	if len(args) == 3 {
		var err error
		if d, err = time.ParseDuration(args[2]); err != nil || d <= 0 {
			return fmt.Errorf("%w: ban duration %q: want a positive duration such as 30m or 2h", errUsage, args[2])
		}
	}
	if err := checkSite(args[1]); err != nil {
		return err
	}
	used, err := a.siteUsed(ctx, args[1]) // before the ban, which leases there
	if err != nil {
		used = true // the warning is a courtesy: no reason not to ban
	}
	if err := a.sw.Ban(ctx, args[0], args[1], d); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(a.out, "banned proxy %s on %s for at least %v\n", proxyName(args[0]), args[1], d); err != nil {
		return err
	}
	if !used {
		return a.warnUnusedSite(args[1], "the ban holds under that name")
	}
	return nil
}

// unban ends proxy's quarantine on site, and says whether it was
// quarantined there: Unban does not tell, so the proxy's state on the site
// is read first.
func (a *app) unban(ctx context.Context, proxy, site string) error {
	if err := checkSite(site); err != nil {
		return err
	}
	states, err := a.sw.ProxyStates(ctx, site)
	if err != nil {
		return err
	}
	id := proxyName(proxy)
	var before *proxyswitch.ProxyState
	for i := range states {
		if states[i].Proxy.ID() == id {
			before = &states[i]
		}
	}
	// Unban also starts the proxy's backoff over (its strikes on the site),
	// quarantined or not.
	if err := a.sw.Unban(ctx, proxy, site); err != nil {
		return err
	}
	if used, err := a.siteUsed(ctx, site); err == nil && !used {
		if err := a.warnUnusedSite(site, "nothing was unbanned under that name but what a ban under it set"); err != nil {
			return err
		}
	}
	if before != nil && before.QuarantinedSlots == 0 {
		// (A hold of its exit IP there, which a proxy that left the IP
		// earned and no state of this proxy shows, is lifted all the same.)
		_, err = fmt.Fprintf(a.out, "proxy %s was not quarantined on %s (%s): nothing to unban but its backoff and any hold of its exit IP there\n", id, site, before.State)
		return err
	}
	_, err = fmt.Fprintf(a.out, "unbanned proxy %s on %s\n", id, site)
	return err
}

func (a *app) clear(ctx context.Context, args []string) error {
	fs := commandFlags("clear")
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		return printCommandHelp(a.out, "clear")
	}
	if err != nil || fs.NArg() != 0 {
		return fmt.Errorf("%w: clear takes only -yes", errUsage)
	}
	if !flagValue[bool](fs, "yes") {
		return fmt.Errorf("%w: clear deletes every key of pool %q under prefix %q: add -yes to do it", errUsage, a.sw.Pool(), a.prefix)
	}
	if err := a.sw.Clear(ctx); err != nil {
		return err
	}
	_, err = fmt.Fprintf(a.out, "cleared pool %q under prefix %q\n", a.sw.Pool(), a.prefix)
	return err
}

// serve exports the state of the pools to Prometheus, and shows it on a
// status page at /, until ctx ends. It reads Redis only when scraped or
// asked for the page.
func (a *app) serve(ctx context.Context, args []string) error {
	fs := commandFlags("serve")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return printCommandHelp(a.out, "serve")
		}
		return fmt.Errorf("%w: serve: %v", errUsage, err)
	}
	addr, queues := flagValue[string](fs, "addr"), flagValue[string](fs, "queue")
	scrapeTimeout := flagValue[time.Duration](fs, "scrape-timeout")
	if scrapeTimeout <= 0 {
		return fmt.Errorf("%w: serve: -scrape-timeout must be positive", errUsage)
	}
	pools := fs.Args()
	if len(pools) == 0 {
		pools = []string{a.sw.Pool()}
	}
	// A client whose dialling and retries cannot outlast a scrape: with
	// Redis down, one refused (or timed out) dial per read, no retry loop;
	// the next scrape tries again.
	o := *a.ropt
	if o.DialTimeout <= 0 || o.DialTimeout > scrapeTimeout {
		o.DialTimeout = scrapeTimeout
	}
	o.DialerRetries = 1
	o.MaxRetries = -1 // no retries
	a.rdb = redis.NewClient(&o)
	defer a.rdb.Close()
	mopts := []metrics.Option{metrics.WithLogger(a.logger), metrics.WithScrapeTimeout(scrapeTimeout)}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var switches []*proxyswitch.Switch
	for _, pool := range pools {
		sw, err := a.newSwitch(pool)
		if err != nil {
			return fmt.Errorf("%w: %w", errUsage, err)
		}
		if err := reg.Register(metrics.NewState(sw, mopts...)); err != nil {
			return fmt.Errorf("%w: pool %q named twice", errUsage, pool)
		}
		switches = append(switches, sw)
	}
	var namespaces []string
	if queues != "" {
		namespaces = strings.Split(queues, ",")
	}
	for _, ns := range namespaces {
		st, err := a.newStorage(ns)
		if err != nil {
			return fmt.Errorf("%w: serve -queue: %w", errUsage, err)
		}
		if err := reg.Register(metrics.NewQueue(st, mopts...)); err != nil {
			return fmt.Errorf("%w: queue %q named twice", errUsage, ns)
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:      promLogger{a.logger},
		ErrorHandling: promhttp.ContinueOnError,
	}))
	mux.Handle("GET /{$}", newStatusPage(switches, scrapeTimeout, a.logger))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	what := "pool " + strings.Join(pools, ", ")
	if len(namespaces) > 0 {
		what += " and queue " + strings.Join(namespaces, ", ")
	}
	if _, err := fmt.Fprintf(a.out, "serving metrics of %s on http://%s/metrics\nstatus page on http://%s/\n", what, ln.Addr(), ln.Addr()); err != nil {
		ln.Close()
		return err
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return err
	}
	<-served
	return nil
}

// promLogger passes promhttp's errors (a failed write to a scraper) on as
// warnings.
type promLogger struct{ l *slog.Logger }

func (p promLogger) Println(v ...any) {
	p.l.Warn("proxyswitch: serving /metrics: " + strings.TrimSuffix(fmt.Sprintln(v...), "\n"))
}

type silentRedis struct{}

func (silentRedis) Printf(context.Context, string, ...any) {}

// proxyName names a proxy given on the command line without its password:
// the ID, as list shows it.
func proxyName(arg string) string {
	if p, err := proxyswitch.ParseProxy(arg); err == nil {
		return p.ID()
	}
	if isProxyID(arg) {
		return arg
	}
	return "(unparseable)"
}

// isProxyID reports whether arg is a proxy ID as list shows it: 16
// lower-case hex digits. The library takes such an argument as an ID
// before trying it as a URL, and so does the CLI.
func isProxyID(arg string) bool {
	return len(arg) == 16 && strings.Trim(arg, "0123456789abcdef") == ""
}

// checkProxyArgs refuses, before any Redis call, a proxy argument of cmd
// (ban and unban take one first, drain and revive only proxies, remove
// proxies or gateway templates)
// that is neither a proxy ID nor a proxy URL, saying both: the library's
// error alone says only why it is no URL ("missing port"). A failure, not
// a usage mistake (exit code 1), as an invalid line of load is.
func checkProxyArgs(cmd string, args []string) error {
	var proxies []string
	templates := false // a gateway template names all its proxies
	switch cmd {
	case "ban", "unban":
		proxies = args[:min(len(args), 1)]
	case "drain", "revive":
		proxies = args
	case "remove":
		proxies, templates = args, true
	}
	for _, arg := range proxies {
		if isProxyID(arg) {
			continue
		}
		if templates && strings.Contains(arg, "{session") {
			continue // the library checks it, and its error says what is wrong
		}
		if _, err := proxyswitch.ParseProxy(arg); err != nil {
			return fmt.Errorf("a proxy argument is neither a proxy ID (16 hex digits, as list shows) nor a proxy URL: %s", message(err))
		}
	}
	return nil
}

// redactURL names a URL given on the command line, which may not parse,
// without echoing anything that could be user info: the scheme if it is a
// known one, "xxxxx@" for any user info, and host[:port] when it is surely
// one; else a placeholder. The path, query and fragment are dropped (a
// password with '/', '?' or '#' lands there).
func redactURL(raw string) string {
	return redactSplit(raw).String()
}

// knownSchemes are the schemes an error may name: any other could be a user
// name read as a scheme.
var knownSchemes = map[string]bool{"redis": true, "rediss": true, "unix": true, "http": true, "https": true,
	"socks5": true, "socks5h": true}

func redactSplit(raw string) redact.Parts {
	return redact.Split(raw, func(s string) bool { return knownSchemes[s] })
}

// redactStored names a URL read back from the queue, which went through
// url.URL.String when it was queued, so parses as it was meant: its user
// name and password are replaced by "xxxxx".
func redactStored(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return redactURL(raw)
	}
	if u.User != nil {
		u.User = url.User("xxxxx")
	}
	return u.String()
}
