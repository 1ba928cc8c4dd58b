package proxyswitch_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch"
	"github.com/redis/go-redis/v9"
)

// The one-line integration: every request leases a proxy for its site.
func ExampleNew() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	c := colly.NewCollector()
	c.SetProxyFunc(proxyswitch.New(rdb))
	_ = c.Visit("https://www.ozon.ru/")
}

// The whole extension: leases released as soon as each response is in, one
// IP per redirect chain, Request.ProxyURL filled (user info masked).
func ExampleSwitch_Attach() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	sw, err := proxyswitch.NewSwitch(rdb,
		proxyswitch.WithPool("datacenter"),
		proxyswitch.WithRotation(proxyswitch.Rotation{Cooldown: 2 * time.Second}), // at most one request per IP per site every 2s, cluster-wide
	)
	if err != nil {
		log.Fatal(err)
	}
	defer sw.Close(context.Background()) // at exit: stops the lease renewer, releases whatever is still leased
	c := colly.NewCollector(colly.Async(true))
	sw.Attach(c) // before your own callbacks
	c.SetRequestTimeout(time.Minute)
	c.OnResponse(func(r *colly.Response) {
		fmt.Println(r.Request.URL, "via", r.Request.ProxyURL)
	})
	c.OnError(func(r *colly.Response, err error) {
		fmt.Println(r.Request.URL, "failed:", err) // errors.Is(err, proxyswitch.ErrNoProxy) when no proxy could be had
	})
	_ = c.Visit("https://www.wildberries.ru/catalog/")
	c.Wait()
}

// Loading the pool from a file, and replacing it at run time without a
// restart: workers see the old set or the new one, never a mix.
func ExampleSwitch_ReplaceProxies() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	sw, err := proxyswitch.NewSwitch(rdb, proxyswitch.WithPool("residential"))
	if err != nil {
		log.Fatal(err)
	}
	f, err := os.Open("proxies.txt") // one URL per line, # comments
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	proxies, err := proxyswitch.ReadProxies(f)
	if err != nil {
		log.Fatal(err) // names the line and the problem, never the password
	}
	change, err := sw.ReplaceProxies(context.Background(), proxies)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("+%d -%d = %d proxies\n", change.Added, change.Removed, change.Size)
}

// Giving every lease back before the process exits. With the proxy function
// alone, a lease is released when its request's context ends (with no
// request timeout, never): Close releases what is left, and any lease
// attempt after it fails with ErrNoProxy.
func ExampleSwitch_Close() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	sw, err := proxyswitch.NewSwitch(rdb)
	if err != nil {
		log.Fatal(err)
	}
	c := colly.NewCollector()
	c.SetProxyFunc(sw.ProxyFunc)
	_ = c.Visit("https://www.avito.ru/")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := sw.Close(ctx); err != nil {
		log.Print(err) // leases it could not release expire by their TTL
	}
}

// Leasing by hand, outside Colly.
func ExampleSwitch_Lease() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	sw, err := proxyswitch.NewSwitch(rdb)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	lease, err := sw.Lease(ctx, "www.avito.ru")
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	fmt.Println("using", lease.Proxy()) // user info masked
}

func ExampleParseProxy() {
	p, err := proxyswitch.ParseProxy("http://shopper-7:s3cret@gw.example.net:8000")
	fmt.Println(p, err)
	_, err = proxyswitch.ParseProxy("ftp://shopper-7:s3cret@gw.example.net:21")
	fmt.Println(err)
	// Output:
	// http://xxxxx:xxxxx@gw.example.net:8000 <nil>
	// proxyswitch: proxy "ftp://xxxxx@gw.example.net:21": unsupported scheme "ftp" (want http, https, socks5 or socks5h)
}

// A shopper flow as one visitor: every request of a task (catalog, product
// card, cart) leaves from one IP, on any server, with the task's own
// cookies, while catalog scans lease a datacenter IP per request.
func ExampleNewTaskContext() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	sw, err := proxyswitch.NewSwitch(rdb,
		proxyswitch.WithPool("datacenter"),                                  // requests of no task
		proxyswitch.WithSessions(proxyswitch.Sessions{Pool: "residential"}), // sessions
		proxyswitch.WithSessions(proxyswitch.Sessions{TTL: 15 * time.Minute, MaxRequests: 200}),
		proxyswitch.WithSessions(proxyswitch.Sessions{Retired: func(r proxyswitch.SessionRetirement) {
			log.Printf("task %s lost its IP %s (%s): it goes on with a fresh IP and no cookies", r.Task, r.Proxy, r.Reason)
		}}),
	)
	if err != nil {
		log.Fatal(err)
	}
	c := colly.NewCollector()
	sw.Attach(c)
	c.OnHTML("a.product-card", func(e *colly.HTMLElement) {
		_ = e.Request.Visit(e.Attr("href")) // inherits e.Request.Ctx: the same task, the same IP
	})
	c.OnResponse(func(r *colly.Response) {
		if s := proxyswitch.SessionOf(r.Ctx); s != nil && s.Previous != nil {
			fmt.Println("session", s.Generation, "of", s.Task, "after", s.Previous.Reason)
		}
	})
	ctx := proxyswitch.NewTaskContext("shopper-42")
	_ = c.Request("GET", "https://www.ozon.ru/category/smartfony-15502/", nil, ctx, nil)
	_, _ = sw.EndSession(context.Background(), "shopper-42") // done: the IP serves others again
}
