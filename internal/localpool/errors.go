package localpool

import "errors"

// Sentinel errors: every error of a Pool or a Lease is an *Error of one of
// these kinds, which the root maps to its own (ErrNoProxy, ErrEmptyPool,
// ErrLeaseLost in a *ProxyError, ErrConfig).
var (
	// ErrNoProxy means no proxy could be leased: an empty site, an empty
	// share, or every proxy busy for the whole wait.
	ErrNoProxy = errors.New("localpool: no proxy available")
	// ErrEmptyPool means the share holds no proxies; an error of this kind
	// is ErrNoProxy too.
	ErrEmptyPool = errors.New("localpool: the share is empty")
	// ErrLeaseLost means a lease can no longer be released or extended by
	// its holder: it ran out (and may be someone else's now) or was released.
	ErrLeaseLost = errors.New("localpool: lease lost")
	// ErrNoMatch means no proxy of the share passes the filter of
	// TryLeaseWhere (busy or not); an error of this kind is ErrNoProxy too.
	ErrNoMatch = errors.New("localpool: no proxy of the share matches")
	// ErrInvalid means a bad argument: an empty ID or site, a duration <= 0,
	// a nil proxy.
	ErrInvalid = errors.New("localpool: invalid argument")
)

// Error is an error of a Pool or a Lease.
type Error struct {
	Kind  error  // ErrNoProxy, ErrEmptyPool, ErrNoMatch, ErrLeaseLost or ErrInvalid
	Proxy string // with ErrLeaseLost, the String of the lease's proxy; else ""
	Msg   string // what happened
}

// Error returns the kind (both kinds for ErrEmptyPool and ErrNoMatch) and
// the message.
func (e *Error) Error() string {
	if e.Kind == ErrEmptyPool || e.Kind == ErrNoMatch {
		return ErrNoProxy.Error() + ": " + e.Kind.Error() + ": " + e.Msg
	}
	return e.Kind.Error() + ": " + e.Msg
}

// Unwrap returns the kind; ErrEmptyPool and ErrNoMatch come with ErrNoProxy.
func (e *Error) Unwrap() []error {
	if e.Kind == ErrEmptyPool || e.Kind == ErrNoMatch {
		return []error{ErrNoProxy, e.Kind}
	}
	return []error{e.Kind}
}

func fail(kind error, msg string) error { return &Error{Kind: kind, Msg: msg} }
