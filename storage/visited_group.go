package storage

import (
	"context"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The visited check's round trips, grouped (internal/group): the HMGETs of
// concurrent IsVisited calls share one pipeline, and so do the claims of
// concurrent Visited calls (HSETNX, or with WithVisitedTTL the visit
// script). A lone caller sends its one command at once, as without the
// group; under load (Colly's threads checking links) n round trips become
// one, and one bounded call (with its watchdog goroutine on a client that
// ignores context deadlines) serves the whole batch.
//
// Each command of a pipeline keeps its own reply: a caller gets its own
// answer, or its own command's error (a WRONGTYPE bucket fails only the
// callers whose IDs live there); a failed round trip (no reply within the
// Redis timeout, a connection error) fails every caller of the batch with
// the error it had alone. Each command touches one bucket, so a pipeline
// needs no slot of its own: a Cluster or Ring client splits it by node.
// Commands of one pipeline run in order on their node but are not atomic
// together, which none of them needs: each claim is atomic alone.

// visitedGroupMax bounds the reads (or claims) that share one pipeline.
const visitedGroupMax = 128

// mark is one caller's share of a grouped visited read or claim.
type mark struct {
	// yes: the ID holds a mark without expiry (read), or this claim set
	// the mark (claim).
	yes bool
	// again: the caller runs the script itself: the read found a mark with
	// an expiry (which needs Redis's clock), the claim without a TTL found
	// a mark present (which may have expired), or Redis had not loaded the
	// visit script a pipelined claim called by its digest.
	again bool
	// owner: the mark is live and was claimed by a delivery of the queued
	// request with this ID (see visited.go); legacyOwner for a mark an
	// earlier version wrote, which names no claimer; "" for any other.
	owner string
	err   error // this caller's failure
}

// claimItem is one Visited call's claim: the ID, and the queue request ID
// of the delivery it is made for ("" for none), written into the mark.
type claimItem struct {
	id    uint64
	owner string
}

// legacyOwner is the owner reported for a mark an earlier version wrote
// ("0" or "<expiry>" alone, naming no claimer; see visited.go). It is not
// a request ID (validOwner).
const legacyOwner = "legacy"

// markValue is the value a claim without a TTL writes: "0|<queue request
// ID>" for a claim made for a queued delivery, "0|" for any other. Either
// way the "|" tells it from an earlier version's mark.
func markValue(owner string) string {
	return "0|" + owner
}

// initVisitedGroups sets up the grouped round trips of the visited check.
func (s *Storage) initVisitedGroups() {
	s.reads.Corrupt, s.reads.Max, s.reads.Flush = ErrCorrupt, visitedGroupMax, s.flushReads
	s.claims.Corrupt, s.claims.Max, s.claims.Flush = ErrCorrupt, visitedGroupMax, s.flushClaims
}

// flushReads reads the marks of a batch of IsVisited calls: one HMGET for
// a lone caller, else one pipeline of them.
func (s *Storage) flushReads(ids []uint64) ([]mark, error) {
	ctx, out := context.Background(), make([]mark, len(ids))
	if len(ids) == 1 {
		key := s.bucketOf(ids[0])
		vals, err := call(ctx, s.cfg.redisTimeout, s.inline, "is visited", func(ctx context.Context) ([]any, error) {
			return s.rdb.HMGet(ctx, key, visitedField(ids[0])).Result()
		})
		out[0] = readMark(key, vals, err)
		return out, nil
	}
	keys := s.bucketsOf(ids)
	cmds, err := call(ctx, s.cfg.redisTimeout, s.inline, "is visited", func(ctx context.Context) ([]redis.Cmder, error) {
		return s.pipelined(ctx, len(ids), func(p redis.Pipeliner, i int) redis.Cmder {
			return p.HMGet(ctx, keys[i], visitedField(ids[i]))
		})
	})
	for i := range out {
		if err != nil {
			out[i] = mark{err: withKey(err, keys[i])}
			continue
		}
		c, ok := cmds[i].(*redis.SliceCmd)
		if !ok {
			out[i] = mark{err: fmt.Errorf("%w: key %s: HMGET replied with %T", ErrCorrupt, keys[i], cmds[i])}
			continue
		}
		vals, cerr := c.Result()
		out[i] = readMark(keys[i], vals, cmdErr("is visited", cerr))
	}
	return out, nil
}

// readMark is what an HMGET of one field of key tells IsVisited.
func readMark(key string, vals []any, err error) mark {
	if err != nil {
		return mark{err: withKey(err, key)}
	}
	if len(vals) != 1 {
		return mark{err: fmt.Errorf("%w: key %s: HMGET replied %d values for one field", ErrCorrupt, key, len(vals))}
	}
	switch v := vals[0].(type) {
	case nil:
		return mark{}
	case string:
		if v == "0" {
			return mark{yes: true, owner: legacyOwner}
		}
		if owner, ok := strings.CutPrefix(v, "0|"); ok && (owner == "" || validOwner(owner)) {
			return mark{yes: true, owner: owner}
		}
	}
	return mark{again: true}
}

// flushClaims claims the IDs of a batch of Visited calls: without a TTL
// one HSETNX each, with one the visit script; a lone caller sends its
// command alone, a batch one pipeline of them.
func (s *Storage) flushClaims(items []claimItem) ([]mark, error) {
	ctx, out := context.Background(), make([]mark, len(items))
	ttl := s.cfg.visitedTTL.Milliseconds()
	if len(items) == 1 {
		key, field := s.bucketOf(items[0].id), visitedField(items[0].id)
		if ttl == 0 {
			set, err := call(ctx, s.cfg.redisTimeout, s.inline, "visited", func(ctx context.Context) (bool, error) {
				return s.rdb.HSetNX(ctx, key, field, markValue(items[0].owner)).Result()
			})
			out[0] = setMark(key, set, err)
		} else {
			n, err := s.run(ctx, "visited", visitScript, []string{key}, field, ttl, items[0].owner)
			out[0] = claimReply(n, err)
		}
		return out, nil
	}
	keys := make([]string, len(items))
	for i, it := range items {
		keys[i] = s.bucketOf(it.id)
	}
	cmds, err := call(ctx, s.cfg.redisTimeout, s.inline, "visited", func(ctx context.Context) ([]redis.Cmder, error) {
		return s.pipelined(ctx, len(items), func(p redis.Pipeliner, i int) redis.Cmder {
			if ttl == 0 {
				return p.HSetNX(ctx, keys[i], visitedField(items[i].id), markValue(items[i].owner))
			}
			return visitScript.EvalSha(ctx, p, keys[i:i+1], visitedField(items[i].id), ttl, items[i].owner)
		})
	})
	for i := range out {
		if err != nil {
			out[i] = mark{err: withKey(err, keys[i])}
			continue
		}
		switch c := cmds[i].(type) {
		case *redis.BoolCmd:
			set, cerr := c.Result()
			out[i] = setMark(keys[i], set, cmdErr("visited", cerr))
		case *redis.Cmd:
			n, cerr := c.Result()
			switch {
			case redis.HasErrorPrefix(cerr, "NOSCRIPT"):
				out[i] = mark{again: true} // s.run loads it
			case cerr != nil:
				out[i] = mark{err: cmdErr("visited", cerr)}
			default:
				out[i] = claimReply(n, nil)
			}
		default:
			out[i] = mark{err: fmt.Errorf("%w: key %s: a claim replied with %T", ErrCorrupt, keys[i], cmds[i])}
		}
	}
	return out, nil
}

// claimReply is what visit.lua's reply n tells a claim: 1 claimed, 0
// visited, 2 visited by an earlier version's mark, a request ID visited by
// that queued request.
func claimReply(n any, err error) mark {
	if err != nil {
		return mark{err: err}
	}
	if owner, ok := n.(string); ok && validOwner(owner) {
		return mark{owner: owner}
	}
	if n == int64(2) {
		return mark{owner: legacyOwner}
	}
	return mark{yes: n == int64(1)}
}

// validOwner reports whether v is a queue request ID as q_add writes them
// (decimal digits).
func validOwner(v string) bool {
	if v == "" || len(v) > 20 {
		return false
	}
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return false
		}
	}
	return true
}

// setMark is what an HSETNX of key tells a claim without a TTL.
func setMark(key string, set bool, err error) mark {
	switch {
	case err != nil:
		return mark{err: withKey(err, key)}
	case set:
		return mark{yes: true}
	}
	return mark{again: true}
}

// bucketsOf returns the bucket key of each ID.
func (s *Storage) bucketsOf(ids []uint64) []string {
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = s.bucketOf(id)
	}
	return keys
}

// pipelined sends the n commands cmd queues (one per call, i from 0) in one
// pipeline and returns them in order, each with its own reply or error.
// Exec's error is only the first command's that failed: go-redis sets every
// command's own, and on a Cluster or Ring client a node that fails takes
// only its own commands down, so each caller reads its command alone (a
// claim that ran on a healthy node is reported set, not failed). The batch
// fails as a whole only when call's bound passes first.
func (s *Storage) pipelined(ctx context.Context, n int, cmd func(p redis.Pipeliner, i int) redis.Cmder) ([]redis.Cmder, error) {
	p := s.rdb.Pipeline()
	cmds := make([]redis.Cmder, n)
	for i := range cmds {
		cmds[i] = cmd(p, i)
	}
	_, _ = p.Exec(ctx)
	return cmds, nil
}

// cmdErr is the error of one command of a pipeline as call would report
// it had the command run alone.
func cmdErr(op string, err error) error {
	if err == nil || err == redis.Nil {
		return err
	}
	return redisErr(op, err)
}
