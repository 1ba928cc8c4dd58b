package proxyswitchtest

import (
	"fmt"
	"net"
	"testing"
)

// MaxSourceIPs is the number of distinct proxy source IPs [SourceIP] can
// produce: 127.0.1.1 .. 127.0.255.254, skipping host parts .0 and .255.
const MaxSourceIPs = 255 * 254

// SourceIP returns the i-th proxy source IP (0-based): 0 -> 127.0.1.1,
// 253 -> 127.0.1.254, 254 -> 127.0.2.1, ... It never returns 127.0.0.1
// ([DirectIP]). It panics if i is outside [0, MaxSourceIPs).
func SourceIP(i int) net.IP {
	if i < 0 || i >= MaxSourceIPs {
		panic(fmt.Sprintf("proxyswitchtest: source IP index %d out of range [0,%d)", i, MaxSourceIPs))
	}
	return net.IPv4(127, 0, byte(1+i/254), byte(1+i%254)).To4()
}

// Farm is a fake proxy farm: local forward proxies, the i-th dialling out
// from SourceIP(i), so that a site tells them apart as a real site tells
// real proxies apart. Proxies is not changed after the start; the methods
// are safe for concurrent use.
type Farm struct {
	Proxies []*Proxy // the i-th dials out from SourceIP(i)
}

// NewFarm starts n proxies with distinct source IPs SourceIP(0) ..
// SourceIP(n-1), 0 <= n <= [MaxSourceIPs]. tb.Cleanup closes them.
func NewFarm(tb testing.TB, n int) *Farm {
	tb.Helper()
	if n < 0 || n > MaxSourceIPs {
		tb.Fatalf("proxyswitchtest: NewFarm(%d): n out of range [0,%d]", n, MaxSourceIPs)
	}
	f := &Farm{Proxies: make([]*Proxy, n)}
	for i := range f.Proxies {
		f.Proxies[i] = NewProxy(tb, SourceIP(i))
	}
	return f
}

// StartFarm is [NewFarm] for programs without a testing.TB (demos,
// examples): it starts the proxies with [StartProxy] and returns an error
// instead of failing a test (having closed those already started). The
// caller must Close the farm.
func StartFarm(n int) (*Farm, error) {
	if n < 0 || n > MaxSourceIPs {
		return nil, fmt.Errorf("proxyswitchtest: StartFarm(%d): n out of range [0,%d]", n, MaxSourceIPs)
	}
	f := &Farm{Proxies: make([]*Proxy, 0, n)}
	for i := range n {
		p, err := StartProxy(SourceIP(i))
		if err != nil {
			f.Close()
			return nil, err
		}
		f.Proxies = append(f.Proxies, p)
	}
	return f, nil
}

// URLs returns the proxies' URLs, in order: the pool to load.
func (f *Farm) URLs() []string {
	urls := make([]string, len(f.Proxies))
	for i, p := range f.Proxies {
		urls[i] = p.URL()
	}
	return urls
}

// SpreadIPs returns the source IPs of n of the proxies (0 <= n <=
// len(Proxies)), spread evenly over the farm: the IPs to put on a
// blacklist before a crawl ([MarketConfig.Burnt]).
func (f *Farm) SpreadIPs(n int) []string {
	ips := make([]string, n)
	for i := range ips {
		ips[i] = f.Proxies[i*len(f.Proxies)/n].SourceIP().String()
	}
	return ips
}

// Close stops every proxy of the farm.
func (f *Farm) Close() {
	for _, p := range f.Proxies {
		p.Close()
	}
}
