// Package proxyswitch lets many Colly collectors on many servers share one
// proxy pool through Redis without two requests ever leaving from one IP to
// one site at the same moment.
//
// Every request leases a proxy for its target site from a pool kept in Redis.
// A lease is atomic (one Lua script, one round trip), owner-checked (a token
// per lease: a holder whose lease ran out can neither release nor extend the
// next holder's), bounded by a TTL (a crashed worker's proxies come back by
// themselves) and handed out in turn (each site's cursor offers every proxy
// of the pool once per turn, skipping those out there), which spreads the
// load evenly over the pool; a proxy that fails often on a site waits a
// little longer there after each request, so it is served less
// (Rotation.FlakyDelay), and the pause between two requests from one IP to one
// site is learned from the site's rate-limit refusals (Rotation.LearnedPacing).
// Time is taken from Redis, never from a client.
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
// That never lets two requests share an IP on one site, but each proxy stays
// taken until its request's context ends (or, without a request timeout,
// until its lease TTL runs out). Install the whole extension instead, so that each lease is
// released as soon as its response is in, a redirect chain keeps one IP, and
// Request.ProxyURL tells your callbacks which proxy served them:
//
//	sw, err := proxyswitch.NewSwitch(rdb, proxyswitch.WithPool("datacenter"))
//	if err != nil { ... }
//	sw.Attach(c) // before your own callbacks
//
// Load the pool once, from any process, and change it at run time without a
// restart:
//
//	_, err = sw.Replace(ctx, []string{"http://user:pass@203.0.113.7:8080", "socks5://203.0.113.8:1080"})
//
// # Bans
//
// Attach also installs a transport (below Colly, around an *http.Transport
// whose Proxy is the Switch's) that classifies every response before Colly
// sees it (package ban): ban status codes (403, 429, 503 by default,
// per site with WithBanStatus; Retry-After is honoured), redirects to
// captcha, login or challenge pages (WithChallengeURLs), pages missing the
// CSS selectors a real page has (WithExpect, checked with goquery), bodies
// far smaller than the site's usual size (WithSizeDrop), proxy failures
// (refused or timed-out connections, 407, failed CONNECT tunnels, a proxy's
// 502) and your own classifier (WithClassifier, a ban.Classifier: a
// classifier needs only package ban, which holds Exchange, Verdict and the
// Reason constants). It reads no more of a body than the collector's
// MaxBodySize, counted in decoded bytes: a gzip body Colly would gunzip is
// gunzipped once, by the transport, and handed to Colly decoded. A page the
// content checks cannot read (a body that does not decode, HTML the parser
// refuses, a selector past MaxBodySize) reaches Colly unchecked, never as a
// ban (ban.ReasonUnchecked).
//
// A refusal takes the proxy out of that site's rotation, for every worker of
// the pool from its next lease on: a first one is a strike (Bans.EvidenceFirst:
// 1 min), a repeated or confirmed one a ban (Bans.Quarantine: 30 min, doubled
// with jitter for repeat offenders, reset by a healthy answer); a proxy that
// keeps failing is marked dead until Revive or probe.CheckDead. The request is sent
// again through another proxy (Bans.Retries: 2); when no retry is left it
// fails with a *BlockedError (errors.Is ErrBanned or ErrProxyFailed) through
// OnError and Visit. A URL refused through two proxies healthy on the site
// is the page's answer: the request fails at once with a *BlockedError
// matching ErrPageRefused, naming the site's status, and the strikes it cost
// are lifted. A banned page never reaches OnResponse or OnHTML. Setting another
// transport or proxy function on the collector after Attach turns this off;
// use WithBaseTransport for dialer or TLS settings, and WithClient for any
// RoundTripper per proxy (a TLS or HTTP/2 fingerprint), keep-alive
// connections per (proxy, site) and a client identity per sticky session.
// New alone does not
// classify, but it respects the bans other workers recorded.
//
// Operators act on single proxies with Ban, Unban, Drain and Revive, read
// the state of a site with SiteState (slot counts) or ProxyStates (each
// proxy), the dead list with Dead, and clear a pool with Clear
// (cmd/proxyswitch does all of it from a shell). BanCounts, LiveSessions and
// SetObserver (one or several observers) feed monitoring (package metrics
// exports Prometheus metrics).
//
// A pool that Redis lost (a restart without persistence, a failover to an
// empty replica, a flush) comes back by itself: every Switch keeps a copy
// of its pools, and a lease that finds a pool empty with no operator's mark
// (Replace with an empty list, Remove of every proxy and Clear leave one)
// re-seeds it, once across the cluster, never over an operator's write.
// Quarantines, cooldowns, leases and sessions are lost with Redis; the
// re-seeded pool leases nothing for the attempt bound (Timeouts.Attempt,
// else the lease TTL), since requests whose leases were lost may still run.
//
// # Failing closed
//
// The proxy function never returns "no proxy": Go would then connect
// directly and expose the crawler's own IP. When no proxy can be had (an
// empty pool, every proxy busy past the max wait, the request's context
// ending, Redis down or hung) the request fails with an error wrapping
// ErrNoProxy, visible in OnError and in the error Visit returns.
//
// # Pools by proxy type
//
// A Switch may lease from several pools, each loaded like its own pool
// (WithPool): WithRoute sends a site to an ordered list of pools, falling
// back to the next one only while the earlier ones are exhausted, and
// UsePools does the same for one kind of request (a collector's context):
//
//	sw, err := proxyswitch.NewSwitch(rdb, proxyswitch.WithPool("datacenter"),
//		proxyswitch.WithRoute("www.ozon.ru", "datacenter", "residential"))
//	sessions := colly.NewCollector()
//	sessions.Context = proxyswitch.UsePools(ctx, "residential", "mobile")
//
// A pool too hot for one Redis node is split over several slots with
// shard.PoolNames, shard.Split and WithSpread.
//
// # When Redis goes away: the fallback, and sharding
//
// With WithFallback every server registers in the pool's member list
// (Start; heartbeat and TTL set by WithMembership) and
// keeps its own share of the pool, computed from the last known member list
// by a sharder of package shard (shard.Rendezvous, consistent hashing, by
// default; shard.Modulo) so that shares never overlap. When Redis is
// unreachable or hangs (every call bounded by Timeouts.Fallback, 1s) the
// server leases from its share in memory, once the attempts other servers started through its
// proxies are over (Timeouts.Attempt: set it, or the switch waits the
// lease TTL); bans go on locally. When Redis answers again the server
// re-seeds a pool Redis lost, writes its bans back, hands its running
// leases over and, once every server has done so, leases from Redis again:
//
//	sw, err := proxyswitch.NewSwitch(rdb, proxyswitch.WithFallback("crawler-1", nil),
//		proxyswitch.WithTimeouts(proxyswitch.Timeouts{Attempt: 5*time.Second}))
//	if err := sw.Start(ctx); err != nil { ... }
//	defer sw.Stop(context.Background())
//
// WithSharding is the shared-nothing scheme: each server leases from its
// own share only, always in memory, with Redis holding the member list and
// the pool. FallbackStatus tells where a Switch leases from; Members reads
// the live member list. The member list is shard.Membership, which a server
// that shards by hand runs itself.
//
// # Sticky sessions: one task, one IP, its own cookies
//
// A flow that must look like one visitor (catalog, product card, cart, next
// page) is a task: name it in the request's colly.Context (TaskKey), and
// every request of the task, on any server, leaves from one proxy while the
// task's session lives. Requests made from a response with Request.Visit or
// Post inherit the context, hence the task; so do requests that travel
// through a shared queue (storage), the task being a string in the context:
//
//	ctx := proxyswitch.NewTaskContext("shopper-42")
//	c.Request("GET", catalogURL, nil, ctx, nil)
//	c.OnHTML("a.product", func(e *colly.HTMLElement) { e.Request.Visit(e.Attr("href")) }) // same task
//
// The proxy function alone never sees Colly's context; the OnRequestHeaders
// hook Attach installs does, and hands the task to the transport and the
// proxy function through the request's binding (WithTaskFunc names tasks
// another way). Sessions therefore need Attach.
//
// A session holds its proxy on every site it visits, for no one else, until
// it lapses: Sessions.TTL (10 minutes) after its last request, with no
// reaper. Each session keeps its own cookies in Redis: the transport sends
// them (with the request's own Cookie header) and takes the site's
// Set-Cookie into them, so they never reach the collector's jar or its
// storage backend, and the collector's never reach a session. A ban or a
// proxy failure through a session's proxy retires the session: the request's
// retry and the task's next requests go on in a new session, with another
// proxy and no cookies. Sessions.MaxRequests and Sessions.MaxAge retire
// sessions too; Sessions.Retired reports every retirement, SessionOf shows
// a request's session and what ended the one before, EndSession ends one when
// its flow is done, LiveSessions counts the live ones on every server, and
// the observer sees each session start and end. Sessions.Pool makes
// sessions lease from their own pool (residential or mobile proxies, say)
// while requests of no task use the Switch's. Sessions live in Redis only:
// with Redis unreachable (or under WithSharding) a request of a task fails
// with ErrNoProxy rather than leave from another IP.
//
// # Waiting for a proxy
//
// With every proxy busy, a request waits (sleeping on the time until the
// next proxy frees, capped by a jittered backoff of 5 to 250ms, never
// spinning on Redis) up to Timeouts.MaxWait (30s). Colly's request timeout (10s by
// default) counts that wait too: give crawls with more workers than proxies a
// longer timeout with Collector.SetRequestTimeout.
//
// # Redis keys
//
// All keys of one pool share one hash tag, so they live in one Redis Cluster
// slot and one script may touch them together. Several projects share one
// Redis by choosing distinct prefixes (WithPrefix). In the keys, pool is
// the pool's name with '%' written "%25" and ':' "%3A" (a name with neither
// is itself), so the pool is what follows the tag's last ':' and two
// distinct (prefix, pool) pairs never share a key; nor does a pool share one
// with a storage namespace, whose tag holds no ':'.
//
//	{prefix:pool}:proxies          hash  proxy ID -> proxy URL (the pool; no TTL)
//	{prefix:pool}:meta             hash  settings all workers must share, and the pool's marks: its version,
//	                                     how far its order and gateway index are built (no TTL)
//	{prefix:pool}:order            zset  proxy ID -> its place in the rotation (no TTL)
//	{prefix:pool}:labels           hash  proxy ID -> its labels "k=v,k=v" (no TTL)
//	{prefix:pool}:gateways         hash  proxy ID -> gateway template, for the virtual proxies of a gateway entry (no TTL)
//	{prefix:pool}:gwindex          hash  SHA-1 (hex) of a gateway template -> its members' labels (no TTL)
//	{prefix:pool}:gw:<SHA-1>       zset  proxy ID -> 0: the members of that template (no TTL)
//	{prefix:pool}:gwrelabel        hash  SHA-1 of a template -> the last member relabelled, while a change of
//	                                     its labels goes through its members in pages (no TTL)
//	{prefix:pool}:sites            zset  site -> time of its last lease (idle TTL)
//	{prefix:pool}:cursor           hash  site -> the rotation's place last offered there (idle TTL)
//	{prefix:pool}:free:<site>      zset  "<id>:<slot>" -> time it is next free, ms (idle TTL)
//	{prefix:pool}:lease:<site>     hash  "<id>:<slot>" -> "<token>|<expiry ms>" (idle TTL)
//	{prefix:pool}:strikes:<site>   hash  proxy ID -> "<bans in a row>|<ms of the last>|<its end>" (idle TTL)
//	{prefix:pool}:health:<site>    hash  proxy ID -> its recent failure rate on the site (idle TTL; Rotation.FlakyDelay)
//	{prefix:pool}:pace:<site>      hash  the cooldown learned for the site (idle TTL; Rotation.LearnedPacing)
//	{prefix:pool}:siteprobe:<site> hash  proxy ID -> "<site>|<end ms>": a quarantine a site probe (package probe)
//	                                     put it under, for a later passing probe to lift (TTL: the longest entry's)
//	{prefix:pool}:breaker          hash  site -> its circuit breaker while open or half-open (no TTL: until it closes)
//	{prefix:pool}:breaker:<site>   hash  the site's ban-rate window (TTL: twice Breaker.Window)
//	{prefix:pool}:fails            hash  proxy ID -> proxy failures in a row (idle TTL)
//	{prefix:pool}:quarantine       zset  proxy ID -> end of a ban on every site, ms (max quarantine)
//	{prefix:pool}:dead             hash  proxy ID -> "<ms>|<reason>" (operator state: no TTL, until Revive)
//	{prefix:pool}:exit             hash  proxy ID -> its exit IP (package probe, Checker.Exits; no TTL)
//	{prefix:pool}:exit:<IP>        set   the proxy IDs leaving from IP: on a site they share one proxy's slots (no TTL)
//	{prefix:pool}:exitips          zset  exit IP -> how many proxy IDs leave from it (no TTL)
//	{prefix:pool}:exitout:<site>   zset  "<IP>|<id>" -> 0: the proxies with an exit IP that may have slots out on
//	                                     the site, so that a lease counts an IP's slots without reading its set (idle TTL)
//	{prefix:pool}:exitban:<IP>     zset  proxy ID -> end of its ban on every site, ms, or later: those of IP (max quarantine)
//	{prefix:pool}:probe-leader     string the token of the process running package probe's rounds (the lock's TTL)
//	{prefix:pool}:members          zset  member ID -> end of its registration, ms (the last registration's end)
//	{prefix:pool}:member-owners    hash  member ID -> token of the process holding it (same TTL)
//	{prefix:pool}:modes            zset  member ID -> when it last leased from Redis, ms (member TTL)
//	{prefix:pool}:session:<task>   hash  a task's session: ID, proxy, slot per site, expiry, requests (session TTL)
//	{prefix:pool}:sjar:<session>   hash  "<domain>;<path>;<name>" -> the session's cookie (session TTL)
//	{prefix:pool}:sessions         zset  session ID -> its expiry, ms: the live sessions (idle TTL)
//	{prefix:pool}:seed:<token>:... the pool, order, dead, gateways and labels a Switch stages while it re-seeds
//	                                     a pool Redis lost from its copy, renamed into place at once (TTL: a minute)
//
// A ban is no key of its own: it is the score of the proxy's slots in the
// site's busy set ("free:<site>": only the slots out on the site, so a site
// costs memory for what is in use there, not for the pool), pushed to the
// end of the quarantine, so a lease skips it and it ends by itself. Likewise a session's hold on
// its proxy is the score of the proxy's slots, pushed to the session's
// expiry by each of its requests, under the owner token "s:<session ID>".
//
// A proxy's ID is a hash of its URL, credentials included; the URL with its
// password is stored only in the pool hash, where it must be kept to dial.
// Errors, logs and Request.ProxyURL show it with its user info (user name and password) masked.
//
// # Long requests, and exit
//
// A lease lives for the lease TTL (Timeouts.LeaseTTL, 30s) unless renewed: the
// Switch renews the leases of running requests every quarter of it, from one
// goroutine per Switch that starts with the first lease and ends when none
// is left, with one script call per pool whatever the number of leases. A
// request keeps its proxy however long it runs; a process that dies stops
// renewing, and its proxies are free again within one TTL. A request whose
// lease is lost all the same (Redis lost it, or the pool was cleared under
// it) fails with ErrLeaseLost rather than pass for exclusive. Call
// Switch.Close once the collectors are done, before the process exits: it
// releases every lease still held, and the Switch fails closed from then on.
//
// # Concurrency
//
// A Switch is safe for concurrent use by any number of goroutines and
// collectors; any number of processes may use one pool at once. The
// guarantees hold across processes because all shared state lives in Redis
// and changes only inside Lua scripts.
package proxyswitch
