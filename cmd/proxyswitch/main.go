// Command proxyswitch administers a proxyswitch pool in Redis.
//
//	proxyswitch [flags] <command> [arguments]
//
// Commands:
//
//	load FILE         replace the pool with the proxies in FILE ("-" for stdin), atomically
//	add URL...        add proxies
//	remove ID|URL...  remove proxies
//	list              list the proxies: ID and URL (password redacted)
//	stats [SITE...]   a table of the pool's state per site (default: every site leased recently)
//
// Flags:
//
//	-redis URL   Redis URL (default $PROXYSWITCH_REDIS_URL, else redis://127.0.0.1:6379/0)
//	-prefix P    key prefix (default "proxyswitch")
//	-pool NAME   pool (default "default")
//	-timeout D   bound on each Redis round trip (default 5s)
//
// Exit codes: 0 success, 1 the operation failed, 2 bad usage.
// Passwords in proxy and Redis URLs are never printed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"text/tabwriter"
	"time"

	"github.com/proxyswitch/proxyswitch"
	"github.com/redis/go-redis/v9"
)

// EnvRedisURL names the environment variable read when -redis is not given.
const EnvRedisURL = "PROXYSWITCH_REDIS_URL"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// errUsage marks a command-line mistake (exit code 2).
var errUsage = errors.New("usage")

func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("proxyswitch", flag.ContinueOnError)
	fs.SetOutput(stderr)
	redisURL := fs.String("redis", "", "Redis URL (default $"+EnvRedisURL+", else redis://127.0.0.1:6379/0)")
	prefix := fs.String("prefix", "proxyswitch", "key prefix")
	pool := fs.String("pool", "default", "pool name")
	timeout := fs.Duration("timeout", 5*time.Second, "bound on each Redis round trip")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: proxyswitch [flags] load FILE | add URL... | remove ID|URL... | list | stats [SITE...]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	raw := *redisURL
	if raw == "" {
		raw = getenv(EnvRedisURL)
	}
	if raw == "" {
		raw = "redis://127.0.0.1:6379/0"
	}
	opt, err := redis.ParseURL(raw)
	if err != nil {
		fmt.Fprintf(stderr, "proxyswitch: invalid Redis URL %s: want redis://[user:password@]host:port/db\n", redactURL(raw))
		return 2
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	sw, err := proxyswitch.NewSwitch(rdb, proxyswitch.WithPrefix(*prefix), proxyswitch.WithPool(*pool), proxyswitch.WithRedisTimeout(*timeout))
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	cmd, rest := fs.Arg(0), fs.Args()[1:]
	err = dispatch(ctx, sw, cmd, rest, stdin, stdout)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintln(stderr, "proxyswitch:", err)
		fs.Usage()
		return 2
	default:
		fmt.Fprintf(stderr, "proxyswitch: %s (Redis %s): %v\n", cmd, opt.Addr, err)
		return 1
	}
}

func dispatch(ctx context.Context, sw *proxyswitch.Switch, cmd string, args []string, stdin io.Reader, out io.Writer) error {
	switch cmd {
	case "load":
		if len(args) != 1 {
			return fmt.Errorf("%w: load takes one FILE (or - for stdin)", errUsage)
		}
		return load(ctx, sw, args[0], stdin, out)
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
		return report(out, ch, err)
	case "list":
		if len(args) != 0 {
			return fmt.Errorf("%w: list takes no arguments", errUsage)
		}
		return list(ctx, sw, out)
	case "stats":
		return stats(ctx, sw, args, out)
	}
	return fmt.Errorf("%w: unknown command %q", errUsage, cmd)
}

func load(ctx context.Context, sw *proxyswitch.Switch, path string, stdin io.Reader, out io.Writer) error {
	r := stdin
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
	ch, err := sw.ReplaceProxies(ctx, ps)
	return report(out, ch, err)
}

func report(out io.Writer, ch proxyswitch.PoolChange, err error) error {
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "added %d, removed %d, pool size %d\n", ch.Added, ch.Removed, ch.Size)
	return err
}

func list(ctx context.Context, sw *proxyswitch.Switch, out io.Writer) error {
	ps, err := sw.List(ctx)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPROXY")
	for _, p := range ps {
		fmt.Fprintf(tw, "%s\t%s\n", p.ID(), p)
	}
	return tw.Flush()
}

func stats(ctx context.Context, sw *proxyswitch.Switch, sites []string, out io.Writer) error {
	if len(sites) == 0 {
		used, err := sw.Sites(ctx)
		if err != nil {
			return err
		}
		for _, u := range used {
			sites = append(sites, u.Site)
		}
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "SITE\tPROXIES\tFREE\tLEASED\tBUSY\t")
	for _, site := range sites {
		st, err := sw.Stats(ctx, site)
		if err != nil {
			return err
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t\n", site, st.Proxies, st.FreeSlots, st.Leased, st.BusySlots)
	}
	return tw.Flush()
}

// redactURL hides the password of a URL that may not parse.
func redactURL(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		return u.Redacted()
	}
	return "(unparseable URL)"
}
