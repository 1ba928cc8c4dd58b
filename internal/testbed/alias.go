package testbed

import (
	"net/http"
	"testing"

	"github.com/proxyswitch/proxyswitch/proxyswitchtest"
)

// The proxies, sites, recorders and the anti-bot layer live in the public
// package proxyswitchtest; these names let the library's tests keep theirs.
type (
	Proxy       = proxyswitchtest.Proxy
	ProxyMode   = proxyswitchtest.ProxyMode
	Site        = proxyswitchtest.Site
	Recorder    = proxyswitchtest.Recorder
	Hit         = proxyswitchtest.Hit
	Marketplace = proxyswitchtest.Guard
	MarketHit   = proxyswitchtest.GuardHit
	Treatment   = proxyswitchtest.Treatment
	Decision    = proxyswitchtest.Decision
	Blacklist   = proxyswitchtest.Blacklist
)

// Modes of a [Proxy].
const (
	ProxyOK   = proxyswitchtest.ProxyOK
	ProxyDead = proxyswitchtest.ProxyDead
	ProxyHang = proxyswitchtest.ProxyHang
	ProxySlow = proxyswitchtest.ProxySlow
	Proxy407  = proxyswitchtest.Proxy407
	Proxy502  = proxyswitchtest.Proxy502
)

// Treatments and decisions of a [Marketplace], and its pages.
const (
	Serve       = proxyswitchtest.Serve
	Placeholder = proxyswitchtest.Placeholder
	Forbid      = proxyswitchtest.Forbid
	Truncate    = proxyswitchtest.Truncate
	Challenge   = proxyswitchtest.Challenge

	DecidedPage        = proxyswitchtest.DecidedPage
	DecidedPlaceholder = proxyswitchtest.DecidedPlaceholder
	DecidedTruncated   = proxyswitchtest.DecidedTruncated
	DecidedForbidden   = proxyswitchtest.DecidedForbidden
	DecidedRateLimited = proxyswitchtest.DecidedRateLimited
	DecidedCaptcha     = proxyswitchtest.DecidedCaptcha
	DecidedCaptchaPage = proxyswitchtest.DecidedCaptchaPage

	CaptchaPath     = proxyswitchtest.CaptchaPath
	PlaceholderHTML = proxyswitchtest.PlaceholderHTML
	CaptchaHTML     = proxyswitchtest.CaptchaHTML
)

// MaxSourceIPs and DirectIP: see proxyswitchtest.
const (
	MaxSourceIPs = proxyswitchtest.MaxSourceIPs
	DirectIP     = proxyswitchtest.DirectIP
)

// SourceIP, NewProxy, NewRecorder and NewBlacklist: see proxyswitchtest.
var (
	SourceIP     = proxyswitchtest.SourceIP
	NewProxy     = proxyswitchtest.NewProxy
	NewRecorder  = proxyswitchtest.NewRecorder
	NewBlacklist = proxyswitchtest.NewBlacklist
)

// NewProxies starts n proxies with distinct source IPs SourceIP(0) ..
// SourceIP(n-1). All are closed by tb.Cleanup.
func NewProxies(tb testing.TB, n int) []*Proxy {
	tb.Helper()
	return proxyswitchtest.NewFarm(tb, n).Proxies
}

// NewSite starts a plain-HTTP site named name serving h (nil means
// [DefaultHandler]). tb.Cleanup closes it.
func NewSite(tb testing.TB, name string, h http.Handler) *Site {
	tb.Helper()
	return proxyswitchtest.NewSite(tb, name, orDefault(h))
}

// NewTLSSite is [NewSite] over HTTPS (see proxyswitchtest.NewTLSSite).
func NewTLSSite(tb testing.TB, name string, h http.Handler) *Site {
	tb.Helper()
	return proxyswitchtest.NewTLSSite(tb, name, orDefault(h))
}

func orDefault(h http.Handler) http.Handler {
	if h == nil {
		return DefaultHandler()
	}
	return h
}

// NewMarketplace wraps next in an anti-bot layer (nil: a [ShopHandler]
// with the default delay whose product pages are padded to 4 KiB).
func NewMarketplace(next http.Handler) *Marketplace {
	if next == nil {
		next = &ShopHandler{Delay: DefaultProductDelay, PageSize: 4 << 10}
	}
	return proxyswitchtest.NewGuard(next)
}
