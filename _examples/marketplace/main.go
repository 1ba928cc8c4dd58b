// Command marketplace crawls three fake marketplaces (modelled on
// Wildberries, Ozon and Avito) the way a product scraper does, from each
// category's first catalog page through its pages to every product page,
// with one Colly collector whose requests lease their proxies from
// proxyswitch.
//
//	go run ./_examples/marketplace                                  # an embedded in-process Redis
//	go run ./_examples/marketplace -redis server                    # a private redis-server from PATH
//	go run ./_examples/marketplace -redis redis://127.0.0.1:6379/0  # your Redis
//
// The marketplaces (proxyswitchtest.StartMarket) defend themselves: rate
// limits per IP, a captcha for two requests at once from one IP,
// placeholder pages, and a blacklist they share, on which some of the
// proxies already are.
// proxyswitch paces every IP under the rate limits (Rotation.Cooldown), never
// sends two requests from one IP to one site at once, recognises each kind
// of refusal (status codes, the captcha redirect, pages without the
// selectors a real page has), quarantines the proxy on every marketplace
// (Bans.AllSites: they share their blacklist) and sends the page again
// through another proxy.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/proxyswitchtest"
)

func main() {
	redisArg := proxyswitchtest.RedisFlag()
	nProxies := flag.Int("proxies", 100, "proxies in the pool")
	burnt := flag.Int("burnt", 8, "proxies already on the marketplaces' blacklist")
	workers := flag.Int("workers", 30, "parallel requests")
	flag.Parse()
	log.SetFlags(0)
	ctx := context.Background()

	// The stage: Redis, the proxies, the marketplaces.
	st, err := proxyswitchtest.StartStage(proxyswitchtest.StageConfig{
		Redis: *redisArg, Proxies: *nProxies, Burnt: *burnt, Market: &proxyswitchtest.MarketConfig{}})
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	rdb := st.Redis.Client()
	defer rdb.Close()
	market := st.Market
	if *workers < 1 {
		log.Fatal("marketplace: need workers >= 1")
	}

	// The crawler.
	opts := []proxyswitch.Option{
		proxyswitch.WithPrefix("marketplace"),
		proxyswitch.WithRotation(proxyswitch.Rotation{Cooldown: proxyswitchtest.SafeInterval}), // under every marketplace's rate limit
		proxyswitch.WithBans(proxyswitch.Bans{AllSites: true}),                                 // they share their blacklist
	}
	for _, p := range market.Platforms {
		// A placeholder or a captcha page comes with 200: say what a real
		// page has.
		opts = append(opts,
			proxyswitch.WithExpect(p.Host(), `^/catalog/`, p.Sel.Card),
			proxyswitch.WithExpect(p.Host(), `^/product/`, p.Sel.Title, p.Sel.Price))
	}
	sw, err := proxyswitch.NewSwitch(rdb, opts...)
	if err != nil {
		log.Fatal(err)
	}
	if err := sw.Clear(ctx); err != nil {
		log.Fatal(err)
	}
	defer sw.Clear(ctx)
	defer sw.Close(ctx) // before the Clear: stops the lease renewer, releases whatever is still leased
	if _, err := sw.Replace(ctx, st.Farm.URLs()); err != nil {
		log.Fatal(err)
	}

	c := colly.NewCollector(colly.Async(true))
	sw.Attach(c) // before the callbacks below
	c.SetRequestTimeout(time.Minute)
	if err := c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: *workers}); err != nil {
		log.Fatal(err)
	}

	type product struct{ platform, title, price string }
	var mu sync.Mutex
	var products []product
	failed := map[string]int{}

	c.OnHTML("html", func(e *colly.HTMLElement) {
		p := market.Platform(e.Request.URL.Host) // each marketplace has its own markup
		if strings.HasPrefix(e.Request.URL.Path, "/catalog/") {
			// A catalog page: every product card, then the next page.
			e.ForEach(p.Sel.Card+", "+p.Sel.Next, func(_ int, a *colly.HTMLElement) {
				_ = e.Request.Visit(a.Attr("href"))
			})
			return
		}
		mu.Lock()
		products = append(products, product{p.Name, e.ChildText(p.Sel.Title), e.ChildText(p.Sel.Price)})
		mu.Unlock()
	})
	c.OnError(func(r *colly.Response, err error) {
		var blocked *proxyswitch.BlockedError
		reason := "error"
		if errors.As(err, &blocked) {
			reason = blocked.Verdict.Reason
		}
		mu.Lock()
		failed[market.Platform(r.Request.URL.Host).Name+" "+reason]++
		mu.Unlock()
		log.Printf("gave up %s: %v", r.Request.URL, err)
	})

	start := time.Now()
	for _, p := range market.Platforms {
		for _, u := range p.CategoryURLs() {
			if err := c.Visit(u); err != nil {
				log.Fatal(err)
			}
		}
	}
	c.Wait()

	// What the crawler got, and what the marketplaces saw.
	fmt.Printf("%d proxies (%d of them already blacklisted), %d workers, Redis: %s\n\n", *nProxies, len(st.Burnt), *workers, st.Redis)
	per := map[string]int{}
	for _, pr := range products {
		per[pr.platform]++
	}
	bans := sw.BanCounts()
	for _, p := range market.Platforms {
		st, err := sw.SiteState(ctx, p.Host())
		if err != nil {
			log.Fatal(err)
		}
		var reasons []string
		for k, n := range bans {
			if k.Site == p.Host() {
				reasons = append(reasons, fmt.Sprintf("%s %d", k.Reason, n))
			}
		}
		sort.Strings(reasons)
		fmt.Printf("%-12s %4d of %d products; bans detected: %s; proxies quarantined now: %d\n",
			p.Name, per[p.Name], p.Products(), orNone(reasons), st.Quarantined)
	}
	if len(products) > 0 {
		ex := products[0]
		fmt.Printf("\na product: %s, %q, %s\n", ex.platform, ex.title, ex.price)
	}
	ms := market.Stats()
	fmt.Printf("the marketplaces saw %d requests: %d refused (%v), %d IP collisions, %d without a proxy; %d IPs on their blacklist\n",
		ms.Requests, ms.Bans, ms.Refused, ms.Collisions, ms.Direct, ms.Listed)
	fmt.Printf("done in %v; pages given up: %v\n", time.Since(start).Round(100*time.Millisecond), orNone(keysOf(failed)))
	if ms.Collisions > 0 || ms.Direct > 0 {
		os.Exit(1)
	}
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

func keysOf(m map[string]int) []string {
	var out []string
	for k, n := range m {
		out = append(out, fmt.Sprintf("%s %d", k, n))
	}
	sort.Strings(out)
	return out
}
