// Package cookierule holds the pure rules of RFC 6265 (sections 5.1.3,
// 5.1.4, 5.3 and 5.4) that both cookie jars of the module apply: the root
// package's session jar (sessionjar.go) and package storage's cookie store
// (storage/cookies.go). They decide which cookies a response may set
// (Domain, default path, expiry) and which stored cookies go with a request
// (domain-match, path-match, Secure), as net/http/cookiejar does, with the
// public suffix list of golang.org/x/net/publicsuffix.
//
// Nothing here does I/O or keeps state.
package cookierule

import (
	"net"
	"net/http"
	"strings"
	"time"

	"golang.org/x/net/idna"
	"golang.org/x/net/publicsuffix"
)

// CanonicalHost is the form of a URL's host name (u.Hostname(): without
// port or IPv6 brackets) that the rules work on, as net/http/cookiejar's
// canonicalHost: lower-cased, without a trailing dot, each non-ASCII
// label in punycode ("www.bücher.de" -> "www.xn--bcher-kva.de"), so that
// a host and its punycode form are one host, and a Domain attribute (which
// must be ASCII) can name an IDN domain. ok is false for a host punycode
// cannot encode. Unlike cookiejar, which encodes the labels before it
// lower-cases ASCII, a label is lower-cased whole first ("BÜCHER" is
// "bücher", as IDNA maps it).
func CanonicalHost(host string) (string, bool) {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	ascii := true
	for i := 0; i < len(host) && ascii; i++ {
		ascii = host[i] < 0x80
	}
	if ascii {
		return host, true
	}
	a, err := idna.Punycode.ToASCII(host)
	if err != nil {
		return "", false
	}
	return strings.ToLower(a), true
}

// IsPublicSuffix reports whether d is a public suffix ("com", "co.uk",
// "github.io"), under which no site may set cookies for its neighbours.
func IsPublicSuffix(d string) bool {
	ps, _ := publicsuffix.PublicSuffix(d)
	return ps == d
}

// Domain applies the Domain attribute attr of a cookie set by a response
// from host (lower-cased, without port) and returns the cookie's domain:
// host itself and hostOnly for no attribute, or for an attribute naming
// host when host is a public suffix; host, not host-only, for an attribute
// naming host; a parent domain of host that is not a public suffix (nor an
// IP's part). ok is false when host may not set cookies for attr's domain.
// A leading dot of attr is ignored and attr is compared lower-cased.
func Domain(host, attr string) (domain string, hostOnly, ok bool) {
	switch d := strings.ToLower(strings.TrimPrefix(attr, ".")); {
	case d == "" || IsPublicSuffix(d) && d == host:
		return host, true, true
	case d == host:
		return host, false, true
	case net.ParseIP(host) == nil && strings.Contains(d, ".") && strings.HasSuffix(host, "."+d) && !IsPublicSuffix(d):
		return d, false, true
	default:
		return "", false, false // a domain the host cannot set cookies for
	}
}

// DefaultPath is RFC 6265's default-path of a request path (5.1.4), as
// net/http/cookiejar computes it: the directory of the path, "/" for "/x"
// or a path not starting with "/".
func DefaultPath(p string) string {
	i := strings.LastIndex(p, "/")
	if !strings.HasPrefix(p, "/") || i <= 0 {
		return "/"
	}
	return p[:i]
}

// Path is the path a cookie is stored under: its Path attribute when that
// starts with "/", else the default path of the request path reqPath.
func Path(attr, reqPath string) string {
	if strings.HasPrefix(attr, "/") {
		return attr
	}
	return DefaultPath(reqPath)
}

// Expiry applies a cookie's Max-Age and Expires attributes at now: del is
// true when the cookie deletes the stored one (Max-Age <= 0, or an Expires
// not after now); otherwise at is when it expires, the zero time for a
// session cookie (neither attribute). Max-Age wins over Expires.
func Expiry(c *http.Cookie, now time.Time) (at time.Time, del bool) {
	switch {
	case c.MaxAge < 0:
		return time.Time{}, true
	case c.MaxAge > 0:
		return now.Add(time.Duration(c.MaxAge) * time.Second), false
	case !c.Expires.IsZero():
		if !c.Expires.After(now) {
			return time.Time{}, true
		}
		return c.Expires, false
	}
	return time.Time{}, false
}

// DomainMatch reports whether a cookie of domain (host-only or not) goes to
// host (lower-cased, without port): the host itself, or for a domain
// cookie any subdomain of domain; an IP host matches only itself.
func DomainMatch(host, domain string, hostOnly bool) bool {
	if host == domain {
		return true
	}
	return !hostOnly && net.ParseIP(host) == nil && strings.HasSuffix(host, "."+domain)
}

// PathMatch reports whether a cookie of path cookiePath goes to a request
// of path reqPath (decoded, as url.URL.Path; "" counts as "/"): the path
// itself, or one below it ("/a" matches "/a/b", not "/ab").
func PathMatch(reqPath, cookiePath string) bool {
	p := reqPath
	if p == "" {
		p = "/"
	}
	return p == cookiePath || (strings.HasPrefix(p, cookiePath) && (strings.HasSuffix(cookiePath, "/") || p[len(cookiePath)] == '/'))
}

// SecureOK reports whether a Secure cookie (secure true) may go over a
// request of scheme.
func SecureOK(secure bool, scheme string) bool {
	return !secure || scheme == "https" || scheme == "wss"
}

// IsIP reports whether host is an IP address (no domain name).
func IsIP(host string) bool { return net.ParseIP(host) != nil }

// JarKey is the registrable domain of host (lower-cased, without port),
// under which net/http/cookiejar keeps the cookies a response from host may
// set: its public suffix plus one label ("www.shop.co.uk" -> "shop.co.uk"),
// or host itself for an IP, a single label ("localhost") or a public
// suffix. Every cookie that may go to host is kept under host's key (a
// domain cookie's domain is host or a parent of it below the public
// suffix, so it has the same registrable domain).
func JarKey(host string) string {
	if net.ParseIP(host) != nil {
		return host
	}
	ps, _ := publicsuffix.PublicSuffix(host)
	if ps == host {
		return host
	}
	i := len(host) - len(ps)
	if i <= 0 || host[i-1] != '.' {
		return host
	}
	prev := strings.LastIndex(host[:i-1], ".")
	return host[prev+1:]
}
