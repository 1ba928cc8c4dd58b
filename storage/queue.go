package storage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/proxyswitch/proxyswitch/internal/group"
)

// The queue gives at-least-once delivery. GetRequest moves a request from
// the ready list to an in-flight set with a deadline (the visibility
// timeout) in one script, and writes a delivery token into the request's
// Colly context. The request leaves the queue only when that delivery is
// acknowledged (Ack, or the hooks Attach installs); while its fetch runs,
// the Storage keeps pushing the deadline back (renew.go); if its worker
// dies first, the deadline passes and the next GetRequest, in any process,
// delivers it again. After the last of WithMaxDeliveries deliveries it goes
// to the dead-letter list, where DeadLetters shows it and Requeue brings it
// back.

// AddRequest implements Colly's queue.Storage: it validates the serialized
// request (see ErrInvalidRequest) and appends it to the namespace's queue,
// unless the queue holds WithMaxQueued requests already (ErrQueueFull). It
// is one Redis round trip, shared with the AddRequest calls of other
// goroutines made meanwhile (see internal/group): it returns when the request is
// in Redis.
func (s *Storage) AddRequest(r []byte) error {
	if _, err := checkRequest(r, s.cfg.maxRequestSize); err != nil {
		return err
	}
	addErr, err := s.adds.Do(r)
	if err != nil {
		return err
	}
	return addErr
}

// Batch bounds of the grouped round trips (internal/group).
const (
	addGroupMax      = 64      // AddRequest calls in one q_add
	addGroupMaxBytes = 1 << 20 // and their bytes, but for a larger request alone
	popGroupMax      = 16      // GetRequest calls in one q_pop
	ackGroupMax      = 256     // acknowledgements in one q_ack
)

// initGroups sets up the grouped round trips of the queue.
func (s *Storage) initGroups() {
	s.adds = group.Group[[]byte, error]{Corrupt: ErrCorrupt, Max: addGroupMax, MaxBytes: addGroupMaxBytes,
		Size: func(r []byte) int { return len(r) }, Flush: s.flushAdds}
	s.pops = group.Group[string, popped]{Corrupt: ErrCorrupt, Max: popGroupMax, Flush: s.flushPops}
	s.acks = group.Group[ackItem, struct{}]{Corrupt: ErrCorrupt, Max: ackGroupMax, Flush: s.flushAcks}
}

// flushAdds queues a batch of AddRequest calls in one q_add. If together
// they would pass WithMaxQueued, each is tried alone (some may fit).
func (s *Storage) flushAdds(reqs [][]byte) ([]error, error) {
	args := make([]any, len(reqs))
	for i, r := range reqs {
		args[i] = r
	}
	errs := make([]error, len(reqs))
	err := s.add(context.Background(), "add request", args)
	if len(reqs) == 1 || !errors.Is(err, ErrQueueFull) {
		for i := range errs {
			errs[i] = err
		}
		return errs, nil
	}
	for i := range args {
		errs[i] = s.add(context.Background(), "add request", args[i:i+1])
	}
	return errs, nil
}

// add runs q_add.lua for reqs, in order and all or none.
func (s *Storage) add(ctx context.Context, op string, reqs []any) error {
	res, err := s.run(ctx, op, qAddScript, s.qkeys, append([]any{s.cfg.maxQueued}, reqs...)...)
	if err != nil {
		return err
	}
	if res == int64(-1) {
		return fmt.Errorf("%w: %d requests would exceed the limit of %d (WithMaxQueued)", ErrQueueFull, len(reqs), s.cfg.maxQueued)
	}
	return nil
}

// GetRequest implements Colly's queue.Storage: it delivers the next ready
// request (requests whose visibility timeout or retry delay has passed come
// first), marked with a delivery token in its Colly context. When nothing
// is ready it returns ErrQueueEmpty, after waiting up to the poll interval
// if requests are still in flight (so that Colly's queue, which asks again
// at once, does not spin). A stored request that fails validation is moved
// to the dead-letter list and reported as ErrInvalidRequest; Colly's queue
// skips it.
//
// Each call sends a pop ID, a nonce it makes, which names the delivery (it
// is part of the delivery token). A call that gets no reply (a Redis
// timeout, a lost connection) may still have taken a request in Redis: its
// pop ID is kept, and the next GetRequest of this Storage sends it again
// and gets that same delivery, not counted again (q_pop.lua). So a reply
// lost on a slow network does not bring a request closer to the
// dead-letter list; only if this Storage makes no GetRequest within the
// visibility timeout (its process exits, its queue.Run ended) does the
// delivery it never received count, as that of a worker that died.
func (s *Storage) GetRequest() ([]byte, error) {
	ctx := context.Background()
	held := false
	for range 8 {
		pop := s.lost.take()
		p, err := s.pops.Do(pop)
		if err != nil {
			s.lost.put(pop)
			return nil, err
		}
		if p.err != nil {
			return nil, p.err
		}
		if p.id == "" {
			if p.wait > 0 || held {
				time.Sleep(min(time.Duration(max(p.wait, 1))*time.Millisecond, s.cfg.pollInterval))
			}
			return nil, ErrQueueEmpty
		}
		b, err := s.deliver(ctx, p.id, p.n, pop, []byte(p.payload))
		if err == errHeld {
			held = true
			continue
		}
		return b, err
	}
	time.Sleep(s.cfg.pollInterval)
	return nil, ErrQueueEmpty
}

// maxLostPops bounds the pop IDs a Storage keeps to send again: as many as
// a few batches of GetRequest calls whose round trips all failed. Beyond
// it the oldest are dropped (their deliveries, if any, count as those of a
// worker that died).
const maxLostPops = 4 * popGroupMax

// lostPops holds the pop IDs of GetRequest calls that got no reply; each
// is sent again by one later call (take), never by two at once.
type lostPops struct {
	mu  sync.Mutex
	ids []string
}

// take returns a pop ID to send: one whose reply was lost, else a new one.
func (l *lostPops) take() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.ids); n > 0 {
		id := l.ids[n-1]
		l.ids = l.ids[:n-1]
		return id
	}
	return newPopID()
}

// put keeps a pop ID whose reply was lost, for a later call to send again.
func (l *lostPops) put(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.ids) >= maxLostPops {
		l.ids = append(l.ids[:0], l.ids[1:]...)
	}
	l.ids = append(l.ids, id)
}

// newPopID returns a random pop ID: 64 bits in base 36.
func newPopID() string { return strconv.FormatUint(rand.Uint64(), 36) }

// validPopID reports whether p has the form newPopID writes.
func validPopID(p string) bool {
	if p == "" || len(p) > 13 {
		return false
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; (c < '0' || c > '9') && (c < 'a' || c > 'z') {
			return false
		}
	}
	return true
}

// popped is one GetRequest's share of a q_pop reply: a delivery, or (id
// "") none and the ms until an in-flight request comes back (-1: none is
// in flight).
type popped struct {
	id      string
	n       int
	payload string
	wait    int64
	err     error // the reply's entry for this call is malformed
}

// flushPops delivers up to one request to each of a batch of GetRequest
// calls in one q_pop. Those left without one share the reply's wait.
func (s *Storage) flushPops(calls []string) ([]popped, error) {
	args := make([]any, 0, 3+len(calls))
	args = append(args, s.cfg.visibility.Milliseconds(), s.cfg.maxDeliveries, s.cfg.maxRequestSize)
	for _, p := range calls {
		args = append(args, p)
	}
	res, err := s.run(context.Background(), "get request", qPopScript, s.qkeys, args...)
	if err != nil {
		return nil, err
	}
	arr, _ := res.([]any)
	k, ok := int64(-1), len(arr) >= 2
	if ok {
		k, _ = arr[0].(int64)
	}
	if !ok || k < 0 || k > int64(len(calls)) || int64(len(arr)) != 2+4*k {
		return nil, fmt.Errorf("%w: unexpected reply from the queue script: %v", ErrCorrupt, clip(fmt.Sprint(res)))
	}
	out := make([]popped, len(calls))
	var gotArr [popGroupMax]bool // the group sends at most popGroupMax calls
	got := gotArr[:]
	if len(calls) > len(got) {
		got = make([]bool, len(calls))
	}
	for j := range int(k) {
		pop, _ := arr[2+4*j].(string)
		id, _ := arr[3+4*j].(string)
		n, _ := arr[4+4*j].(int64)
		payload, _ := arr[5+4*j].(string)
		i := slices.Index(calls, pop)
		if i < 0 || got[i] {
			return nil, fmt.Errorf("%w: unexpected reply from the queue script: delivery for pop %q", ErrCorrupt, clip(pop))
		}
		got[i] = true
		if id == "" || n < 1 {
			// That call's alone: the others' deliveries are good.
			out[i].err = fmt.Errorf("%w: unexpected delivery from the queue script: id %q, delivery %d (key %s)",
				ErrCorrupt, clip(id), n, s.q.tries)
			continue
		}
		out[i] = popped{id: id, n: int(n), payload: payload}
	}
	for i := range out {
		if !got[i] {
			out[i].wait, _ = arr[1].(int64)
		}
	}
	return out, nil
}

// errHeld means deliver handed a request back: this process is already
// running another delivery of the same URL.
var errHeld = errors.New("held back")

// deliver validates a popped request and stamps it with its delivery token.
// While this process runs another delivery with the same visited ID, the
// new one is handed back (q_release) rather than run beside it: with two
// such deliveries in one process, the visited check could not tell which
// of them Colly is asking about (see pending.go).
func (s *Storage) deliver(ctx context.Context, id string, n int, pop string, payload []byte) ([]byte, error) {
	d := &delivery{id: id, number: n, pop: pop, at: time.Now()}
	w, err := checkRequest(payload, s.cfg.maxRequestSize)
	var out []byte
	if err == nil {
		out, err = withDelivery(payload, d.token())
	}
	if err != nil {
		if _, berr := s.nack(ctx, d.token(), err.Error(), true); berr != nil {
			err = fmt.Errorf("%w (and dead-lettering it failed: %w)", err, berr)
		}
		return nil, fmt.Errorf("queued request %s: %w", id, err)
	}
	h, ok := requestHash(w)
	if !ok {
		return out, nil
	}
	d.hash = h
	if !s.pending.add(d) {
		if _, err := s.run(ctx, "release", qReleaseScript, s.qkeys, id, n, pop); err != nil {
			return nil, err
		}
		return nil, errHeld
	}
	return out, nil
}

// QueueSize implements Colly's queue.Storage: the requests ready plus those
// in flight (running somewhere, or waiting for a retry). Counting the
// in-flight ones keeps every worker's queue.Run going until the whole
// namespace's work is done, so a request whose worker dies is still picked
// up by a survivor. It is one Redis round trip.
//
// Requests are acknowledged by the hooks Attach installs. If this Storage
// has requests of its own out and Attach was never called, QueueSize
// returns ErrNotAttached (and logs it once at error level), which ends
// Colly's queue.Run at once instead of never.
func (s *Storage) QueueSize() (int, error) {
	if !s.attached.Load() && s.pending.n.Load() > 0 {
		if !s.warnedUnattached.Swap(true) {
			s.cfg.logger.Error("proxyswitch: a queue on this storage runs without Storage.Attach: nothing acknowledges its requests, so the run would never end",
				"namespace", s.cfg.namespace)
		}
		return 0, ErrNotAttached
	}
	st, err := s.Stats(context.Background())
	return st.Ready + st.InFlight, err
}

// Stats counts the namespace's queue at one moment: a plain value, a
// snapshot that other processes may change right after.
type Stats struct {
	// Ready is the number of requests waiting for delivery. It may count a
	// few IDs acknowledged after their visibility timeout, which the next
	// GetRequest drops.
	Ready int
	// InFlight is the number of requests delivered and not yet acknowledged,
	// or failed and waiting for their retry.
	InFlight int
	// Dead is the number of dead letters.
	Dead int
}

// Stats counts ready, in-flight and dead requests, in one round trip.
func (s *Storage) Stats(ctx context.Context) (Stats, error) {
	res, err := s.run(ctx, "queue stats", qStatsScript, s.qkeys)
	if err != nil {
		return Stats{}, err
	}
	arr, _ := res.([]any)
	if len(arr) != 3 {
		return Stats{}, fmt.Errorf("%w: unexpected reply from the stats script: %v", ErrCorrupt, res)
	}
	n := func(v any) int { i, _ := v.(int64); return int(i) }
	return Stats{Ready: n(arr[0]), InFlight: n(arr[1]), Dead: n(arr[2])}, nil
}

// DeadLetter is a request that failed or was not acknowledged on each of
// its deliveries, or that failed validation. It is a plain value, a copy of
// what Redis held when DeadLetters read it.
type DeadLetter struct {
	ID         string    // queue ID; pass it to Requeue
	URL        string    // the request's URL ("" if the request is unreadable)
	Request    []byte    // the serialized Colly request, as queued
	Deliveries int       // how often it was delivered
	Reason     string    // the last failure
	Since      time.Time // when it was dead-lettered (Redis clock)
}

// DeadLetters returns up to count dead letters, oldest first, skipping the
// first offset. It is one Redis round trip.
func (s *Storage) DeadLetters(ctx context.Context, offset, count int) ([]DeadLetter, error) {
	if offset < 0 || count <= 0 {
		return nil, fmt.Errorf("%w: dead letters offset %d, count %d", ErrConfig, offset, count)
	}
	last := -1 // ZRANGE's "to the end", when offset+count-1 would overflow
	if count-1 <= math.MaxInt-offset {
		last = offset + count - 1
	}
	res, err := s.run(ctx, "dead letters", qDeadScript, s.qkeys, offset, last)
	if err != nil {
		return nil, err
	}
	arr, _ := res.([]any)
	out := make([]DeadLetter, 0, len(arr)/5)
	for i := 0; i+4 < len(arr); i += 5 {
		str := func(v any) string { s, _ := v.(string); return s }
		ms, _ := strconv.ParseInt(str(arr[i+1]), 10, 64)
		n, _ := strconv.Atoi(str(arr[i+2]))
		dl := DeadLetter{
			ID: str(arr[i]), Request: []byte(str(arr[i+4])), Deliveries: n,
			Reason: str(arr[i+3]), Since: time.UnixMilli(ms),
		}
		var w struct{ URL string } // only the URL: the rest may be what made it a dead letter
		if json.Unmarshal(dl.Request, &w) == nil {
			dl.URL = w.URL
		}
		out = append(out, dl)
	}
	return out, nil
}

// Requeue moves a dead letter back to the end of the queue with a fresh
// delivery count. It returns ErrNotFound if id is not a dead letter.
func (s *Storage) Requeue(ctx context.Context, id string) error {
	n, err := s.run(ctx, "requeue", qRequeueScript, s.qkeys, id)
	if err != nil {
		return err
	}
	if n != int64(1) {
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	return nil
}
