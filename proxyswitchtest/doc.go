// Package proxyswitchtest is a loopback-only world to run and test
// crawlers that use proxyswitch, as net/http/httptest is for HTTP code:
//
//   - a fake proxy farm ([Farm], [Proxy]): local HTTP forward proxies (plain
//     requests and CONNECT tunnels), each dialling out from its own source
//     address 127.0.x.y ([SourceIP]), so that a site tells them apart as a
//     real site tells real proxies apart; a proxy can be made to fail on
//     purpose ([Proxy.SetMode]: dead, hanging, slow, 407, 502);
//   - fake sites ([Site]) whose [Recorder] is the ground truth: which client
//     IP sent what, and how often two requests from one IP were in flight
//     at once on the site (an IP collision), or one came without a proxy;
//   - an anti-bot layer ([Guard]): rate limits answered with 429 then a
//     block, captchas for concurrent requests from one IP, placeholders
//     (200 without the product), and a blacklist several sites share
//     ([Blacklist]);
//   - fake marketplaces built from them ([Market], [StartMarket]): three
//     platforms with a catalog, product pages, a shop with sign-in and cart,
//     each with its own markup and anti-bot habits;
//   - a Redis for demos and tests ([Redis], [StartRedis]): an embedded one
//     by default, a private redis-server, or yours.
//
// Linux routes the whole 127.0.0.0/8 to the loopback interface, so the
// proxies' source addresses need no setup there; all traffic stays on
// 127.0.0.0/8 (a proxy refuses any target that is not a loopback address or
// "localhost"). Constructors named New take a testing.TB and close what they
// start with tb.Cleanup; those named Start are for programs, and the caller
// closes what they return.
//
// # In-flight intervals
//
// A request is "in flight" at a site from its arrival until the handler
// starts writing the response (first Write/WriteHeader/Flush), or until the
// handler returns if it never writes. At a proxy, a forwarded request is in
// flight from its arrival until the upstream response body has been read
// completely; only then is anything written back to the client. Both
// intervals therefore end before the client can observe the end of its
// response, release its lease and start the next request, which rules out
// false collision reports, while two leases handed out at the same time
// still overlap.
package proxyswitchtest
