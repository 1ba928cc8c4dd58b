// Package proxyswitch lets many Colly collectors on many servers share one
// proxy pool through Redis without two requests ever leaving from one IP to
// one site at the same moment.
//
// Every request leases a proxy for its target site from a pool kept in
// Redis. A lease is atomic, owner-checked (a holder whose lease ran out can
// neither release nor extend the next holder's) and bounded by a TTL (a
// crashed worker's proxies come back by themselves). Each site is offered
// the pool's proxies in turn, so the load spreads evenly; flaky proxies are
// served less (Rotation.FlakyDelay) and the pause between two requests from
// one IP to one site is learned from the site's refusals
// (Rotation.LearnedPacing). Time is taken from Redis, never from a client.
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
// With New alone each proxy stays taken until its request's context ends
// (or its lease TTL runs out). Install the whole extension instead: each
// lease is then released as soon as its response is in, a redirect chain
// keeps one IP, bans are detected and retried, and Request.ProxyURL tells
// your callbacks which proxy served them:
//
//	sw, err := proxyswitch.NewSwitch(rdb, proxyswitch.WithPool("datacenter"))
//	if err != nil { ... }
//	sw.Attach(c) // before your own callbacks
//	defer sw.Close(context.Background())
//
// Load the pool once, from any process, and change it at run time:
//
//	_, err = sw.Replace(ctx, []string{"http://user:pass@203.0.113.7:8080", "socks5://203.0.113.8:1080"})
//
// # Main concepts
//
//   - Failing closed: the proxy function never returns "no proxy" (Go would
//     then connect directly). When no proxy can be had (an empty pool, every
//     proxy busy past Timeouts.MaxWait, the context ending, Redis down) the
//     request fails with an error wrapping ErrNoProxy.
//   - Bans (Attach only): every response is classified (package ban; see
//     WithBanStatus, WithChallengeURLs, WithExpect, WithSizeDrop,
//     WithClassifier). A refused proxy leaves that site's rotation for every
//     worker (Bans), the request is retried through another proxy, and a
//     request out of retries fails with a *BlockedError (ErrBanned,
//     ErrProxyFailed, ErrPageRefused). A banned page never reaches
//     OnResponse or OnHTML. New alone respects bans but does not detect them.
//   - Waiting: with every proxy busy a request waits up to Timeouts.MaxWait
//     without spinning on Redis. Colly's request timeout (10s by default)
//     counts that wait too.
//   - Long requests: the Switch renews the leases of running requests, so a
//     request keeps its proxy however long it runs; a lease lost all the same
//     fails its request with ErrLeaseLost.
//   - Pools: WithRoute and UsePools send sites or kinds of request to other
//     pools in order of preference; UseLabels selects proxies by label;
//     gateway entries (a provider's rotating gateway) expand into sessions.
//   - Sticky sessions (Attach only): requests of one task (TaskKey,
//     NewTaskContext) leave from one proxy with their own cookies while the
//     session lives (Sessions).
//   - Operators: Ban, Unban, Drain, Revive, Remove, Clear; reads with List,
//     Dead, SiteState, ProxyStates, Stats; SetObserver and package metrics
//     for monitoring; cmd/proxyswitch does it all from a shell.
//   - Redis failures: a pool Redis lost is re-seeded from every Switch's
//     copy; WithFallback keeps leasing from each server's own share while
//     Redis is away, WithSharding always does; package shard computes the
//     shares.
//   - Credentials: a proxy's password is stored only in the pool; errors,
//     logs and Request.ProxyURL show proxies with their user info masked.
//
// # Concurrency
//
// A Switch is safe for concurrent use by any number of goroutines and
// collectors; any number of processes may use one pool at once. The
// guarantees hold across processes because all shared state lives in Redis
// and changes only inside Lua scripts. Several projects share one Redis by
// choosing distinct prefixes (WithPrefix).
//
// # More
//
// README.md is the user guide; ARCHITECTURE.md describes the internals,
// among them every Redis key the package writes.
package proxyswitch
