package proxyswitch

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// Proxy is one validated proxy of a pool. It is immutable and safe for
// concurrent use.
//
// A proxy's identity is its whole canonical URL, credentials included:
// gateway providers hand out one host:port with a different username per exit
// IP, and those are different proxies. ID is derived from that identity (a
// hash, so it carries no secret) and names the proxy in Redis, logs and
// metrics.
type Proxy struct {
	id  string
	url *url.URL
}

// proxySchemes are the schemes net/http's Transport can dial through.
var proxySchemes = map[string]bool{"http": true, "https": true, "socks5": true, "socks5h": true}

// ParseProxy validates raw and returns the proxy it names. Accepted:
// http, https, socks5 and socks5h URLs with a host and a numeric port, optional
// user:password, no path, query or fragment. The error, a *ProxyError wrapping
// ErrInvalidProxy, names the problem without echoing the password.
func ParseProxy(raw string) (*Proxy, error) {
	bad := func(reason string) error {
		return &ProxyError{Proxy: redactRaw(raw), Reason: reason, Err: ErrInvalidProxy}
	}
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return nil, bad("empty URL")
	}
	if strings.ContainsAny(raw, " \t\r\n") {
		return nil, bad("URL contains white space")
	}
	i := strings.Index(raw, "://")
	if i <= 0 {
		return nil, bad(`missing scheme (want http://, https://, socks5:// or socks5h://)`)
	}
	if scheme := strings.ToLower(raw[:i]); !proxySchemes[scheme] {
		return nil, bad(fmt.Sprintf("unsupported scheme %q (want http, https, socks5 or socks5h)", redactRaw(raw[:i])))
	}
	u, err := url.Parse(raw)
	if err != nil {
		// url.Error quotes the whole input, password included: never wrap it.
		return nil, bad("malformed URL")
	}
	u.Scheme = strings.ToLower(u.Scheme)
	host, port := u.Hostname(), u.Port()
	switch {
	case host == "":
		return nil, bad("missing host")
	case port == "":
		return nil, bad("missing port")
	case u.Path != "" && u.Path != "/":
		return nil, bad("proxy URL must not have a path")
	case u.RawQuery != "" || u.ForceQuery:
		return nil, bad("proxy URL must not have a query")
	case u.Fragment != "":
		return nil, bad("proxy URL must not have a fragment")
	case u.Opaque != "":
		return nil, bad("malformed URL")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return nil, bad("port must be a number from 1 to 65535")
	}
	if u.User != nil && u.User.Username() == "" {
		return nil, bad("empty user name")
	}
	canon := &url.URL{Scheme: u.Scheme, User: u.User, Host: net.JoinHostPort(strings.ToLower(host), port)}
	sum := sha256.Sum256([]byte(canon.String()))
	return &Proxy{id: hex.EncodeToString(sum[:8]), url: canon}, nil
}

// ID is a short, stable identifier of the proxy (16 hex digits derived from
// its canonical URL, credentials included). It reveals no secret.
func (p *Proxy) ID() string { return p.id }

// URL returns a copy of the proxy URL, credentials included, for dialing.
// Do not log it; log String instead.
func (p *Proxy) URL() *url.URL {
	u := *p.url
	return &u
}

// String returns the URL with the password replaced by "xxxxx".
func (p *Proxy) String() string { return p.url.Redacted() }

// raw is the canonical URL with credentials, as stored in Redis.
func (p *Proxy) raw() string { return p.url.String() }

// redactRaw hides the password of a proxy URL that may not even parse:
// everything between the first ':' of the user info and its last '@' is
// replaced. Used for error messages about rejected input.
func redactRaw(raw string) string {
	rest, scheme := raw, ""
	if i := strings.Index(raw, "://"); i >= 0 {
		scheme, rest = raw[:i+3], raw[i+3:]
	}
	auth := rest
	if j := strings.IndexAny(auth, "/?#"); j >= 0 {
		auth = auth[:j]
	}
	at := strings.LastIndex(auth, "@")
	if at < 0 {
		if scheme == "" && strings.Contains(rest, "@") {
			// No scheme and an '@': treat everything before the last '@' as user info.
			at = strings.LastIndex(rest, "@")
			auth = rest
		} else {
			return raw
		}
	}
	userinfo := auth[:at]
	if k := strings.Index(userinfo, ":"); k >= 0 {
		userinfo = userinfo[:k] + ":xxxxx"
	}
	return scheme + userinfo + rest[at:]
}

// ParseProxies validates every URL and returns the proxies in order, with
// duplicates (same identity) dropped. On any invalid URL it returns an error
// naming its position (1-based) and reason, and no proxies: a pool is never
// half-loaded.
func ParseProxies(raws []string) ([]*Proxy, error) {
	return parseAll(raws, func(i int) string { return fmt.Sprintf("proxy #%d", i+1) })
}

// ReadProxies reads proxy URLs from r, one per line. Blank lines and lines
// starting with '#' are skipped. Every URL is validated as ParseProxies does;
// an error names the line number and never echoes a password.
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
	for i, raw := range raws {
		p, err := ParseProxy(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where(i), err)
		}
		if !seen[p.id] {
			seen[p.id] = true
			out = append(out, p)
		}
	}
	return out, nil
}
