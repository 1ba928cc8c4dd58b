package proxyswitch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/redis/go-redis/v9"
)

// Cluster membership: every server of a pool registers under the pool's hash
// tag and renews its registration with a heartbeat; the live member list is
// what the sharding schemes split the pool by, and the list last read is
// what a server computes its fallback shard from while Redis is out of reach.
// Its keys are listed in keys.go.

// maxMemberID bounds the length of a member ID, in bytes.
const maxMemberID = 200

// memberConfig is what a Membership is configured with: the Switch's
// WithHeartbeat, WithMemberTTL and WithMembersChanged, unless NewMembership
// got its own.
type memberConfig struct {
	interval time.Duration
	ttl      time.Duration
	onChange func([]string)
}

// defaultMemberConfig: a heartbeat every second, a member TTL of 3s.
func defaultMemberConfig() memberConfig {
	return memberConfig{interval: time.Second, ttl: 3 * time.Second}
}

func (mc *memberConfig) validate() error {
	switch {
	case mc.interval <= 0:
		return configErr("heartbeat interval %v must be positive", mc.interval)
	case mc.ttl < 2*mc.interval:
		return configErr("member TTL %v must be at least twice the heartbeat interval %v", mc.ttl, mc.interval)
	}
	return nil
}

// WithHeartbeat sets how often a Membership renews its registration: the
// one Start registers for WithFallback or WithSharding, and every one
// NewMembership makes for the Switch. Each renewal is one Redis round trip,
// bounded by the Switch's Redis timeout; a renewal slower than the interval
// delays the next one. It must be positive. The default is 1s.
func WithHeartbeat(d time.Duration) Option { return func(c *config) { c.member.interval = d } }

// WithMemberTTL sets how long a registration lives without renewal: a server
// that stops heartbeating (crashed, cut off) drops out of every member list
// that long after its last heartbeat. Like WithHeartbeat it applies to the
// Membership of WithFallback or WithSharding and to those NewMembership
// makes. It must be at least twice the heartbeat interval, so that one late
// heartbeat does not drop a server. The default is 3s.
func WithMemberTTL(d time.Duration) Option { return func(c *config) { c.member.ttl = d } }

// WithMembersChanged sets a function called with the member list (sorted,
// a copy) each time the list a Membership reads differs from the one it
// last reported, for instance to recompute this server's share ahead of
// need or to feed metrics.Collector.ObserveMembers. Given to NewSwitch, it
// applies to the Membership of WithFallback or WithSharding and to every one
// NewMembership makes for the Switch; given to NewMembership, to that one
// alone (WithMembersChanged(nil) there turns it off). Calls are one at a
// time per Membership, in the order the lists were read. The function must
// not block and must not panic. The default is none.
func WithMembersChanged(f func(members []string)) Option {
	return func(c *config) { c.member.onChange = f }
}

// Membership registers one server (a process) in the member list of a
// Switch's pool and keeps the registration alive with a heartbeat. It keeps
// the member list it last read in memory (LastKnown), for computing a
// fallback shard while Redis is unreachable.
//
// NewMembership does no I/O and starts nothing; Start registers and starts
// the heartbeat goroutine, Stop ends it and deregisters. A Membership is
// safe for concurrent use by multiple goroutines.
type Membership struct {
	rdb     redis.Scripter
	keys    []string // members zset, owners hash
	self    string
	token   string
	timeout time.Duration
	logger  *slog.Logger
	cfg     memberConfig

	mu      sync.Mutex
	members []string  // last list read, sorted
	readAt  time.Time // when it was read (local clock)
	redisMS int64     // Redis clock of that read: orders concurrent reads
	cancel  context.CancelFunc
	done    chan struct{} // non-nil while started
	failing bool          // the last heartbeat failed

	notifyMu sync.Mutex
	notified []string // nil until the first call of cfg.onChange
}

// NewMembership returns the membership of the server named self in the pool
// of sw: it uses sw's Redis client, prefix, pool, Redis timeout and logger,
// and sw's WithHeartbeat, WithMemberTTL and WithMembersChanged settings.
// opts override those three for this Membership alone; other options have
// no effect here. self names this process in the cluster, e.g. its host
// name; it must be unique among live processes, 1 to 200 bytes, with no
// white space or control characters. A server that restarts under the same
// ID gets the same share back. It fails with ErrConfig on bad input.
func NewMembership(sw *Switch, self string, opts ...Option) (*Membership, error) {
	if sw == nil || sw.rdb == nil {
		return nil, fmt.Errorf("%w: nil switch", ErrConfig)
	}
	if err := validMemberID(self); err != nil {
		return nil, err
	}
	cfg := sw.cfg.member
	if len(opts) > 0 {
		c := defaultConfig()
		c.member = cfg
		c.apply(opts)
		cfg = c.member
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var b [12]byte
	_, _ = rand.Read(b[:])
	return &Membership{
		rdb:     sw.rdb,
		keys:    []string{sw.keys.members(), sw.keys.memberOwners()},
		self:    self,
		token:   hex.EncodeToString(b[:]),
		timeout: sw.cfg.redisTimeout,
		logger:  sw.cfg.logger,
		cfg:     cfg,
	}, nil
}

func validMemberID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: empty member ID", ErrConfig)
	case len(id) > maxMemberID:
		return fmt.Errorf("%w: member ID of %d bytes is longer than %d", ErrConfig, len(id), maxMemberID)
	case strings.ContainsFunc(id, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) || r == unicode.ReplacementChar }):
		return fmt.Errorf("%w: member ID %q contains white space, control characters or invalid UTF-8", ErrConfig, id)
	}
	return nil
}

// Self returns this server's member ID.
func (m *Membership) Self() string { return m.self }

// Start registers this server and starts the heartbeat goroutine, which
// renews the registration until Stop is called or ctx ends. Ending ctx does
// not deregister: the registration then runs out after the member TTL, as a
// crashed server's would. If the first registration fails (Redis
// unreachable: ErrRedis; the ID held by another live process:
// ErrMemberTaken) Start returns the error and starts nothing. Starting a
// started Membership fails with ErrConfig.
//
// Once started, a failed heartbeat is logged (once per run of failures) and
// retried at the next interval; the last known member list is kept. A Redis
// that restarted empty gets the registration back at the next heartbeat.
func (m *Membership) Start(ctx context.Context) error {
	m.mu.Lock()
	if m.done != nil {
		m.mu.Unlock()
		return fmt.Errorf("%w: membership of %q already started", ErrConfig, m.self)
	}
	done := make(chan struct{})
	m.done = done
	m.mu.Unlock()

	if err := m.beat(ctx); err != nil {
		m.mu.Lock()
		m.done = nil
		m.mu.Unlock()
		close(done)
		return err
	}
	lctx, cancel := context.WithCancel(ctx)
	m.mu.Lock()
	m.cancel = cancel
	m.mu.Unlock()
	go m.run(lctx, done)
	return nil
}

func (m *Membership) run(ctx context.Context, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(m.cfg.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := m.beat(ctx)
		if ctx.Err() != nil {
			return
		}
		m.mu.Lock()
		wasFailing := m.failing
		m.failing = err != nil
		m.mu.Unlock()
		switch {
		case err != nil && !wasFailing && errors.Is(err, ErrMemberTaken):
			m.logger.Error("proxyswitch: another live process registered under this member ID; retrying", "member", m.self)
		case err != nil && !wasFailing:
			m.logger.Warn("proxyswitch: heartbeat failed; keeping the last known member list", "member", m.self, "err", err)
		case err == nil && wasFailing:
			m.logger.Info("proxyswitch: heartbeat back", "member", m.self)
		}
	}
}

// Stop ends the heartbeat, waits for its goroutine, then deregisters this
// server at once (bounded by the Redis timeout and ctx) so that the others
// see it gone without waiting for the TTL. If deregistering fails the
// registration runs out by itself after the TTL; the error is returned
// anyway. Stop on a Membership that is not started does nothing.
func (m *Membership) Stop(ctx context.Context) error {
	m.mu.Lock()
	cancel, done := m.cancel, m.done
	m.cancel, m.done = nil, nil
	m.mu.Unlock()
	if done == nil {
		return nil
	}
	if cancel != nil {
		cancel()
	}
	<-done
	_, err := roundTrip(ctx, m.timeout, func(ctx context.Context) (int64, error) {
		return memberLeaveScript.Run(ctx, m.rdb, m.keys, m.self, m.token).Int64()
	}, nil)
	if err != nil {
		return redisErr("member leave", err)
	}
	return nil
}

// Members reads the live member list from Redis: the IDs of the servers of
// this pool whose registration has not run out, sorted. It also becomes the
// last known list. It is one round trip, bounded by the Redis timeout.
func (m *Membership) Members(ctx context.Context) ([]string, error) {
	res, err := roundTrip(ctx, m.timeout, func(ctx context.Context) ([]any, error) {
		return memberListScript.Run(ctx, m.rdb, m.keys[:1]).Slice()
	}, nil)
	if err != nil {
		return nil, redisErr("member list", err)
	}
	now, ok := intAt(res, 0)
	if !ok {
		return nil, fmt.Errorf("%w: malformed member list reply", ErrCorrupt)
	}
	list, err := memberIDs(res[1:])
	if err != nil {
		return nil, err
	}
	m.update(list, now)
	return slices.Clone(list), nil
}

// LastKnown returns the member list last read from Redis (by a heartbeat or
// Members), sorted, and when it was read; nil and the zero time before the
// first read. It does no I/O: it is what a server shards by while Redis is
// unreachable.
func (m *Membership) LastKnown() ([]string, time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.members), m.readAt
}

// beat runs one heartbeat: renew, prune, read the live list.
func (m *Membership) beat(ctx context.Context) error {
	res, err := roundTrip(ctx, m.timeout, func(ctx context.Context) ([]any, error) {
		return memberHeartbeatScript.Run(ctx, m.rdb, m.keys, m.self, m.token, m.cfg.ttl.Milliseconds()).Slice()
	}, nil)
	if err != nil {
		return redisErr("heartbeat", err)
	}
	status, ok1 := intAt(res, 0)
	at, ok2 := intAt(res, 1)
	switch {
	case ok1 && ok2 && status == 0 && len(res) == 2:
		return fmt.Errorf("%w: %q is registered until %s", ErrMemberTaken, m.self, time.UnixMilli(at).UTC().Format(time.RFC3339Nano))
	case ok1 && ok2 && status == 1:
		list, err := memberIDs(res[2:])
		if err != nil {
			return err
		}
		m.update(list, at)
		return nil
	}
	return fmt.Errorf("%w: malformed heartbeat reply", ErrCorrupt)
}

// update records a list read at Redis time redisMS, unless a later read
// was recorded already, and reports a change to the callback.
func (m *Membership) update(list []string, redisMS int64) {
	m.mu.Lock()
	if redisMS < m.redisMS {
		m.mu.Unlock()
		return
	}
	m.members, m.readAt, m.redisMS = list, time.Now(), redisMS
	m.mu.Unlock()
	if m.cfg.onChange == nil {
		return
	}
	m.notifyMu.Lock()
	defer m.notifyMu.Unlock()
	m.mu.Lock()
	cur := m.members
	m.mu.Unlock()
	if m.notified != nil && slices.Equal(cur, m.notified) {
		return
	}
	m.notified = cur
	m.cfg.onChange(slices.Clone(cur))
}

// memberIDs checks and sorts the IDs of a script reply.
func memberIDs(vals []any) ([]string, error) {
	out := make([]string, 0, len(vals))
	for _, v := range vals {
		id, ok := v.(string)
		if !ok || validMemberID(id) != nil {
			return nil, fmt.Errorf("%w: malformed member ID in the member list", ErrCorrupt)
		}
		out = append(out, id)
	}
	slices.Sort(out)
	return out, nil
}
