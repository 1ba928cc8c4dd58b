package storage

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/gocolly/colly/v2"
)

// Colly's queue has no acknowledge step, so Attach installs hooks on the
// collector that answer for each delivered request, found by the delivery
// token GetRequest wrote into its context:
//
//   - OnRequest records which fetch owns the delivery: the first request
//     that runs with the token. Requests visited from its callbacks share
//     its context (colly.Request.Visit), so without this a child's outcome
//     would answer for the parent. It also marks the delivery as running,
//     so that it stays invisible to other workers until it settles (see
//     renew.go).
//   - OnScraped (the end of a successful fetch) acknowledges it, after the
//     collector's other OnScraped callbacks (see below).
//   - OnError fails it (Nack: retried after the retry delay, dead-lettered
//     after the last delivery) at once, so that a Request.Retry() made in a
//     later OnError callback takes the delivery over (its success then
//     acknowledges it). When WithRetryIf says the error is final (a 404, a
//     redirect to a URL already visited) it acknowledges it instead, after
//     the collector's other OnError callbacks, unless one of them retried.
//
// Acknowledging last. Colly runs the callbacks of one kind in the order
// they were registered, and the user's are usually registered after
// Attach; an acknowledgement that ran before them would let a worker killed
// in between lose the page for good (the queue forgets it, the user's code
// never saw it). So the acknowledging OnScraped and OnError callbacks are
// not registered by Attach but appended by the OnRequest hook, when the
// collector runs its first request: after every callback registered before
// the crawl started, in whatever order relative to Attach. At every
// request the hook checks that no OnScraped or OnError callback was
// registered since (Colly v2 exposes no count, so it reads the length of
// the collector's callback list by reflection; the field is pinned by a
// test), and if one was, appends a fresh acknowledging callback and retires
// the old one. What this cannot cover: a callback registered while a
// response is being handled, after its request started (from one of that
// response's own callbacks), runs after that response's acknowledgement;
// the next request puts the acknowledgement last again. Nor are callbacks
// registered from another goroutine while requests run (a data race in
// Colly itself, which reads its lists unlocked). A panicking callback
// leaves the request unacknowledged: it comes back (see below).
//
// A delivered request that Colly drops before sending fires none of these.
// If it was dropped as already visited, IsVisited/Visited acknowledge it
// (see pending.go). If it was dropped for another reason (URL filters,
// robots.txt, MaxDepth, MaxRequests, Abort in an OnRequest callback
// registered before Attach), it comes back after the visibility timeout
// and, after its last delivery, lands in the dead-letter list: filter
// before AddRequest, or call Ack yourself. One aborted by an OnRequest
// callback registered after Attach (or whose callbacks panic) has already
// been marked running: it comes back only when WithMaxFetchTime ends its
// renewal, plus up to the visibility timeout; call Ack or Nack before
// aborting it.

// ownerFailed prefixes the owner of a delivery whose fetch failed; the next
// request that runs with the token (a Retry) takes it over. ownerFinal
// prefixes the owner of one whose fetch failed for good: the last OnError
// callback acknowledges it unless a Retry took it over first.
const (
	ownerFailed = "failed:"
	ownerFinal  = "final:"
)

// Attach installs the acknowledgement hooks on c: an OnRequest and an
// OnError callback now, and at c's first request the acknowledging
// OnScraped and OnError callbacks, which stay after every callback
// registered before that request (see ack.go). Call it once per collector
// that runs requests from this Storage's queue, before its first request;
// others are not affected (their requests carry no delivery token). A
// queue run without it could never end: see ErrNotAttached. Register your
// own OnError callbacks after Attach if they call Request.Retry.
func (s *Storage) Attach(c *colly.Collector) {
	s.attached.Store(true)
	scraped := &lastHook{count: func() int { return callbackCount(c, scrapedField) }}
	failed := &lastHook{count: func() int { return callbackCount(c, errorField) }}
	c.OnRequest(func(r *colly.Request) {
		scraped.keep(func(live func() bool) {
			c.OnScraped(func(resp *colly.Response) {
				if !live() {
					return
				}
				if tok, ok := s.owned(resp.Request); ok {
					s.logErr("acknowledging", resp.Request, s.settle(tok, nil))
				}
			})
		})
		failed.keep(func(live func() bool) {
			c.OnError(func(resp *colly.Response, _ error) {
				if !live() {
					return
				}
				tok, ok := deliveryToken(resp.Request)
				if !ok {
					return
				}
				owner, _ := resp.Request.Ctx.GetAny(ctxOwner).(string)
				if owner == ownerFinal+strconv.FormatUint(uint64(resp.Request.ID), 10) {
					s.logErr("acknowledging", resp.Request, s.settle(tok, nil))
				}
			})
		})
		if !c.AllowURLRevisit {
			s.settleMiscredited(r)
		}
		tok, ok := deliveryToken(r)
		if !ok {
			return
		}
		owner, _ := r.Ctx.GetAny(ctxOwner).(string)
		if owner == "" || strings.HasPrefix(owner, ownerFailed) || strings.HasPrefix(owner, ownerFinal) {
			r.Ctx.Put(ctxOwner, strconv.FormatUint(uint64(r.ID), 10))
			if !r.IsAbort() { // an earlier OnRequest callback aborted it
				s.begin(r, tok)
			}
		}
	})
	c.OnError(func(resp *colly.Response, err error) {
		tok, ok := s.owned(resp.Request)
		if !ok {
			return
		}
		id := strconv.FormatUint(uint64(resp.Request.ID), 10)
		if !s.cfg.retryIf(resp, err) {
			resp.Request.Ctx.Put(ctxOwner, ownerFinal+id)
			return
		}
		resp.Request.Ctx.Put(ctxOwner, ownerFailed+id)
		s.logErr("failing", resp.Request, s.settle(tok, err))
	})
}

// lastHook keeps one acknowledging callback of a collector after all the
// others of its kind. n is the length of the collector's list right after
// the live callback was appended, gen the live callback's generation (0:
// none yet): older ones do nothing.
type lastHook struct {
	mu    sync.Mutex
	n     int
	gen   uint64
	live  atomic.Uint64
	count func() int // the length of the collector's list; -1 if unknown
}

// keep appends a new acknowledging callback through register if none is
// live yet or callbacks were registered after the live one. register gets
// the test the callback runs first: is it still the live one? Every
// request of the collector passes here before its callbacks run, so the
// append (under Colly's lock) happens before any of them reads the list.
func (h *lastHook) keep(register func(live func() bool)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.count()
	if h.gen > 0 && (n < 0 || n == h.n) {
		return
	}
	h.gen++
	gen := h.gen
	// Retire the old one first: a response in between acknowledges late
	// (a duplicate if the worker dies), never early.
	h.live.Store(gen)
	register(func() bool { return h.live.Load() == gen })
	h.n = h.count()
}

// Indexes of colly.Collector's unexported callback lists, -1 if this
// version of Colly has no such slice field (then lastHook registers its
// callback once, at the first request). TestCallbackFieldsFound pins them.
var (
	scrapedField = sliceField("scrapedCallbacks")
	errorField   = sliceField("errorCallbacks")
)

func sliceField(name string) int {
	f, ok := reflect.TypeFor[colly.Collector]().FieldByName(name)
	if !ok || len(f.Index) != 1 || f.Type.Kind() != reflect.Slice {
		return -1
	}
	return f.Index[0]
}

// callbackCount reads the length of c's callback list at field index i.
// Colly writes the list only under its lock, in OnScraped / OnError, which
// a correct program does not call while requests run (Colly itself reads
// the list unlocked).
func callbackCount(c *colly.Collector, i int) int {
	if i < 0 {
		return -1
	}
	return reflect.ValueOf(c).Elem().Field(i).Len()
}

// owned returns the delivery token of r if r is the fetch that owns it.
func (s *Storage) owned(r *colly.Request) (string, bool) {
	tok, ok := deliveryToken(r)
	if !ok {
		return "", false
	}
	owner, _ := r.Ctx.GetAny(ctxOwner).(string)
	id := strconv.FormatUint(uint64(r.ID), 10)
	return tok, owner == id || owner == ownerFailed+id
}

func deliveryToken(r *colly.Request) (string, bool) {
	if r == nil || r.Ctx == nil {
		return "", false
	}
	tok, _ := r.Ctx.GetAny(ctxDelivery).(string)
	return tok, tok != ""
}

// Ack acknowledges the delivery r came with: the request is done and leaves
// the queue. Acknowledging a delivery that was delivered again since (its
// visibility timeout passed) changes nothing and is not an error; the newer
// delivery answers for the request. It returns ErrNotQueued if r was not
// delivered by a Storage queue.
func (s *Storage) Ack(r *colly.Request) error {
	tok, ok := deliveryToken(r)
	if !ok {
		return ErrNotQueued
	}
	return s.settle(tok, nil)
}

// Nack fails the delivery r came with: the request is delivered again
// after the retry delay, or moved to the dead-letter list with cause as its
// reason if this was its last delivery. A stale delivery is left alone, as
// with Ack. It returns ErrNotQueued if r was not delivered by a Storage
// queue.
func (s *Storage) Nack(r *colly.Request, cause error) error {
	tok, ok := deliveryToken(r)
	if !ok {
		return ErrNotQueued
	}
	if cause == nil {
		cause = errors.New("failed")
	}
	return s.settle(tok, cause)
}

// settle acknowledges (cause nil) or fails the delivery with token tok.
func (s *Storage) settle(tok string, cause error) error {
	var err error
	if cause == nil {
		err = s.ack(tok)
	} else {
		_, err = s.nack(context.Background(), tok, cause.Error(), false)
	}
	s.pending.forget(tok)
	return err
}

// ack acknowledges the delivery with token tok. It is one q_ack round trip,
// shared with the acknowledgements other goroutines make meanwhile (see
// internal/group): it returns when the acknowledgement is in Redis.
func (s *Storage) ack(tok string) error {
	id, n, pop, err := parseToken(tok)
	if err != nil {
		return err
	}
	_, err = s.acks.Do(ackItem{id, n, pop})
	return err
}

// ackItem is one delivery to acknowledge.
type ackItem struct {
	id  string
	n   int
	pop string
}

// flushAcks acknowledges a batch of deliveries in one q_ack.
func (s *Storage) flushAcks(items []ackItem) ([]struct{}, error) {
	args := make([]any, 0, 3*len(items))
	for _, it := range items {
		args = append(args, it.id, it.n, it.pop)
	}
	res, err := s.run(context.Background(), "ack", qAckScript, s.qkeys, args...)
	if err != nil {
		return nil, err
	}
	if codes, _ := res.([]any); len(codes) != len(items) {
		return nil, fmt.Errorf("%w: unexpected reply from the ack script: %v", ErrCorrupt, clip(fmt.Sprint(res)))
	}
	return make([]struct{}, len(items)), nil
}

// nack fails a delivery; now dead-letters it whatever its count. It returns
// the script's answer: 1 retry scheduled, 2 dead-lettered, 0 stale.
func (s *Storage) nack(ctx context.Context, tok, reason string, now bool) (int64, error) {
	id, n, pop, err := parseToken(tok)
	if err != nil {
		return 0, err
	}
	reason = redactUserinfo(reason)
	if len(reason) > maxReasonLen {
		reason = strings.ToValidUTF8(reason[:maxReasonLen], "") + "..."
	}
	force := "0"
	if now {
		force = "1"
	}
	res, err := s.run(ctx, "nack", qNackScript, s.qkeys, id, n, pop, reason,
		s.cfg.retryDelay.Milliseconds(), s.cfg.maxDeliveries, force)
	v, _ := res.(int64)
	return v, err
}

// settleMiscredited is called as request r starts. If r is a GET without
// a body (a Visit), Colly granted it its URL through Visited before
// starting it; if that grant was credited to a delivery of the same URL
// waiting in this process (Visited cannot tell the two apart: a queued
// request and a direct Visit of its URL claim the same ID), the grant was
// r's, and Colly will refuse that delivery as already visited, with no
// callback: it is acknowledged now, rather than coming back after the
// visibility timeout to be fetched again. The delivery's own request
// carries its token and is left alone.
func (s *Storage) settleMiscredited(r *colly.Request) {
	if r.Method != "GET" || r.Body != nil || r.URL == nil || s.pending.n.Load() == 0 {
		return
	}
	h, ok := requestHash(wireRequest{URL: r.URL.String()})
	if !ok {
		return
	}
	tok, _ := deliveryToken(r)
	if d := s.pending.miscredited(h, tok); d != nil {
		s.dropDuplicate(d)
	}
}

// dropDuplicate acknowledges a delivery that Colly refuses as already
// visited (it fires no callback for it).
func (s *Storage) dropDuplicate(d *delivery) {
	tok := d.token()
	s.pending.forget(tok)
	if err := s.ack(tok); err != nil {
		s.cfg.logger.Warn("proxyswitch: acknowledging a request already visited",
			"namespace", s.cfg.namespace, "delivery", tok, "err", err)
	}
}

// splitToken returns the request ID and delivery number of a delivery
// token (see parseToken).
func splitToken(tok string) (string, int, error) {
	id, n, _, err := parseToken(tok)
	return id, n, err
}

// parseToken splits a delivery token, "<request ID>:<delivery number>:<pop
// ID>", or "<request ID>:<delivery number>" for a delivery an earlier
// version made (pop ""). Only the form token() writes is accepted.
func parseToken(tok string) (id string, n int, pop string, err error) {
	id, rest, ok := strings.Cut(tok, ":")
	num, pop, hasPop := strings.Cut(rest, ":")
	n, aerr := strconv.Atoi(num)
	if !ok || id == "" || aerr != nil || n < 1 || strconv.Itoa(n) != num || // only the form token() writes
		hasPop && !validPopID(pop) {
		return "", 0, "", fmt.Errorf("%w: bad delivery token %q", ErrNotQueued, tok)
	}
	return id, n, pop, nil
}

func (s *Storage) logErr(what string, r *colly.Request, err error) {
	if err != nil {
		s.cfg.logger.Warn("proxyswitch: "+what+" a queued request",
			"namespace", s.cfg.namespace, "url", r.URL.Redacted(), "err", err)
	}
}

// finalErr reports errors a retry cannot cure: the URL belongs to another
// collector, or a callback aborted the request on purpose.
func finalErr(err error) bool {
	var av *colly.AlreadyVisitedError
	return errors.Is(err, ErrAlreadyVisited) || errors.As(err, &av) ||
		errors.Is(err, colly.ErrAbortedAfterHeaders) || errors.Is(err, colly.ErrAbortedBeforeRequest)
}
