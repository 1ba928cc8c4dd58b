package proxyswitch_test

import (
	"context"
	"fmt"
	"log"

	"github.com/proxyswitch/proxyswitch"
	"github.com/redis/go-redis/v9"
)

// Splitting a pool between servers with no one to ask: every server runs the
// same computation on the same lists and keeps its own part.
func ExampleShare() {
	ids := make([]string, 500)
	for i := range ids {
		ids[i] = fmt.Sprintf("proxy-%03d", i)
	}
	members := []string{"crawler-1", "crawler-2", "crawler-3"}
	total := 0
	for _, self := range members {
		mine, err := proxyswitch.Share(proxyswitch.Rendezvous{}, ids, members, self)
		if err != nil {
			log.Fatal(err)
		}
		total += len(mine)
		fmt.Println(self, "owns at most 175:", len(mine) <= 175)
	}
	fmt.Println("together:", total)
	// Output:
	// crawler-1 owns at most 175: true
	// crawler-2 owns at most 175: true
	// crawler-3 owns at most 175: true
	// together: 500
}

// One proxy never serves two marketplaces that may share their blacklists.
func ExamplePartition() {
	ids := make([]string, 90)
	for i := range ids {
		ids[i] = fmt.Sprintf("proxy-%02d", i)
	}
	parts, err := proxyswitch.Partition(proxyswitch.Rendezvous{}, ids, []string{"ozon.ru", "wildberries.ru", "avito.ru"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(parts["ozon.ru"]) + len(parts["wildberries.ru"]) + len(parts["avito.ru"]))
	// Output: 90
}

// A server registers in its pool's member list, and computes its own share
// of the pool from the last lists it read.
func ExampleMembership() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	sw, err := proxyswitch.NewSwitch(rdb, proxyswitch.WithPool("datacenter"))
	if err != nil {
		log.Fatal(err)
	}
	m, err := proxyswitch.NewMembership(sw, "crawler-1") // e.g. the host name
	if err != nil {
		log.Fatal(err)
	}
	if err := m.Start(ctx); err != nil { // registers, then heartbeats every second
		log.Fatal(err)
	}
	defer m.Stop(ctx)

	pool, err := sw.List(ctx) // keep the last pool read, too
	if err != nil {
		log.Fatal(err)
	}
	ids := make([]string, len(pool))
	for i, p := range pool {
		ids[i] = p.ID()
	}

	// Later, Redis is gone: shard by the last lists read. (WithFallback
	// does this, and leases from the share, by itself.)
	members, _ := m.LastKnown()
	mine, err := proxyswitch.Share(proxyswitch.Rendezvous{}, ids, members, m.Self())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("my share:", len(mine), "of", len(ids), "proxies")
}
