package testbed

import (
	"fmt"
	"testing"
)

// TotalCollisions sums the collisions recorded by the sites' recorders and
// by the proxies.
func TotalCollisions(sites []*Site, proxies []*Proxy) (siteCollisions, proxyCollisions int) {
	for _, s := range sites {
		siteCollisions += s.Recorder().Collisions()
	}
	for _, p := range proxies {
		proxyCollisions += p.Collisions()
	}
	return siteCollisions, proxyCollisions
}

// Bed groups sites and proxies of one test.
type Bed struct {
	Sites   []*Site
	Proxies []*Proxy
}

// NewBed starts nSites sites named "site-0", "site-1", ... serving
// [DefaultHandler] and nProxies proxies created by [NewProxies].
func NewBed(tb testing.TB, nSites, nProxies int) *Bed {
	tb.Helper()
	b := &Bed{Sites: make([]*Site, nSites)}
	for i := range b.Sites {
		b.Sites[i] = NewSite(tb, fmt.Sprintf("site-%d", i), nil)
	}
	b.Proxies = NewProxies(tb, nProxies)
	return b
}

// ProxyURLs returns the URLs of all proxies.
func (b *Bed) ProxyURLs() []string {
	urls := make([]string, len(b.Proxies))
	for i, p := range b.Proxies {
		urls[i] = p.URL()
	}
	return urls
}

// Collisions is TotalCollisions over the bed.
func (b *Bed) Collisions() (siteCollisions, proxyCollisions int) {
	return TotalCollisions(b.Sites, b.Proxies)
}

// SiteHits returns the total number of hits recorded by all sites.
func (b *Bed) SiteHits() int {
	n := 0
	for _, s := range b.Sites {
		n += s.Recorder().Count()
	}
	return n
}

// DirectHits returns the total number of direct (non-proxied) hits on all
// sites.
func (b *Bed) DirectHits() int {
	n := 0
	for _, s := range b.Sites {
		n += s.Recorder().DirectHits()
	}
	return n
}
