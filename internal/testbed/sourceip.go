package testbed

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
		panic(fmt.Sprintf("testbed: source IP index %d out of range [0,%d)", i, MaxSourceIPs))
	}
	return net.IPv4(127, 0, byte(1+i/254), byte(1+i%254)).To4()
}

// NewProxies starts n proxies with distinct source IPs SourceIP(0) ..
// SourceIP(n-1). All are closed by tb.Cleanup.
func NewProxies(tb testing.TB, n int) []*Proxy {
	tb.Helper()
	if n < 0 || n > MaxSourceIPs {
		tb.Fatalf("testbed: NewProxies(%d): n out of range [0,%d]", n, MaxSourceIPs)
	}
	ps := make([]*Proxy, n)
	for i := range ps {
		ps[i] = NewProxy(tb, SourceIP(i))
	}
	return ps
}

// StartProxies is [NewProxies] for programs without a testing.TB: it starts
// n proxies with [StartProxy]; on an error it closes those already started.
// The caller must Close every proxy.
func StartProxies(n int) ([]*Proxy, error) {
	if n < 0 || n > MaxSourceIPs {
		return nil, fmt.Errorf("testbed: StartProxies(%d): n out of range [0,%d]", n, MaxSourceIPs)
	}
	ps := make([]*Proxy, n)
	for i := range ps {
		p, err := StartProxy(SourceIP(i))
		if err != nil {
			for _, q := range ps[:i] {
				q.Close()
			}
			return nil, err
		}
		ps[i] = p
	}
	return ps, nil
}
