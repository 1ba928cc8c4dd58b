// Package stage sets the scene for the example programs: a Redis
// (internal/devredis), local forward proxies each dialling out from its own
// loopback address (internal/testbed) and, when asked, the fake
// marketplaces (internal/fakemarket), some of the proxies already on their
// blacklist.
package stage

import (
	"flag"
	"fmt"

	"github.com/proxyswitch/proxyswitch/internal/devredis"
	"github.com/proxyswitch/proxyswitch/internal/fakemarket"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
)

// RedisFlag defines the examples' -redis flag on the command line's flag
// set: the redisURL to give Start.
func RedisFlag() *string {
	return flag.String("redis", "", `Redis URL, or "embedded" (default: a private redis-server if one is on PATH, else an embedded in-process Redis)`)
}

// Stage is what an example runs against. Close it when done.
type Stage struct {
	Redis   *devredis.Server
	Proxies []*testbed.Proxy
	Burnt   []string           // exit IPs of the proxies on the blacklist before the crawl
	Market  *fakemarket.Market // nil unless Start was given a marketplace config
}

// Start starts Redis (see devredis.Start for redisURL), n proxies, and, with
// market non-nil, the marketplaces with burnt of the proxies on their
// blacklist (market.Burnt is set from them).
func Start(redisURL string, n, burnt int, market *fakemarket.Config) (*Stage, error) {
	if n < 1 || n > testbed.MaxSourceIPs || burnt < 0 || burnt > n {
		return nil, fmt.Errorf("stage: need 1 <= proxies <= %d and 0 <= burnt <= proxies", testbed.MaxSourceIPs)
	}
	rs, err := devredis.Start(redisURL)
	if err != nil {
		return nil, err
	}
	proxies, err := testbed.StartProxies(n)
	if err != nil {
		rs.Close()
		return nil, err
	}
	s := &Stage{Redis: rs, Proxies: proxies, Burnt: BurntIPs(proxies, burnt)}
	if market != nil {
		cfg := *market
		cfg.Burnt = s.Burnt
		s.Market = fakemarket.Start(cfg)
	}
	return s, nil
}

// ProxyURLs returns the proxies' URLs, the pool to load.
func (s *Stage) ProxyURLs() []string {
	urls := make([]string, len(s.Proxies))
	for i, p := range s.Proxies {
		urls[i] = p.URL()
	}
	return urls
}

// Close stops everything Start started.
func (s *Stage) Close() {
	if s.Market != nil {
		s.Market.Close()
	}
	for _, p := range s.Proxies {
		p.Close()
	}
	s.Redis.Close()
}

// BurntIPs picks n of the proxies, evenly spread over the list, and returns
// the addresses they dial out from.
func BurntIPs(proxies []*testbed.Proxy, n int) []string {
	var ips []string
	for i := range n {
		ips = append(ips, proxies[i*len(proxies)/n].SourceIP().String())
	}
	return ips
}
