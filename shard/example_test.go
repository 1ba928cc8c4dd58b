package shard_test

import (
	"context"
	"fmt"
	"log"
	"slices"

	"github.com/proxyswitch/proxyswitch/shard"
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
		mine, err := shard.Share(shard.Rendezvous{}, ids, members, self)
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
	parts, err := shard.Partition(shard.Rendezvous{}, ids, []string{"ozon.ru", "wildberries.ru", "avito.ru"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(parts["ozon.ru"]) + len(parts["wildberries.ru"]) + len(parts["avito.ru"]))
	// Output: 90
}

// standby is a custom Sharder: the first member by name owns the whole
// pool, the others stand by. Like every Sharder its answer depends only on
// the sets of IDs and members, never on their order. (A real one would also
// reject empty and duplicate names with ErrConfig.)
type standby struct{}

func (standby) Assign(ids, members []string) ([]int, error) {
	if len(members) == 0 {
		return nil, fmt.Errorf("%w: no members", shard.ErrConfig)
	}
	first := 0
	for i, m := range members {
		if m < members[first] {
			first = i
		}
	}
	return slices.Repeat([]int{first}, len(ids)), nil
}

// A sharder of your own needs only this package; pass it to
// proxyswitch.WithFallback or proxyswitch.WithSharding like the built-in
// ones. Share checks its answer.
func ExampleSharder() {
	ids := []string{"proxy-1", "proxy-2", "proxy-3"}
	members := []string{"crawler-2", "crawler-1"}
	for _, self := range members {
		mine, err := shard.Share(standby{}, ids, members, self)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(self, mine)
	}
	// Output:
	// crawler-2 []
	// crawler-1 [proxy-1 proxy-2 proxy-3]
}

// A server registers in its pool's member list, and computes its own share
// of the pool from the last lists it read. (proxyswitch.WithFallback and
// WithSharding run a Membership, and lease from the share, by themselves.)
func ExampleMembership() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	m, err := shard.NewMembership(rdb, shard.MemberConfig{
		Prefix: "proxyswitch", // proxyswitch.WithPrefix, this is its default
		Pool:   "datacenter",  // proxyswitch.WithPool
		Self:   "crawler-1",   // e.g. the host name
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := m.Start(ctx); err != nil { // registers, then heartbeats every second
		log.Fatal(err)
	}
	defer m.Stop(ctx)

	// The IDs of the pool last read: Proxy.ID of each proxy
	// proxyswitch.Switch.List returned. Keep them, too.
	ids := []string{"a1b2c3", "d4e5f6", "0718a9"}

	// Later, Redis is gone: shard by the last lists read.
	members, _ := m.LastKnown()
	mine, err := shard.Share(shard.Rendezvous{}, ids, members, m.Self())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("my share:", len(mine), "of", len(ids), "proxies")
}
