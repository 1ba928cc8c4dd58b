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
	// ErrNoProxy: no proxy could be leased (empty pool, all busy past the
	// wait, context ended, Redis failed); the request was never sent.
	ErrNoProxy = errors.New("proxyswitch: no proxy available")

	// ErrEmptyPool: the pool holds no proxies (always with ErrNoProxy).
	ErrEmptyPool = errors.New("proxyswitch: proxy pool is empty")

	// ErrInvalidProxy: a proxy URL was rejected, by a *ProxyError that
	// never carries the password.
	ErrInvalidProxy = errors.New("proxyswitch: invalid proxy URL")

	// ErrLeaseLost: the lease expired and may belong to someone else.
	ErrLeaseLost = errors.New("proxyswitch: lease lost (expired or taken over)")

	// ErrConfig: an invalid option, or one other workers of the pool
	// disagree with.
	ErrConfig = shard.ErrConfig

	// ErrRedis: a Redis round trip failed (its error is wrapped too).
	ErrRedis = shard.ErrRedis

	// ErrCorrupt: a value in Redis is not what this package writes there.
	ErrCorrupt = shard.ErrCorrupt

	// ErrNotInPool: an operator action named a proxy not in the pool.
	ErrNotInPool = errors.New("proxyswitch: proxy not in the pool")

	// ErrInvalidTask: a task ID is empty, over 256 bytes, not UTF-8 or has
	// characters that are not printable (unicode.IsPrint), or TaskKey holds
	// something other than a string; its request fails before any lease.
	ErrInvalidTask = errors.New("proxyswitch: invalid task ID")

	// ErrBanned: the site banned every proxy tried (a *BlockedError).
	ErrBanned = errors.New("proxyswitch: banned by the site")

	// ErrPageRefused: the site refused the page itself, not the proxies
	// (a *BlockedError; Bans.PageProxies).
	ErrPageRefused = errors.New("proxyswitch: the site refused the page")

	// ErrProxyFailed: every proxy tried failed (a *BlockedError).
	ErrProxyFailed = errors.New("proxyswitch: proxy failed")

	// ErrNotMember: this server is not in the member list.
	ErrNotMember = shard.ErrNotMember

	// ErrMemberTaken: another live process holds this member ID.
	ErrMemberTaken = shard.ErrMemberTaken
)

// BlockedError is the error of a request given up after bans or proxy
// failures. It wraps ErrPageRefused, ErrBanned or ErrProxyFailed (with
// ErrSiteStorm in a storm of the site) and the last attempt's transport
// error, if any. No field or message carries a
// password.
type BlockedError struct {
	Site     string      // the site, as the site function names it
	Proxy    string      // the last proxy tried, redacted
	Verdict  ban.Verdict // what the last attempt showed
	Attempts int         // proxies tried for the request
	Status   int         // the HTTP status of the site's last answer; 0 when there was none
	Page     bool        // the site refused the page itself (ErrPageRefused), not the proxies
	// Storm: the request met a storm of its site (ErrSiteStorm, storm.go):
	// many pages refused or failed through every proxy at once, or the
	// site's circuit breaker open. Never with Page.
	Storm bool
	// NotResent: the last attempt failed after its request may have
	// reached the site, and the request is not one net/http would replay
	// (a POST, say, without an Idempotency-Key header), so it was not sent
	// again through another proxy, retries left or not: the site may have
	// acted on it (Bans.Retries).
	NotResent bool
	Err       error // the last attempt's transport error, if any
}

func (e *BlockedError) Error() string {
	what := "banned by"
	switch {
	case e.Page && !e.Storm:
		what = "page refused by"
	case e.Verdict.Kind == ban.ProxyFailure:
		what = "proxy failed on"
	}
	answer := e.Verdict.Reason
	if e.Status != 0 {
		answer = fmt.Sprintf("%d %s, %s", e.Status, http.StatusText(e.Status), e.Verdict.Reason)
	}
	msg := fmt.Sprintf("proxyswitch: %s %s (%s) via %q after %d attempt(s)%s", what, e.Site, answer, e.Proxy, e.Attempts, stormText(e))
	if e.NotResent {
		msg += ", not sent again: the request may have reached the site"
	}
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
	case e.Page && !e.Storm:
		sentinel = ErrPageRefused
	case e.Verdict.Kind == ban.ProxyFailure:
		sentinel = ErrProxyFailed
	}
	out := []error{sentinel}
	if e.Storm {
		out = append(out, ErrSiteStorm)
	}
	if e.Err != nil {
		out = append(out, e.Err)
	}
	return out
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

// bothErr is two errors on one line ("a: b"), wrapping both: errors.Join
// would put a newline between them, which splits a log line.
type bothErr struct{ a, b error }

// withCause returns err and cause on one line, wrapping both (err alone
// when cause is nil).
func withCause(err, cause error) error {
	if cause == nil {
		return err
	}
	return &bothErr{err, cause}
}

func (e *bothErr) Error() string   { return e.a.Error() + ": " + e.b.Error() }
func (e *bothErr) Unwrap() []error { return []error{e.a, e.b} }
