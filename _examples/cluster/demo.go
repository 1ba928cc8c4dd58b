package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/gocolly/colly/v2/proxy"
	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/proxyswitchtest"
	"github.com/redis/go-redis/v9"
)

// setup is what both runs of the demo share.
type setup struct {
	Servers int                            // simulated servers, each with its own collector
	Workers int                            // parallel requests per server
	Proxies []string                       // the shared proxy list
	Market  proxyswitchtest.MarketConfig   // the marketplaces (fresh ones for each run)
	Retries int                            // re-sends through another proxy after a refusal, in both runs
	Redis   func() redis.UniversalClient   // a new Redis client, one per server (proxyswitch run)
	Prefix  string                         // proxyswitch key prefix
	Logger  *slog.Logger                   // proxyswitch warnings
	Started func(run string, products int) // called as a run starts (nil: none)
	Advance func(products int)             // called as products are settled, scraped or given up (nil: none)
	GaveUp  func(u string, err error)      // called for every page given up (nil: none)
}

// outcome is what one run measured.
type outcome struct {
	Run      string
	Elapsed  time.Duration
	Products int // product pages in the catalogs
	Scraped  int // product pages scraped (title and price read)
	Sent     int // requests the servers sent to the proxies
	Market   proxyswitchtest.MarketStats
	Servers  []serverOutcome
	// proxyswitch run only:
	Quarantined int // proxies quarantined on a platform at the end
	LeasesLeft  int // leases still held in Redis at the end
}

type serverOutcome struct {
	Scraped int
	Sent    int
	Elapsed time.Duration
}

// server is one simulated server: a collector and its counters.
type server struct {
	base    *http.Transport // dials the proxies, counting requests
	retry   bool            // re-send refused pages itself (no proxyswitch below)
	sent    atomic.Int64
	scraped atomic.Int64
}

// The names of the two runs.
const (
	runWithout = "without coordination"
	runWith    = "with proxyswitch"
)

// attachFunc gives a server's collector its proxies, before any callback.
type attachFunc func(*colly.Collector, *server) error

// runUncoordinated is the cluster as it is before proxyswitch: every server
// walks the same proxy list on its own with Colly's round-robin switcher and
// re-sends a refused page through the next proxy.
func runUncoordinated(ctx context.Context, s setup) (outcome, error) {
	market := proxyswitchtest.StartMarket(s.Market)
	defer market.Close()
	return run(ctx, runWithout, s, market, func(c *colly.Collector, srv *server) error {
		rr, err := proxy.RoundRobinProxySwitcher(s.Proxies...)
		if err != nil {
			return err
		}
		srv.retry = true
		c.WithTransport(srv.base)
		c.SetProxyFunc(rr)
		return nil
	})
}

// runProxyswitch is the same cluster with every server attached to one
// proxyswitch pool in Redis: a proxy serves one request per platform at a
// time cluster-wide, waits SafeInterval between two requests to a platform,
// and a refusal quarantines it on every platform for every server.
func runProxyswitch(ctx context.Context, s setup) (outcome, error) {
	market := proxyswitchtest.StartMarket(s.Market)
	defer market.Close()

	retries := s.Retries
	if retries == 0 {
		retries = proxyswitch.Off // a zero field would keep the default
	}
	opts := []proxyswitch.Option{
		proxyswitch.WithPrefix(s.Prefix),
		proxyswitch.WithPool("cluster-demo"),
		proxyswitch.WithRotation(proxyswitch.Rotation{Cooldown: proxyswitchtest.SafeInterval}), // under every platform's rate limit
		proxyswitch.WithBans(proxyswitch.Bans{AllSites: true, Retries: retries}),               // the platforms share their blacklist
		proxyswitch.WithTimeouts(proxyswitch.Timeouts{MaxWait: time.Minute}),
		proxyswitch.WithLogger(s.Logger),
	}
	// Placeholders and captcha pages come with 200: name what a real page has.
	for _, p := range market.Platforms {
		opts = append(opts,
			proxyswitch.WithExpect(p.Host(), `^/catalog/`, p.Sel.Card),
			proxyswitch.WithExpect(p.Host(), `^/product/`, p.Sel.Title, p.Sel.Price))
	}

	var mu sync.Mutex
	var clients []redis.UniversalClient
	newClient := func() redis.UniversalClient {
		mu.Lock()
		defer mu.Unlock()
		clients = append(clients, s.Redis())
		return clients[len(clients)-1]
	}
	defer func() {
		for _, c := range clients {
			_ = c.Close()
		}
	}()

	// Load the pool once, from any process.
	admin, err := proxyswitch.NewSwitch(newClient(), opts...)
	if err != nil {
		return outcome{}, err
	}
	if err := admin.Clear(ctx); err != nil { // left over from an interrupted run
		return outcome{}, err
	}
	defer admin.Clear(context.WithoutCancel(ctx))
	if _, err := admin.Replace(ctx, s.Proxies); err != nil {
		return outcome{}, err
	}

	var switches []*proxyswitch.Switch
	out, err := run(ctx, runWith, s, market, func(c *colly.Collector, srv *server) error {
		// Each server has its own Switch and Redis connection, as on its
		// own machine.
		sw, err := proxyswitch.NewSwitch(newClient(), append(slices.Clip(opts), proxyswitch.WithBaseTransport(srv.base))...)
		if err != nil {
			return err
		}
		mu.Lock()
		switches = append(switches, sw)
		mu.Unlock()
		sw.Attach(c) // the proxy function, ban detection, retries, release hooks
		return nil
	})
	for _, sw := range switches {
		// Each server, done: its lease renewer stops, and whatever it
		// still leases is released.
		err = errors.Join(err, sw.Close(context.WithoutCancel(ctx)))
	}
	if err != nil {
		return out, err
	}
	for _, p := range market.Platforms {
		st, err := admin.SiteState(ctx, p.Host())
		if err != nil {
			return out, err
		}
		out.Quarantined = max(out.Quarantined, st.Quarantined+st.Dead)
		out.LeasesLeft += st.Leased
	}
	return out, nil
}

// run crawls market with s.Servers servers, each attached by attach, and
// measures what the platforms saw.
func run(ctx context.Context, name string, s setup, market *proxyswitchtest.Market, attach attachFunc) (outcome, error) {
	// Deal the catalog pages out to the servers, as a scheduler would.
	seeds := make([][]string, s.Servers)
	i := 0
	for _, p := range market.Platforms {
		for _, u := range p.CatalogURLs() {
			seeds[i%s.Servers] = append(seeds[i%s.Servers], u)
			i++
		}
	}
	out := outcome{Run: name, Products: market.Products(), Servers: make([]serverOutcome, s.Servers)}
	if s.Started != nil {
		s.Started(name, out.Products)
	}

	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, s.Servers)
	for id := range s.Servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			srv := &server{}
			srv.base = &http.Transport{DialContext: srv.dial, DisableKeepAlives: true}
			errs[id] = crawl(ctx, s, srv, market, seeds[id], attach)
			out.Servers[id] = serverOutcome{Scraped: int(srv.scraped.Load()), Sent: int(srv.sent.Load()), Elapsed: time.Since(start)}
		}()
	}
	wg.Wait()
	out.Elapsed = time.Since(start)
	if err := errors.Join(append(errs, ctx.Err())...); err != nil {
		return out, err
	}
	for _, so := range out.Servers {
		out.Scraped += so.Scraped
		out.Sent += so.Sent
	}
	out.Market = market.Stats()
	return out, nil
}

// crawl is one server's crawler: its catalog pages, then the product pages
// they link.
func crawl(ctx context.Context, s setup, srv *server, market *proxyswitchtest.Market, seeds []string, attach attachFunc) error {
	// Each page is asked for once by construction (catalog pages dealt out,
	// each product linked once), so Colly's revisit check is not needed. It
	// also applies to redirect targets, and a captcha URL met a second time
	// (a page redirected to it through two proxies in a row) would fail the
	// request with "already visited" instead of the captcha being seen.
	c := colly.NewCollector(colly.Async(true), colly.StdlibContext(ctx), colly.AllowURLRevisit())
	c.SetRequestTimeout(2 * time.Minute) // the wait for a free proxy counts against it
	if err := c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: s.Workers}); err != nil {
		return err
	}
	if err := attach(c, srv); err != nil {
		return err
	}

	// settle records the end of a page: a product page counts one product;
	// a catalog page given up loses the products it links.
	settle := func(kind, u string, err error) {
		if err != nil && s.GaveUp != nil {
			s.GaveUp(u, err)
		}
		n := 1
		switch {
		case kind == "product" && err == nil:
			srv.scraped.Add(1)
		case kind == "catalog" && err == nil:
			return // its products settle one by one
		case kind == "catalog":
			pu, _ := url.Parse(u)
			n = market.Platform(pu.Host).ProductsPerPage()
		}
		if s.Advance != nil {
			s.Advance(n)
		}
	}
	visit := func(u, kind string) {
		ctx := colly.NewContext() // one per page: kind, first URL, attempt
		ctx.Put("kind", kind)
		ctx.Put("url", u)
		ctx.Put("attempt", 1)
		if err := c.Request(http.MethodGet, u, nil, ctx, nil); err != nil {
			settle(kind, u, err)
		}
	}
	// fail re-sends a refused page through the next proxy, as crawlers do
	// without proxyswitch. With proxyswitch the retries through other
	// proxies already happened below Colly: the page is given up.
	fail := func(r *colly.Request, why error) {
		attempt := r.Ctx.GetAny("attempt").(int)
		if srv.retry && attempt <= s.Retries && ctx.Err() == nil {
			r.Ctx.Put("attempt", attempt+1)
			r.URL, _ = url.Parse(r.Ctx.Get("url")) // after a redirect r.URL is the captcha page
			if r.Retry() == nil {
				return
			}
		}
		settle(r.Ctx.Get("kind"), r.Ctx.Get("url"), why)
	}

	c.OnHTML("html", func(e *colly.HTMLElement) {
		p := market.Platform(e.Request.URL.Host)
		if e.Request.Ctx.Get("kind") == "catalog" {
			links := e.ChildAttrs(p.Sel.Card, "href")
			if len(links) == 0 {
				fail(e.Request, errNoContent)
				return
			}
			settle("catalog", e.Request.Ctx.Get("url"), nil)
			for _, href := range links {
				visit(e.Request.AbsoluteURL(href), "product")
			}
			return
		}
		if e.ChildText(p.Sel.Title) == "" || e.ChildText(p.Sel.Price) == "" {
			fail(e.Request, errNoContent)
			return
		}
		settle("product", e.Request.Ctx.Get("url"), nil)
	})
	c.OnError(func(r *colly.Response, err error) { fail(r.Request, err) })

	for _, u := range seeds {
		visit(u, "catalog")
	}
	c.Wait()
	return nil
}

// errNoContent is a page without what a real page has: a captcha or a
// placeholder served with 200.
var errNoContent = errors.New("no content (a captcha or a placeholder page)")

// dial connects to a proxy and counts the request: keep-alives are off, so
// every request (every redirect hop, every retry) dials once.
func (srv *server) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	srv.sent.Add(1)
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}
