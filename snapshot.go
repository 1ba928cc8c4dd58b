package proxyswitch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// A pool that Redis lost comes back by itself. Redis may lose a pool
// without any operator asking: a restart without persistence, a failover
// to an empty replica, a flush. Every operator write leaves a mark in the
// pool's meta hash that survives an empty pool (pool_update.lua and
// clear.lua set "emptied" when they leave the pool empty, and every change
// moves its generation, "version"), so an empty pool hash without the mark
// is a lost one, never one emptied on purpose.
//
// Every Switch keeps a copy of each pool it leases from (a poolSnapshot:
// the proxies, the dead list, the gateways and labels hashes, the recorded
// concurrency, the generation; a change of labels alone moves the
// generation too).
// lease.lua returns the generation with every lease; when it differs from
// the copy's, the copy is read again in the background, by one goroutine
// at a time and at most once per snapshotInterval, in pages of
// pageSize proxies (pool_snapshot.lua, paged.go), so the lease path never waits
// for it and no round trip is added to it. When lease.lua finds the pool
// empty and unmarked, the Switch re-seeds it from its copy (pool_seed.lua,
// one call per process at a time) and leases again. The script seeds only
// while the pool is still absent and unmarked: concurrent re-seeds by many
// servers write it once, and an operator's write made in between (an Add,
// a Replace with an empty list, a Clear) is never overwritten. Switches
// with a fallback use the same copy and the same re-seed when they resume
// (fallbackloop.go).
//
// What the copy does not hold is lost with Redis: quarantines, strikes,
// cooldowns, leases, sessions. Exclusivity survives the lost leases: the
// requests that held them may still be running, so the re-seed holds every
// proxy out of every site's rotation for the attempt bound (the attempt
// timeout when set, else the lease TTL; see attemptBound), the same hold
// the fallback's switch-over uses, recorded in the meta hash ("hold") and
// applied by lease.lua when it builds a site's free set. Set
// Timeouts.Attempt to get the pool back within seconds.

const (
	// snapshotInterval is the least time between two reads of the copy
	// that lease replies start.
	snapshotInterval = time.Second
)

// errSnapshotMoved: the pool changed while its copy was read; the copy
// kept is the one before, and the next lease reply starts another read.
var errSnapshotMoved = errors.New("the pool changed while it was read")

// poolSnapshot is the copy of a pool a Switch keeps. Immutable once stored.
type poolSnapshot struct {
	version  int64 // the pool's generation ("version" in its meta hash)
	slots    int64 // the recorded concurrency, 0 for none
	pairs    []any // id, URL, ...: the pool hash
	gateways []any // id, template, ...: the gateways hash (gateway.go)
	labels   []any // id, "k=v,k=v", ...: the labels hash (labels.go)
	dead     []any // id, "<ms>|<reason>", ...: the dead list

	gwOnce sync.Once
	gwByID map[string]string // gateways by ID, built on the first gatewayOf
}

// gatewayOf returns the gateway template of proxy id as the copy has it, ""
// for none or no copy. A session rotated in since the copy was read is not
// in it: "" says "not known here", never "plain" (penalize asks Redis then).
func (s *poolSnapshot) gatewayOf(id string) string {
	if s == nil || len(s.gateways) == 0 {
		return ""
	}
	s.gwOnce.Do(func() {
		m := make(map[string]string, len(s.gateways)/2)
		for i := 0; i+1 < len(s.gateways); i += 2 {
			k, _ := s.gateways[i].(string)
			t, _ := s.gateways[i+1].(string)
			m[k] = t
		}
		s.gwByID = m
	})
	return s.gwByID[id]
}

// labelsByID returns the labels of the copy's proxies by ID.
func (s *poolSnapshot) labelsByID() map[string]string {
	if s == nil {
		return nil
	}
	m := make(map[string]string, len(s.labels)/2)
	for i := 0; i+1 < len(s.labels); i += 2 {
		id, _ := s.labels[i].(string)
		l, _ := s.labels[i+1].(string)
		m[id] = l
	}
	return m
}

// size is the number of proxies in the copy.
func (s *poolSnapshot) size() int {
	if s == nil {
		return 0
	}
	return len(s.pairs) / 2
}

// snapState is the copy of one redisPool and what refreshes and re-seeds it.
type snapState struct {
	cur     atomic.Pointer[poolSnapshot]
	busy    atomic.Bool  // a background refresh is running
	startAt atomic.Int64 // unix ns at which the last background refresh started

	readMu sync.Mutex // one read of the copy at a time: a later read is never overwritten by an earlier one

	seedMu   sync.Mutex
	seeding  *seedFlight  // the re-seed in flight, nil for none
	reseeded atomic.Int64 // proxies this process wrote into a Redis that had lost the pool
}

// seedFlight is one re-seed; callers that find one in flight wait for it.
type seedFlight struct {
	done chan struct{}
	n    int
	err  error
}

// attemptBound is the longest an attempt through a proxy may run: the
// attempt timeout when set, else the lease TTL. It is how long a re-seeded
// pool and the fallback's local shard are held before they lease.
func (c *config) attemptBound() time.Duration {
	if c.attemptTimeout > 0 {
		return c.attemptTimeout
	}
	return c.leaseTTL
}

// noteVersion compares the generation a lease reply carried with the copy's
// and, when they differ, reads the copy again in the background (one
// refresh at a time, at most once per snapshotInterval).
func (p *redisPool) noteVersion(v int64) {
	if s := p.snap.cur.Load(); s != nil && s.version == v {
		return
	}
	now := time.Now().UnixNano()
	if now-p.snap.startAt.Load() < int64(snapshotInterval) || !p.snap.busy.CompareAndSwap(false, true) {
		return
	}
	p.snap.startAt.Store(now)
	if !p.sw.renew.background() {
		p.snap.busy.Store(false)
		return
	}
	go func() {
		defer p.sw.renew.backgroundDone()
		defer p.snap.busy.Store(false)
		if _, err := p.refreshSnapshot(context.Background()); err != nil {
			p.cfg.logger.Debug("proxyswitch: reading the copy of the pool failed", "pool", p.name, "err", err)
		}
	}()
}

// emptied records that the pool is empty on purpose at generation v (a
// lease found it so): the copy becomes empty, and is never re-seeded. It
// never waits for a read of the copy under way; should that read store an
// older copy after this, the next lease that finds the pool empty empties
// the copy again.
func (p *redisPool) emptied(v int64) {
	if s := p.snap.cur.Load(); s != nil && s.version == v && s.size() == 0 {
		return
	}
	p.snap.cur.Store(&poolSnapshot{version: v})
}

// refreshSnapshot reads the copy of the pool, page by page. It keeps the
// copy it has when Redis lost the pool (empty and unmarked: lost reports
// it) or when the pool changed while it read (errSnapshotMoved).
func (p *redisPool) refreshSnapshot(ctx context.Context) (lost bool, err error) {
	p.snap.readMu.Lock()
	defer p.snap.readMu.Unlock()
	var snap poolSnapshot
	var emptied bool
	first := true
	// The pool hash, then the dead list: every page of the same generation.
	for _, key := range []string{p.keys.proxies(), p.keys.dead()} {
		dead := key == p.keys.dead()
		seen := map[string]bool{}
		err := snapshotPages(ctx, p.rdb, p.cfg.redisTimeout, key, p.keys.meta(), func(version, slots int64, mark bool, kv []any) error {
			if !first && version != snap.version {
				return errSnapshotMoved
			}
			if !dead {
				snap.slots, emptied = slots, mark
			}
			snap.version, first = version, false
			for i := 0; i+1 < len(kv); i += 2 {
				id, _ := kv[i].(string)
				v, _ := kv[i+1].(string)
				if id == "" || v == "" || seen[id] { // HSCAN may return an entry twice
					continue
				}
				seen[id] = true
				if dead {
					snap.dead = append(snap.dead, id, v)
				} else {
					snap.pairs = append(snap.pairs, id, v)
				}
			}
			return nil
		})
		if err != nil {
			return false, err
		}
	}
	if len(snap.pairs) == 0 && !emptied {
		return true, nil
	}
	// The gateways and labels hashes, at the same generation (a change of
	// labels moves it too: pool_update.lua).
	for _, h := range []struct {
		key string
		to  *[]any
	}{{p.keys.gateways(), &snap.gateways}, {p.keys.labels(), &snap.labels}} {
		kv, version, err := p.readHash(ctx, h.key)
		if err != nil {
			return false, err
		}
		if version != snap.version {
			return false, errSnapshotMoved
		}
		*h.to = kv
	}
	p.snap.cur.Store(&snap)
	return false, nil
}

// readHash pages through a hash of the pool keyed by proxy ID (the
// gateways or labels hash) and returns its pairs and the pool's generation,
// or errSnapshotMoved if it moved between pages.
func (p *redisPool) readHash(ctx context.Context, key string) ([]any, int64, error) {
	var kv []any
	var version int64
	seen := map[string]bool{}
	first := true
	err := snapshotPages(ctx, p.rdb, p.cfg.redisTimeout, key, p.keys.meta(), func(v, _ int64, _ bool, page []any) error {
		if !first && v != version {
			return errSnapshotMoved
		}
		first, version = false, v
		for i := 0; i+1 < len(page); i += 2 {
			id, _ := page[i].(string)
			val, _ := page[i+1].(string)
			if id == "" || val == "" || seen[id] { // HSCAN may return an entry twice
				continue
			}
			seen[id] = true
			kv = append(kv, id, val)
		}
		return nil
	})
	return kv, version, err
}

// snapshotPages reads hash key (of the pool with meta hash meta, keyed by proxy ID) page by page
// with pool_snapshot.lua, pageSize entries per call, and calls each with
// every page: the pool's generation, recorded concurrency and "emptied"
// mark when the page was read, and the page's id, value pairs.
func snapshotPages(ctx context.Context, rdb redis.Scripter, timeout time.Duration, key, meta string,
	each func(version, slots int64, emptied bool, kv []any) error) error {
	cursor := "0"
	for first := true; first || cursor != "0"; first = false {
		c := cursor
		res, err := roundTrip(ctx, timeout, func(ctx context.Context) ([]any, error) {
			return poolSnapshotScript.Run(ctx, rdb, []string{key, meta}, c, pageSize()).Slice()
		}, nil)
		if err != nil {
			return redisErr("read the pool", err)
		}
		if len(res) < 5 {
			return fmt.Errorf("%w: pool snapshot reply of %d items", ErrCorrupt, len(res))
		}
		version, ok1 := intAt(res, 0)
		mark, ok2 := intAt(res, 1)
		slots, ok3 := intAt(res, 2)
		next, ok4 := res[3].(string)
		n, ok5 := intAt(res, 4)
		if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || n < 0 || len(res) != 5+2*int(n) {
			return fmt.Errorf("%w: malformed pool snapshot reply", ErrCorrupt)
		}
		cursor = next
		if err := each(version, slots, mark == 1, res[5:]); err != nil {
			return err
		}
	}
	return nil
}

// snapshot returns the copy of the pool last read, nil before the first.
func (p *redisPool) snapshot() *poolSnapshot { return p.snap.cur.Load() }

// recoverLost re-seeds the pool from the copy after a lease found it lost.
// It reports whether a lease should be tried again: the copy was written,
// or the pool came back otherwise meanwhile. err is a Redis error.
func (p *redisPool) recoverLost(ctx context.Context) (again bool, err error) {
	if p.snapshot().size() == 0 {
		return false, nil // nothing to seed from: another server may, or an operator
	}
	if _, err := p.reseed(ctx); err != nil {
		return false, err
	}
	return true, nil
}

// reseed writes the copy into a Redis that lost the pool (pool_seed.lua):
// one call per process at a time, the others wait for it. It returns the
// proxies written, 0 when the pool was there (another server seeded it, an
// operator wrote it) or emptied on purpose.
func (p *redisPool) reseed(ctx context.Context) (int, error) {
	p.snap.seedMu.Lock()
	if f := p.snap.seeding; f != nil {
		p.snap.seedMu.Unlock()
		select {
		case <-f.done:
			return f.n, f.err
		case <-ctx.Done():
			return 0, fmt.Errorf("%w: %w", ErrRedis, ctx.Err())
		}
	}
	f := &seedFlight{done: make(chan struct{})}
	p.snap.seeding = f
	p.snap.seedMu.Unlock()
	f.n, f.err = p.seedOnce(ctx)
	p.snap.seedMu.Lock()
	p.snap.seeding = nil
	p.snap.seedMu.Unlock()
	close(f.done)
	return f.n, f.err
}

// seedStageTTL is how long the staged copy of a re-seed outlives its last
// stage call (pool_seed.lua): what a seeder cut off leaves behind.
const seedStageTTL = time.Minute

// seedOnce runs pool_seed.lua with the copy: stage calls of 250 proxies
// each (half a page) into staged keys of this call alone, then one commit
// (and merge calls when the commit set dead marks aside: seedMerge).
func (p *redisPool) seedOnce(ctx context.Context) (int, error) {
	snap := p.snapshot()
	if snap.size() == 0 {
		return 0, nil
	}
	slots := snap.slots
	if slots <= 0 {
		slots = int64(p.cfg.slots)
	}
	hold := p.cfg.attemptBound()
	k := p.keys
	var tok [8]byte
	_, _ = rand.Read(tok[:])
	staged := k.base + ":seed:" + hex.EncodeToString(tok[:])
	keys := []string{k.proxies(), k.meta(), k.dead(), k.order(), staged + ":pool", staged + ":order", staged + ":dead",
		staged + ":gateways", staged + ":labels", k.gateways(), k.labels(), k.gatewayIndex(), k.relabel(), staged + ":aside"}
	byID := func(kv []any) map[string]string {
		m := make(map[string]string, len(kv)/2)
		for i := 0; i+1 < len(kv); i += 2 {
			id, _ := kv[i].(string)
			v, _ := kv[i+1].(string)
			m[id] = v
		}
		return m
	}
	gateways, labels, dead := byID(snap.gateways), byID(snap.labels), byID(snap.dead)
	page := max(1, pageSize()/2) // a proxy costs a few writes (its place in the order)
	for i := 0; i < len(snap.pairs); i += 2 * page {
		part := snap.pairs[i:min(i+2*page, len(snap.pairs))]
		// The gateway templates, labels and dead marks of this part's proxies.
		var extra [3][]any
		for n, m := range []map[string]string{gateways, labels, dead} {
			for j := 0; j < len(part); j += 2 {
				if v, ok := m[part[j].(string)]; ok {
					extra[n] = append(extra[n], part[j], v)
				}
			}
		}
		argv := make([]any, 0, 5+2*len(part))
		argv = append(argv, "stage", seedStageTTL.Milliseconds(), len(part)/2, len(extra[0])/2, len(extra[1])/2)
		argv = append(append(append(append(argv, part...), extra[0]...), extra[1]...), extra[2]...)
		more, err := roundTrip(ctx, p.cfg.redisTimeout, func(ctx context.Context) (int64, error) {
			return poolSeedScript.Run(ctx, p.rdb, keys, argv...).Int64()
		}, nil)
		if err != nil {
			return 0, redisErr("re-seed", err)
		}
		if more == 0 { // the pool is there again, or emptied on purpose
			return 0, nil
		}
	}
	res, err := roundTrip(ctx, p.cfg.redisTimeout, func(ctx context.Context) ([]int64, error) {
		return poolSeedScript.Run(ctx, p.rdb, keys, "commit", snap.version, hold.Milliseconds(), slots, snap.size(), k.base,
			pageSize(), seedStageTTL.Milliseconds()).Int64Slice()
	}, nil)
	if err != nil {
		return 0, redisErr("re-seed", err)
	}
	if len(res) != 2 {
		return 0, fmt.Errorf("%w: re-seed: commit reply %v", ErrCorrupt, res)
	}
	n := res[0]
	if res[1] == 1 {
		p.seedMerge(ctx, keys)
	}
	if n > 0 {
		p.snap.reseeded.Add(n)
		p.cfg.logger.Warn("proxyswitch: Redis had lost the pool; re-seeded it from this server's copy (quarantines and leases were lost with it; every proxy is held for the attempt bound)",
			"pool", p.name, "proxies", n, "dead", len(snap.dead)/2, "generation", snap.version, "hold", hold)
	}
	return int(n), nil
}

// seedMerge puts back, a page per pool_seed.lua "merge" call, the dead marks
// written since the loss that the commit set aside because both they and
// the copy's dead list were too many to merge in one call. The pool is
// there already, its proxies held out of rotation by the re-seed's hold,
// with the copy's marks; a failure here loses marks written since the loss
// only, and is logged, not returned: the re-seed itself is done.
func (p *redisPool) seedMerge(ctx context.Context, keys []string) {
	cursor := "0"
	for first := true; first || cursor != "0"; first = false {
		next, err := roundTrip(ctx, p.cfg.redisTimeout, func(ctx context.Context) (string, error) {
			return poolSeedScript.Run(ctx, p.rdb, keys, "merge", cursor, pageSize(), seedStageTTL.Milliseconds()).Text()
		}, nil)
		if err != nil {
			p.cfg.logger.Warn("proxyswitch: re-seed: dead marks written since Redis lost the pool not all merged back",
				"pool", p.name, "error", redisErr("re-seed", err))
			return
		}
		cursor = next
	}
}
