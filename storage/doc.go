// Package storage keeps a Colly crawl's shared state in Redis, so that
// several collectors on several servers crawl as one: a visited set in
// which each URL is fetched once, cookies shared as Colly's own storage
// keeps them, and one request queue that survives a crashed worker.
//
// One *Storage implements both of Colly's backends, storage.Storage
// (Init, Visited, IsVisited, Cookies, SetCookies) and queue.Storage
// (AddRequest, GetRequest, QueueSize), for every go-redis client kind
// (single node, Sentinel, Cluster, Ring):
//
//	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
//	s, err := storage.New(rdb, storage.WithNamespace("shop-crawl"))
//	if err != nil { ... }
//	c := colly.NewCollector()
//	if err := c.SetStorage(s); err != nil { ... } // visited set and cookies
//	s.Attach(c)                                   // acknowledges queued requests
//	q, err := queue.New(50, s)                    // the shared queue
//	q.AddURL("https://example.com/")
//	s.AddURLs(ctx, seeds...)                      // many URLs, one round trip per 500
//	q.Run(c)
//
// # Visited, across processes
//
// Colly checks a URL with IsVisited and then calls Visited. Here Visited is
// the atomic step (set-if-absent in Redis): when collectors race on one URL,
// exactly one gets nil and fetches; the others get ErrAlreadyVisited and do
// not. IsVisited only reads, so Collector.HasVisited never marks a URL.
// WithVisitedTTL lets marks expire for re-crawls. Colly's one deliberate
// revisit, a Request.Retry() after a redirect to a URL already visited,
// is let through as with Colly's in-memory storage.
//
// # Cookies
//
// Cookies follow RFC 6265 as net/http/cookiejar (the jar of Colly's own
// storage) applies it, with the public suffix list: a cookie set by
// www.shop.com with Domain=shop.com goes to api.shop.com and m.shop.com, a
// host-only cookie (no Domain) only to its host, a cookie of Path=/admin
// only to /admin and below, a Secure one only over https; a Domain the
// host may not set (another site, a public suffix such as "com" or
// "co.uk", a part of an IP) is refused; Max-Age=0 or a past Expires
// deletes. Cookies returns the matching ones, longest path first, then the
// earliest set. Ports do not matter. They are kept in one hash per
// registrable domain (shop.com for www.shop.com), one field per cookie, so
// concurrent writers in any number of processes never undo each other's
// unrelated cookies. Colly's jar wrapper writes back what it has just
// read; a write-back of a line this process's last read of the host
// returned is skipped, but one that this check misses (storage/cookies.go
// names the cases: another read of the host in between, two collectors on
// one Storage) can still undo a change or a deletion another collector
// made to the same cookie meanwhile.
// Cookies an earlier version stored per host and port move into the
// domain's hash when that host (with that port) is next read or written.
//
// Limits: a domain's hash holds at most 3000 cookies (of all its hosts
// together) and 4 MiB of stored values; a cookie whose stored value
// (Set-Cookie line plus about 20 bytes) passes 8 KiB is not stored. A full
// hash makes room as a browser does: expired cookies go first, then the
// oldest by creation time. Cookies a response sets are never refused for a
// full hash (only the earliest of a single response that alone passes the
// limits are); whatever is not stored is logged.
//
// # Queue, at least once
//
// GetRequest keeps each delivered request in flight, invisible to other
// workers, until it is acknowledged. The hooks Attach installs mark it
// running when its fetch starts (OnRequest), acknowledge it when the fetch
// ends (OnScraped), or fail it (OnError). The acknowledgement runs after
// every OnScraped (or, for a final failure, OnError) callback of the
// collector, whether registered before or after Attach: the acknowledging
// callbacks are appended at the collector's first request, and appended
// again at a later request if callbacks were registered since. A worker
// killed while your callbacks run therefore loses no page: the request
// comes back. (A callback registered by one of a response's own callbacks
// runs after that response's acknowledgement.) A queue.Run on a Storage
// never attached returns ErrNotAttached at once rather than never.
// Until the fetch starts, the
// visibility timeout (WithVisibilityTimeout) keeps it invisible; from then
// on, a renewer goroutine of the Storage extends it every third of that
// timeout, however long the fetch takes (a slow site, a wait for a free
// proxy, retries through several proxies), for up to WithMaxFetchTime. A
// request whose worker dies comes back within the visibility timeout.
// After WithMaxDeliveries deliveries a request goes to the dead-letter list
// (DeadLetters, Requeue). A request is fetched twice only if its worker
// dies after fetching and before acknowledging, or its fetch outlasts
// WithMaxFetchTime. QueueSize counts in-flight requests too, so queue.Run
// returns nil only when the whole namespace's work is done.
//
// A delivery the worker never received does not count toward
// WithMaxDeliveries: a GetRequest whose reply is lost (no reply within
// WithRedisTimeout on a slow network: the pop ran in Redis) keeps its pop
// ID, and this Storage's next GetRequest sends it again and gets the same
// delivery, not counted again. Only if the process makes no GetRequest
// within the visibility timeout (it exits, or its queue.Run ended and is
// not run again) does that delivery count, as a worker's that died.
// Likewise a delivery whose visited check fails on a Redis error (Colly
// then drops it, firing no callback) is handed back at once, not counted,
// rather than coming back after the visibility timeout as one more.
// Delivery tokens carry that pop ID, a random nonce, so a late Ack of an
// earlier delivery never settles a later one, even after Requeue or after
// an empty Redis handed out the same request IDs again.
//
// Redis outages. Every call is bounded by WithRedisTimeout, QueueSize
// included, and Colly's queue.Run returns the first error QueueSize
// returns: an outage (or a network slower than the timeout) that lasts
// longer ends Run with an ErrRedis error, though work is left. Run it again
// until it returns nil, soon (within the visibility timeout, so that a
// GetRequest whose reply was lost is sent again before its delivery comes
// back and counts):
//
//	for {
//		err := q.Run(c)
//		if err == nil {
//			break // the namespace's work is done
//		}
//		if !errors.Is(err, storage.ErrRedis) {
//			return err
//		}
//		time.Sleep(time.Second) // Redis is unreachable or slow: try again
//	}
//
// The queue and the visited set live only in Redis: run it with
// persistence (AOF with appendfsync everysec or always, or RDB snapshots)
// and, for failover, replicas. A Redis that restarts empty forgets every
// queued, in-flight and dead request and every visited mark: the crawl
// starts again from what is queued next (re-seed it), and URLs already
// fetched are fetched again. One restored from an older snapshot loses
// what came after it: requests queued since are gone, and ones acknowledged
// since come back (fetched twice, never lost once queued before the
// snapshot). Workers still holding deliveries from before such a restart
// cannot settle anything their tokens did not name (see above).
//
// Which delivery claimed a URL. A claim Visited makes for a queued delivery
// writes the queued request's ID into the visited mark ("0|<id>"; any other
// claim writes "0|"), and a delivery is let through a mark only if the mark
// names its own request: one delivered again after its worker died after
// the claim, or after a failure, or requeued, is fetched again; one that
// finds the mark of another request of the URL (the URL was queued twice,
// or visited directly) is acknowledged as a duplicate, whatever its
// delivery number. A mark an earlier version wrote ("0" or "<expiry>",
// without "|") names no claimer and keeps the earlier rule: a redelivery
// passes it, a first delivery is refused. So a request an earlier version
// delivered (in flight at the upgrade, or back in the ready list after its
// worker died) is still fetched after it.
//
// Upgrading and going back. Earlier versions cannot run beside this one:
// they read its tries values ("<n>|<pop ID>") as corrupt and dead-letter
// the request (Requeue brings it back), and its visited marks ("0|...") as
// corrupt. Stop every collector of the earlier version before starting one
// of this version on the namespace (not a rolling upgrade); this version
// reads everything the earlier one left (requests in flight or ready,
// dead letters, marks). Going back is not supported as is: stop every collector
// of this version, then either Clear the namespace, or rewrite its data to
// the earlier form first: each {ns}:q:tries value "<n>|<pop ID>" to "<n>",
// DEL {ns}:q:pops, and in each visited bucket each mark "<expiry>|..." to
// "<expiry>" (a bucket's marks then no longer say which request claimed
// them, as before).
//
// Requests Colly drops before sending fire no callback. Those dropped as
// already visited are acknowledged by the visited check (or, when a
// callback's Visit of the same URL took it while the queued one waited
// for a thread, when that Visit's request starts); those dropped by
// URL filters, robots.txt, MaxDepth or Abort end in the dead-letter list
// (filter before AddRequest, or call Ack). One aborted by an OnRequest
// callback registered after Attach is already running: it comes back only
// after WithMaxFetchTime (call Ack or Nack before aborting it). Use one
// Storage as both the collector's storage and the queue's, so the two
// cooperate.
//
// # Redis key layout
//
// All keys of a namespace ns are derived from it; none is found by a glob.
// In the keys, ns is the namespace with '%' written "%25" and ':' "%3A" (a
// namespace with neither is itself), so no two namespaces, and no
// namespace and proxy pool (whose tag "{prefix:pool}" always holds a ':'),
// share a key:
//
//	{ns}:meta           hash    shared settings ("buckets")
//	{ns}:cookiedomains  set     registrable domains that have cookies (the registry Clear reads)
//	{ns}:cj:<domain>    hash    "<domain>;<path>;<name>" -> "<created µs>|<flags>|<expires ms>|<Set-Cookie line>" (flags h: host-only, d: domain; m: moved)
//	{ns}:cookiehosts    set     earlier versions: hosts that have cookies (Clear reads it too)
//	{ns}:c:<host>       hash    earlier versions: "<name>;<path>;<domain>" -> Set-Cookie line (moved into {ns}:cj:<domain> when the host is next read or written)
//	{ns}:q:ready        list    request IDs ready for delivery
//	{ns}:q:data         hash    request ID -> serialized request
//	{ns}:q:tries        hash    request ID -> "<deliveries so far>|<pop ID of the latest>" (a random nonce)
//	{ns}:q:inflight     zset    request ID -> unix ms it comes back
//	{ns}:q:dead         zset    request ID -> unix ms it was dead-lettered
//	{ns}:q:why          hash    request ID -> last failure
//	{ns}:q:seq          string  last request ID
//	{ns}:q:pops         hash    pop ID -> request ID, while that pop's delivery is the latest
//	ns:v:{<bucket>}     hash    request hash -> "0" or expiry (unix ms), then "|<queue request ID>" for a claim a queued delivery made
//
// The "{ns}" keys share one Redis Cluster hash tag, so each script runs in
// one slot; the visited buckets (65536 by default, WithVisitedBuckets) each
// have a tag of their own and spread over all nodes.
//
// Time (expiry, visibility) always comes from Redis's TIME, never from a
// client's clock, but for cookies: a cookie's Max-Age and Expires are
// applied, and its expiry checked, on the client's clock, as
// net/http/cookiejar does (their creation times, which order them, are
// Redis's). Every Redis round trip is bounded by WithRedisTimeout.
//
// # Round trips
//
// AddRequest, GetRequest and the acknowledgement of a delivery (Ack, and
// the hooks Attach installs) made by several goroutines at once share one
// script call (group commit: while one call of a kind is in Redis, the
// next ones gather and go together when it returns; a lone call goes at
// once). Each still returns only when its own outcome is in Redis, so
// delivery stays at-least-once and an acknowledgement still follows the
// callbacks. IsVisited and Visited are one plain command each for a URL
// without an expiry (HMGET, HSETNX), as GET and SET would be; calls of
// either kind made at once go together the same way, as one pipeline of
// those commands (with WithVisitedTTL, of Visited's script calls), each
// caller still getting its own answer or error.
package storage
