// Command metrics shows how a proxyswitch cluster is monitored: each worker
// exports its own /metrics (a metrics.Collector: attempts, bans, latency,
// sticky sessions, the member list as it sees it), one process exports the
// cluster's state read from Redis (a metrics.StateCollector, as
// "proxyswitch serve" does), and Prometheus scrapes them all; the dashboard
// (dashboards/proxyswitch.json) sums the workers' series.
//
//	go run ./_examples/metrics                  # crawl, print what each /metrics says, exit
//	go run ./_examples/metrics -serve           # then keep serving, for prometheus.yml (next to this file)
//	go run ./_examples/metrics -redis server    # a private redis-server from PATH instead of the embedded Redis
//
// By default it listens on 127.0.0.1:9465 (the cluster state, as
// "proxyswitch serve") and 127.0.0.1:9466.. (one port per worker): the
// targets of prometheus.yml. -port 0 takes free ports instead.
//
// Three workers (here goroutines, each with its own Redis client and its
// own Prometheus registry, as separate servers would have) crawl the fake
// marketplaces of package proxyswitchtest through one shared proxy pool, a
// few of whose proxies the marketplaces have already blacklisted, so there
// are bans to count; each worker then runs two sticky-session shoppers.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/metrics"
	"github.com/proxyswitch/proxyswitch/proxyswitchtest"
	"github.com/proxyswitch/proxyswitch/shard"
)

// prefix is the key prefix of this demo's pool in Redis.
const prefix = "metricsdemo"

// config is what the flags set.
type config struct {
	redis          string
	host           string
	port           int // the state exporter's; workers take the next ones (0: free ports)
	workers        int
	proxies, burnt int
}

func main() {
	redisArg := proxyswitchtest.RedisFlag()
	cfg := config{}
	flag.StringVar(&cfg.host, "host", "127.0.0.1", "address to listen on")
	flag.IntVar(&cfg.port, "port", 9465, "port of the cluster-state exporter; worker i listens on port+i (0: free ports)")
	flag.IntVar(&cfg.workers, "workers", 3, "workers, each with its own /metrics")
	flag.IntVar(&cfg.proxies, "proxies", 60, "proxies in the pool")
	flag.IntVar(&cfg.burnt, "burnt", 6, "proxies already on the marketplaces' blacklist")
	serve := flag.Bool("serve", false, "after the crawl, keep serving /metrics until interrupted (for prometheus.yml)")
	flag.Parse()
	cfg.redis = *redisArg
	log.SetFlags(0)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	d, err := start(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()
	for _, e := range d.endpoints {
		fmt.Printf("%-8s http://%s/metrics\n", e.name, e.addr)
	}
	start := time.Now()
	if err := d.crawl(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("crawled in %v\n\n", time.Since(start).Round(100*time.Millisecond))
	if err := d.summary(os.Stdout); err != nil {
		log.Fatal(err)
	}
	if ms := d.stage.Market.Stats(); ms.Collisions > 0 || ms.Direct > 0 {
		log.Fatalf("the marketplaces saw %d IP collisions and %d requests without a proxy", ms.Collisions, ms.Direct)
	}
	if *serve {
		fmt.Println("\nserving until interrupted (prometheus --config.file=_examples/metrics/prometheus.yml)")
		<-ctx.Done()
	}
}

// endpoint is one process's /metrics.
type endpoint struct {
	name, addr string
	srv        *http.Server
}

// worker is one crawling server: its Switch, its Collector and registry,
// and its membership in the pool's member list.
type worker struct {
	name   string
	sw     *proxyswitch.Switch
	member *shard.Membership
	close  func() error // its Redis client
}

// demo is the stage, the workers and the exporters.
type demo struct {
	stage     *proxyswitchtest.Stage
	admin     *proxyswitch.Switch
	workers   []*worker
	endpoints []endpoint // the state exporter first, then one per worker
	closers   []func() error
}

// start starts the stage, loads the pool, and starts the exporters: the
// cluster state's and each worker's, each on its own listener and registry.
func start(ctx context.Context, cfg config) (_ *demo, err error) {
	if cfg.workers < 1 || cfg.proxies < 1 || cfg.burnt < 0 || cfg.burnt > cfg.proxies {
		return nil, errors.New("metrics: need workers >= 1, proxies >= 1 and 0 <= burnt <= proxies")
	}
	st, err := proxyswitchtest.StartStage(proxyswitchtest.StageConfig{Redis: cfg.redis, Proxies: cfg.proxies, Burnt: cfg.burnt,
		Market: &proxyswitchtest.MarketConfig{Categories: 2, PagesPerCategory: 2, ProductsPerPage: 10}})
	if err != nil {
		return nil, err
	}
	d := &demo{stage: st}
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	opts := []proxyswitch.Option{
		proxyswitch.WithPrefix(prefix),
		proxyswitch.WithRotation(proxyswitch.Rotation{Cooldown: proxyswitchtest.SafeInterval}), // under every marketplace's rate limit
		proxyswitch.WithBans(proxyswitch.Bans{AllSites: true}),                                 // they share their blacklist
	}
	for _, p := range st.Market.Platforms {
		opts = append(opts,
			proxyswitch.WithExpect(p.Host(), `^/catalog/`, p.Sel.Card),
			proxyswitch.WithExpect(p.Host(), `^/product/`, p.Sel.Title, p.Sel.Price))
	}
	client := func() *proxyswitch.Switch {
		rdb := st.Redis.Client()
		d.closers = append(d.closers, rdb.Close)
		sw, e := proxyswitch.NewSwitch(rdb, opts...)
		if e != nil {
			err = e
		}
		return sw
	}

	// The cluster state, read from Redis at each scrape: one process only
	// (in production, "proxyswitch serve").
	d.admin = client()
	if err != nil {
		return nil, err
	}
	if err := d.admin.Clear(ctx); err != nil {
		return nil, err
	}
	if _, err := d.admin.Replace(ctx, st.Farm.URLs()); err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewState(d.admin))
	if err := d.listen(cfg, "state", cfg.port, reg); err != nil {
		return nil, err
	}

	// Every worker: its own Collector on its own registry, under its own
	// server label, and its place in the pool's member list.
	var allSeen sync.WaitGroup
	allSeen.Add(cfg.workers)
	for i := 1; i <= cfg.workers; i++ {
		w := &worker{name: "worker-" + strconv.Itoa(i), sw: client()}
		if err != nil {
			return nil, err
		}
		col := metrics.New(w.sw, metrics.WithServer(w.name))
		reg := prometheus.NewRegistry()
		reg.MustRegister(col)
		var seen sync.Once
		mrdb := st.Redis.Client()
		d.closers = append(d.closers, mrdb.Close)
		m, err := shard.NewMembership(mrdb, shard.MemberConfig{Prefix: prefix, Pool: w.sw.Pool(), Self: w.name,
			Changed: func(list []string) {
				col.ObserveMembers(list)
				if len(list) == cfg.workers {
					seen.Do(allSeen.Done) // for this demo only: crawl once every worker sees every other
				}
			}})
		if err != nil {
			return nil, err
		}
		if err := m.Start(ctx); err != nil {
			return nil, err
		}
		w.member = m
		d.workers = append(d.workers, w)
		port := 0
		if cfg.port != 0 {
			port = cfg.port + i
		}
		if err := d.listen(cfg, w.name, port, reg); err != nil {
			return nil, err
		}
	}
	seenAll := make(chan struct{})
	go func() { allSeen.Wait(); close(seenAll) }()
	select {
	case <-seenAll: // within a heartbeat (1s)
	case <-time.After(10 * time.Second):
		return nil, errors.New("metrics: the workers did not see each other in the member list within 10s")
	}
	return d, nil
}

// listen serves reg's /metrics on host:port.
func (d *demo) listen(cfg config, name string, port int, reg *prometheus.Registry) error {
	ln, err := net.Listen("tcp", net.JoinHostPort(cfg.host, strconv.Itoa(port)))
	if err != nil {
		return fmt.Errorf("%s: %w (-port 0 takes free ports)", name, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	d.endpoints = append(d.endpoints, endpoint{name: name, addr: ln.Addr().String(), srv: srv})
	return nil
}

// crawl has the workers crawl the marketplaces, each category going to one
// worker, then run two sticky-session shoppers each.
func (d *demo) crawl(ctx context.Context) error {
	market := d.stage.Market
	var seeds []string
	for _, p := range market.Platforms {
		seeds = append(seeds, p.CategoryURLs()...)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(d.workers))
	for i, w := range d.workers {
		var mine []string
		for j := i; j < len(seeds); j += len(d.workers) {
			mine = append(mine, seeds[j])
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = w.crawl(ctx, market, mine)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// crawl walks seeds (catalog pages, their next pages, every product they
// link) with one collector, then two shoppers' sticky sessions.
func (w *worker) crawl(ctx context.Context, market *proxyswitchtest.Market, seeds []string) error {
	c := colly.NewCollector(colly.Async(true), colly.StdlibContext(ctx))
	w.sw.Attach(c)
	c.SetRequestTimeout(time.Minute)
	if err := c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: 10}); err != nil {
		return err
	}
	var products []string
	var mu sync.Mutex
	c.OnHTML("html", func(e *colly.HTMLElement) {
		p := market.Platform(e.Request.URL.Host)
		if strings.HasPrefix(e.Request.URL.Path, "/catalog/") {
			e.ForEach(p.Sel.Card+", "+p.Sel.Next, func(_ int, a *colly.HTMLElement) { _ = e.Request.Visit(a.Attr("href")) })
			return
		}
		mu.Lock()
		products = append(products, e.Request.URL.String())
		mu.Unlock()
	})
	c.OnError(func(r *colly.Response, err error) { log.Printf("%s: gave up %s: %v", w.name, r.Request.URL, err) })
	for _, u := range seeds {
		if err := c.Visit(u); err != nil {
			return err
		}
	}
	c.Wait()
	// Two shoppers, each from one IP with its own cookies while its session
	// lives (counted by proxyswitch_sessions_started_total, and live ones
	// by the state's proxyswitch_sessions_live).
	for i, u := range products[:min(2, len(products))] {
		task := fmt.Sprintf("%s-shopper-%d", w.name, i+1)
		if err := c.Request("GET", u+"?from="+task, nil, proxyswitch.NewTaskContext(task), nil); err != nil {
			return err
		}
	}
	c.Wait()
	return nil
}

// Close stops the exporters, the workers' memberships, the clients and
// the stage, and clears the pool.
func (d *demo) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, e := range d.endpoints {
		_ = e.srv.Shutdown(ctx)
	}
	for _, w := range d.workers {
		_ = w.member.Stop(ctx)
	}
	if d.admin != nil {
		_ = d.admin.Clear(ctx)
	}
	for _, c := range d.closers {
		_ = c()
	}
	d.stage.Close()
}

// scrape fetches and parses one /metrics page, as Prometheus would.
func scrape(addr string) (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET http://%s/metrics: %s", addr, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// sum adds up the values of family's counters and gauges whose labels
// include want.
func sum(fams map[string]*dto.MetricFamily, family string, want map[string]string) float64 {
	var total float64
	for _, m := range fams[family].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		ok := true
		for k, v := range want {
			ok = ok && labels[k] == v
		}
		if ok {
			total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return total
}

// summary scrapes every endpoint and prints what each says, and the sums
// over the workers that the dashboard shows.
func (d *demo) summary(out io.Writer) error {
	var attempts, bans, sessions float64
	for _, e := range d.endpoints {
		fams, err := scrape(e.addr)
		if err != nil {
			return err
		}
		if e.name == "state" {
			var slots []string
			for _, state := range []string{"free", "leased", "cooling", "quarantined", "dead"} {
				slots = append(slots, fmt.Sprintf("%s %v", state, sum(fams, "proxyswitch_site_slots", map[string]string{"state": state})))
			}
			fmt.Fprintf(out, "%-8s proxies %v, members %v, live sessions %v; slots over every site: %s\n", e.name,
				sum(fams, "proxyswitch_pool_proxies", nil), sum(fams, "proxyswitch_pool_members", nil),
				sum(fams, "proxyswitch_sessions_live", nil), strings.Join(slots, ", "))
			continue
		}
		a, b := sum(fams, "proxyswitch_attempts_total", nil), sum(fams, "proxyswitch_bans_total", nil)
		s := sum(fams, "proxyswitch_sessions_started_total", nil)
		attempts, bans, sessions = attempts+a, bans+b, sessions+s
		var reasons []string
		for _, m := range fams["proxyswitch_bans_total"].GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" {
					reasons = append(reasons, fmt.Sprintf("%s %v", l.GetValue(), m.GetCounter().GetValue()))
				}
			}
		}
		sort.Strings(reasons)
		fmt.Fprintf(out, "%-8s attempts %v, bans %v (%s), sessions started %v\n", e.name, a, b, strings.Join(reasons, ", "), s)
	}
	ms := d.stage.Market.Stats()
	fmt.Fprintf(out, "workers  attempts %v, bans %v, sessions started %v (the sums the dashboard shows)\n", attempts, bans, sessions)
	fmt.Fprintf(out, "the marketplaces saw %d requests and refused %d\n", ms.Requests, ms.Bans)
	return nil
}
