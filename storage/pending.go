package storage

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// pending tracks the requests this process took from the queue and has not
// yet seen finished, by the request ID Colly will pass to IsVisited and
// Visited for them (see requestHash). It lets the visited check tell the
// queue's deliveries apart:
//
//   - a first delivery that Colly finds already visited is a duplicate:
//     Colly drops it before sending, with no callback, so IsVisited/Visited
//     acknowledge it on Colly's behalf;
//   - a delivery that finds the mark of its own request's earlier delivery
//     (its worker died after the claim, or it failed and is retried, or it
//     was requeued) is let through once: a claim made for a delivery
//     writes the request's ID into the mark (see visited.go). A mark
//     another request set refuses it, whatever its delivery number; one
//     an earlier version wrote, which names no request, lets any
//     redelivery through, as that version did.
//
// At most one delivery per visited ID is unclaimed in a process at a time
// (GetRequest hands a second one back until the first has passed Visited or
// is done), so a visited check that finds an unclaimed delivery is about
// that one, or is a HasVisited call (which acknowledges it only if the URL
// is visited, when Colly would refuse it anyway), or is another request of
// the same URL: a direct Visit from a callback while the delivery waits in
// Colly's queue for a free thread (Colly's queue takes a request from the
// queue storage before a thread is free to run it). Visited cannot tell
// that Visit from the delivery's own request (it gets only the ID), so a
// fresh claim is credited to the delivery provisionally (credit); the
// first request of that ID to start settles it (Attach's OnRequest hook):
// the delivery's own (it carries its token) confirms it, any other GET
// without a body proves the grant was that request's, and the delivery,
// which Colly refuses as already visited, is acknowledged at once
// (miscredited). While a delivery of an ID is pending, the visited checks
// of that ID in this process run one at a time (lockVisited), so none sees
// a mark whose bookkeeping is not done. Cases stay imprecise: a redirect,
// or a POST or a GET with a body, whose claim lands on the URL of a
// delivery waiting in this process, claims it on that delivery's behalf
// without a request of that ID starting; the delivery is then refused,
// comes back after the visibility timeout and is fetched again (a
// duplicate, never a loss).
//
// pending also knows which deliveries are running: the fetch that owns one
// has started (Attach's OnRequest hook calls start). A renewer goroutine
// keeps those invisible in the queue (see renew.go); the first start when
// none is alive starts it, and it exits at a tick that finds nothing
// running.
//
// Entries leave when their delivery is acknowledged or failed (forget). An
// entry whose fetch never started leaves after the visibility timeout
// (Colly dropped the request for another reason: a URL filter, robots.txt,
// MaxDepth, Abort in OnRequest), one whose fetch started after the max
// fetch time (it never settled: Abort in a later OnRequest callback, a
// panic); expired entries are purged every 256 adds.
type pending struct {
	n        atomic.Int64 // len(byToken), kept by putLocked and removeLocked; lets the visited path skip the lock
	renewers atomic.Int32 // renewer goroutines alive (0 or 1; for tests)
	mu       sync.Mutex
	byHash   map[uint64]*delivery // the unclaimed delivery of each visited ID
	credited map[uint64]*delivery // deliveries granted by a fresh claim whose fetch has not started, by visited ID
	byToken  map[string]*delivery // every pending delivery
	running  map[string]*delivery // the deliveries whose fetch runs, renewed
	renewing bool                 // a renewer goroutine is alive or starting
	adds     int
	// stripes serialize, per visited ID, the visited checks made while a
	// delivery of that ID is pending: each holds its stripe across its
	// Redis call and the bookkeeping that follows, so that no check sees
	// the mark another one has just set before that one has credited (or
	// dropped) the delivery (see lockVisited).
	stripes [64]sync.Mutex

	visibility, maxFetch time.Duration // the Storage's settings
}

// delivery is one delivery of a queued request to this process.
type delivery struct {
	id     string    // request ID in the queue
	number int       // 1 for the first delivery
	pop    string    // the pop ID of the GetRequest call that made it ("": an earlier version's)
	hash   uint64    // Colly's request ID for the visited check
	at     time.Time // when it was delivered; zero if unknown (see start)
	// started is when the fetch that owns the delivery started, zero before.
	started time.Time
}

// token is the delivery token "<request ID>:<delivery number>:<pop ID>"
// (see q_lib.lua): unique across Requeue and a Redis that lost its data,
// unlike the request ID and number alone.
func (d *delivery) token() string {
	if d.pop == "" {
		return d.id + ":" + strconv.Itoa(d.number)
	}
	return d.id + ":" + strconv.Itoa(d.number) + ":" + d.pop
}

func (p *pending) init(visibility, maxFetch time.Duration) {
	p.byHash = make(map[uint64]*delivery)
	p.credited = make(map[uint64]*delivery)
	p.byToken = make(map[string]*delivery)
	p.running = make(map[string]*delivery)
	p.visibility, p.maxFetch = visibility, maxFetch
}

// expiredLocked reports whether this process no longer answers for e at
// now: its fetch did not start within the visibility timeout, or started
// longer than the max fetch time ago.
func (p *pending) expiredLocked(e *delivery, now time.Time) bool {
	if !e.started.IsZero() {
		// A running delivery is the renewer's to cap (and to log).
		return p.running[e.token()] != e && now.Sub(e.started) > p.maxFetch
	}
	return now.Sub(e.at) > p.visibility
}

// add records d, unless another unclaimed delivery with the same hash,
// delivered at most the visibility timeout earlier, is pending: then it
// reports false. Every 256 adds it forgets expired entries.
func (p *pending) add(d *delivery) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if old := p.byHash[d.hash]; old != nil {
		if d.at.Sub(old.at) <= p.visibility {
			return false
		}
		delete(p.byHash, d.hash)
		if p.expiredLocked(old, d.at) {
			p.removeLocked(old)
		}
	}
	tok := d.token()
	if old := p.byToken[tok]; old != nil {
		p.removeLocked(old)
	}
	p.putLocked(tok, d)
	p.byHash[d.hash] = d
	if p.adds++; p.adds%256 == 0 {
		for _, e := range p.byToken {
			if p.expiredLocked(e, d.at) {
				p.removeLocked(e)
			}
		}
	}
	return true
}

// unclaimed returns the pending delivery whose visited ID is hash and which
// Visited has not granted yet, or nil.
func (p *pending) unclaimed(hash uint64) *delivery {
	if p.n.Load() == 0 {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.byHash[hash]
}

// lockVisited takes the stripe of hash if a delivery with that visited ID
// is pending (unclaimed or credited), and returns its unlock (nil if none
// was taken). Without it a visited check could find the mark that a
// concurrent Visited of the delivery's own request has just set before
// that Visited credited the delivery, take the delivery for a duplicate
// and acknowledge it: the page would be lost.
func (p *pending) lockVisited(hash uint64) func() {
	if p.n.Load() == 0 {
		return nil
	}
	p.mu.Lock()
	held := p.byHash[hash] != nil || p.credited[hash] != nil
	p.mu.Unlock()
	if !held {
		return nil
	}
	mu := &p.stripes[hash%uint64(len(p.stripes))]
	mu.Lock()
	return mu.Unlock
}

// claim marks d as granted by Visited: later visited checks of the same ID
// (a page linking to itself, HasVisited, another delivery of the URL) leave
// it alone.
func (p *pending) claim(d *delivery) {
	p.mu.Lock()
	if p.byHash[d.hash] == d {
		delete(p.byHash, d.hash)
	}
	p.mu.Unlock()
}

// credit is claim for a delivery whose visited ID Visited has just
// claimed afresh (the mark was absent). That grant may belong to another
// request of the same URL (a direct Visit from a callback, while the
// delivery waits in Colly's queue for a free thread): miscredited tells.
func (p *pending) credit(d *delivery) {
	p.mu.Lock()
	if p.byHash[d.hash] == d {
		delete(p.byHash, d.hash)
		p.credited[d.hash] = d
	}
	p.mu.Unlock()
}

// miscredited is called when a request whose visited ID is hash, and which
// was granted by Visited (a fresh claim), starts with delivery token tok
// ("" for none). If a delivery of another token was credited with a fresh
// claim of that ID and has not started, the grant was this request's, not
// that delivery's (Visited grants an ID once): the delivery will be refused
// as already visited. It is removed and returned, for the caller to
// acknowledge.
func (p *pending) miscredited(hash uint64, tok string) *delivery {
	if p.n.Load() == 0 {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	d := p.credited[hash]
	if d == nil || d.token() == tok || !d.started.IsZero() {
		return nil
	}
	p.removeLocked(d)
	return d
}

// reopen is called when the delivery of request id numbered n will not be
// fetched because the request was delivered again. If this process holds
// that later delivery, the visited check may have granted the earlier one
// on its behalf (two deliveries of one URL in a process cannot be told
// apart there): it is made unclaimed again, so its own visited check lets
// it through.
func (p *pending) reopen(id string, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var later *delivery
	for _, e := range p.byToken {
		if e.id == id && e.number > n && e.hash != 0 && (later == nil || e.number > later.number) {
			later = e
		}
	}
	if later != nil && p.byHash[later.hash] == nil {
		p.byHash[later.hash] = later
	}
}

// forget removes the delivery with token, if present.
func (p *pending) forget(token string) {
	if p.n.Load() == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if d := p.byToken[token]; d != nil {
		p.removeLocked(d)
	}
}

func (p *pending) putLocked(tok string, d *delivery) {
	p.byToken[tok] = d
	p.n.Store(int64(len(p.byToken)))
}

func (p *pending) removeLocked(d *delivery) {
	tok := d.token()
	delete(p.byToken, tok)
	p.n.Store(int64(len(p.byToken)))
	if p.byHash[d.hash] == d {
		delete(p.byHash, d.hash)
	}
	if p.credited[d.hash] == d {
		delete(p.credited, d.hash)
	}
	if p.running[tok] == d {
		delete(p.running, tok)
	}
}

// start marks the delivery with token tok as running from now on: the
// fetch that owns it started (again, for a Retry after a failure). A
// delivery this process does not hold (settled before a Retry, or one add
// never saw) is recorded with an unknown delivery time. spawn reports that
// no renewer is alive: the caller must start one.
func (p *pending) start(tok string, now time.Time) (d *delivery, spawn bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	d = p.byToken[tok]
	if d == nil {
		id, n, pop, err := parseToken(tok)
		if err != nil {
			return nil, false, err
		}
		d = &delivery{id: id, number: n, pop: pop}
		p.putLocked(tok, d)
	}
	d.started = now
	if p.credited[d.hash] == d {
		delete(p.credited, d.hash) // its own fetch: the grant was its
	}
	p.running[tok] = d
	spawn = !p.renewing
	p.renewing = true
	return d, spawn, nil
}

// stop ends the renewal of d, if it runs; d stays pending.
func (p *pending) stop(d *delivery) {
	p.mu.Lock()
	if p.running[d.token()] == d {
		delete(p.running, d.token())
	}
	p.mu.Unlock()
}

// renewals returns the running deliveries to extend at now. Those whose
// fetch started at least the max fetch time ago are forgotten instead (their
// tokens are capped): they come back within the visibility timeout, and a
// late acknowledgement still reaches Redis. If none is left, renewals
// records that the renewer exits, under the lock start takes: the next
// start spawns a new one.
func (p *pending) renewals(now time.Time) (batch []*delivery, capped []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for tok, d := range p.running {
		if now.Sub(d.started) >= p.maxFetch {
			p.removeLocked(d)
			capped = append(capped, tok)
			continue
		}
		batch = append(batch, d)
	}
	if len(batch) == 0 {
		p.renewing = false
	}
	return batch, capped
}
