package proxyswitch_test

import (
	"context"
	"fmt"
	"log"

	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/shard"
	"github.com/redis/go-redis/v9"
)

// A server registers in its pool's member list, and leases from its own
// share in memory while Redis is unreachable.
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

	// Later, Redis is gone: shard by the last lists read.
	members, _ := m.LastKnown()
	ids := make([]string, len(pool))
	for i, p := range pool {
		ids[i] = p.ID()
	}
	mineIDs, err := shard.Share(shard.Rendezvous{}, ids, members, m.Self())
	if err != nil {
		log.Fatal(err)
	}
	var mine []*proxyswitch.Proxy // in the order of pool, as mineIDs
	for _, p := range pool {
		if len(mine) < len(mineIDs) && p.ID() == mineIDs[len(mine)] {
			mine = append(mine, p)
		}
	}
	local, err := proxyswitch.NewLocalPool(proxyswitch.WithPool("datacenter"))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := local.SetProxies(mine); err != nil {
		log.Fatal(err)
	}
	lease, err := local.Lease(ctx, "www.ozon.ru")
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release()
	fmt.Println("via", lease.Proxy()) // password redacted
}
