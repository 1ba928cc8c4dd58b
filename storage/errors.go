package storage

import (
	"errors"
	"fmt"
	"strings"

	"github.com/proxyswitch/proxyswitch/internal/engine"
)

// Sentinel errors. Callers branch on them with errors.Is; every error the
// package returns wraps one of them, a Redis error or a context error.
var (
	// ErrAlreadyVisited is returned by Visited when another request (of
	// this collector or another, in this process or any other sharing the
	// namespace) claimed the same request ID between the collector's
	// IsVisited check and its Visited call. Colly passes it on: Visit
	// returns it, and on a redirect it reaches OnError. It is the
	// cross-process counterpart of Colly's *AlreadyVisitedError, which this
	// package cannot build because Colly hands the storage only the
	// request's hash, not its URL.
	ErrAlreadyVisited = errors.New("proxyswitch: url already visited: another request claimed it first")

	// ErrQueueEmpty is returned by GetRequest when no request is ready for
	// delivery. Requests may still be in flight elsewhere (see QueueSize).
	ErrQueueEmpty = errors.New("proxyswitch: no queued request is ready")

	// ErrInvalidRequest means a serialized request was rejected: not
	// Colly's JSON (one that colly.Collector.UnmarshalRequest cannot decode:
	// Headers that are no object of arrays of strings, a Depth or ID that is
	// no integer of Colly's type, a Ctx that is no object), a URL that is
	// not absolute http or https, or larger than the size limit. AddRequest refuses it; GetRequest moves it to the
	// dead-letter list.
	ErrInvalidRequest = errors.New("proxyswitch: invalid queued request")

	// ErrQueueFull means AddRequest or AddURLs would take the queue past
	// WithMaxQueued requests (ready or in flight): nothing of that call (or
	// batch) was queued. Retry once workers have drained some.
	ErrQueueFull = errors.New("proxyswitch: the request queue is full")

	// ErrNotQueued means Ack or Nack was given a request that was not
	// delivered by a Storage queue (its context carries no delivery token).
	ErrNotQueued = errors.New("proxyswitch: request was not delivered by the queue")

	// ErrNotAttached is returned by QueueSize when this Storage has handed
	// out requests that are not yet settled and Attach was never called:
	// nothing would acknowledge them, so QueueSize would count them for
	// ever and Colly's queue.Run would never return (after the visibility
	// timeout the same URLs would be fetched again). queue.Run returns it at
	// once. Call Attach on the collector that runs the queue; code that
	// consumes the queue itself (GetRequest, then Ack or Nack) reads Stats,
	// not QueueSize.
	ErrNotAttached = errors.New("proxyswitch: the queue delivered requests but no collector is attached (call Storage.Attach on the collector that runs it)")

	// ErrNotFound means Requeue was given an ID that is not in the
	// dead-letter list.
	ErrNotFound = errors.New("proxyswitch: no such dead letter")

	// ErrConfig means an option value is invalid, or disagrees with the
	// value other collectors of the namespace stored in Redis.
	ErrConfig = errors.New("proxyswitch: invalid storage configuration")

	// ErrRedis marks a failed Redis round trip (connection refused, no reply
	// within the timeout, a script error). The go-redis error is wrapped too.
	ErrRedis = errors.New("proxyswitch: redis error")

	// ErrCorrupt means a value read from Redis is not what this package
	// writes there (a foreign or damaged key, a key of another type) or is
	// larger than its limit. The message names the key and quotes at most
	// the first bytes of the value.
	ErrCorrupt = errors.New("proxyswitch: corrupt value in redis")
)

// redisErr wraps a failed Redis call so that errors.Is(err, ErrRedis) and
// errors.Is(err, <the go-redis or context error>) both hold; a script's
// PSCORRUPT reply becomes ErrCorrupt instead. go-redis errors name the
// server address and the command, never the password.
func redisErr(op string, err error) error {
	if detail, ok := engine.Corrupt(err); ok {
		return fmt.Errorf("%w: %s: %s", ErrCorrupt, op, detail)
	}
	return fmt.Errorf("%w: %s: %w", ErrRedis, op, err)
}

// withKey names key in err when err is an ErrCorrupt of a command outside a
// script, which Redis does not name (a WRONGTYPE reply).
func withKey(err error, key string) error {
	if err == nil || !errors.Is(err, ErrCorrupt) || strings.Contains(err.Error(), key) {
		return err
	}
	return fmt.Errorf("%w (key %s)", err, key)
}

// clip is a stored value as an error may quote it: at most 64 bytes, then
// its length.
func clip(s string) string {
	if len(s) <= 64 {
		return s
	}
	return fmt.Sprintf("%s...(%d bytes)", strings.ToValidUTF8(s[:64], ""), len(s))
}

// invalid builds an ErrInvalidRequest with a reason.
func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidRequest}, a...)...)
}
