package proxyswitch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/proxyswitch/proxyswitch/internal/bounded"
	"github.com/redis/go-redis/v9"
)

// Lease calls of unknown outcome.
//
// A lease call that fails after it was sent (no reply within the Redis
// timeout, the connection lost while waiting for the reply) may still run
// in Redis: a stalled Redis (paused, swapping, a long script) runs the
// commands waiting in its sockets when it wakes, whether or not their
// client still listens. Such a call's lease would have no holder: its
// caller got an error and made no Lease, so nothing releases, renews or
// reports it, and the proxy stays out on its site for the lease TTL.
//
// So the Switch remembers what such a call asked for: its pool, its scope
// and the owner token it generated (one token per call: a plain lease, in
// its pool call or alone, a preferred or named one), and gives back, in the
// background, any lease recorded under that token (reclaim.lua, one page of
// the scope's lease hash per call, owner-checked by the token, released as
// an unused lease: no cooldown). A token is a fresh one per call, held by no
// Lease, so this never releases a lease someone holds. A failed release of
// a grant nobody took (giveBack: leaseLate, a pool call's late grants) is
// remembered the same way. A call abandoned on its bound
// (bounded.ErrAbandoned) is judged by its late callback on its real outcome.
//
// The background goroutine (one per Switch, while calls are in doubt)
// sweeps every second (retry) until Redis answers and for two seconds more
// (a sweep sent while Redis was stalled may run before the stalled lease
// call it looks for), then every renewal period (a quarter of the lease
// TTL); a token stays for one lease TTL after the first sweep Redis
// answered (so that a call still in flight somewhere, run later, is found
// too; after that its lease has run out by itself). Close sweeps once
// more, bounded by its context, and reports the calls it could not check.
// The healthy lease path does nothing of this: only a failed call records
// its token.
//
// Calls that failed before reaching Redis (no connection: dial errors, the
// client's pool timeout, a closed client) and calls Redis answered with an
// error are not in doubt. Sticky sessions' leases are not covered: a
// session keeps its token from call to call, so a token in doubt may be
// the session's own lease later.

const (
	reclaimPage   = 500    // lease hash entries one reclaim.lua call looks at
	reclaimTokens = 256    // tokens per reclaim.lua call
	maxDoubts     = 10_000 // tokens remembered at most; past it, new ones are dropped (their leases end by their TTL)
)

// doubtKey is where a call in doubt may have leased: a pool and a scope.
type doubtKey struct {
	p     *redisPool
	scope string
}

// doubts is a Switch's lease calls of unknown outcome and the goroutine
// that gives their leases back. Safe for concurrent use.
type doubts struct {
	s *Switch

	mu      sync.Mutex
	m       map[doubtKey]map[string]time.Time // token -> start of the first sweep Redis answered after it came (zero: none yet)
	n       int                               // tokens in m
	running bool
	stop    chan struct{} // closed by Close
	done    chan struct{} // closed when the running goroutine exits
	closed  bool
	full    bool // maxDoubts was logged
}

// outcomeUnknown reports whether a failed Redis call may have run all the
// same: it was (or may have been) sent and no reply came. A reply of Redis
// (a script error), a client closed and a connection never made are not.
func outcomeUnknown(err error) bool {
	if err == nil || errors.Is(err, ErrCorrupt) || errors.Is(err, redis.ErrClosed) || errors.Is(err, redis.ErrPoolTimeout) {
		return false
	}
	var re redis.Error
	if errors.As(err, &re) {
		return false
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return false
	}
	return true
}

// doubt records that a lease call of p for token on scope failed with err;
// if err leaves its outcome unknown, the call's lease, if any, goes back
// once Redis answers. A call abandoned on its bound (bounded.ErrAbandoned:
// the client still waits for the reply) is left to its late callback
// (leaseLate, a pool call's), which gets its real outcome: a reply, whose
// lease it gives back; an error of a call sent, in doubt; or an error of a
// call never sent (Redis down: no connection), in no doubt.
func (p *redisPool) doubt(scope, token string, err error) {
	if !errors.Is(err, bounded.ErrAbandoned) && outcomeUnknown(err) {
		p.sw.doubts.add(p, scope, token)
	}
}

// leaseLate is bounded.Call's late for a lease call of token on scope (one
// that takes no Lease): a lease it granted goes back (giveBack), and an
// outcome still unknown is in doubt.
func (p *redisPool) leaseLate(scope, token string) func([]any, error) {
	return func(res []any, err error) {
		if err != nil {
			p.doubt(scope, token, err)
			return
		}
		if status, _ := intAt(res, 0); status == 1 && len(res) >= 4 {
			if member, ok := res[1].(string); ok {
				p.giveBack(context.Background(), scope, member, token)
			}
		}
	}
}

// giveBack releases member, leased to token on scope by a call whose
// caller took no Lease; if the release fails, the token is remembered as in
// doubt, so that the lease goes back once Redis answers.
func (p *redisPool) giveBack(ctx context.Context, scope, member, token string) {
	if _, err := p.releaseMember(ctx, scope, member, token, ""); err != nil {
		p.sw.doubts.add(p, scope, token)
	}
}

// add remembers token, of a call of p on scope in doubt, and starts the
// goroutine if it does not run.
func (d *doubts) add(p *redisPool, scope, token string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		d.s.cfg.logger.Warn("proxyswitch: a lease call of unknown outcome after Close: its lease, if Redis made one, ends by its TTL",
			"pool", p.name, "site", scope)
		return
	}
	if d.n >= maxDoubts {
		if !d.full {
			d.full = true
			d.s.cfg.logger.Warn("proxyswitch: too many lease calls of unknown outcome to remember: the leases of further ones, if Redis made them, end by their TTL",
				"pool", p.name, "max", maxDoubts)
		}
		return
	}
	if d.m == nil {
		d.m = map[doubtKey]map[string]time.Time{}
	}
	k := doubtKey{p, scope}
	ts := d.m[k]
	if ts == nil {
		ts = map[string]time.Time{}
		d.m[k] = ts
	}
	if _, ok := ts[token]; ok {
		return
	}
	ts[token] = time.Time{}
	d.n++
	if !d.running {
		d.running, d.stop, d.done = true, make(chan struct{}), make(chan struct{})
		go d.run(d.stop, d.done)
	}
}

// pending returns the tokens remembered (for tests).
func (d *doubts) pending() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n
}

// retry is how soon the goroutine sweeps again while a token waits for
// Redis' first answer: a second, or the renewal period if shorter.
func (d *doubts) retry() time.Duration { return min(d.s.renew.every(), time.Second) }

// run is the goroutine: it sweeps every retry while a token waits for its
// first answered sweep or got it within two retries, else every renewal
// period, until no token is left or Close.
func (d *doubts) run(stop, done chan struct{}) {
	defer close(done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	t := time.NewTimer(d.retry())
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		next, more, _ := d.sweep(ctx, false)
		if !more {
			return
		}
		t.Reset(next)
	}
}

// sweep gives back the leases of the tokens remembered, each scope's in
// turn (a pool that fails is skipped until the next sweep), and forgets
// the tokens whose first answered sweep is a lease TTL old, or, with final
// (Close), every token. It returns when to sweep next and whether tokens
// remain (false also stops the goroutine: the next add starts one); with
// final, err counts the tokens no answered sweep looked for.
func (d *doubts) sweep(ctx context.Context, final bool) (next time.Duration, more bool, err error) {
	type work struct {
		k      doubtKey
		tokens []string
	}
	d.mu.Lock()
	var todo []work
	for k, ts := range d.m {
		w := work{k: k, tokens: make([]string, 0, len(ts))}
		for tok := range ts {
			w.tokens = append(w.tokens, tok)
		}
		todo = append(todo, w)
	}
	d.mu.Unlock()

	start := time.Now()
	failed := map[*redisPool]error{}
	answered := make([]bool, len(todo))
	for i, w := range todo {
		if failed[w.k.p] != nil {
			continue
		}
		n, err := w.k.p.reclaim(ctx, w.k.scope, w.tokens)
		if n > 0 {
			d.s.cfg.logger.Info("proxyswitch: gave back leases that lease calls of unknown outcome made (Redis ran them after they timed out)",
				"pool", w.k.p.name, "site", w.k.scope, "leases", n)
			d.s.waiters.wake(w.k.p.name, w.k.scope)
		}
		if err != nil {
			failed[w.k.p] = err
			d.s.cfg.logger.Debug("proxyswitch: giving back the leases of lease calls of unknown outcome failed",
				"pool", w.k.p.name, "site", w.k.scope, "err", err)
			continue
		}
		answered[i] = true
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	ttl := d.s.cfg.leaseTTL
	unsettled, unchecked := false, 0
	for i, w := range todo {
		ts := d.m[w.k]
		if ts == nil {
			continue // forgotten meanwhile (Close's last sweep)
		}
		for _, tok := range w.tokens {
			if answered[i] && ts[tok].IsZero() {
				ts[tok] = start
			}
		}
		for tok, at := range ts {
			switch {
			case final:
				if at.IsZero() {
					unchecked++
				}
			case at.IsZero() || time.Since(at) < 2*d.retry():
				unsettled = true
				continue
			case time.Since(at) < ttl:
				continue
			}
			delete(ts, tok)
			d.n--
		}
		if len(ts) == 0 {
			delete(d.m, w.k)
		}
	}
	if final {
		d.m, d.n = nil, 0
		var errs []error
		for _, e := range failed {
			errs = append(errs, e)
		}
		if unchecked > 0 {
			err = fmt.Errorf("proxyswitch: close: %d lease calls of unknown outcome not checked (their leases, if Redis made them, end by their TTL): %w",
				unchecked, errors.Join(errs...))
		}
	}
	if d.n == 0 || d.closed && !final {
		d.running = false
		return 0, false, err
	}
	if unsettled {
		return d.retry(), true, err
	}
	return d.s.renew.every(), true, err
}

// close stops the goroutine (waiting for it at most until ctx ends) and
// sweeps once more, bounded by ctx; every token is then forgotten. It
// reports the calls no answered sweep looked for.
func (d *doubts) close(ctx context.Context) error {
	d.mu.Lock()
	d.closed = true
	running, stop, done := d.running, d.stop, d.done
	if running {
		close(stop)
	}
	d.mu.Unlock()
	if running {
		select {
		case <-done:
		case <-ctx.Done():
		}
	}
	d.mu.Lock()
	n := d.n
	d.mu.Unlock()
	if n == 0 {
		return nil
	}
	_, _, err := d.sweep(ctx, true)
	return err
}

// reclaim gives back the leases of scope recorded under tokens (calls in
// doubt, which no Lease holds), owner-checked: reclaim.lua over the
// scope's lease hash, a page per call, the tokens reclaimTokens at a time.
// It returns how many it released.
func (p *redisPool) reclaim(ctx context.Context, scope string, tokens []string) (int, error) {
	keys := []string{p.keys.free(scope), p.keys.leases(scope), p.keys.strikes(scope), p.keys.fails(),
		p.keys.health(scope), p.keys.pace(scope)}
	released := 0
	for len(tokens) > 0 {
		chunk := tokens[:min(len(tokens), reclaimTokens)]
		tokens = tokens[len(chunk):]
		cursor := "0"
		for {
			argv := make([]any, 0, 3+len(chunk))
			argv = append(argv, cursor, reclaimPage, p.cfg.idleTTL.Milliseconds())
			for _, t := range chunk {
				argv = append(argv, t)
			}
			res, err := bounded.Call(ctx, p.timeout, p.inline, func(ctx context.Context) ([]any, error) {
				return reclaimScript.Run(ctx, p.rdb, keys, argv...).Slice()
			}, nil)
			if err != nil {
				return released, redisErr("reclaim", err)
			}
			next, ok := firstString(res)
			if !ok || len(res)%2 != 1 {
				return released, fmt.Errorf("%w: reclaim reply of %d items", ErrCorrupt, len(res))
			}
			released += (len(res) - 1) / 2
			if next == "0" {
				break
			}
			cursor = next
		}
	}
	return released, nil
}
