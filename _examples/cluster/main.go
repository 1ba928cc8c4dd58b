// Command cluster shows the problem proxyswitch solves and its cure, in one
// command: three simulated servers with 50 workers each share 500 proxies
// to crawl three fake marketplaces (modelled on Wildberries, Ozon and Avito,
// with their anti-bot habits and a blacklist they share), first the way
// clusters do it today (every server walks the shared proxy list on its own,
// with Colly's round-robin switcher), then through proxyswitch, and prints
// what each run got and what the marketplaces saw, side by side.
//
//	go run ./_examples/cluster                                   # an embedded in-process Redis (miniredis): nothing to install
//	go run ./_examples/cluster -redis server                     # a private redis-server from PATH on a free port (faster)
//	go run ./_examples/cluster -redis redis://127.0.0.1:6379/0   # your Redis
//
// Everything runs on loopback: each proxy is a local forward proxy that
// dials the marketplaces from its own address 127.0.x.y, so the
// marketplaces tell the 500 proxies apart as real sites would, and count an
// IP collision whenever a request arrives while another one from the same
// IP is still in flight.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"time"

	"github.com/proxyswitch/proxyswitch/proxyswitchtest"
	"github.com/redis/go-redis/v9"
)

func main() {
	redisArg := proxyswitchtest.RedisFlag()
	prefix := flag.String("prefix", "clusterdemo", "key prefix in Redis (the demo clears its pool before and after)")
	servers := flag.Int("servers", 3, "simulated servers")
	workers := flag.Int("workers", 50, "parallel requests per server")
	nProxies := flag.Int("proxies", 500, "proxies in the shared pool")
	burnt := flag.Int("burnt", 20, "proxies already on the marketplaces' shared blacklist")
	categories := flag.Int("categories", 8, "categories per marketplace")
	pages := flag.Int("pages", 5, "catalog pages per category")
	perPage := flag.Int("per-page", 20, "products per catalog page")
	retries := flag.Int("retries", 2, "re-sends of a refused page through another proxy")
	only := flag.String("only", "", `run one side only: "without" or "with"`)
	verbose := flag.Bool("v", false, "print every page given up, and why")
	flag.Parse()
	log.SetFlags(0)
	if os.Getenv("GOGC") == "" {
		// 500 proxies, 3 sites, 150 workers and an embedded Redis in one
		// process allocate a lot: collect garbage less often.
		debug.SetGCPercent(400)
	}
	if *servers < 1 || *workers < 1 || *categories < 1 || *pages < 1 || *perPage < 1 || *retries < 0 {
		log.Fatal("cluster: need servers, workers, categories, pages, per-page >= 1 and retries >= 0")
	}
	if *only != "" && *only != "without" && *only != "with" {
		log.Fatal(`cluster: -only takes "without" or "with"`)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	// Redis and the proxies; the marketplaces: fresh ones for each run.
	st, err := proxyswitchtest.StartStage(proxyswitchtest.StageConfig{Redis: *redisArg, Proxies: *nProxies, Burnt: *burnt})
	if err != nil {
		log.Fatalf("cluster: %v", err)
	}
	defer st.Close()
	rs, proxies := st.Redis, st.Farm.Proxies
	if err := ping(ctx, rs); err != nil {
		log.Fatalf("cluster: %s does not answer: %v", rs, err)
	}

	s := setup{
		Servers: *servers,
		Workers: *workers,
		Market: proxyswitchtest.MarketConfig{
			Categories:       *categories,
			PagesPerCategory: *pages,
			ProductsPerPage:  *perPage,
		},
		Retries: *retries,
		Prefix:  *prefix,
		Logger:  slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
		// Each server has its own connection to Redis, as on real machines.
		Redis: func() redis.UniversalClient { return rs.Client() },
	}
	s.Proxies, s.Market.Burnt = st.Farm.URLs(), st.Burnt

	fmt.Printf("%d servers x %d workers share %d proxies (%s .. %s); %d of them are already on the marketplaces' blacklist.\n",
		*servers, *workers, *nProxies, proxies[0].SourceIP(), proxies[len(proxies)-1].SourceIP(), len(s.Market.Burnt))
	fmt.Printf("They crawl 3 fake marketplaces (wildberries, ozon, avito): %d catalog pages, %d product pages. Redis: %s.\n\n",
		3**categories**pages, 3**categories**pages**perPage, rs)

	if *verbose {
		s.GaveUp = func(u string, err error) { log.Printf("gave up %s: %v", u, err) }
	}
	bar := newProgress(os.Stderr)
	s.Started, s.Advance = bar.start, bar.add
	var results []outcome
	for _, side := range []struct {
		name string
		run  func(context.Context, setup) (outcome, error)
	}{{"without", runUncoordinated}, {"with", runProxyswitch}} {
		if *only != "" && *only != side.name {
			continue
		}
		out, err := side.run(ctx, s)
		bar.finish()
		if err != nil {
			if errors.Is(err, context.Canceled) {
				log.Fatal("cluster: interrupted")
			}
			log.Fatalf("cluster: run %s proxyswitch: %v", side.name, err)
		}
		results = append(results, out)
	}
	if !report(os.Stdout, results, *nProxies) {
		os.Exit(1)
	}
}

func ping(ctx context.Context, rs *proxyswitchtest.Redis) error {
	rdb := rs.Client()
	defer rdb.Close()
	return rdb.Ping(ctx).Err()
}

// report prints the runs side by side, then checks what proxyswitch
// promises; it reports whether the promises held.
func report(w io.Writer, rs []outcome, proxies int) bool {
	row := func(label string, f func(outcome) string) {
		fmt.Fprintf(w, "%-36s", label)
		for _, r := range rs {
			fmt.Fprintf(w, "%24s", f(r))
		}
		fmt.Fprintln(w)
	}
	perServer := func(f func(serverOutcome) string) func(outcome) string {
		return func(r outcome) string {
			var parts []string
			for _, s := range r.Servers {
				parts = append(parts, f(s))
			}
			return strings.Join(parts, " / ")
		}
	}
	fmt.Fprintln(w)
	row("", func(r outcome) string { return r.Run })
	row("pages scraped", func(r outcome) string { return fmt.Sprintf("%d / %d", r.Scraped, r.Products) })
	row("success rate", func(r outcome) string { return fmt.Sprintf("%.1f%%", 100*float64(r.Scraped)/float64(r.Products)) })
	row("bans (refused answers)", func(r outcome) string { return fmt.Sprint(r.Market.Bans) })
	row("  403 / 429 / captcha / placeholder", func(r outcome) string {
		f := r.Market.Refused
		return fmt.Sprintf("%d / %d / %d / %d", f["403"], f["429"], f["captcha"], f["placeholder"])
	})
	row("IP collisions", func(r outcome) string { return fmt.Sprint(r.Market.Collisions) })
	row(fmt.Sprintf("IPs blacklisted (of %d)", proxies), func(r outcome) string { return fmt.Sprint(r.Market.Listed) })
	row("requests sent", func(r outcome) string { return fmt.Sprint(r.Sent) })
	row("requests per server", perServer(func(s serverOutcome) string { return fmt.Sprint(s.Sent) }))
	row("pages scraped per server", perServer(func(s serverOutcome) string { return fmt.Sprint(s.Scraped) }))
	row("time per server", perServer(func(s serverOutcome) string { return fmt.Sprintf("%.1fs", s.Elapsed.Seconds()) }))
	row("time", func(r outcome) string { return r.Elapsed.Round(100 * time.Millisecond).String() })
	fmt.Fprintln(w)

	ok := true
	var without *outcome
	for i, r := range rs {
		if r.Run == runWithout {
			without = &rs[i]
			continue
		}
		fmt.Fprintf(w, "proxyswitch quarantined %d proxies on every platform; %d leases left in Redis.\n", r.Quarantined, r.LeasesLeft)
		if r.Market.Collisions > 0 || r.Market.Direct > 0 {
			fmt.Fprintf(w, "FAILED: with proxyswitch the marketplaces saw %d IP collisions and %d requests without a proxy; want none.\n", r.Market.Collisions, r.Market.Direct)
			ok = false
		}
		if without != nil && r.Market.Bans >= without.Market.Bans {
			fmt.Fprintf(w, "FAILED: %d bans with proxyswitch, %d without; want fewer with.\n", r.Market.Bans, without.Market.Bans)
			ok = false
		}
	}
	return ok
}
