package proxyswitch_test

import (
	"context"
	"fmt"
	"log"

	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/shard"
	"github.com/redis/go-redis/v9"
)

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
	mine, err := shard.Share(shard.Rendezvous{}, ids, members, m.Self())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("my share:", len(mine), "of", len(ids), "proxies")
}
