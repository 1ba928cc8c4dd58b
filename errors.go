package proxyswitch

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/engine"
	"github.com/proxyswitch/proxyswitch/internal/redact"
	"github.com/proxyswitch/proxyswitch/shard"
)

// Sentinel errors. Callers branch on them with errors.Is; every error the
// package returns wraps one of them or a Redis/context error.
var (
	// ErrNoProxy means no proxy could be leased for a request (an empty
	// pool, every proxy busy for the whole wait, the context ended, Redis
	// failed). The request stops before any connection is made; the error
	// reaches Colly's OnError and the error Visit returns.
	ErrNoProxy = errors.New("proxyswitch: no proxy available")

	// ErrEmptyPool means the pool holds no proxies at all. It is always
	// returned together with ErrNoProxy.
	ErrEmptyPool = errors.New("proxyswitch: proxy pool is empty")

	// ErrInvalidProxy means a proxy URL was rejected by validation. The error
	// that wraps it is a *ProxyError naming the problem; it never carries the
	// password.
	ErrInvalidProxy = errors.New("proxyswitch: invalid proxy URL")

	// ErrLeaseLost means a lease can no longer be released or extended by its
	// holder: it expired and may already belong to someone else.
	ErrLeaseLost = errors.New("proxyswitch: lease lost (expired or taken over)")

	// ErrConfig means an option value or a setting shared through Redis is
	// invalid or disagrees with other workers of the pool (shard.ErrConfig).
	ErrConfig = shard.ErrConfig

	// ErrRedis marks a failed Redis round trip; the go-redis error is
	// wrapped too (shard.ErrRedis).
	ErrRedis = shard.ErrRedis

	// ErrCorrupt means a value read from Redis is not what this package
	// writes there; the message names the key (shard.ErrCorrupt).
	ErrCorrupt = shard.ErrCorrupt

	// ErrNotInPool means an operator action named a proxy the pool does not hold.
	ErrNotInPool = errors.New("proxyswitch: proxy not in the pool")

	// ErrInvalidTask means a task ID is empty, longer than 256 bytes, not
	// UTF-8 or holds control characters. A request with such a task fails
	// with it (and ErrNoProxy) before any proxy is leased.
	ErrInvalidTask = errors.New("proxyswitch: invalid task ID")

	// ErrBanned means a request was given up because the site banned the
	// proxies tried for it and no retry was left. The error is a
	// *BlockedError; the banned response never reaches OnResponse or
	// OnHTML.
	ErrBanned = errors.New("proxyswitch: banned by the site")

	// ErrPageRefused means the site refused the page itself, not the
	// proxies: the URL was refused through several proxies the site serves
	// otherwise (Bans.PageProxies). The error is a *BlockedError naming the
	// site's answer; it does not match ErrBanned.
	ErrPageRefused = errors.New("proxyswitch: the site refused the page")

	// ErrProxyFailed means a request was given up because the proxies tried
	// for it failed and no retry was left. The error is a *BlockedError.
	ErrProxyFailed = errors.New("proxyswitch: proxy failed")

	// ErrNotMember means a server asked for its share of a member list it is
	// not in (shard.ErrNotMember).
	ErrNotMember = shard.ErrNotMember

	// ErrMemberTaken means another live process holds the same member ID:
	// give each process its own (shard.ErrMemberTaken).
	ErrMemberTaken = shard.ErrMemberTaken
)

// BlockedError is the error of a request given up after bans or proxy
// failures. It wraps ErrPageRefused, ErrBanned or ErrProxyFailed and the
// last attempt's transport error, if any. No field or message carries a
// password.
type BlockedError struct {
	Site     string      // the site, as the site function names it
	Proxy    string      // the last proxy tried, redacted
	Verdict  ban.Verdict // what the last attempt showed
	Attempts int         // proxies tried for the request
	Status   int         // the HTTP status of the site's last answer; 0 when there was none
	Page     bool        // the site refused the page itself (ErrPageRefused), not the proxies
	Err      error       // the last attempt's transport error, if any
}

func (e *BlockedError) Error() string {
	what := "banned by"
	switch {
	case e.Page:
		what = "page refused by"
	case e.Verdict.Kind == ban.ProxyFailure:
		what = "proxy failed on"
	}
	answer := e.Verdict.Reason
	if e.Status != 0 {
		answer = fmt.Sprintf("%d %s, %s", e.Status, http.StatusText(e.Status), e.Verdict.Reason)
	}
	msg := fmt.Sprintf("proxyswitch: %s %s (%s) via %q after %d attempt(s)", what, e.Site, answer, e.Proxy, e.Attempts)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns the sentinel (ErrPageRefused, ErrBanned or
// ErrProxyFailed) and the transport error, so errors.Is matches either.
func (e *BlockedError) Unwrap() []error {
	sentinel := ErrBanned
	switch {
	case e.Page:
		sentinel = ErrPageRefused
	case e.Verdict.Kind == ban.ProxyFailure:
		sentinel = ErrProxyFailed
	}
	if e.Err == nil {
		return []error{sentinel}
	}
	return []error{sentinel, e.Err}
}

// ProxyError describes a problem with one proxy. Proxy is the redacted form
// of the URL (user name and password masked as "xxxxx"), safe to log.
type ProxyError struct {
	Proxy  string // redacted proxy URL; never holds the password
	Reason string // what is wrong, in words
	Err    error  // the sentinel or cause; Unwrap returns it
}

func (e *ProxyError) Error() string {
	if e.Proxy == "" {
		return fmt.Sprintf("proxyswitch: proxy: %s", e.Reason)
	}
	return fmt.Sprintf("proxyswitch: proxy %q: %s", e.Proxy, e.Reason)
}

func (e *ProxyError) Unwrap() error { return e.Err }

// configErr is an ErrConfig error whose message says what is wrong.
func configErr(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrConfig}, a...)...)
}

// redisErr wraps a failed Redis call so that errors.Is(err, ErrRedis) and
// errors.Is(err, <the go-redis or context error>) both hold; a script's
// reply that a stored value is corrupt becomes ErrCorrupt instead, naming
// the key in a bounded message (engine.Corrupt).
func redisErr(op string, err error) error {
	if detail, ok := engine.Corrupt(err); ok {
		return fmt.Errorf("%w: %s: %s", ErrCorrupt, op, detail)
	}
	return fmt.Errorf("%w: %s: %w", ErrRedis, op, err)
}

// maxQuoted bounds what an error quotes of a value read from Redis.
const maxQuoted = 96

// clip is s as an error may quote it: at most maxQuoted bytes, then its
// length, so a huge stored value is never copied into an error whole.
func clip(s string) string {
	if len(s) <= maxQuoted {
		return s
	}
	return fmt.Sprintf("%s...(%d bytes)", strings.ToValidUTF8(s[:maxQuoted], ""), len(s))
}

// redactedError hides a proxy's credentials in an error's message: a
// dialer (SOCKS, a custom one), a custom RoundTripper or a Client.New
// function may quote the proxy's URL or user name.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

func redactErr(err error, p *Proxy) error {
	if err == nil || p == nil || p.url == nil || p.url.User == nil {
		return err
	}
	msg := redact.Credentials(err.Error(), p.url, p.String())
	if msg == err.Error() {
		return err
	}
	return &redactedError{msg: msg, err: err}
}
