package proxyswitch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/proxyswitch/proxyswitch/shard"
	"github.com/redis/go-redis/v9"
)

// The hybrid fallback (WithFallback) and shared-nothing sharding
// (WithSharding): leasing from this server's own share of the pool, kept in
// memory (localPool), instead of from Redis.
//
// Every server registers in the pool's member list (shard.Membership) and keeps
// the pool it last read, minus dead proxies; from the two it precomputes
// its share (shard.Sharder), so that a switch costs no computation. Shares of
// servers that agree on the two lists never overlap.
//
// Members that come and go. Two servers holding different member lists
// may both own a proxy; shard.Rendezvous gives a proxy to the highest-ranked
// member of a list, so two servers that each name the other in their lists
// never both own one, and the fallback makes sure that every pair of
// servers leasing locally do. It shards by shard.Membership.FallbackView,
// not by the live list alone:
//
//   - A newcomer takes no share (an empty one: its requests fail with
//     ErrNoProxy while Redis is out) until every member that joined before
//     it holds a list naming it: each heartbeat acknowledges, in Redis, the
//     Redis time of the list its server last received, and
//     member_heartbeat.lua replies "settled" once every such member's
//     acknowledgement is later than the newcomer's join (two or three
//     heartbeats). A member that joins later answers for itself the same
//     way, so a settled server stays settled. A server leasing from its
//     shard acknowledges no list later than the one the shard was cut from
//     (shard.Membership.PinView) until it leases from Redis again: its
//     heartbeats may still get through (Redis slow for it alone), and a
//     newcomer seen only by such acknowledgements would take a share this
//     server's shard overlaps.
//   - A member whose registration ran out without a leave (crashed, or cut
//     off from Redis: it may be leasing from its own shard, by a list that
//     names this server) stays in the list shares are cut from for
//     Membership.LapseKeep (20 member TTLs), and newcomers stay unsettled
//     while one does. A member that left (Stop) leases no more and drops
//     out at once.
//
// With shard.Modulo or a sharder of your own, only servers that hold the
// same list are sure not to meet; lists differ for a heartbeat or two
// after each change.
//
// A partial partition breaks the promise: a server cut off from Redis while
// the others still reach it leases its share locally, and the others go on
// leasing the whole pool from Redis, its share included, so the two can
// use one IP on one site at once. (The others drop it from the live list a
// member TTL after its last heartbeat, but keep it, lapsed, in the list
// they would shard by if they lost Redis too.) Mitigate it by running the
// servers and Redis where a partition cuts them off together (one network,
// one zone), and by alerting on FallbackStatus().Mode "local" while other
// servers are on the broker. (WithSharding has the same gap: the others
// take a cut-off server's share over once it drops out of the live list.)
//
// Detection. With a fallback every lease, release and quarantine call is
// bounded by the fallback timeout (1s by default) instead of the Redis
// timeout, and a goroutine started by Start probes Redis every quarter of
// it. The first call that fails for want of Redis (refused, reset, timed
// out; not a script or data error, not the caller's own cancellation)
// switches the Switch to its local shard; a lease call caught by the
// failure goes on from the local shard at once.
//
// The switch-over window. Other servers' requests leased from Redis just
// before it went away may still run on proxies of this server's share, and
// nothing tells which: so the local shard starts serving only once they are
// over. Each attempt through a proxy ends within the attempt timeout
// (Timeouts.Attempt) when one is set, else within the lease TTL: the
// shard is held that long (localPool.Hold). This server's own Redis leases
// still running are reserved in the shard until released.
//
// Resume. When a probe succeeds again the Switch re-seeds a pool Redis lost
// (an empty pool hash that no operator emptied) from its copy of the pool,
// as every Switch does when a lease finds the pool lost (snapshot.go: one
// re-seed path, with its hold), writes back the bans it
// learnt, writes its local leases still running into Redis (so that no
// other server leases their proxies), marks itself as ready and waits until
// every server of the member list it sharded by is ready too, or has left
// the list (at most the member TTL after Redis came back). New requests, a
// task's (sticky session's) too, wait meanwhile, at most Timeouts.MaxWait;
// a task's requests fail with ErrNoProxy while the Switch leases locally
// (a session lives in Redis). Only then does it lease from Redis again: no
// server leases a proxy from Redis while another still uses it locally. A
// request that ends while the Switch resumes ends its lease in Redis: a
// ban is quarantined there (penalizeHandedOver), a release of a Redis
// lease from before the outage is sent once back on the broker.

// leaseMode is where a Switch leases from at a given moment.
type leaseMode int32

const (
	// modeBroker leases from Redis, the central broker.
	modeBroker leaseMode = iota
	// modeLocal leases from this server's share of the pool, in memory:
	// Redis is unreachable (WithFallback), or always (WithSharding).
	modeLocal
	// modeResuming means Redis is reachable again after an outage: the
	// Switch writes its state back and waits for the other servers before
	// leasing from Redis. Requests wait meanwhile.
	modeResuming
)

func (m leaseMode) String() string {
	switch m {
	case modeBroker:
		return "broker"
	case modeLocal:
		return "local"
	case modeResuming:
		return "resuming"
	}
	return fmt.Sprintf("leaseMode(%d)", int32(m))
}

// defaultFallbackTimeout bounds every Redis call of a Switch with a fallback.
const defaultFallbackTimeout = time.Second

type fallbackConfig struct {
	self    string
	sharder shard.Sharder
	sharded bool // WithSharding: always local
	timeout time.Duration
	set     int // options naming a scheme: more than one is a conflict
}

// WithFallback leases from Redis and, while Redis is unreachable, from this
// server's own share of the pool (computed by sh, nil: shard.Rendezvous{}),
// so that servers still never share an IP: a server that joined lately
// takes no share until every other server has seen it. The promise does
// not hold across a partial partition: a server cut off from Redis while
// others still reach it can share IPs with them (see the package's
// README, "the fallback when Redis is down"). self names this process, unique
// among live ones. Bans are written back when Redis returns; set
// Timeouts.Attempt to switch within seconds. Call Start and Stop; all
// workers must use the same sharder. The default is no fallback.
func WithFallback(self string, sh shard.Sharder) Option {
	return func(c *config) {
		c.fallback.self, c.fallback.sharder, c.fallback.sharded = self, sh, false
		c.fallback.set++
	}
}

// WithSharding makes this server lease only from its own share of the pool,
// in memory, computed by sh (shard.Rendezvous{} or shard.Modulo{}) from the
// live member list in Redis; self names this process. Bans stay local. Call
// Start first and Stop when done. The default is the central broker.
func WithSharding(self string, sh shard.Sharder) Option {
	return func(c *config) {
		c.fallback.self, c.fallback.sharder, c.fallback.sharded = self, sh, true
		c.fallback.set++
	}
}

func (fc *fallbackConfig) validate() error {
	if fc.set == 0 {
		if fc.timeout < 0 {
			return fmt.Errorf("%w: negative Timeouts.Fallback %v", ErrConfig, fc.timeout)
		}
		return nil
	}
	if fc.set > 1 {
		return fmt.Errorf("%w: WithFallback and WithSharding given together, or twice", ErrConfig)
	}
	if err := shard.ValidMemberID(fc.self); err != nil {
		return err
	}
	if fc.sharder == nil || isNilPointer(fc.sharder) {
		fc.sharder = shard.Rendezvous{}
	}
	switch {
	case fc.timeout == 0:
		fc.timeout = defaultFallbackTimeout
	case fc.timeout < 20*time.Millisecond:
		return fmt.Errorf("%w: Timeouts.Fallback %v is below 20ms", ErrConfig, fc.timeout)
	}
	return nil
}

// FallbackStatus is a snapshot of a Switch's fallback or sharding state.
type FallbackStatus struct {
	// Mode is where the Switch leases from now: "broker" (Redis), "local"
	// (this server's share, in memory) or "resuming" (Redis is back;
	// requests wait while the servers write their state back).
	Mode    string
	Since   time.Time // when the current mode began
	Members []string  // the member list this server's share is computed from
	Share   int       // proxies in this server's share of the Switch's pool
	Outages int       // switches to the local shard since Start
	// Reseeded counts the proxies this Switch wrote into a Redis that had
	// lost the pool, BansWritten the local bans written back, Adopted the
	// local leases handed over to Redis, since Start.
	Reseeded, BansWritten, Adopted int
}

// FallbackStatus returns where the Switch leases from now (Mode "broker"
// without WithFallback or WithSharding). It is safe for concurrent use.
func (s *Switch) FallbackStatus() FallbackStatus {
	f := s.fb
	if f == nil {
		return FallbackStatus{Mode: modeBroker.String()}
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	st := f.stats
	st.Mode, st.Since = leaseMode(f.mode.Load()).String(), f.since
	for _, fp := range f.pools {
		st.Reseeded += int(fp.rp.snap.reseeded.Load())
	}
	if fp := f.pools[s.cfg.pool]; fp != nil {
		fp.mu.Lock()
		st.Members, st.Share = append([]string(nil), fp.members...), len(fp.share)
		fp.mu.Unlock()
	}
	return st
}

// fallback is the state of WithFallback or WithSharding, shared by a Switch
// and the Switches of the pools it routes to. Safe for concurrent use.
type fallback struct {
	s     *Switch // the Switch it was made for
	cfg   fallbackConfig
	hold  time.Duration // switch-over hold: the longest an attempt may run
	every time.Duration // probe interval

	mode atomic.Int32 // a leaseMode

	mu        sync.RWMutex // write: mode changes, pools map; read: local leases
	since     time.Time
	pools     map[string]*fbPool
	member    *shard.Membership
	memberCfg memberConfig
	stats     FallbackStatus
	started   bool
	stopped   bool
	cancel    context.CancelFunc
	done      chan struct{}
	kick      chan struct{} // a call failed: probe now

	// resuming: the list sharded by, the Redis time Redis came back, and
	// whether this server's state is written back (it marks itself ready)
	tripMembers []string
	backAt      int64
	written     bool
}

// fbPool is the fallback state of one pool. Its fields are guarded by mu;
// the fallback's mutex is taken first when both are.
type fbPool struct {
	f  *fallback
	rp *redisPool

	mu        sync.Mutex
	last      []*Proxy // the pool last read, dead proxies left out
	sig       poolSig  // what the probe said about that pool
	readAt    time.Time
	members   []string // the list share was computed from
	settled   bool     // and whether it could count (fallback.shardList)
	share     []*Proxy
	shareErr  error
	local     *localPool
	fromRedis map[*Lease]struct{} // this Switch's live Redis leases
	locals    map[*Lease]bool     // live local leases -> adopted by Redis
	deferred  []*Lease            // Redis leases released while local
}

// poolSig is the probe's view of a pool: a change means read it again.
type poolSig struct{ size, version, dead int64 }

// poolRefresh is how often the pool list is read again even if the probe
// saw no change.
const poolRefresh = 30 * time.Second

// newFallback returns the fallback state for s, nil without WithFallback or
// WithSharding. It does no I/O.
func newFallback(s *Switch) *fallback {
	fc := s.cfg.fallback
	if fc.set == 0 {
		return nil
	}
	f := &fallback{s: s, cfg: fc, hold: s.cfg.attemptBound(), every: max(fc.timeout/4, 5*time.Millisecond),
		pools: map[string]*fbPool{}, memberCfg: s.cfg.member, kick: make(chan struct{}, 1), since: time.Now()}
	if fc.sharded {
		f.mode.Store(int32(modeLocal))
	}
	return f
}

func newFbPool(f *fallback, rp *redisPool) *fbPool {
	return &fbPool{f: f, rp: rp, fromRedis: map[*Lease]struct{}{}, locals: map[*Lease]bool{}}
}

// Start registers this server in the member list and starts watching Redis
// until Stop or ctx ends. WithFallback and WithSharding need it (leases fail
// with ErrNoProxy and ErrConfig until then); otherwise it does nothing. It
// fails with ErrRedis or ErrMemberTaken.
func (s *Switch) Start(ctx context.Context) error {
	f := s.fb
	if f == nil {
		return nil
	}
	f.mu.Lock()
	if f.started || f.stopped {
		f.mu.Unlock()
		return fmt.Errorf("%w: Start called twice, or after Stop", ErrConfig)
	}
	f.started = true
	f.mu.Unlock()
	m, err := s.membership(f.cfg.self, f.memberCfg)
	if err == nil {
		err = m.Start(ctx)
	}
	if err == nil {
		f.member = m
		for _, name := range s.routedPools() {
			if _, err = s.backendFor(name); err != nil {
				break
			}
		}
		if err == nil {
			err = f.refreshAll(ctx, true)
		}
		if err != nil {
			_ = m.Stop(context.WithoutCancel(ctx))
		}
	}
	if err != nil {
		f.mu.Lock()
		f.started = false
		f.mu.Unlock()
		return err
	}
	lctx, cancel := context.WithCancel(ctx)
	f.mu.Lock()
	f.cancel, f.done = cancel, make(chan struct{})
	if f.cfg.sharded {
		for _, fp := range f.pools {
			fp.applyShare(f, true)
		}
		f.since = time.Now()
	}
	f.mu.Unlock()
	go f.run(lctx)
	return nil
}

// Stop leaves the member list and stops watching Redis; leases after it fail
// with ErrNoProxy. Stop without Start, or twice, does nothing.
func (s *Switch) Stop(ctx context.Context) error {
	f := s.fb
	if f == nil {
		return nil
	}
	f.mu.Lock()
	if !f.started || f.stopped {
		f.mu.Unlock()
		return nil
	}
	f.stopped = true
	cancel, done := f.cancel, f.done
	f.mu.Unlock()
	cancel()
	<-done
	return f.member.Stop(ctx)
}

// ready reports why the Switch cannot lease yet, or nil.
func (f *fallback) ready() error {
	switch {
	case f.stopped:
		return fmt.Errorf("%w: %w: the switch was stopped", ErrNoProxy, ErrConfig)
	case !f.started || f.done == nil:
		return fmt.Errorf("%w: %w: WithFallback and WithSharding need Switch.Start before the first lease", ErrNoProxy, ErrConfig)
	}
	return nil
}

// wrap returns the backend of pool rp: rp itself without a fallback (f is
// nil), else rp behind its local shard.
func (f *fallback) wrap(rp *redisPool) backend {
	if f == nil {
		return rp
	}
	return f.pool(rp)
}

// pool returns the state of rp's pool, registering it on first use.
func (f *fallback) pool(rp *redisPool) *fbPool {
	f.mu.RLock()
	fp := f.pools[rp.name]
	f.mu.RUnlock()
	if fp != nil {
		return fp
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if fp = f.pools[rp.name]; fp == nil {
		fp = newFbPool(f, rp)
		f.pools[rp.name] = fp
	}
	return fp
}

// isOutage reports whether err, from a Redis call made for a caller whose
// context is still alive, means Redis is unreachable or hangs (rather than
// a script or data error).
func isOutage(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil || errors.Is(err, redis.ErrClosed) || errors.Is(err, ErrConfig) || errors.Is(err, ErrCorrupt) {
		return false
	}
	var re redis.Error
	if errors.As(err, &re) {
		for _, p := range []string{"LOADING", "CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN", "BUSY"} {
			if strings.HasPrefix(re.Error(), p) {
				return true
			}
		}
		return false
	}
	return true
}
