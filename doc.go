// Package proxyswitch lets many Colly collectors on many servers share one
// proxy pool through Redis without two requests ever leaving from one IP to
// one site at the same moment.
//
// Every request leases a proxy for its target site from a pool kept in Redis.
// A lease is atomic (one Lua script, one round trip), owner-checked (a token
// per lease: a holder whose lease ran out can neither release nor extend the
// next holder's), bounded by a TTL (a crashed worker's proxies come back by
// themselves) and handed out least-recently-used first, which spreads the
// load evenly over the pool. Time is taken from Redis, never from a client.
//
// # Usage
//
// The smallest integration is one line:
//
//	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"}) // or NewClusterClient, NewFailoverClient
//	c := colly.NewCollector()
//	c.SetProxyFunc(proxyswitch.New(rdb))
//
// That never lets two requests share an IP on one site, but each proxy stays
// taken until its request's context ends (or, at the latest, its lease TTL
// runs out). Install the whole extension instead, so that each lease is
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
// # Failing closed
//
// The proxy function never returns "no proxy": Go would then connect
// directly and expose the crawler's own IP. When no proxy can be had (an
// empty pool, every proxy busy past the max wait, the request's context
// ending, Redis down or hung) the request fails with an error wrapping
// ErrNoProxy, visible in OnError and in the error Visit returns.
//
// # Waiting for a proxy
//
// With every proxy busy, a request waits (sleeping on the time until the
// next proxy frees, capped by a jittered backoff of 5 to 250ms, never
// spinning on Redis) up to WithMaxWait (30s). Colly's request timeout (10s by
// default) counts that wait too: give crawls with more workers than proxies a
// longer timeout with Collector.SetRequestTimeout.
//
// # Redis keys
//
// All keys of one pool share one hash tag, so they live in one Redis Cluster
// slot and one script may touch them together. Several projects share one
// Redis by choosing distinct prefixes (WithPrefix).
//
//	{prefix:pool}:proxies        hash  proxy ID -> proxy URL (the pool; no TTL)
//	{prefix:pool}:meta           hash  settings all workers must share (no TTL)
//	{prefix:pool}:sites          zset  site -> time of its last lease (idle TTL)
//	{prefix:pool}:free:<site>    zset  "<id>:<slot>" -> time it is next free, ms (idle TTL)
//	{prefix:pool}:lease:<site>   hash  "<id>:<slot>" -> "<token>|<expiry ms>" (idle TTL)
//
// A proxy's ID is a hash of its URL, credentials included; the URL with its
// password is stored only in the pool hash, where it must be kept to dial.
// Errors, logs and Request.ProxyURL show it with the password replaced.
//
// # Concurrency
//
// A Switch is safe for concurrent use by any number of goroutines and
// collectors; any number of processes may use one pool at once. The
// guarantees hold across processes because all shared state lives in Redis
// and changes only inside Lua scripts.
package proxyswitch
