package proxyswitch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/proxyswitch/proxyswitch/internal/bounded"
)

// Renewal and Close.
//
// Every lease the Switch grants (through ProxyFunc or Lease) is in its
// renewer's set until it ends (released, or ended by a quarantine), so
// that Close can release what is left. The leases of running requests (the
// ProxyFunc's) are also renewed: one goroutine per Switch, started by the
// first lease it tracks and gone once the set is empty (or on Close),
// extends them all every quarter of the lease TTL, owner-checked, with one
// script call (extend_many.lua) per pool and batch of at most
// renewBatch leases, whatever sites they are for. A request therefore
// keeps its proxy however long it runs, while a process that dies stops
// renewing: its proxies are free again within one lease TTL.
//
// Not renewed:
//   - leases from Switch.Lease: their holder owns their life (Lease.Extend,
//     Release), and their TTL is what the Lease documents;
//   - a lease of the ProxyFunc without the hooks whose request context can
//     never end (no deadline, no cancellation): nothing would ever release
//     it, so its TTL bounds it;
//   - sticky sessions' leases: they are not leases of one request but of
//     the session, which holds its proxy until Sessions.TTL (10 minutes)
//     after its last request, renewed by each request's use, and, while
//     one of its requests runs, every quarter of the session or lease
//     TTL, whichever is shorter, by a timer of its own (sessionrenew.go): a
//     request longer than the session TTL keeps its proxy too, and so does
//     one whose session a sibling request retired meanwhile.
//
// Leases from the fallback's local shard are renewed too, in memory (and
// their record in Redis once the fallback handed them over).
//
// One bound remains: a request whose hooks never run (a Colly path that
// skips its callbacks) would keep its lease renewed for ever, so the sweep
// (proxyswitch.go) still ends any binding older than the max wait plus ten
// lease TTLs plus a minute (6.5 minutes by default), releasing its lease: a
// request running longer than that loses its proxy's exclusivity.
//
// A lease the renewer finds lost (its record in Redis no longer carries its
// token: the pool was cleared, or Redis lost it, or it expired while Redis
// was unreachable and someone else took it) is logged as a warning; its
// request, if it came through the transport Attach installs, fails with an
// error wrapping ErrLeaseLost once its response is in (it is not cut short:
// that would cost every request a context of its own), instead of reaching
// the collector as if its proxy had been exclusive throughout. No Observer
// event fits, so none is sent.

// renewBatch bounds the leases one extend_many.lua call renews.
const renewBatch = 512

// errClosed is what every lease attempt after Close fails with.
var errClosed = fmt.Errorf("%w: the switch is closed", ErrNoProxy)

// renewer is a Switch's set of live leases and the goroutine that renews
// those of running requests. Safe for concurrent use.
type renewer struct {
	s *Switch

	mu      sync.Mutex
	live    map[*Lease]struct{}
	running bool          // the goroutine runs
	done    chan struct{} // closed when the running goroutine exits
	stop    chan struct{} // closed by Close
	closed  bool
	bg      sync.WaitGroup // other background work of the Switch (a read of the pool's copy: snapshot.go), waited for by Close
}

// every is the renewer's tick: a quarter of the lease TTL, so that a
// renewal may come late (a loaded machine, a slow Redis) by up to three
// quarters of the TTL and still find the lease live.
func (r *renewer) every() time.Duration { return r.s.cfg.leaseTTL / 4 }

// isClosed reports whether Close was called.
func (r *renewer) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// track adds l to the set, renewed if renew, and starts the goroutine if
// it does not run. It fails with errClosed after Close (the caller then
// releases l).
func (r *renewer) track(l *Lease, renew bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errClosed
	}
	l.renew = renew
	if r.live == nil {
		r.live = make(map[*Lease]struct{})
		r.stop = make(chan struct{})
	}
	r.live[l] = struct{}{}
	if !r.running {
		r.running, r.done = true, make(chan struct{})
		go r.run(r.done)
	}
	return nil
}

// drop removes l from the set (a no-op for a lease not in it).
func (r *renewer) drop(l *Lease) {
	if l == nil {
		return
	}
	r.mu.Lock()
	delete(r.live, l)
	r.mu.Unlock()
}

// run is the renewer goroutine: it renews the set every tick, until the set
// is empty at a tick or Close.
func (r *renewer) run(done chan struct{}) {
	defer close(done)
	t := time.NewTicker(r.every())
	defer t.Stop()
	// Close ends a renewal in flight: it does not wait out a stalled Redis
	// before it releases.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-r.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		due, ok := r.due()
		if !ok {
			return
		}
		r.renew(ctx, due)
	}
}

// due returns the leases to renew now, and forgets leases that are over:
// ended ones (their ender drops them; due, a tick later, those it did not),
// and unrenewed ones past their expiry (by more than a TTL, for the clocks
// of Redis and of this host may differ). ok is false when the
// set is empty: the goroutine then ends (the next track starts another).
func (r *renewer) due() (due []*Lease, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, false
	}
	over := time.Now().Add(-r.s.cfg.leaseTTL).UnixMilli()
	for l := range r.live {
		switch {
		case l.released.Load():
			// Ending on another goroutine, which drops it; one that is
			// still here a tick later was ended by a path that does not.
			if l.endSeen {
				delete(r.live, l)
			}
			l.endSeen = true
		case !l.renew && l.expiry.Load() < over:
			delete(r.live, l)
		case l.renew && !l.taken.Load():
			due = append(due, l)
		}
	}
	if len(r.live) == 0 {
		r.running = false
		return nil, false
	}
	return due, true
}

// renew extends due: the leases from Redis with one script call per pool
// (and batch), those from a local shard one by one in memory.
func (r *renewer) renew(ctx context.Context, due []*Lease) {
	ttl := r.s.cfg.leaseTTL
	byPool := map[*redisPool][]*Lease{}
	for _, l := range due {
		if l.local != nil {
			if err := l.be.extend(ctx, l, ttl); errors.Is(err, ErrLeaseLost) {
				r.lost(l)
			}
			continue
		}
		rp := l.be.redis()
		byPool[rp] = append(byPool[rp], l)
	}
	for rp, ls := range byPool {
		for len(ls) > 0 && ctx.Err() == nil { // Close ended it: no more calls
			n := min(len(ls), renewBatch)
			exp, err := rp.extendMany(ctx, ls[:n], ttl)
			if err != nil {
				// Redis unreachable or slow: the next tick tries again,
				// within the TTL's three quarters of slack.
				r.s.cfg.logger.Debug("proxyswitch: renewing leases failed", "pool", rp.name, "leases", n, "err", err)
			}
			for i, l := range ls[:n] {
				switch {
				case err != nil:
				case exp[i] > 0:
					l.expiry.Store(exp[i])
				default:
					r.lost(l)
				}
			}
			ls = ls[n:]
		}
	}
}

// lost reports a lease the renewer found taken over, once.
func (r *renewer) lost(l *Lease) {
	if l.released.Load() || !l.taken.CompareAndSwap(false, true) {
		return // ended meanwhile: not a loss
	}
	r.s.cfg.logger.Warn("proxyswitch: a running request lost its lease (Redis lost it, the pool was cleared, "+
		"or it expired while Redis was unreachable); the request fails with ErrLeaseLost",
		"proxy", l.proxy.String(), "site", l.scope)
}

// extendMany runs extend_many.lua for ls (leases of this pool): the new
// expiry of each, 0 for one no longer its holder's.
func (p *redisPool) extendMany(ctx context.Context, ls []*Lease, ttl time.Duration) ([]int64, error) {
	var keys []string
	scopes := map[string]int{}
	argv := make([]any, 1, 1+3*len(ls))
	argv[0] = ttl.Milliseconds()
	for _, l := range ls {
		i, ok := scopes[l.scope]
		if !ok {
			keys = append(keys, p.keys.free(l.scope), p.keys.leases(l.scope))
			i = len(keys) / 2
			scopes[l.scope] = i
		}
		argv = append(argv, i, l.member, l.token)
	}
	res, err := bounded.Call(ctx, p.timeout, p.inline, func(ctx context.Context) ([]int64, error) {
		return extendManyScript.Run(ctx, p.rdb, keys, argv...).Int64Slice()
	}, nil)
	if err != nil {
		return nil, redisErr("renew", err)
	}
	if len(res) != len(ls) {
		return nil, fmt.Errorf("%w: renewal reply of %d items for %d leases", ErrCorrupt, len(res), len(ls))
	}
	return res, nil
}

// Close releases every lease the Switch holds (requests still running fail
// with ErrLeaseLost) and calls Stop; then ProxyFunc and Lease fail with
// ErrNoProxy. Call it after Collector.Wait, before exiting, or leases stay
// in Redis until their TTL. The releases go all at once, in batched script
// calls: with Redis unreachable or hung they end within about one Redis
// timeout (Timeouts.Redis), whatever the number of leases. It waits at most
// until ctx ends, and its error, if leases could not be released, is one
// line counting them and naming why, wrapping the cause (ErrRedis, ctx's
// error). It is safe for concurrent use.
//
// Sticky sessions are not the Switch's leases: Close does not end them. A
// session stays live, its proxy held on every site it visited, until it
// lapses (Sessions.TTL after its last request, 10 minutes by default;
// Close stops renewing those with requests still under way), for this
// process and every other. End each with EndSession before Close to free
// their proxies at once.
func (s *Switch) Close(ctx context.Context) error {
	r := &s.renew
	r.mu.Lock()
	r.closed = true
	if r.stop != nil {
		select {
		case <-r.stop:
		default:
			close(r.stop)
		}
	}
	running, done := r.running, r.done
	r.running = false
	r.mu.Unlock()
	if running {
		select {
		case <-done:
		case <-ctx.Done():
		}
	}
	// The bindings of requests without the hooks end (their leases are in
	// the set, released below); those of the hooks' requests end with their
	// request.
	s.reg.forget(func(b *binding) bool { return !b.hooked })
	s.clients.close() // the idle connections of every proxy (client.go)
	if fw := s.forward.Load(); fw != nil {
		fw.CloseIdleConnections()
	}
	err := r.releaseAll(ctx)
	err = errors.Join(err, s.doubts.close(ctx)) // the leases lease calls of unknown outcome may have made (reclaim.go)
	err = errors.Join(err, s.Stop(ctx))
	r.waitBackground(ctx)
	s.brk.close(ctx) // its background report (breaker.go)
	return err
}

// background registers one piece of background work of the Switch, which
// Close waits for; false once the Switch is closed (start none then).
func (r *renewer) background() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.bg.Add(1)
	return true
}

// backgroundDone ends a piece of work background registered.
func (r *renewer) backgroundDone() { r.bg.Done() }

// waitBackground waits for the background work, or until ctx ends.
func (r *renewer) waitBackground(ctx context.Context) {
	done := make(chan struct{})
	go func() { r.bg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// closePoll is how often Close looks again at releases in flight.
const closePoll = 5 * time.Millisecond

// releaseAll releases every lease in the set and waits until the set is
// empty (releases in flight on other goroutines end it) or ctx ends. The
// leases go back all at once, in batched pool calls (releaseMany), not one
// after another: with Redis stalled the leases it holds are given up
// within one Redis timeout (or when ctx ends), whatever their number;
// releases already queued by requests ending meanwhile are waited for
// until ctx ends. Its error, if any lease could not be released, counts
// them (closeError).
func (r *renewer) releaseAll(ctx context.Context) error {
	ce := &closeError{ttl: r.s.cfg.leaseTTL}
	seen := map[*Lease]struct{}{}
	for {
		r.mu.Lock()
		left := make([]*Lease, 0, len(r.live))
		for l := range r.live {
			left = append(left, l)
		}
		r.mu.Unlock()
		if len(left) == 0 {
			return ce.err()
		}
		var mine []*Lease
		for _, l := range left {
			if _, ok := seen[l]; !ok {
				seen[l] = struct{}{}
				ce.total++
			}
			if l.released.Load() {
				continue // ending on another goroutine: it drops it
			}
			if l.renew {
				l.taken.Store(true) // its request, if still running, is no longer exclusive
			}
			if l.released.CompareAndSwap(false, true) {
				mine = append(mine, l)
			}
		}
		for i, err := range r.s.releaseMany(ctx, mine) {
			l := mine[i]
			if errors.Is(err, ErrRedis) {
				l.released.Store(false) // as Release: it may be released again
			}
			r.drop(l)
			if err != nil && !errors.Is(err, ErrLeaseLost) {
				ce.add(1, err)
			}
		}
		r.mu.Lock()
		n := len(r.live)
		r.mu.Unlock()
		if n == 0 {
			continue
		}
		if !pause(ctx, 2*closePoll) {
			ce.add(n, fmt.Errorf("still being released: %w", ctx.Err()))
			return ce.err()
		}
	}
}

// releaseMany releases ls as Lease.Release would each (and returns each
// one's error), but all at once: per backend in its batched calls when it
// has them (redisPool.releaseMany, fbPool.releaseMany), else each on a
// goroutine of its own. The caller has marked them released.
func (s *Switch) releaseMany(ctx context.Context, ls []*Lease) []error {
	errs := make([]error, len(ls))
	byBackend := map[backend][]int{}
	for i, l := range ls {
		byBackend[l.be] = append(byBackend[l.be], i)
	}
	var wg sync.WaitGroup
	for be, idx := range byBackend {
		if br, ok := be.(batchReleaser); ok {
			wg.Add(1)
			go func() {
				defer wg.Done()
				group := make([]*Lease, len(idx))
				for j, i := range idx {
					group[j] = ls[i]
				}
				for j, err := range br.releaseMany(ctx, group) {
					errs[idx[j]] = err
				}
			}()
			continue
		}
		for _, i := range idx {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = ls[i].be.release(ctx, ls[i])
			}()
		}
	}
	wg.Wait()
	return errs
}

// batchReleaser is a backend that releases many leases in batched calls.
type batchReleaser interface {
	releaseMany(ctx context.Context, ls []*Lease) []error
}

// closeError is Close's error when leases could not be released: one line
// counting them, with the distinct causes (each with its count when there
// are several), which it wraps (errors.Is finds ErrRedis, a context's
// error). Causes never quote a proxy's URL: they are Redis' errors.
type closeError struct {
	failed, total int
	ttl           time.Duration // they stay leased in Redis until it runs out
	causes        []error       // distinct by message, in order of first seen
	counts        []int
}

// add counts n leases not released because of err.
func (e *closeError) add(n int, err error) {
	e.failed += n
	msg := err.Error()
	for i, c := range e.causes {
		if c.Error() == msg {
			e.counts[i] += n
			return
		}
	}
	e.causes = append(e.causes, err)
	e.counts = append(e.counts, n)
}

// err is e, or nil when every lease was released.
func (e *closeError) err() error {
	if e.failed == 0 {
		return nil
	}
	return e
}

func (e *closeError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "proxyswitch: close: %d of %d leases not released (they stay in Redis until they expire, lease TTL %v): ",
		e.failed, max(e.total, e.failed), e.ttl)
	for i, c := range e.causes {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(c.Error())
		if len(e.causes) > 1 {
			fmt.Fprintf(&b, " (%d)", e.counts[i])
		}
	}
	return strings.NewReplacer("\r\n", " ", "\n", " ").Replace(b.String())
}

func (e *closeError) Unwrap() []error { return e.causes }
