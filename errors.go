package proxyswitch

import (
	"errors"
	"fmt"
)

// Sentinel errors. Callers branch on them with errors.Is; every error the
// package returns wraps one of them or a Redis/context error.
var (
	// ErrNoProxy means no proxy could be leased for a request: the pool is
	// empty, every proxy stayed busy for the whole wait, the request's context
	// ended while waiting, or Redis failed. A ProxyFunc that returns it stops
	// the request before any connection is made, so the request never leaves
	// without a proxy. It reaches Colly's OnError and the error Visit returns.
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
	// invalid or disagrees with the one other workers of the pool use.
	ErrConfig = errors.New("proxyswitch: invalid configuration")

	// ErrRedis marks a failed Redis round trip (connection refused, timeout,
	// a script error). The underlying go-redis error is wrapped too.
	ErrRedis = errors.New("proxyswitch: redis error")

	// ErrCorrupt means a value read from Redis is not what this package
	// writes there (a foreign or damaged key).
	ErrCorrupt = errors.New("proxyswitch: corrupt value in redis")
)

// ProxyError describes a problem with one proxy. Proxy is the redacted form
// of the URL (the password replaced by "xxxxx"), safe to log.
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

// redisErr wraps a failed Redis call so that errors.Is(err, ErrRedis) and
// errors.Is(err, <the go-redis or context error>) both hold.
func redisErr(op string, err error) error {
	return fmt.Errorf("%w: %s: %w", ErrRedis, op, err)
}
