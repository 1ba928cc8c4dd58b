package storage

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/gocolly/colly/v2"
)

// Colly's queue has no acknowledge step, so Attach installs three hooks on
// the collector that answer for each delivered request, found by the
// delivery token GetRequest wrote into its context:
//
//   - OnRequest records which fetch owns the delivery: the first request
//     that runs with the token. Requests visited from its callbacks share
//     its context (colly.Request.Visit), so without this a child's outcome
//     would answer for the parent. It also marks the delivery as running,
//     so that it stays invisible to other workers until it settles (see
//     renew.go).
//   - OnScraped (the end of a successful fetch) acknowledges it.
//   - OnError fails it (Nack: retried after the retry delay, dead-lettered
//     after the last delivery) or, when WithRetryIf says the error is final
//     (a 404, a redirect to a URL already visited), acknowledges it. A
//     Request.Retry() made in a later OnError callback takes the delivery
//     over, and its success acknowledges it.
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
// request that runs with the token (a Retry) takes it over.
const ownerFailed = "failed:"

// Attach installs the acknowledgement hooks on c: OnRequest, OnError and
// OnScraped callbacks. Call it once per collector, before registering your
// own OnError callbacks if they call Request.Retry. It is needed only for
// collectors that run requests from this Storage's queue; others are not
// affected (their requests carry no delivery token).
func (s *Storage) Attach(c *colly.Collector) {
	c.OnRequest(func(r *colly.Request) {
		tok, ok := deliveryToken(r)
		if !ok {
			return
		}
		owner, _ := r.Ctx.GetAny(ctxOwner).(string)
		if owner == "" || strings.HasPrefix(owner, ownerFailed) {
			r.Ctx.Put(ctxOwner, strconv.FormatUint(uint64(r.ID), 10))
			if !r.IsAbort() { // an earlier OnRequest callback aborted it
				s.begin(r, tok)
			}
		}
	})
	c.OnScraped(func(resp *colly.Response) {
		if tok, ok := s.owned(resp.Request); ok {
			s.logErr("acknowledging", resp.Request, s.settle(tok, nil))
		}
	})
	c.OnError(func(resp *colly.Response, err error) {
		tok, ok := s.owned(resp.Request)
		if !ok {
			return
		}
		if !s.cfg.retryIf(resp, err) {
			s.logErr("acknowledging", resp.Request, s.settle(tok, nil))
			return
		}
		resp.Request.Ctx.Put(ctxOwner, ownerFailed+strconv.FormatUint(uint64(resp.Request.ID), 10))
		s.logErr("failing", resp.Request, s.settle(tok, err))
	})
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
		err = s.ack(context.Background(), tok)
	} else {
		_, err = s.nack(context.Background(), tok, cause.Error(), false)
	}
	s.pending.forget(tok)
	return err
}

func (s *Storage) ack(ctx context.Context, tok string) error {
	id, n, err := splitToken(tok)
	if err != nil {
		return err
	}
	_, err = s.run(ctx, "ack", qAckScript, s.qkeys, id, n)
	return err
}

// nack fails a delivery; now dead-letters it whatever its count. It returns
// the script's answer: 1 retry scheduled, 2 dead-lettered, 0 stale.
func (s *Storage) nack(ctx context.Context, tok, reason string, now bool) (int64, error) {
	id, n, err := splitToken(tok)
	if err != nil {
		return 0, err
	}
	if len(reason) > maxReasonLen {
		reason = strings.ToValidUTF8(reason[:maxReasonLen], "") + "..."
	}
	force := "0"
	if now {
		force = "1"
	}
	res, err := s.run(ctx, "nack", qNackScript, s.qkeys, id, n, reason,
		s.cfg.retryDelay.Milliseconds(), s.cfg.maxDeliveries, force)
	v, _ := res.(int64)
	return v, err
}

// dropDuplicate acknowledges a delivery that Colly refuses as already
// visited (it fires no callback for it).
func (s *Storage) dropDuplicate(d *delivery) {
	tok := d.token()
	s.pending.forget(tok)
	if err := s.ack(context.Background(), tok); err != nil {
		s.cfg.logger.Warn("proxyswitch: acknowledging a request already visited",
			"namespace", s.cfg.namespace, "delivery", tok, "err", err)
	}
}

func splitToken(tok string) (string, int, error) {
	id, num, ok := strings.Cut(tok, ":")
	n, err := strconv.Atoi(num)
	if !ok || id == "" || err != nil || n < 1 || strconv.Itoa(n) != num { // only the form token() writes

		return "", 0, fmt.Errorf("%w: bad delivery token %q", ErrNotQueued, tok)
	}
	return id, n, nil
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
