package proxyswitch_test

import (
	"context"
	"log"
	"os"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/shard"
	"github.com/redis/go-redis/v9"
)

// A crawler that keeps going from its own share of the pool while Redis is
// down, without ever sharing an IP with the other servers.
func ExampleWithFallback() {
	ctx := context.Background()
	host, _ := os.Hostname() // unique per process
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	sw, err := proxyswitch.NewSwitch(rdb,
		proxyswitch.WithPool("datacenter"),
		proxyswitch.WithFallback(host, shard.Rendezvous{}),
		proxyswitch.WithTimeouts(proxyswitch.Timeouts{Attempt: 5 * time.Second})) // also how long the switch waits for others' attempts
	if err != nil {
		log.Fatal(err)
	}
	if err := sw.Start(ctx); err != nil { // joins the member list, reads the pool, starts the probe
		log.Fatal(err)
	}
	defer sw.Close(context.Background()) // releases what it still leases, then leaves the member list (Stop)

	c := colly.NewCollector()
	sw.Attach(c)
	_ = c.Visit("https://www.ozon.ru/")
	log.Println("leasing from", sw.FallbackStatus().Mode) // broker, local or resuming
}

// Datacenter proxies for catalog scans, residential ones for sessions, with
// the residential pool as the catalog's overflow.
func ExampleUsePools() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	sw, err := proxyswitch.NewSwitch(rdb,
		proxyswitch.WithPool("datacenter"),
		proxyswitch.WithRoute("www.wildberries.ru", "datacenter", "residential"))
	if err != nil {
		log.Fatal(err)
	}
	catalog := colly.NewCollector() // routed by site
	sw.Attach(catalog)

	sessions := colly.NewCollector() // routed by request kind
	sessions.Context = proxyswitch.UsePools(context.Background(), "residential")
	sw.Attach(sessions)
}
