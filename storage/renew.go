package storage

import (
	"context"
	"fmt"
	"time"

	"github.com/gocolly/colly/v2"
)

// A delivered request is invisible to other workers for the visibility
// timeout, which covers the wait from GetRequest to the start of its fetch.
// From then on the fetch may take much longer (a slow site, a long wait for
// a free proxy, retries through several proxies), so while a delivery of
// this process runs, a renewer goroutine extends its in-flight deadline to
// now + visibility every third of the visibility timeout: one q_extend
// round trip per tick for all running deliveries. q_extend touches a
// delivery only while it is still the request's latest and in flight, so
// one that came back and went to another worker is never extended. A
// worker that dies stops renewing, and its requests come back within the
// visibility timeout as before.
//
// The renewer is started by the first fetch that starts when none is
// alive, and exits at a tick that finds nothing running; the Storage needs
// no Close. Renewal of a delivery ends when it is acknowledged or failed,
// when q_extend finds it gone, or WithMaxFetchTime after its fetch started
// (a fetch that never settles: the user's own OnRequest callback aborted
// it after Attach's hook, a callback panicked, Colly dropped it), after
// which it comes back within the visibility timeout.

// Codes of q_extend.lua, per delivery.
const (
	extendGone     = 0 // acknowledged, delivered again, or back in the ready list
	extendExtended = 1 // still in flight: deadline pushed
	extendDead     = 2 // dead-lettered after this delivery: nothing to extend
)

// begin runs in Attach's OnRequest hook when r, the fetch that owns the
// delivery tok, starts: the delivery is renewed from now on. A delivery
// that waited longer than a third of the visibility timeout for its fetch
// to start (for a free Colly thread) may have been delivered again, or be
// about to, before the renewer's next tick; it is extended at once, and if
// it is gone its fetch is aborted (another delivery answers for the
// request). If Redis cannot tell, the fetch goes on: at worst it is a
// duplicate, never a loss.
func (s *Storage) begin(r *colly.Request, tok string) {
	now := time.Now()
	d, spawn, err := s.pending.start(tok, now)
	if err != nil {
		return // not a token of this package; Ack and Nack report it
	}
	if spawn {
		s.pending.renewers.Add(1)
		go s.renew()
	}
	if now.Sub(d.at) <= s.cfg.visibility/3 {
		return
	}
	codes, err := s.extend(context.Background(), []*delivery{d})
	switch {
	case err != nil:
		s.logErr("extending", r, err)
	case codes[0] == extendDead:
		s.pending.stop(d)
	case codes[0] == extendGone:
		s.pending.forget(tok)
		s.pending.reopen(d.id, d.number)
		r.Abort()
		s.cfg.logger.Info("proxyswitch: not fetching a queued request delivered again while it waited",
			"namespace", s.cfg.namespace, "url", r.URL.Redacted(), "delivery", tok)
	}
}

// renew is the renewer goroutine (see above). Redis errors are logged once
// per failure streak and retried at the next tick.
func (s *Storage) renew() {
	defer s.pending.renewers.Add(-1)
	t := time.NewTicker(s.cfg.visibility / 3)
	defer t.Stop()
	failing := false
	for range t.C {
		batch, capped := s.pending.renewals(time.Now())
		for _, tok := range capped {
			s.cfg.logger.Warn("proxyswitch: a queued request ran past the max fetch time and is no longer kept invisible",
				"namespace", s.cfg.namespace, "delivery", tok, "max_fetch_time", s.cfg.maxFetch)
		}
		if len(batch) == 0 {
			return
		}
		codes, err := s.extend(context.Background(), batch)
		if err != nil {
			if !failing {
				s.cfg.logger.Warn("proxyswitch: extending running queued requests failed; retrying at each tick",
					"namespace", s.cfg.namespace, "running", len(batch), "err", err)
			}
			failing = true
			continue
		}
		if failing {
			s.cfg.logger.Info("proxyswitch: extending running queued requests works again",
				"namespace", s.cfg.namespace, "running", len(batch))
			failing = false
		}
		for i, c := range codes {
			if c != extendExtended {
				s.pending.stop(batch[i])
			}
		}
	}
}

// extend runs q_extend for ds in one round trip and returns its code for
// each.
func (s *Storage) extend(ctx context.Context, ds []*delivery) ([]int64, error) {
	args := make([]any, 0, 1+3*len(ds))
	args = append(args, s.cfg.visibility.Milliseconds())
	for _, d := range ds {
		args = append(args, d.id, d.number, d.pop)
	}
	res, err := s.run(ctx, "extend", qExtendScript, s.qkeys, args...)
	if err != nil {
		return nil, err
	}
	arr, _ := res.([]any)
	if len(arr) != len(ds) {
		return nil, fmt.Errorf("%w: unexpected reply from the extend script: %v", ErrCorrupt, res)
	}
	codes := make([]int64, len(arr))
	for i, v := range arr {
		codes[i], _ = v.(int64)
	}
	return codes, nil
}
