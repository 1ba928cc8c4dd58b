package proxyswitch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/proxyswitch/proxyswitch/shard"
)

// The fallback's goroutine: probe, switch over, resume (see fallback.go).

// resumeWait is what a lease waits between looks while the Switch resumes.
const resumeWait = 20 * time.Millisecond

// probeResult is a probe's reply.
type probeResult struct {
	now   int64 // Redis ms
	sig   poolSig
	marks map[string]int64 // live member -> its last mark (ms; -1 for none)
}

func (f *fallback) run(ctx context.Context) {
	defer close(f.done)
	t := time.NewTicker(f.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-f.kick:
		}
		f.tick(ctx)
	}
}

// tick probes Redis once and acts on the answer.
func (f *fallback) tick(ctx context.Context) {
	mode := leaseMode(f.mode.Load())
	mark := "0" // sharding: no marks
	switch {
	case f.cfg.sharded:
	case mode == modeBroker:
		mark = "1"
	case mode == modeResuming:
		f.mu.RLock()
		if f.written {
			mark = "1"
		} else {
			mark = "-1"
		}
		f.mu.RUnlock()
	default: // local: no other server may count this one as ready
		mark = "-1"
	}
	res, err := f.probe(ctx, mark)
	if ctx.Err() != nil {
		return
	}
	switch {
	case f.cfg.sharded:
		if err == nil {
			f.refresh(ctx, res)
		}
	case mode == modeBroker:
		if err != nil {
			f.trip(ctx, err)
			return
		}
		f.refresh(ctx, res)
	case mode == modeLocal:
		if err == nil {
			f.beginResume(ctx, res)
		}
	case mode == modeResuming:
		if err != nil {
			f.backToLocal(err)
			return
		}
		f.tryFinishResume(ctx, res)
	}
}

// probe runs the probe script on the Switch's own pool; mark is its ARGV[2].
func (f *fallback) probe(ctx context.Context, m string) (probeResult, error) {
	k := f.s.keys
	ttl := max(f.memberCfg.ttl, 4*f.every)
	res, err := roundTrip(ctx, f.cfg.timeout, func(ctx context.Context) ([]any, error) {
		return fallbackProbeScript.Run(ctx, f.s.rdb, []string{k.modes(), k.members(), k.proxies(), k.meta(), k.dead()},
			f.cfg.self, m, ttl.Milliseconds()).Slice()
	}, nil)
	if err != nil {
		return probeResult{}, redisErr("probe", err)
	}
	var out probeResult
	var ok [4]bool
	out.now, ok[0] = intAt(res, 0)
	out.sig.size, ok[1] = intAt(res, 1)
	out.sig.version, ok[2] = intAt(res, 2)
	out.sig.dead, ok[3] = intAt(res, 3)
	if ok != [4]bool{true, true, true, true} || len(res)%2 != 0 {
		return probeResult{}, fmt.Errorf("%w: malformed probe reply", ErrCorrupt)
	}
	out.marks = make(map[string]int64, (len(res)-4)/2)
	for i := 4; i+1 < len(res); i += 2 {
		id, _ := res[i].(string)
		v, _ := intAt(res, i+1)
		out.marks[id] = v
	}
	return out, nil
}

// refresh re-reads the pools whose probe signature changed (or that were
// read long ago) and recomputes the shares whose inputs changed.
func (f *fallback) refresh(ctx context.Context, res probeResult) {
	pools := f.poolList()
	now := time.Now()
	for _, fp := range pools {
		fp.mu.Lock()
		for l := range fp.fromRedis {
			if l.Expiry().Before(now) { // never released (a leaked lease): over anyway
				delete(fp.fromRedis, l)
			}
		}
		stale := fp.readAt.IsZero() || time.Since(fp.readAt) > poolRefresh || (fp.rp.name == f.s.cfg.pool && fp.sig != res.sig)
		fp.mu.Unlock()
		if stale {
			if err := fp.read(ctx); err != nil {
				f.s.cfg.logger.Debug("proxyswitch: reading the pool for the fallback shard failed", "pool", fp.rp.name, "err", err)
				continue
			}
			if fp.rp.name == f.s.cfg.pool {
				fp.mu.Lock()
				fp.sig = res.sig
				fp.mu.Unlock()
			}
		}
		f.mu.RLock()
		fp.applyShare(f, f.cfg.sharded)
		f.mu.RUnlock()
	}
}

// poolList returns the pools the fallback knows.
func (f *fallback) poolList() []*fbPool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.poolListLocked()
}

// poolListLocked is poolList for a caller that holds f.mu.
func (f *fallback) poolListLocked() []*fbPool {
	pools := make([]*fbPool, 0, len(f.pools))
	for _, fp := range f.pools {
		pools = append(pools, fp)
	}
	return pools
}

// refreshAll reads every pool and computes the shares (Start).
func (f *fallback) refreshAll(ctx context.Context, must bool) error {
	pools := f.poolList()
	for _, fp := range pools {
		if err := fp.read(ctx); err != nil && must {
			return err
		}
		fp.applyShare(f, false)
	}
	return nil
}

// read loads the pool and its dead proxies into the pool's copy
// (snapshot.go), re-seeding a pool Redis lost, and keeps the pool a share
// is cut from: the copy without its dead proxies.
func (fp *fbPool) read(ctx context.Context) error {
	lost, err := fp.rp.refreshSnapshot(ctx)
	if err != nil {
		return err
	}
	if lost {
		if _, err := fp.rp.reseed(ctx); err != nil {
			return err
		}
	}
	snap := fp.rp.snapshot()
	if snap == nil {
		return nil // changed while read: the next tick reads again
	}
	gone := make(map[string]bool, len(snap.dead)/2)
	for i := 0; i+1 < len(snap.dead); i += 2 {
		id, _ := snap.dead[i].(string)
		gone[id] = true
	}
	labels := snap.labelsByID() // a labelled request leases from the share only a proxy carrying its labels
	ps := make([]*Proxy, 0, snap.size())
	for i := 0; i+1 < len(snap.pairs); i += 2 {
		id, raw := snap.pairs[i].(string), snap.pairs[i+1].(string)
		if gone[id] {
			continue
		}
		p, err := fp.rp.sw.poolEntry(fp.rp.keys.proxies(), id, raw)
		if err != nil {
			return err
		}
		ps = append(ps, p.withLabels(labels[id]))
	}
	sortProxies(ps, func(p *Proxy) *Proxy { return p })
	fp.mu.Lock()
	fp.last, fp.readAt = ps, time.Now()
	fp.members = nil // recompute
	fp.mu.Unlock()
	return nil
}

// applyShare recomputes the share if the member list or the pool changed.
// With handover (sharding), proxies that join the share are held until
// their former owner can have stopped using them. The caller holds f.mu
// (read or write) or is Start.
func (fp *fbPool) applyShare(f *fallback, handover bool) {
	members, settled := f.shardList()
	fp.mu.Lock()
	defer fp.mu.Unlock()
	if fp.share != nil && slices.Equal(fp.members, members) && fp.settled == settled && (fp.local != nil || !handover) {
		return
	}
	old := fp.share
	share, err := fp.cutShareLocked(f, members, settled)
	if err != nil {
		f.s.cfg.logger.Warn("proxyswitch: no share of the pool for this server", "pool", fp.rp.name, "member", f.cfg.self, "err", err)
	}
	if handover && fp.local == nil {
		// Sharding: the pool's first share. Others may use its proxies until
		// they notice this server.
		fp.local = newLocalPool(*fp.rp.cfg)
		if len(members) > 1 {
			fp.local.Hold(f.handover())
		}
		old = share
	}
	if fp.local == nil {
		return
	}
	if handover {
		had := make(map[string]bool, len(old))
		for _, p := range old {
			had[p.id] = true
		}
		until := time.Now().Add(f.handover())
		for _, p := range share {
			if !had[p.id] {
				fp.local.ReserveAll(p.id, until)
			}
		}
	}
	_, _ = fp.local.SetProxies(share)
}

// trip switches to the local shard if err means Redis is out of reach. It
// reports whether the Switch leases locally now.
func (f *fallback) trip(ctx context.Context, err error) bool {
	if !isOutage(ctx, err) {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.member == nil || f.done == nil || f.stopped {
		return false // not started (an operator's call), or stopped
	}
	if leaseMode(f.mode.Load()) != modeBroker {
		return true
	}
	// The share is cut from this list until the Switch leases from Redis
	// again: meanwhile this server's heartbeats, which may still get
	// through, acknowledge no later list (shard.Membership.PinView).
	members, settled := f.member.PinView()
	size := 0
	for _, fp := range f.pools {
		fp.applyShareLocked(f, members, settled)
		lp := newLocalPool(*fp.rp.cfg)
		fp.mu.Lock()
		_, _ = lp.SetProxies(fp.share)
		lp.Hold(f.hold)
		for l := range fp.fromRedis {
			_ = lp.Reserve(l.proxy.id, l.site, l.Expiry())
		}
		fp.local = lp
		if fp.rp.name == f.s.cfg.pool {
			size = len(fp.share)
		}
		fp.mu.Unlock()
	}
	f.tripMembers, f.written = members, false
	f.stats.Outages++
	f.since = time.Now()
	f.mode.Store(int32(modeLocal))
	f.s.cfg.logger.Warn("proxyswitch: Redis unreachable; leasing from this server's local shard",
		"pool", f.s.cfg.pool, "member", f.cfg.self, "share", size, "members", len(members), "hold", f.hold, "err", err)
	return true
}

// applyShareLocked makes sure the share is computed for members (a trip
// with a list newer than the last tick's).
func (fp *fbPool) applyShareLocked(f *fallback, members []string, settled bool) {
	fp.mu.Lock()
	defer fp.mu.Unlock()
	if fp.share != nil && slices.Equal(fp.members, members) && fp.settled == settled {
		return
	}
	_, _ = fp.cutShareLocked(f, members, settled)
}

// errUnseen is the share error of a server that not every other member has
// seen yet (shard.Membership.FallbackView): it takes no share.
var errUnseen = errors.New("this server joined the member list lately, and not every other server has read a list naming it yet")

// shardList returns the member list the share is cut from and whether it
// may count: for the fallback, the last heartbeat's live members with the
// lately lapsed ones, and whether every other member has seen this server
// (shard.Membership.FallbackView, see fallback.go); for sharding, the
// last known list (its hand-over hold covers a change: applyShare).
func (f *fallback) shardList() ([]string, bool) {
	if f.cfg.sharded {
		members, _ := f.member.LastKnown()
		return members, true
	}
	return f.member.FallbackView()
}

// cutShareLocked computes this server's share of the pool last read for
// members (empty, with the error, when there is none, or when it may not
// count yet: !settled). The caller holds fp.mu.
func (fp *fbPool) cutShareLocked(f *fallback, members []string, settled bool) ([]*Proxy, error) {
	share, err := shareProxies(f.cfg.sharder, fp.last, members, f.cfg.self)
	if err == nil && !settled {
		err = errUnseen
	}
	if err != nil {
		share = []*Proxy{}
	}
	fp.share, fp.shareErr, fp.members, fp.settled = share, err, members, settled
	return share, err
}

// beginResume runs when a probe succeeds in local mode: no new local lease
// from now on; the pool is re-seeded if Redis lost it, the local bans are
// written back and the live local leases handed over to Redis.
func (f *fallback) beginResume(ctx context.Context, res probeResult) {
	f.mu.Lock()
	if leaseMode(f.mode.Load()) != modeLocal {
		f.mu.Unlock()
		return
	}
	f.mode.Store(int32(modeResuming))
	f.since, f.backAt, f.written = time.Now(), res.now, false
	pools := f.poolListLocked()
	f.mu.Unlock()
	f.s.cfg.logger.Info("proxyswitch: Redis reachable again; writing back before leasing from it", "pool", f.s.cfg.pool, "member", f.cfg.self)

	var bans, adopted int
	for _, fp := range pools {
		_, err := fp.rp.reseed(ctx) // the one re-seed path (snapshot.go): it logs and counts
		if err == nil {
			var b, a int
			b, a, err = fp.writeBack(ctx, f)
			bans, adopted = bans+b, adopted+a
		}
		if err == nil {
			err = fp.releaseDeferred(ctx)
		}
		if err != nil {
			f.s.cfg.logger.Warn("proxyswitch: writing back to Redis failed; staying on the local shard", "pool", fp.rp.name, "err", err)
			f.backToLocal(err)
			return
		}
	}
	f.mu.Lock()
	f.written = true
	f.stats.BansWritten += bans
	f.stats.Adopted += adopted
	f.mu.Unlock()
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// backToLocal returns from resuming to the local shard after a failure.
func (f *fallback) backToLocal(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if leaseMode(f.mode.Load()) == modeResuming {
		f.mode.Store(int32(modeLocal))
		f.since, f.written = time.Now(), false
		f.s.cfg.logger.Debug("proxyswitch: Redis failed again while resuming", "err", err)
	}
}

// tryFinishResume switches back to the broker once every server of the
// member list sharded by is ready (marked after Redis came back) or gone
// (not registered a member TTL after Redis came back).
func (f *fallback) tryFinishResume(ctx context.Context, res probeResult) {
	f.mu.RLock()
	written, back, peers := f.written, f.backAt, f.tripMembers
	f.mu.RUnlock()
	if !written {
		return
	}
	grace := f.memberCfg.ttl.Milliseconds()
	var waiting []string
	for _, p := range peers {
		if p == f.cfg.self {
			continue
		}
		mark, live := res.marks[p]
		if (live && mark >= back) || (!live && res.now-back >= grace) {
			continue
		}
		waiting = append(waiting, p)
	}
	if len(waiting) > 0 && res.now-back < 3*grace {
		return
	}
	if len(waiting) > 0 {
		f.s.cfg.logger.Warn("proxyswitch: servers still not ready after resuming; leasing from Redis anyway", "waiting", waiting)
	}
	f.mu.Lock()
	if leaseMode(f.mode.Load()) == modeResuming && f.written {
		for _, fp := range f.pools {
			fp.mu.Lock()
			fp.local = nil
			fp.mu.Unlock()
		}
		f.mode.Store(int32(modeBroker))
		f.member.Unpin()
		f.since = time.Now()
		f.s.cfg.logger.Info("proxyswitch: leasing from Redis again", "pool", f.s.cfg.pool, "member", f.cfg.self)
	}
	pools := f.poolListLocked()
	f.mu.Unlock()
	for _, fp := range pools {
		// Redis leases released while resuming (after the write-back's own
		// pass): their records end now, not at their TTL.
		if err := fp.releaseDeferred(ctx); err != nil {
			f.s.cfg.logger.Debug("proxyswitch: releasing leases deferred while resuming failed", "pool", fp.rp.name, "err", err)
		}
	}
	f.refresh(ctx, res)
}

// writeBack writes the local bans and the live local leases to Redis.
func (fp *fbPool) writeBack(ctx context.Context, f *fallback) (bans, adopted int, err error) {
	fp.mu.Lock()
	lp := fp.local
	var leases []*Lease
	for l := range fp.locals {
		leases = append(leases, l)
	}
	fp.mu.Unlock()
	if lp == nil {
		return 0, 0, nil
	}
	var argv []any
	for _, b := range lp.Bans() {
		if left := time.Until(b.Until).Milliseconds(); left > 0 {
			argv = append(argv, "ban", b.Site, b.ProxyID, strconv.Itoa(b.Strikes), left)
		}
	}
	var sent []*Lease
	for _, l := range leases {
		if left := time.Until(l.local.Expiry()).Milliseconds(); left > 0 && !l.local.Released() {
			argv = append(argv, "lease", l.scope, l.member, l.token, left)
			sent = append(sent, l)
		}
	}
	if len(argv) == 0 {
		return 0, 0, nil
	}
	sw := fp.rp
	k := sw.keys
	head := []any{k.base, sw.cfg.idleTTL.Milliseconds(), sw.cfg.slots, sw.cfg.maxQuarantine.Milliseconds()}
	res, err := roundTrip(ctx, sw.cfg.redisTimeout, func(ctx context.Context) ([]int64, error) {
		return fallbackWritebackScript.Run(ctx, sw.rdb, []string{k.proxies(), k.sites(), k.meta(), k.dead(), k.quarantine()},
			append(head, argv...)...).Int64Slice()
	}, nil)
	if err != nil {
		return 0, 0, redisErr("write back", err)
	}
	if len(res) != 2 {
		return 0, 0, fmt.Errorf("%w: write-back reply of %d items", ErrCorrupt, len(res))
	}
	// A lease released while the script ran holds its record in Redis:
	// release it there too.
	var late []*Lease
	fp.mu.Lock()
	for _, l := range sent {
		if _, live := fp.locals[l]; live {
			fp.locals[l] = true
		} else {
			late = append(late, l)
		}
	}
	fp.mu.Unlock()
	for _, l := range late {
		_, _ = sw.releaseMember(ctx, l.scope, l.member, l.token, "")
	}
	return int(res[0]), int(res[1]), nil
}

// releaseDeferred releases in Redis the leases taken from it before the
// outage and released during it (their records would otherwise hold the
// proxies until they expire).
func (fp *fbPool) releaseDeferred(ctx context.Context) error {
	fp.mu.Lock()
	todo := fp.deferred
	fp.deferred = nil
	fp.mu.Unlock()
	for i, l := range todo {
		if _, err := fp.rp.releaseMember(ctx, l.scope, l.member, l.token, ""); err != nil {
			fp.mu.Lock()
			fp.deferred = append(fp.deferred, todo[i:]...)
			fp.mu.Unlock()
			return err
		}
	}
	return nil
}

// handover is how long a proxy that joins a server's share (sharding) waits:
// until its former owner has read the new member list and its attempts
// through the proxy are over.
func (f *fallback) handover() time.Duration {
	return f.memberCfg.interval + f.cfg.timeout + f.hold
}

// shareProxies is shard.Share for parsed proxies: the proxies of ps that
// member self owns under sh, in the order of ps. A server that lost Redis
// builds its local pool from it (see localPool). It fails like shard.Share,
// and with ErrConfig on a nil proxy.
func shareProxies(sh shard.Sharder, ps []*Proxy, members []string, self string) ([]*Proxy, error) {
	ids := make([]string, len(ps))
	for i, p := range ps {
		if p == nil {
			return nil, configErr("nil proxy #%d", i+1)
		}
		ids[i] = p.id
	}
	mine, err := shard.Share(sh, ids, members, self)
	if err != nil {
		return nil, err
	}
	// mine is a subsequence of ids, which Share checked for duplicates.
	out := make([]*Proxy, 0, len(mine))
	for _, p := range ps {
		if len(out) < len(mine) && p.id == mine[len(out)] {
			out = append(out, p)
		}
	}
	return out, nil
}
