package proxyswitch

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/proxyswitch/proxyswitch/internal/redact"
	"golang.org/x/net/idna"
)

// Proxy is one validated proxy of a pool. It is immutable and safe for
// concurrent use. Its identity is its whole canonical URL, credentials
// included (a gateway's usernames per exit IP are different proxies); two
// spellings of one proxy are one pool entry. ID, a hash of that identity,
// names the proxy in Redis, logs and metrics.
type Proxy struct {
	id     string
	url    *url.URL
	shown  string // String: the URL with user info masked, computed once
	gw     string // the gateway template it was expanded from (gateway.go), or ""
	labels string // its labels, canonical "k=v,k=v" (labels.go), or ""
}

// proxySchemes are the schemes net/http's Transport can dial through.
var proxySchemes = map[string]bool{"http": true, "https": true, "socks5": true, "socks5h": true}

// ParseProxy validates raw: a URL (http, https, socks5, socks5h, with a
// numeric port and optional user:password), host:port,
// user:password@host:port or host:port:user:password (user info as is). Host
// and port are canonicalised; ambiguous lines are rejected. The error, a
// *ProxyError wrapping ErrInvalidProxy, never echoes user info.
func ParseProxy(raw string) (*Proxy, error) {
	bad := func(reason string) error {
		return &ProxyError{Proxy: redactRaw(raw), Reason: reason, Err: ErrInvalidProxy}
	}
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return nil, bad("empty URL")
	}
	if isTemplate(raw) {
		if _, _, err := parseGateway(raw); err != nil {
			return nil, err
		}
		return nil, &ProxyError{Proxy: redactRaw(sessionToken.ReplaceAllString(raw, "s")),
			Reason: "a gateway template names many proxies: give it to Add, Replace, ParseProxies or ReadProxies", Err: ErrInvalidProxy}
	}
	if strings.ContainsAny(raw, " \t\r\n") {
		return nil, bad("URL contains white space")
	}
	if i := strings.Index(raw, "://"); i > 0 && redact.IsScheme(raw[:i]) {
		p, reason := parseURL(raw)
		if p == nil {
			return nil, bad(reason)
		}
		return p, nil
	}
	// No scheme: user:password@host:port, host:port:user:password or host:port.
	if swappedLine(raw) {
		return nil, bad("ambiguous: reads as host:port:user:password and as user:password:host:port; write it as a URL")
	}
	var found *Proxy
	var reasons []string
	for _, c := range schemelessReadings(raw) {
		p, reason := parseURL(c.url)
		switch {
		case p == nil:
			reasons = append(reasons, c.form+": "+reason)
		case found != nil && found.id != p.id:
			return nil, bad("ambiguous: reads as user:password@host:port and as host:port:user:password; write it as a URL")
		default:
			found = p
		}
	}
	if found == nil {
		return nil, bad(strings.Join(reasons, "; "))
	}
	return found, nil
}

// reading is one way to read a proxy given without a scheme.
type reading struct{ form, url string }

// schemelessReadings are the URLs raw (no "://") may stand for.
func schemelessReadings(raw string) []reading {
	var out []reading
	if at := strings.LastIndex(raw, "@"); at >= 0 {
		user, pass, ok := strings.Cut(raw[:at], ":")
		u := &url.URL{Scheme: "http", User: url.User(user), Host: raw[at+1:]}
		if ok {
			u.User = url.UserPassword(user, pass)
		}
		out = append(out, reading{"as user:password@host:port", u.String()})
	}
	if r, ok := lineReading(raw); ok {
		out = append(out, r)
	}
	if len(out) == 0 {
		out = append(out, reading{"as host:port", "http://" + raw})
	}
	return out
}

// lineReading reads raw as host:port:user:password (host may be a bracketed
// IPv6 address; the password may hold ':').
func lineReading(raw string) (reading, bool) {
	host, rest := "", raw
	if strings.HasPrefix(raw, "[") {
		end := strings.Index(raw, "]:")
		if end < 0 {
			return reading{}, false
		}
		host, rest = raw[1:end], raw[end+2:]
	} else {
		var ok bool
		if host, rest, ok = strings.Cut(raw, ":"); !ok {
			return reading{}, false
		}
	}
	f := strings.SplitN(rest, ":", 3)
	if len(f) != 3 {
		return reading{}, false
	}
	u := &url.URL{Scheme: "http", User: url.UserPassword(f[1], f[2]), Host: net.JoinHostPort(host, f[0])}
	return reading{"as host:port:user:password", u.String()}, true
}

// swappedLine reports whether raw, with no '@', reads as well as
// user:password:host:port (the order some providers use) as it does as
// host:port:user:password: its third field is a dotted name or address and
// its fourth a port number.
func swappedLine(raw string) bool {
	if strings.Contains(raw, "@") {
		return false
	}
	f := strings.Split(raw, ":")
	return len(f) == 4 && strings.Contains(f[2], ".") && redact.IsHostPort(f[2]+":"+f[3])
}

// parseURL validates a proxy URL with a scheme. On failure it returns the
// reason, which never quotes the input.
func parseURL(raw string) (*Proxy, string) {
	i := strings.Index(raw, "://")
	if i <= 0 {
		return nil, "missing scheme (want http://, https://, socks5:// or socks5h://)"
	}
	if scheme := strings.ToLower(raw[:i]); !proxySchemes[scheme] {
		if knownSchemes[scheme] {
			return nil, fmt.Sprintf("unsupported scheme %q (want http, https, socks5 or socks5h)", scheme)
		}
		return nil, "unsupported scheme (want http, https, socks5 or socks5h)"
	}
	u, err := url.Parse(raw)
	if err != nil {
		// url.Error quotes the whole input, password included: never wrap it.
		if strings.Contains(raw, "@") {
			return nil, `malformed URL (in a user name or password, '/', '?', '#', '@', '%' and characters outside RFC 3986's user info, such as '{', '}', '^', '"', '<', '>', '|' or '\', must be %-escaped)`
		}
		return nil, "malformed URL"
	}
	u.Scheme = strings.ToLower(u.Scheme)
	host, port := u.Hostname(), u.Port()
	switch {
	case u.Opaque != "":
		return nil, "malformed URL"
	case strings.HasPrefix(u.Host, "[") && !strings.Contains(host, ":"):
		// Only IPv6 addresses are bracketed (Go 1.24's net/url took
		// "[1.2.3.4]"; later ones refuse it).
		return nil, "invalid IPv6 address"
	case host == "":
		return nil, "missing host"
	case port == "":
		return nil, "missing port"
	case u.Path != "" && u.Path != "/":
		return nil, "proxy URL must not have a path"
	case u.RawQuery != "" || u.ForceQuery:
		return nil, "proxy URL must not have a query"
	case u.Fragment != "":
		return nil, "proxy URL must not have a fragment"
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n < 1 {
		return nil, "port must be a number from 1 to 65535"
	}
	if u.User != nil && u.User.Username() == "" {
		return nil, "empty user name"
	}
	host, reason := canonicalHost(host)
	if reason != "" {
		return nil, reason
	}
	canon := &url.URL{Scheme: u.Scheme, User: u.User, Host: net.JoinHostPort(host, strconv.FormatUint(n, 10))}
	sum := sha256.Sum256([]byte(canon.String()))
	return &Proxy{id: hex.EncodeToString(sum[:8]), url: canon, shown: masked(canon)}, ""
}

// hostProfile maps an internationalised host name to its punycode (UTS #46
// lookup processing, non-transitional, as browsers do), lower-casing it, but
// accepts what real proxy host names hold and STD3 would refuse: '_' (service
// names) and "--" in the third and fourth position (CDN host names).
var hostProfile = idna.New(idna.MapForLookup(), idna.Transitional(false), idna.StrictDomainName(false),
	idna.CheckHyphens(false), idna.BidiRule())

// canonicalHost returns the one spelling of a proxy's host (as url.Hostname
// gives it: no brackets) that names it, so that every spelling of one proxy
// has one identity: an IP address in its shortest form (RFC 5952 for IPv6, an
// IPv4-mapped IPv6 address as the IPv4 address it maps), a name lower-cased,
// without its trailing dot and in punycode (an IDN and its xn-- form are one
// host). On failure it returns the reason, which never quotes the input.
func canonicalHost(host string) (string, string) {
	if strings.Contains(host, ":") { // only IPv6 addresses hold ':'
		a, err := netip.ParseAddr(host)
		if err != nil || !a.Is6() {
			return "", "invalid IPv6 address"
		}
		return a.Unmap().String(), ""
	}
	if !isASCII(host) || strings.Contains(strings.ToLower(host), "xn--") {
		if !utf8.ValidString(host) {
			return "", "invalid host name (not UTF-8)"
		}
		a, err := hostProfile.ToASCII(host)
		if err != nil || strings.ContainsAny(a, ":/?#[]@%\\ ") {
			return "", "invalid internationalised host name"
		}
		// The canonical form must be canonical itself: what is stored is
		// parsed again by every worker.
		if again, err := hostProfile.ToASCII(a); err != nil || again != a {
			return "", "invalid internationalised host name"
		}
		host = a // ASCII now; "²" became "2", "h。" "h.": read on as any name
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	switch {
	case host == "":
		return "", "missing host"
	case strings.HasSuffix(host, "."):
		return "", "invalid host name (empty label)"
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return a.String(), ""
	}
	if strings.Trim(host, "0123456789.") == "" {
		// "010.0.0.1", "1.2.3.256": no resolver agrees on what these name.
		return "", "invalid IPv4 address"
	}
	return host, ""
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// ID is a short, stable identifier of the proxy (16 hex digits), a hash that
// reveals no secret.
func (p *Proxy) ID() string { return p.id }

// URL returns a copy of the proxy URL, credentials included, for dialing.
// Log String instead.
func (p *Proxy) URL() *url.URL {
	if p == nil || p.url == nil {
		return nil
	}
	u := *p.url
	return &u
}

// String returns the URL with its user name and password each masked as
// "xxxxx" (http://xxxxx:xxxxx@gw.example:8000): what logs, errors,
// Request.ProxyURL and the CLI show. Entries that differ only in credentials
// print alike; ID tells them apart.
func (p *Proxy) String() string { return p.shown }

// masked is u with its user info masked, as String shows it.
func masked(u *url.URL) string {
	if u.User == nil {
		return u.String()
	}
	m := *u
	if _, ok := u.User.Password(); ok {
		m.User = url.UserPassword("xxxxx", "xxxxx")
	} else {
		m.User = url.User("xxxxx")
	}
	return m.String()
}

// raw is the canonical URL with credentials, as stored in Redis.
func (p *Proxy) raw() string { return p.url.String() }

// knownSchemes are the schemes an error may name: any other could be a
// user name read as a scheme.
var knownSchemes = map[string]bool{"http": true, "https": true, "socks4": true, "socks4a": true,
	"socks5": true, "socks5h": true, "ftp": true, "ws": true, "wss": true}

// redactRaw names a rejected proxy without echoing anything that could be
// user info: the scheme if known, "xxxxx@" for any user info, and host:port
// when it is surely one; else a placeholder. The path, query and fragment
// are dropped too (a password with '/', '?' or '#' lands there).
func redactRaw(raw string) string {
	return redact.Split(strings.TrimSpace(raw), func(s string) bool { return knownSchemes[s] }).String()
}

// ParseProxies validates every URL and returns the proxies in order, without
// duplicates. A gateway template, a URL whose user info holds {session:N},
// becomes N virtual proxies with random session ids
// (http://customer-acme-session-{session:50}:secret@gw.example:7000). Any
// invalid URL returns an error naming its position, and no proxies.
func ParseProxies(raws []string) ([]*Proxy, error) {
	return parseAll(raws, func(i int) string { return fmt.Sprintf("proxy #%d", i+1) })
}

// ReadProxies reads proxy URLs from r, one per line, skipping blank lines and
// '#' comments, validated as ParseProxies does.
func ReadProxies(r io.Reader) ([]*Proxy, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 64*1024)
	var raws []string
	var lines []int
	for line := 1; sc.Scan(); line++ {
		s := strings.TrimSpace(sc.Text())
		if s != "" && !strings.HasPrefix(s, "#") {
			raws = append(raws, s)
			lines = append(lines, line)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("proxyswitch: reading proxy list: %w", err)
	}
	return parseAll(raws, func(i int) string { return fmt.Sprintf("line %d", lines[i]) })
}

func parseAll(raws []string, where func(i int) string) ([]*Proxy, error) {
	out := make([]*Proxy, 0, len(raws))
	seen := make(map[string]bool, len(raws))
	for i, line := range raws {
		raw, labels, err := splitLabels(line)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where(i), err)
		}
		if isTemplate(raw) {
			t, n, err := parseGateway(raw)
			if err == nil && !seen["gw:"+t] {
				seen["gw:"+t] = true
				var ps []*Proxy
				ps, err = expandGateway(t, n)
				for _, p := range ps {
					p.labels = labels
				}
				out = append(out, ps...)
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %w", where(i), err)
			}
			continue
		}
		p, err := ParseProxy(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where(i), err)
		}
		if labels != "" {
			q := *p
			q.labels = labels
			p = &q
		}
		if !seen[p.id] {
			seen[p.id] = true
			out = append(out, p)
		}
	}
	return out, nil
}
