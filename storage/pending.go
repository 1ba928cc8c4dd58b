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
//   - a later delivery (its worker died, or it failed and is retried) finds
//     the mark of its own earlier delivery, so it is let through once.
//
// At most one delivery per visited ID is unclaimed in a process at a time
// (GetRequest hands a second one back until the first has passed Visited or
// is done), so a visited check that finds an unclaimed delivery is about
// that one, or is a HasVisited call (which acknowledges it only if the URL
// is visited, when Colly would refuse it anyway). One case stays
// imprecise: a redirect that lands on the URL of a delivery waiting in this
// process claims it on that delivery's behalf; the delivery is then refused,
// comes back after the visibility timeout and is fetched again (a
// duplicate, never a loss). Entries leave
// when their delivery is acknowledged or failed, or after the visibility
// timeout (Colly dropped the request for another reason: a URL filter,
// robots.txt, MaxDepth, Abort in OnRequest).
type pending struct {
	n       atomic.Int64 // entries; lets the visited path skip the lock
	mu      sync.Mutex
	byHash  map[uint64]*delivery // the unclaimed delivery of each visited ID
	byToken map[string]*delivery // every pending delivery
	adds    int
}

// delivery is one delivery of a queued request to this process.
type delivery struct {
	id     string    // request ID in the queue
	number int       // 1 for the first delivery
	hash   uint64    // Colly's request ID for the visited check
	at     time.Time // when it was delivered
}

func (d *delivery) token() string { return d.id + ":" + strconv.Itoa(d.number) }

func (p *pending) init() {
	p.byHash = make(map[uint64]*delivery)
	p.byToken = make(map[string]*delivery)
}

// add records d, unless another unclaimed delivery with the same hash is
// pending: then it reports false. Every 256 adds it forgets entries older than maxAge.
func (p *pending) add(d *delivery, maxAge time.Duration) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	cutoff := d.at.Add(-maxAge)
	if old := p.byHash[d.hash]; old != nil {
		if !old.at.Before(cutoff) {
			return false
		}
		p.removeLocked(old)
	}
	if old := p.byToken[d.token()]; old != nil {
		p.removeLocked(old)
	}
	p.byToken[d.token()] = d
	p.byHash[d.hash] = d
	if p.adds++; p.adds%256 == 0 {
		for _, e := range p.byToken {
			if e.at.Before(cutoff) {
				p.removeLocked(e)
			}
		}
	}
	p.n.Store(int64(len(p.byToken)))
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

// forget removes the delivery with token, if present.
func (p *pending) forget(token string) {
	if p.n.Load() == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if d := p.byToken[token]; d != nil {
		p.removeLocked(d)
		p.n.Store(int64(len(p.byToken)))
	}
}

func (p *pending) removeLocked(d *delivery) {
	delete(p.byToken, d.token())
	if p.byHash[d.hash] == d {
		delete(p.byHash, d.hash)
	}
}
