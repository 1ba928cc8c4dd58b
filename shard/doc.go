// Package shard splits one proxy pool between the servers of a cluster
// without asking anyone, so that a server can lease from its own share
// while Redis is out of reach and still never use a proxy another server
// uses. Package proxyswitch uses it for WithFallback and WithSharding; it
// imports nothing of proxyswitch and works on string IDs only (a proxy's ID
// is Proxy.ID in package proxyswitch), so a custom Sharder needs only this
// package. Membership keeps the member list itself: who is in the fleet,
// where the sharders say who owns what.
//
// Every server computes the whole assignment from the same two inputs (the
// proxy IDs of the pool and the member list) and keeps its own part. The
// assignment depends on nothing else: not on the order of either list, the
// platform, the Go version or a clock. Servers that agree on the inputs
// therefore get shares that never overlap and together cover the pool.
//
// # Schemes
//
// Modulo is the static modulo shard: with the members sorted by name, the
// proxy with ID p goes to member number Hash(p) mod n. Simple and evenly
// loaded on average, but a change in the number of members moves almost the
// whole pool, so it suits a cluster of fixed size.
//
// Rendezvous is consistent hashing (highest random weight) with a load
// bound: a member that joins takes about 1/n of the pool, evenly from every
// other member, and little else moves; no member owns more than MaxLoad
// times the average share. It is what proxyswitch uses by default.
//
// Partition uses either to split a pool between keys instead of servers
// (sites or task types), so that no proxy ever serves two of them; Share
// then splits a key's part between servers:
//
//	parts, err := shard.Partition(shard.Rendezvous{}, ids, []string{"ozon.ru", "wildberries.ru"})
//	mine, err := shard.Share(shard.Rendezvous{}, parts["ozon.ru"], members, self)
//
// # The contract
//
// Servers of one cluster must agree on the sharder (and its settings) and
// on Hash, which every scheme here is built on: both are part of the
// cluster's contract, and changing either reshuffles every share. Hash is
// pinned by tests, so every version of this package computes the same
// shares. See BENCHMARKS.md ("sharding") in the repository for how much each
// scheme moves when servers come and go.
//
// # Membership
//
// Membership registers a server in the member list of a pool in Redis,
// under the keys proxyswitch uses ("{prefix:pool}:members" and
// "{prefix:pool}:member-owners"), renews the registration with a heartbeat
// (every second by default; a registration not renewed runs out after
// three heartbeats) and keeps the list it last read, to shard by while
// Redis is out of reach:
//
//	m, err := shard.NewMembership(rdb, shard.MemberConfig{Prefix: "proxyswitch", Pool: "datacenter", Self: host})
//	err = m.Start(ctx)
//	members, _ := m.LastKnown()
//	mine, err := shard.Share(shard.Rendezvous{}, ids, members, m.Self())
//
// # Errors
//
// Bad input (no members, an empty or duplicate ID or member name, a sharder
// that breaks its contract) is reported with an error wrapping ErrConfig,
// never a panic; asking for the share of a server that is not a member
// fails with ErrNotMember. A Membership also fails with ErrRedis (Redis
// unreachable), ErrCorrupt (a foreign or damaged key) and ErrMemberTaken
// (another live process registered under the same ID). All are the very
// values of proxyswitch's errors of the same names, so errors.Is matches
// either name.
package shard
