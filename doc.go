// Package proxyswitch lets many Colly collectors on many servers share one
// proxy pool through Redis without two requests ever leaving from one IP to
// one site at the same moment.
//
// Every request leases a proxy for its target site from a pool kept in
// Redis. A lease is atomic, owner-checked (a holder whose lease ran out can
// neither release nor extend the next holder's) and bounded by a TTL (a
// crashed worker's proxies come back by themselves). Each site is offered
// the pool's proxies in turn (Rotation). Time is taken from Redis.
//
// # Usage
//
// The smallest integration is one line:
//
//	rdb := redis.NewClient(&redis.Options{ // or NewClusterClient, NewFailoverClient
//		Addr:                  "localhost:6379",
//		ContextTimeoutEnabled: true, // calls bounded by their context, on the caller's goroutine
//	})
//	c := colly.NewCollector()
//	c.SetProxyFunc(proxyswitch.New(rdb))
//
// Install the whole extension instead, so that leases are released as
// soon as responses are in, bans are detected and retried, and sessions
// work (see Attach):
//
//	sw, err := proxyswitch.NewSwitch(rdb, proxyswitch.WithPool("datacenter"))
//	if err != nil { ... }
//	sw.Attach(c) // before your own callbacks
//	defer sw.Close(context.Background())
//
// Load the pool from any process, at any time:
//
//	_, err = sw.Replace(ctx, []string{"http://user:pass@203.0.113.7:8080", "socks5://203.0.113.8:1080"})
//
// # Main concepts
//
//   - Failing closed: the proxy function never returns "no proxy" (Go would
//     then connect directly): a request that cannot get a proxy fails with
//     an error wrapping ErrNoProxy.
//   - Bans (Attach only): responses are classified (package ban, Bans); a
//     refused proxy leaves that site's rotation for every worker and the
//     request is retried through another one, or fails with a *BlockedError.
//   - Waiting: with every proxy busy a request waits up to Timeouts.MaxWait;
//     Colly's request timeout counts that wait too.
//   - Pools and labels: WithRoute, UsePools and UseLabels choose proxies by
//     site, kind of request or label.
//   - Sticky sessions (Attach only): requests of one task (TaskKey) leave
//     from one proxy with their own cookies (Sessions).
//   - Operators: Ban, Drain, Revive, SiteState, ProxyStates and more
//     (cmd/proxyswitch from a shell); SetObserver and package metrics.
//   - Redis failures: a pool Redis lost is re-seeded from every Switch's
//     copy; WithFallback leases from each server's own share while Redis is
//     away (package shard).
//   - Credentials: errors, logs and Request.ProxyURL mask a proxy's user
//     info.
//
// # Concurrency
//
// A Switch is safe for concurrent use by any number of goroutines and
// collectors, and any number of processes may use one pool at once: all
// shared state lives in Redis and changes atomically.
//
// # More
//
// README.md is the user guide; ARCHITECTURE.md describes the internals
// and every Redis key.
package proxyswitch
