package metrics_test

import (
	"context"
	"log"
	"net/http"
	"os"

	"github.com/gocolly/colly/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/metrics"
	"github.com/proxyswitch/proxyswitch/shard"
	"github.com/proxyswitch/proxyswitch/storage"
	"github.com/redis/go-redis/v9"
)

// A worker exports what its Switch sees under its own server name, with
// the 20 worst proxies, and feeds the member list to the ban-spike signal.
func ExampleNew() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	sw, err := proxyswitch.NewSwitch(rdb, proxyswitch.WithPool("datacenter"))
	if err != nil {
		log.Fatal(err)
	}
	host, _ := os.Hostname()
	col := metrics.New(sw, metrics.WithServer(host), metrics.WithTopProxies(20))
	prometheus.MustRegister(col)

	// Register in the pool's member list (WithFallback and WithSharding
	// do it by themselves: give them WithMembership(shard.MemberConfig{Changed: ...}) instead).
	m, err := shard.NewMembership(rdb, shard.MemberConfig{Prefix: "proxyswitch", Pool: sw.Pool(), Self: host,
		Changed: col.ObserveMembers})
	if err != nil {
		log.Fatal(err)
	}
	if err := m.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer m.Stop(ctx)

	go func() { log.Println(http.ListenAndServe("127.0.0.1:9100", promhttp.Handler())) }()
	c := colly.NewCollector()
	sw.Attach(c)
	_ = c.Visit("https://www.ozon.ru/")
}

// One process (not every worker) exports the pool's state read from Redis;
// "proxyswitch serve" does this as a standalone exporter.
func ExampleNewState() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	sw, err := proxyswitch.NewSwitch(rdb, proxyswitch.WithPool("datacenter"))
	if err != nil {
		log.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewState(sw))
	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	log.Fatal(http.ListenAndServe("127.0.0.1:9465", nil))
}

// The same process exports the shared Colly queue of a storage namespace:
// requests ready, in flight and dead-lettered ("proxyswitch serve -queue").
func ExampleNewQueue() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	s, err := storage.New(rdb, storage.WithNamespace("ozon-crawl"))
	if err != nil {
		log.Fatal(err)
	}
	prometheus.MustRegister(metrics.NewQueue(s))
	http.Handle("/metrics", promhttp.Handler())
	log.Fatal(http.ListenAndServe("127.0.0.1:9465", nil))
}
