package storage

import (
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"time"
)

// Colly checks a URL with IsVisited and then, if it was not visited, calls
// Visited, in Collector.requestCheck and (for each redirect hop) in
// checkRedirectFunc; it also calls IsVisited alone from HasVisited and
// HasPosted. The two calls are not atomic, so here the decision lives in
// Visited:
//
//   - IsVisited only reads. It never claims, so HasVisited, HasPosted and any
//     user code that asks never mark a URL as visited.
//   - Visited is a set-if-absent (one Lua script). Of all the collectors that
//     passed IsVisited for the same ID at the same time, in any process,
//     exactly one gets nil; the others get ErrAlreadyVisited, which Colly
//     returns from Visit (or hands to OnError on a redirect), so they do not
//     fetch.
//
// The alternative, claiming inside IsVisited, would make every HasVisited
// call mark its URL and silently drop it from the crawl.
//
// Requests delivered by the queue add one twist (see pending.go): a request
// delivered again after its worker died (or failed, or was requeued) must
// be fetched again although that earlier delivery's claim is still there,
// and a delivery that Colly refuses as already visited must be
// acknowledged, since Colly fires no callback for it, including when the
// claim that refuses it was a direct Visit of its URL made in this process
// while it waited for a thread. To tell the two apart, a claim made for a
// queued delivery writes the queue request's ID into the mark
// ("0|<request ID>", or "<expiry>|<request ID>" with a TTL), any other
// claim an empty owner ("0|", "<expiry>|"): a delivery is let through a
// mark only if that mark names its own request. A mark set by another
// request of the same URL (a second queue entry of it, a direct Visit)
// refuses it, whatever its delivery number: a URL queued twice whose first
// entry's worker died before fetching is not fetched twice.
//
// A mark without "|" ("0", "<expiry>") was written by a version before
// owners were recorded: it names no claimer, so the earlier rule applies to
// it: a redelivery (delivery number > 1) is let through, a first delivery
// refused. A request whose earlier delivery claimed the URL under that
// version and then went back to the ready list (its worker died) is so
// still fetched after an upgrade.

// ownsMark reports whether a mark of owner owner (see isVisited) lets
// delivery d through: the mark names d's own request, or it is an earlier
// version's mark and d is a redelivery.
func (d *delivery) ownsMark(owner string) bool {
	if owner == legacyOwner {
		return d.number > 1
	}
	return owner != "" && owner == d.id
}

// IsVisited implements Colly's storage.Storage. It reports whether the
// request ID holds a live visited mark in the namespace, and writes nothing.
// It is one Redis round trip (HMGET, shared with the IsVisited calls of
// other goroutines made meanwhile; a mark with an expiry takes a second,
// a script that compares it with Redis's clock).
func (s *Storage) IsVisited(requestID uint64) (bool, error) {
	if unlock := s.pending.lockVisited(requestID); unlock != nil {
		defer unlock()
	}
	d := s.pending.unclaimed(requestID)
	visited, owner, err := s.isVisited(requestID)
	if err != nil {
		s.handBack(d, err)
		return false, err
	}
	if visited && d != nil && d.ownsMark(owner) {
		// The mark is an earlier delivery of this request's own (its worker
		// died, or it failed, or it was requeued): fetch again.
		return false, nil
	}
	if d == nil {
		s.revisits.note(requestID, visited, time.Now())
	}
	if visited && d != nil {
		// Colly will refuse this delivered request before sending it and
		// fire no callback: acknowledge it here.
		s.dropDuplicate(d)
	}
	return visited, nil
}

// isVisited reads the mark with HMGET (as HGET, but a missing field, the
// usual answer for a new URL, is a nil in the reply rather than go-redis's
// redis.Nil error, whose retry checks alone cost some 16 allocations); only
// a mark with an expiry needs Redis's clock, and so the script. The HMGETs
// of concurrent callers share one pipeline (s.reads, see flushReads).
// It also returns the mark's owner, the queue request ID of the delivery
// that claimed it ("" for none, legacyOwner for an earlier version's mark).
func (s *Storage) isVisited(id uint64) (bool, string, error) {
	r, err := s.reads.Do(id)
	if err != nil {
		return false, "", err
	}
	if !r.again {
		return r.yes, r.owner, r.err
	}
	n, err := s.run(context.Background(), "is visited", isVisitedScript, s.visitedKey(id), visitedField(id))
	if err != nil {
		return false, "", err
	}
	if owner, ok := n.(string); ok && validOwner(owner) {
		return true, owner, nil
	}
	if n == int64(2) {
		return true, legacyOwner, nil
	}
	return n == int64(1), "", nil
}

// Visited implements Colly's storage.Storage. It claims the request ID for
// the caller, atomically across every process sharing the namespace: nil
// means the caller may fetch, ErrAlreadyVisited that someone else claimed
// it first (and Colly then does not fetch). With WithVisitedTTL the mark
// expires; an expired mark can be claimed again. Without a TTL it is one
// HSETNX, plus a script if a mark is present (it may carry another
// writer's expiry); with a TTL it is one script. Concurrent calls share
// that first round trip (see visited_group.go).
func (s *Storage) Visited(requestID uint64) error {
	if unlock := s.pending.lockVisited(requestID); unlock != nil {
		defer unlock()
	}
	d := s.pending.unclaimed(requestID)
	owner := ""
	if d != nil {
		owner = d.id
	}
	claimed, markOwner, err := s.claim(requestID, owner)
	if err != nil {
		s.handBack(d, err)
		return err
	}
	if claimed {
		if d != nil {
			s.pending.credit(d)
		} else {
			s.revisits.visited(requestID, true, time.Now())
		}
		return nil
	}
	if d != nil && d.ownsMark(markOwner) {
		// The mark is an earlier delivery of this request's own.
		s.pending.claim(d)
		return nil
	}
	if d != nil {
		s.dropDuplicate(d)
		return ErrAlreadyVisited
	}
	if s.revisits.visited(requestID, false, time.Now()) {
		return nil // Colly revisits on purpose: a Retry following a redirect
	}
	return ErrAlreadyVisited
}

// handBack is called when the visited check of a pending delivery d (nil:
// none) failed with err. Colly drops the request on that error, firing no
// callback, so the delivery would come back only after the visibility
// timeout, counted: on a network slower than the Redis timeout, deliveries
// the worker never could check would send a request to the dead-letter list
// unfetched. For a Redis failure (not corrupt data, which would fail every
// time) it is handed back at once instead (q_release: to the end of the
// ready list, not counted), if it is still the request's latest delivery;
// if that fails too, it comes back after the visibility timeout as before.
// A claim that reached Redis though its reply was lost names the request,
// so its next delivery is let through.
func (s *Storage) handBack(d *delivery, err error) {
	if d == nil || !errors.Is(err, ErrRedis) || errors.Is(err, ErrCorrupt) {
		return
	}
	s.pending.forget(d.token())
	if _, rerr := s.run(context.Background(), "release", qReleaseScript, s.qkeys, d.id, d.number, d.pop); rerr != nil {
		s.cfg.logger.Warn("proxyswitch: handing back a queued request whose visited check failed",
			"namespace", s.cfg.namespace, "delivery", d.token(), "err", rerr)
	}
}

// Colly calls Visited for an ID that IsVisited just reported visited in one
// place only: when a Request.Retry() follows a redirect (checkRedirectFunc
// skips the revisit check for a retry, and marks the target again). With
// Colly's in-memory storage that mark always succeeds and the retry goes
// on; here the mark is already set, so Visited would refuse it, though no
// other request took the URL from this one.
//
// So revisits remembers, for revisitWindow, the answers IsVisited gave for
// each ID (outside a queued delivery): how many callers were told "not
// visited" and how many "visited". Colly calls Visited right after its
// IsVisited, so a Visited that finds the mark set answers for one of them:
// for a caller told "not visited" if there is one (it lost a race to
// another request: ErrAlreadyVisited), else for one told "visited" (the
// retry: let through, nil). Only a retry after a redirect racing a first
// visit of the same URL in the same process, within the window, can be
// mistaken for the other: a refused retry, or a URL fetched twice; never
// one lost.
const (
	revisitWindow = time.Second
	maxRevisits   = 1 << 16 // IDs remembered at once; beyond, answers older than the window go
)

type revisits struct {
	mu sync.Mutex
	at map[uint64]answers
}

type answers struct {
	last    time.Time // the latest answer
	no, yes int       // callers told "not visited" / "visited", not yet matched by a Visited
}

// note records that IsVisited told a caller visited (yes) or not.
func (v *revisits) note(id uint64, yes bool, now time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.at == nil {
		v.at = make(map[uint64]answers)
	}
	if len(v.at) >= maxRevisits {
		for k, e := range v.at {
			if now.Sub(e.last) > revisitWindow {
				delete(v.at, k)
			}
		}
		if len(v.at) >= maxRevisits {
			clear(v.at) // a burst within one window: forget it (at worst a refused retry)
		}
	}
	e := v.at[id]
	if now.Sub(e.last) > revisitWindow {
		e = answers{}
	}
	e.last = now
	if yes {
		e.yes++
	} else {
		e.no++
	}
	v.at[id] = e
}

// visited matches a Visited call for id with a caller IsVisited answered,
// and reports whether that caller was told "visited" (a deliberate
// revisit). claimed says whether this Visited set the mark.
func (v *revisits) visited(id uint64, claimed bool, now time.Time) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	e, ok := v.at[id]
	if !ok {
		return false
	}
	if now.Sub(e.last) > revisitWindow {
		delete(v.at, id)
		return false
	}
	revisit := false
	switch {
	case e.no > 0:
		e.no--
	case e.yes > 0 && !claimed:
		e.yes--
		revisit = true
	}
	if e.no == 0 && e.yes == 0 {
		delete(v.at, id)
	} else {
		v.at[id] = e
	}
	return revisit
}

// claim sets the mark if it is absent or expired. Without a TTL of its own
// it tries HSETNX first: one plain command for the usual case, a new URL;
// only a present mark, which may have expired, needs the script. With a TTL
// it is the script. The claims of concurrent callers share one pipeline
// (s.claims, see flushClaims).
//
// owner is the queue request ID of the delivery the claim is made for (""
// for none), written into the mark. If the mark was present, claim returns
// its owner (legacyOwner for an earlier version's mark).
func (s *Storage) claim(id uint64, owner string) (claimed bool, markOwner string, err error) {
	r, err := s.claims.Do(claimItem{id, owner})
	if err != nil {
		return false, "", err
	}
	if !r.again {
		return r.yes, r.owner, r.err
	}
	n, err := s.run(context.Background(), "visited", visitScript, s.visitedKey(id), visitedField(id), s.cfg.visitedTTL.Milliseconds(), owner)
	r = claimReply(n, err)
	return r.yes, r.owner, r.err
}

func (s *Storage) visitedKey(id uint64) []string {
	return []string{s.bucketOf(id)}
}

// bucketOf is the key of the visited bucket holding id's mark.
func (s *Storage) bucketOf(id uint64) string {
	return s.keys.bucket(id % uint64(s.cfg.buckets))
}

func visitedField(id uint64) string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], id)
	return string(b[:])
}
