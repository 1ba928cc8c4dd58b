package storage

import (
	"context"
	"encoding/binary"

	"github.com/redis/go-redis/v9"
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
// delivered again after its worker died must be fetched again although the
// dead worker's claim is still there, and a first delivery that Colly
// refuses as already visited must be acknowledged, since Colly fires no
// callback for it.

// IsVisited implements Colly's storage.Storage. It reports whether the
// request ID holds a live visited mark in the namespace, and writes nothing.
// It is one Redis round trip (HGET; a mark with an expiry takes a second,
// a script that compares it with Redis's clock).
func (s *Storage) IsVisited(requestID uint64) (bool, error) {
	d := s.pending.unclaimed(requestID)
	if d != nil && d.number > 1 {
		// Redelivered: the mark is the failed delivery's own. Fetch again.
		return false, nil
	}
	visited, err := s.isVisited(requestID)
	if err != nil {
		return false, err
	}
	if visited && d != nil {
		// Colly will refuse this delivered request before sending it and
		// fire no callback: acknowledge it here.
		s.dropDuplicate(d)
	}
	return visited, nil
}

// isVisited reads the mark with HGET; only a mark with an expiry needs
// Redis's clock, and so the script.
func (s *Storage) isVisited(id uint64) (bool, error) {
	ctx, key, field := context.Background(), s.visitedKey(id), visitedField(id)
	v, err := call(ctx, s.cfg.redisTimeout, s.inline, "is visited", func(ctx context.Context) (string, error) {
		return s.rdb.HGet(ctx, key[0], field).Result()
	})
	switch {
	case err == redis.Nil:
		return false, nil
	case err != nil:
		return false, withKey(err, key[0])
	case v == "0":
		return true, nil
	}
	n, err := s.run(ctx, "is visited", isVisitedScript, key, field)
	return n == int64(1), err
}

// Visited implements Colly's storage.Storage. It claims the request ID for
// the caller, atomically across every process sharing the namespace: nil
// means the caller may fetch, ErrAlreadyVisited that someone else claimed
// it first (and Colly then does not fetch). With WithVisitedTTL the mark
// expires; an expired mark can be claimed again. Without a TTL it is one
// HSETNX, plus a script if a mark is present (it may carry another
// writer's expiry); with a TTL it is one script.
func (s *Storage) Visited(requestID uint64) error {
	claimed, err := s.claim(requestID)
	if err != nil {
		return err
	}
	d := s.pending.unclaimed(requestID)
	if claimed {
		if d != nil {
			s.pending.claim(d)
		}
		return nil
	}
	if d != nil && d.number > 1 {
		s.pending.claim(d)
		return nil
	}
	if d != nil {
		s.dropDuplicate(d)
	}
	return ErrAlreadyVisited
}

// claim sets the mark if it is absent or expired. Without a TTL of its own
// it tries HSETNX first: one plain command for the usual case, a new URL;
// only a present mark, which may have expired, needs the script.
func (s *Storage) claim(id uint64) (bool, error) {
	ctx, key, field := context.Background(), s.visitedKey(id), visitedField(id)
	if s.cfg.visitedTTL == 0 {
		set, err := call(ctx, s.cfg.redisTimeout, s.inline, "visited", func(ctx context.Context) (bool, error) {
			return s.rdb.HSetNX(ctx, key[0], field, "0").Result()
		})
		if err != nil || set {
			return set, withKey(err, key[0])
		}
	}
	n, err := s.run(ctx, "visited", visitScript, key, field, s.cfg.visitedTTL.Milliseconds())
	return n == int64(1), err
}

func (s *Storage) visitedKey(id uint64) []string {
	return []string{s.keys.bucket(id % uint64(s.cfg.buckets))}
}

func visitedField(id uint64) string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], id)
	return string(b[:])
}
