// Package testbed is a loopback-only bed of fake target sites and fake HTTP
// forward proxies used as the ground truth in tests of the proxy-rotation
// library.
//
// # Model
//
// The library under test leases a proxy per (proxy, site) pair so that one
// proxy never serves two concurrent requests to one site. The testbed checks
// this from the outside:
//
//   - Every fake [Proxy] listens on 127.0.0.1:PORT and dials targets from its
//     own source IP (127.0.x.y, see [SourceIP]). Linux routes the whole
//     127.0.0.0/8 to the loopback interface, so a target site sees
//     RemoteAddr == the proxy's source IP and can tell proxies apart.
//   - Every fake [Site] wraps its handler in a [Recorder], which records every
//     request ([Hit]) and counts "collisions": arrivals that find another
//     request from the same client IP still in flight.
//   - Proxies do the same accounting per target host ([Proxy.Collisions]).
//   - A request that reaches a site from 127.0.0.1 did not go through any fake
//     proxy (they never use 127.0.0.1 as source), see [Recorder.DirectHits].
//
// # In-flight intervals
//
// A request is "in flight" at a site from its arrival until the handler
// starts writing the response (first Write/WriteHeader/Flush), or until the
// handler returns if it never writes. At a proxy, a forwarded request is in
// flight from its arrival until the upstream response body has been read
// completely; only then is anything written back to the client. Both
// intervals therefore end before the client can possibly observe the end of
// its response, release its lease and start the next request, which rules out
// false collision reports, while two leases handed out at the same time still
// overlap.
//
// # Safety
//
// All traffic stays on 127.0.0.0/8: proxies refuse (403) any target that is
// not a loopback IP literal or "localhost", and re-check the resolved address
// at dial time.
//
// # Files
//
//   - proxy.go: the fake forward proxy ([Proxy], [ProxyMode]).
//   - sourceip.go: deterministic source IP allocation ([SourceIP], [NewProxies]).
//   - site.go: fake sites ([Site], [NewSite], [NewTLSSite]).
//   - handler.go: the default product-site handler ([ShopHandler]).
//   - recorder.go, inflight.go: request recording and collision accounting.
//   - bed.go: helpers working on groups of sites and proxies ([Bed],
//     [TotalCollisions]).
//   - marketplace.go: an anti-bot middleware ([Marketplace]): rate limits
//     answered with 429 then 403, a captcha redirect for concurrent requests
//     from one IP, and burnt IPs served placeholders, 403s, truncated pages
//     or captchas.
//
// Anti-bot behaviour is added as middlewares composed inside the recorder
// (NewSite(tb, name, NewMarketplace(nil))), so that the recorder keeps
// seeing every request, refused ones included.
package testbed
