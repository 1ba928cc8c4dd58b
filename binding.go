package proxyswitch

import (
	"fmt"
	"net/http"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gocolly/colly/v2"
)

// Tying a lease to its request.
//
// Colly's ProxyFunc sees only the *http.Request that net/http hands the
// Transport: a shallow copy of Colly's request, so nothing written into it
// reaches Colly's callbacks, and Request.ProxyURL stays empty under Colly's
// defaults. What the copy shares with Colly's request is its header map: the
// map OnRequestHeaders sees through *r.Headers is the very map the ProxyFunc
// gets as req.Header. On a redirect hop net/http builds a new map and the
// ProxyFunc can reach the previous hop's map through req.Response.Request.
// OnResponse and OnError see the last hop's map, or the first one when the
// chain failed midway.
//
// So a binding is keyed by the identity of a header map (its address), and
// every hop of a redirect chain is an alias of the same binding. The binding
// keeps each map it is keyed by alive, so an address cannot be reused by a
// new map while the key is registered. The OnRequestHeaders hook gives every
// request a fresh map first, so two requests never share one even when the
// caller passes one header map to many requests (Collector.Request, Retry).
//
// This leans on how Colly v2 and net/http behave today; the tests in
// collyfacts_test.go and extension_test.go pin it.

// binding is the lease state of one request (one redirect chain).
type binding struct {
	mu       sync.Mutex
	hdrs     []http.Header    // every hop's map: keeps the keys' maps alive
	lease    *Lease           // current lease; nil before the first hop or after failure
	hooked   bool             // made by the hooks (released by them), not by the ProxyFunc alone
	touched  atomic.Int64     // unix ns of creation or of the last lease taken
	done     bool             // finished: released, must not take a new lease
	proxy    *Proxy           // the proxy of the latest lease (kept after release)
	calls    int              // ProxyFunc calls served: tells the transport a hop used a proxy
	retries  int              // retries through another proxy taken (transport.go)
	task     *taskState       // the request's task, for its sticky session (session.go); nil for none
	coll     *colly.Collector // the collector the hooks saw it on (its MaxBodySize); nil without hooks
	waitBy   time.Time        // the hop's wait for a proxy ends by then (leaseEarly); zero: MaxWait alone
	sessKey  sessionHoldKey   // the session the request goes through, renewed while it runs (sessionrenew.go)
	sessSlot heldSlot         // the slot of that session it goes through
	sessEnd  func()           // ends that renewal for this request; nil for none

	refusals []refusal     // the bans met, for the page-or-IP judgment (ban.go)
	failures []failure     // the proxy failures of the site's kind met (storm.go)
	blocked  *BlockedError // the latest ban or failure retried: named by a later ErrNoProxy
}

// sentAfter is when the request's current hop went at the earliest: the
// later of start (the attempt's start) and the last lease taken (after
// the wait for a proxy).
func (b *binding) sentAfter(start time.Time) time.Time {
	if t := b.touched.Load(); t > start.UnixNano() {
		return time.Unix(0, t)
	}
	return start
}

// addRefusal records a ban the request met, and the error it would have
// failed with had no retry been left.
func (b *binding) addRefusal(r refusal, blocked *BlockedError) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r.proxy != nil {
		b.refusals = append(b.refusals, r)
	}
	b.blocked = blocked
}

// addFailure records a proxy failure of the site's kind the request met.
func (b *binding) addFailure(f failure) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures = append(b.failures, f)
}

// takeFailures returns the failures met on url of site and forgets them.
func (b *binding) takeFailures(url, site string) []failure {
	b.mu.Lock()
	defer b.mu.Unlock()
	return takeMatching(&b.failures, func(f failure) bool { return f.url == url && f.site == site })
}

// takeMatching removes the entries of *list that match and returns them,
// in order.
func takeMatching[T any](list *[]T, match func(T) bool) (out []T) {
	kept := (*list)[:0]
	for _, v := range *list {
		if match(v) {
			out = append(out, v)
		} else {
			kept = append(kept, v)
		}
	}
	*list = kept
	return out
}

// failed reports whether the request met a failure it still remembers.
func (b *binding) failed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.failures) > 0
}

// setWaitBy sets when the hop's wait for a proxy ends (zero: MaxWait alone).
func (b *binding) setWaitBy(t time.Time) {
	b.mu.Lock()
	b.waitBy = t
	b.mu.Unlock()
}

// refused reports whether the request met a ban it still remembers.
func (b *binding) refused() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.refusals) > 0
}

// refusalsOf returns the refusals met on url of site.
func (b *binding) refusalsOf(url, site string) []refusal {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []refusal
	for _, r := range b.refusals {
		if r.url == url && r.site == site {
			out = append(out, r)
		}
	}
	return out
}

// takeRefusals returns the refusals met on url of site and forgets them.
func (b *binding) takeRefusals(url, site string) []refusal {
	b.mu.Lock()
	defer b.mu.Unlock()
	return takeMatching(&b.refusals, func(r refusal) bool { return r.url == url && r.site == site })
}

// noProxy is err, a failure to lease a proxy for the request's next
// attempt, naming what the site answered the attempt before, if any: the
// error then matches ErrNoProxy and that answer's sentinel (ErrBanned...).
func (b *binding) noProxy(err error) error {
	if b == nil {
		return err
	}
	b.mu.Lock()
	last := b.blocked
	b.mu.Unlock()
	if last == nil {
		return err
	}
	return fmt.Errorf("%w; the attempt before: %w", err, last)
}

// proxyCalls returns how many ProxyFunc calls b served (0 for a nil b).
func (b *binding) proxyCalls() int {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.calls
}

// currentLease returns the lease the request holds now.
func (b *binding) currentLease() *Lease {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lease
}

// lastProxy returns the proxy of the request's latest lease (nil before
// the first one).
func (b *binding) lastProxy() *Proxy {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.proxy
}

// dropLease forgets l (ended by a ban or a failure): the next ProxyFunc call
// for the request leases anew.
func (b *binding) dropLease(l *Lease) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.lease == l {
		b.lease = nil
	}
}

// attempt returns the number of the current attempt (1 for the first proxy).
func (b *binding) attempt() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.retries + 1
}

// retryLeft reports whether takeRetry(limit) would grant a retry now.
func (b *binding) retryLeft(limit int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.retries < limit
}

// takeRetry takes one retry if fewer than limit were taken.
func (b *binding) takeRetry(limit int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.retries >= limit {
		return false
	}
	b.retries++
	return true
}

// collector returns the collector b's request came from (nil if unknown).
// It is set before the request is sent and never changes.
func (b *binding) collector() *colly.Collector {
	if b == nil {
		return nil
	}
	return b.coll
}

func newBinding(hooked bool) *binding {
	b := &binding{hooked: hooked}
	b.touched.Store(time.Now().UnixNano())
	return b
}

// registry maps header-map identities to bindings. Safe for concurrent use.
type registry struct {
	mu        sync.Mutex
	m         map[uintptr]*binding
	lastSweep time.Time
}

func headerKey(h http.Header) uintptr {
	if h == nil {
		return 0
	}
	return reflect.ValueOf(h).Pointer()
}

func (r *registry) lookup(h http.Header) *binding {
	k := headerKey(h)
	if k == 0 {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m[k]
}

// add keys b by h unless h is already taken; it reports whether it did.
func (r *registry) add(h http.Header, b *binding) bool {
	k := headerKey(h)
	if k == 0 {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = make(map[uintptr]*binding)
	}
	if _, taken := r.m[k]; taken {
		return false
	}
	b.hdrs = append(b.hdrs, h)
	r.m[k] = b
	return true
}

// take removes the binding keyed by h, with all its aliases, and returns it.
func (r *registry) take(h http.Header) *binding {
	k := headerKey(h)
	if k == 0 {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.m[k]
	if b != nil {
		r.dropLocked(b)
	}
	return b
}

// takeSessionHold returns, and forgets, the end of the renewal of the
// session b's request goes through (nil for none). b.mu is held.
func (b *binding) takeSessionHold() func() {
	f := b.sessEnd
	b.sessEnd, b.sessKey, b.sessSlot = nil, sessionHoldKey{}, heldSlot{}
	return f
}

// drop removes b and its aliases if they are still registered.
func (r *registry) drop(b *binding) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dropLocked(b)
}

func (r *registry) dropLocked(b *binding) {
	for _, h := range b.hdrs {
		if k := headerKey(h); r.m[k] == b {
			delete(r.m, k)
		}
	}
}

func (r *registry) size() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.m)
}

// sweep, at most once per interval, forgets bindings that no hook will ever
// finish (a Colly path that skips the callbacks, such as a charset error):
// those older than maxAge. It returns their leases for the caller to release.
func (r *registry) sweep(now time.Time, interval, maxAge time.Duration) []*Lease {
	r.mu.Lock()
	if now.Sub(r.lastSweep) < interval {
		r.mu.Unlock()
		return nil
	}
	r.lastSweep = now
	r.mu.Unlock()
	return r.forget(func(b *binding) bool { return now.Sub(time.Unix(0, b.touched.Load())) > maxAge })
}

// forget ends and drops the bindings for which stale (called with the
// registry locked) is true, and returns their leases for the caller to
// release: sweep, and Switch.Close for the bindings without hooks.
func (r *registry) forget(stale func(*binding) bool) []*Lease {
	r.mu.Lock()
	var gone []*binding
	for _, b := range r.m {
		if stale(b) {
			gone = append(gone, b)
		}
	}
	for _, b := range gone {
		r.dropLocked(b)
	}
	r.mu.Unlock()
	var leases []*Lease
	for _, b := range gone {
		b.mu.Lock()
		if b.lease != nil {
			leases = append(leases, b.lease)
			b.lease = nil
		}
		b.done = true
		held := b.takeSessionHold()
		b.mu.Unlock()
		if held != nil {
			held()
		}
	}
	return leases
}
