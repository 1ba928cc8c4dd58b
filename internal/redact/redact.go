// Package redact names rejected URLs without echoing anything that could be
// a credential. It trusts nothing in the input: a password may hold '/', '?',
// '#', '@' or ':', a user name may be a secret, and a line may not be a URL
// at all.
package redact

import (
	"net/url"
	"slices"
	"strings"
)

// Unparsable stands for the part of a URL that could not be identified.
const Unparsable = "<unparsable URL>"

// Parts is what Split could identify in a URL that may not parse.
type Parts struct {
	Scheme    string // lower-cased scheme if it is one known() accepts, else ""
	HasScheme bool   // raw holds "://"
	User      bool   // raw holds an '@': all before its last '@' may be user info
	HostPort  string // host[:port] after the user info, "" unless surely one
	Tail      string // what follows HostPort ('/', '?' or '#' first); "" if none
}

// Split splits raw as [scheme://][userinfo@]host[:port][tail] without
// trusting it: the scheme is what precedes the first "://" if it has the
// syntax of one, everything before the last '@' counts as user info (a
// password may hold '/', '?' or '#'), and HostPort is set only when what
// follows that '@' (or the scheme, with no '@') up to the first '/', '?' or
// '#' is a plain host name, IPv4 or bracketed IPv6 address with an optional
// numeric port, and the user info holds at most one ':' (else the line may
// be host:port:user:password with an '@' in the password). Without a
// scheme, HostPort is set only if nothing follows it.
func Split(raw string, known func(scheme string) bool) Parts {
	var p Parts
	rest := raw
	if i := strings.Index(raw, "://"); i > 0 && IsScheme(raw[:i]) {
		p.HasScheme = true
		if s := strings.ToLower(raw[:i]); known(s) {
			p.Scheme = s
		}
		rest = raw[i+3:]
	}
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		p.User = true
		if strings.Count(rest[:at], ":") > 1 {
			// host:port:user:password with an '@' in the password, or a
			// password with ':': what follows the '@' may be secret too.
			return p
		}
		rest = rest[at+1:]
	}
	hp, tail := rest, ""
	if j := strings.IndexAny(rest, "/?#"); j >= 0 {
		hp, tail = rest[:j], rest[j:]
	}
	if !p.HasScheme && tail != "" {
		// A line such as user:password:host:port with a '/', '?', '#' or
		// '@' in the password: what precedes the tail is no host.
		return p
	}
	if IsHostPort(hp) {
		p.HostPort, p.Tail = hp, tail
	}
	return p
}

// String is p with the user info as "xxxxx", without the tail:
// [scheme://][xxxxx@]host[:port], or Unparsable (after the scheme if known)
// when no host was identified.
func (p Parts) String() string {
	prefix := ""
	if p.Scheme != "" {
		prefix = p.Scheme + "://"
	}
	if p.HostPort == "" {
		return prefix + Unparsable
	}
	if p.User {
		prefix += "xxxxx@"
	}
	return prefix + p.HostPort
}

// IsHostPort reports whether s is host[:port] with host a name of ASCII
// letters, digits, '.', '-' and '_', or a bracketed IPv6 address, and port
// 1 to 5 digits.
func IsHostPort(s string) bool {
	host, port, hasPort := s, "", false
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return false
		}
		host, port = s[1:end], s[end+1:]
		if port != "" && port[0] != ':' {
			return false
		}
		if !only(host, "0123456789abcdefABCDEF:.") || !strings.Contains(host, ":") {
			return false
		}
		hasPort, port = port != "", strings.TrimPrefix(port, ":")
	} else {
		if i := strings.IndexByte(s, ':'); i >= 0 {
			host, port, hasPort = s[:i], s[i+1:], true
		}
		if !only(host, letters+"0123456789.-_") {
			return false
		}
	}
	if hasPort && (port == "" || len(port) > 5 || !only(port, "0123456789")) {
		return false
	}
	return host != ""
}

// IsScheme reports whether s has the syntax of a URL scheme (RFC 3986).
func IsScheme(s string) bool {
	return s != "" && only(s[:1], letters) && only(s, letters+"0123456789+-.")
}

const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

// only reports whether s is non-empty and made only of bytes in set.
func only(s, set string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if strings.IndexByte(set, s[i]) < 0 {
			return false
		}
	}
	return true
}

// Credentials returns msg with every spelling of u's credentials replaced:
// u written whole becomes shown (a name for the URL without them), then its
// user info, password and user name, escaped or raw, become "xxxxx". A user
// name counts as a secret too (a provider's token or account name often is
// one), however short: a message may come out mangled, never leaking. With
// no user info in u, msg is returned as it is.
func Credentials(msg string, u *url.URL, shown string) string {
	if u == nil || u.User == nil {
		return msg
	}
	msg = strings.ReplaceAll(msg, u.String(), shown)
	name := u.User.Username()
	pw, _ := u.User.Password()
	escName, escPw, _ := strings.Cut(u.User.String(), ":")
	secrets := []string{u.User.String(), escPw, pw, escName, name}
	// Longest first: a secret inside a longer one must not cut that one up.
	slices.SortStableFunc(secrets, func(a, b string) int { return len(b) - len(a) })
	for _, s := range secrets {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, "xxxxx")
		}
	}
	return msg
}
