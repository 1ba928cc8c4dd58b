// Command multiserver runs a small cluster on one machine: worker processes
// (this program started again with -worker), each a server with its own
// collector and its own Redis connections, crawl the fake marketplaces as
// one. They share nothing but Redis: the proxy pool (proxyswitch), and the
// visited set and the request queue (proxyswitch/storage), so each page is
// fetched once by whichever server takes it from the queue, and no two
// servers ever use one IP on one marketplace at the same moment.
//
//	go run ./_examples/multiserver                 # 3 worker processes
//	go run ./_examples/multiserver -servers 5
//	go run ./_examples/multiserver -redis server   # a private redis-server from PATH (default: an embedded Redis)
//	go run ./_examples/multiserver -redis redis://127.0.0.1:6379/0
//
// The parent process holds the stage: Redis (the embedded one, which the
// workers reach over loopback, unless told otherwise), the local
// proxies and the marketplaces. It loads the pool, queues the catalog's
// first pages, starts the workers, and reports what each worker did and
// what the marketplaces saw.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/gocolly/colly/v2/queue"
	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/proxyswitchtest"
	"github.com/proxyswitch/proxyswitch/storage"
	"github.com/redis/go-redis/v9"
)

// job is what the parent tells a worker, on its standard input.
type job struct {
	Server    string
	RedisURL  string
	Workers   int
	Platforms []platform
}

type platform struct {
	Name, Host string
	Sel        proxyswitchtest.Selectors
}

// report is what a worker tells the parent, on its standard output.
type report struct {
	Server  string
	Pages   int              // pages fetched (catalog and product)
	Sent    int              // requests sent through the proxies
	Bans    map[string]int64 // bans and proxy failures it detected, by reason
	Elapsed time.Duration
}

const (
	prefix    = "multiserver" // proxyswitch keys
	namespace = "multiserver" // storage keys
)

func main() {
	worker := flag.Bool("worker", false, "run as a worker (started by the parent)")
	redisArg := proxyswitchtest.RedisFlag()
	servers := flag.Int("servers", 3, "worker processes")
	workers := flag.Int("workers", 20, "parallel requests per worker process")
	nProxies := flag.Int("proxies", 150, "proxies in the pool")
	burnt := flag.Int("burnt", 6, "proxies already on the marketplaces' blacklist")
	flag.Parse()
	log.SetFlags(0)
	if *worker {
		runWorker()
		return
	}
	if *servers < 1 || *workers < 1 {
		log.Fatal("multiserver: need servers, workers >= 1")
	}
	ctx := context.Background()
	st, err := proxyswitchtest.StartStage(proxyswitchtest.StageConfig{
		Redis: *redisArg, Proxies: *nProxies, Burnt: *burnt, Market: &proxyswitchtest.MarketConfig{}})
	must(err)
	defer st.Close()
	rdb := st.Redis.Client()
	defer rdb.Close()
	market := st.Market

	// Load the pool and queue the first catalog page of every category.
	sw, err := proxyswitch.NewSwitch(rdb, proxyswitch.WithPrefix(prefix))
	must(err)
	must(sw.Clear(ctx))
	defer sw.Clear(ctx)
	defer sw.Close(ctx) // before the Clear: stops the lease renewer, releases whatever is still leased
	_, err = sw.Replace(ctx, st.Farm.URLs())
	must(err)
	queued, err := storage.New(rdb, storage.WithNamespace(namespace))
	must(err)
	must(queued.Clear(ctx))
	defer queued.Clear(ctx)
	q, err := queue.New(1, queued)
	must(err)
	j := job{RedisURL: st.Redis.URL(), Workers: *workers}
	for _, p := range market.Platforms {
		j.Platforms = append(j.Platforms, platform{p.Name, p.Host(), p.Sel})
		for _, u := range p.CategoryURLs() {
			must(q.AddURL(u))
		}
	}
	fmt.Printf("%d worker processes x %d workers share %d proxies (%d blacklisted already); Redis: %s\n\n",
		*servers, *workers, *nProxies, len(st.Burnt), st.Redis)

	// Start the workers and wait for their reports.
	self, err := os.Executable()
	must(err)
	start := time.Now()
	reports := make([]report, *servers)
	var wg sync.WaitGroup
	for i := range *servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j := j
			j.Server = fmt.Sprintf("server-%d", i+1)
			r, err := startWorker(self, j)
			reports[i] = r
			if err != nil {
				log.Fatalf("%s: %v", j.Server, err)
			}
		}()
	}
	wg.Wait()

	pages := 0
	for _, r := range reports {
		pages += r.Pages
		fmt.Printf("%-9s fetched %4d pages with %4d requests in %v; bans detected: %v\n",
			r.Server, r.Pages, r.Sent, r.Elapsed.Round(100*time.Millisecond), r.Bans)
	}
	ms := market.Stats()
	catalog := 0
	for _, p := range market.Platforms {
		catalog += len(p.CatalogURLs()) + p.Products()
	}
	fmt.Printf("\n%d of %d pages fetched in %v, each once: the marketplaces saw %d requests, %d refused (%v),\n",
		pages, catalog, time.Since(start).Round(100*time.Millisecond), ms.Requests, ms.Bans, ms.Refused)
	fmt.Printf("%d IP collisions, %d requests without a proxy, %d IPs on their blacklist.\n", ms.Collisions, ms.Direct, ms.Listed)
	if dead, err := queued.DeadLetters(ctx, 0, 1000); err == nil && len(dead) > 0 {
		fmt.Printf("%d requests given up (dead letters)\n", len(dead))
	}
	if ms.Collisions > 0 || ms.Direct > 0 {
		os.Exit(1)
	}
}

// startWorker runs one worker process with j on its standard input and
// returns its report.
func startWorker(self string, j job) (report, error) {
	cmd := exec.Command(self, "-worker")
	cmd.Stderr = os.Stderr
	in, err := json.Marshal(j)
	if err != nil {
		return report{}, err
	}
	cmd.Stdin = strings.NewReader(string(in))
	out, err := cmd.Output()
	if err != nil {
		return report{}, fmt.Errorf("worker process: %w", err)
	}
	var r report
	return r, json.Unmarshal(out, &r)
}

// runWorker is one server: it takes requests from the shared queue until
// the whole crawl is done, leasing a proxy from the shared pool for each.
func runWorker() {
	var j job
	must(json.NewDecoder(bufio.NewReader(os.Stdin)).Decode(&j))
	opt, err := redis.ParseURL(j.RedisURL)
	must(err)
	opt.ContextTimeoutEnabled = true // each call bounded by its context, on the caller's goroutine
	rdb := redis.NewClient(opt)
	defer rdb.Close()

	opts := []proxyswitch.Option{
		proxyswitch.WithPrefix(prefix),
		proxyswitch.WithRotation(proxyswitch.Rotation{Cooldown: proxyswitchtest.SafeInterval}), // under every marketplace's rate limit
		proxyswitch.WithBans(proxyswitch.Bans{AllSites: true}),                                 // they share their blacklist
		proxyswitch.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))),
	}
	sel := map[string]proxyswitchtest.Selectors{}
	for _, p := range j.Platforms {
		sel[p.Host] = p.Sel
		opts = append(opts,
			proxyswitch.WithExpect(p.Host, `^/catalog/`, p.Sel.Card),
			proxyswitch.WithExpect(p.Host, `^/product/`, p.Sel.Title, p.Sel.Price))
	}
	var sent atomic.Int64
	opts = append(opts, proxyswitch.WithBaseTransport(&http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			sent.Add(1) // keep-alives are off: one dial per request
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	}))
	sw, err := proxyswitch.NewSwitch(rdb, opts...)
	must(err)
	defer sw.Close(context.Background()) // at exit: stops the lease renewer, releases whatever is still leased
	st, err := storage.New(rdb, storage.WithNamespace(namespace))
	must(err)
	q, err := queue.New(j.Workers, st)
	must(err)

	c := colly.NewCollector()
	must(c.SetStorage(st)) // one visited set for the whole cluster
	sw.Attach(c)           // proxies from the shared pool
	st.Attach(c)           // acknowledge queued requests
	c.SetRequestTimeout(time.Minute)
	var pages atomic.Int64
	c.OnHTML("html", func(e *colly.HTMLElement) {
		pages.Add(1)
		s := sel[e.Request.URL.Host]
		e.ForEach(s.Card+", "+s.Next, func(_ int, a *colly.HTMLElement) {
			_ = q.AddURL(e.Request.AbsoluteURL(a.Attr("href"))) // any server may take it
		})
	})
	c.OnError(func(r *colly.Response, err error) { log.Printf("%s: %s: %v", j.Server, r.Request.URL, err) })

	start := time.Now()
	must(q.Run(c)) // until the queue is empty cluster-wide
	bans := map[string]int64{}
	for k, n := range sw.BanCounts() {
		bans[k.Reason] += n
	}
	must(json.NewEncoder(os.Stdout).Encode(report{Server: j.Server, Pages: int(pages.Load()), Sent: int(sent.Load()), Bans: bans, Elapsed: time.Since(start)}))
}

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
