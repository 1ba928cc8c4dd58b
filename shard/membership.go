package shard

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

	"github.com/proxyswitch/proxyswitch/internal/bounded"
	"github.com/proxyswitch/proxyswitch/internal/engine"
	"github.com/redis/go-redis/v9"
)

// Cluster membership: every server of a pool registers under the pool's hash
// tag and renews its registration with a heartbeat; the live member list is
// what the sharding schemes split the pool by, and the list last read is
// what a server computes its fallback shard from while Redis is out of reach.
//
//	{prefix:pool}:members        zset  member ID -> end of its registration, ms; TTL: the last registration's end
//	{prefix:pool}:member-owners  hash  member ID -> token of the process holding it; same TTL
//	{prefix:pool}:member-joins   hash  member ID -> Redis ms at which its registration began; same TTL
//	{prefix:pool}:member-acks    hash  member ID -> Redis ms of the member list it holds; that TTL plus the lapse keep
//	{prefix:pool}:member-lapsed  zset  member ID -> ms at which its registration ran out with no leave (lapse keep)
//
// The last three tell who has seen whom (FallbackView): a server that
// shards by a list while Redis is unreachable must not count a share that
// another server, holding an older list, may still claim.

// Errors of a Membership, besides ErrConfig. Package proxyswitch exports the
// same values as proxyswitch.ErrRedis, proxyswitch.ErrCorrupt and
// proxyswitch.ErrMemberTaken, so errors.Is matches either name.
var (
	// ErrRedis marks a failed Redis round trip (connection refused, timeout,
	// a script error). The underlying go-redis error is wrapped too.
	ErrRedis = errors.New("proxyswitch: redis error")

	// ErrCorrupt means a value read from Redis is not what this module
	// writes there (a foreign or damaged key).
	ErrCorrupt = errors.New("proxyswitch: corrupt value in redis")

	// ErrMemberTaken means another live process is registered under the same
	// member ID. Two processes with one ID would compute one share and use the
	// same proxies: give each process its own ID.
	ErrMemberTaken = errors.New("proxyswitch: member ID held by another live process")
)

var (
	memberHeartbeatScript = engine.Root.Script("member_heartbeat")
	memberLeaveScript     = engine.Root.Script("member_leave")
	memberListScript      = engine.Root.Script("member_list")
)

// maxMemberID bounds the length of a member ID, in bytes.
const maxMemberID = 200

// Defaults of MemberConfig.
const (
	defaultHeartbeat    = time.Second
	defaultTTLBeats     = 3 // the TTL is 3 heartbeats: 3s by default
	defaultRedisTimeout = 2 * time.Second
)

// MemberConfig configures a Membership. Prefix, Pool and Self are
// required; every other field has a default, used when it is left zero.
type MemberConfig struct {
	// Prefix and Pool name the pool, as proxyswitch.WithPrefix and
	// proxyswitch.WithPool do ("proxyswitch" and "default" for a Switch
	// with neither): the keys are "{Prefix:Pool}:members" and
	// "{Prefix:Pool}:member-owners". Neither may be empty or contain
	// braces, spaces or line breaks.
	Prefix, Pool string

	// Self names this process in the cluster, e.g. its host name; it must be
	// unique among live processes, 1 to 200 bytes, with no white space or
	// control characters. A server that restarts under the same ID gets the
	// same share back.
	Self string

	// Heartbeat is how often the registration is renewed. Each renewal is
	// one Redis round trip, bounded by Timeout; a renewal slower than the
	// interval delays the next one. The default is 1s; negative is an
	// error.
	Heartbeat time.Duration

	// TTL is how long a registration lives without renewal: a server that
	// stops heartbeating (crashed, cut off) drops out of every member list
	// that long after its last heartbeat. It must be at least twice the
	// heartbeat, so that one late heartbeat does not drop a server. The
	// default is three heartbeats (3s with the default Heartbeat).
	TTL time.Duration

	// Timeout bounds each Redis round trip, whatever the client's settings.
	// The default is 2s, that of proxyswitch.Timeouts.Redis; negative is
	// an error.
	Timeout time.Duration

	// Changed, if non-nil, is called with the member list (sorted, a copy)
	// each time the list read differs from the one last reported, the first
	// list read included: for instance to recompute this server's share
	// ahead of need or to feed metrics.Collector.ObserveMembers. Calls are
	// one at a time, in the order the lists were read. It must not block
	// and must not panic. The default is none.
	Changed func(members []string)

	// Logger receives a line when heartbeats start failing, when another
	// process holds Self and when heartbeats work again. The default is
	// slog.Default().
	Logger *slog.Logger
}

// withDefaults fills the zero fields and checks the result.
func (c MemberConfig) withDefaults() (MemberConfig, error) {
	if _, err := engine.KeyBase(c.Prefix, c.Pool); err != nil {
		return c, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	if err := ValidMemberID(c.Self); err != nil {
		return c, err
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = defaultHeartbeat
	}
	if c.TTL == 0 {
		c.TTL = defaultTTLBeats * c.Heartbeat
	}
	if c.Timeout == 0 {
		c.Timeout = defaultRedisTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch {
	case c.Heartbeat < 0:
		return c, fmt.Errorf("%w: heartbeat interval %v must be positive", ErrConfig, c.Heartbeat)
	case c.TTL < 2*c.Heartbeat:
		return c, fmt.Errorf("%w: member TTL %v must be at least twice the heartbeat interval %v", ErrConfig, c.TTL, c.Heartbeat)
	case c.Timeout < 0:
		return c, fmt.Errorf("%w: negative Redis timeout %v", ErrConfig, c.Timeout)
	}
	return c, nil
}

// ValidMemberID checks a member ID: 1 to 200 bytes of UTF-8 with no white
// space or control characters. It fails with ErrConfig, saying what is
// wrong. It is safe for concurrent use.
func ValidMemberID(id string) error {
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

// Membership registers one server (a process) in the member list of a
// pool and keeps the registration alive with a heartbeat. It keeps the
// member list it last read in memory (LastKnown), for computing a fallback
// shard while Redis is unreachable: Share(sh, ids, members, m.Self()).
// proxyswitch.Switch.Start runs one for WithFallback and WithSharding.
//
// NewMembership does no I/O and starts nothing; Start registers and starts
// the heartbeat goroutine, Stop ends it and deregisters. A Membership that
// is never started can still read the list (Members). A Membership is safe
// for concurrent use by multiple goroutines.
type Membership struct {
	rdb   redis.Scripter
	keys  []string // members zset, owners hash, joins hash, acks hash, lapsed zset
	token string
	cfg   MemberConfig

	mu      sync.Mutex
	members []string  // last list read, sorted
	readAt  time.Time // when it was read (local clock)
	redisMS int64     // Redis clock of that read: orders concurrent reads
	cancel  context.CancelFunc
	done    chan struct{} // non-nil while started
	failing bool          // the last heartbeat failed

	// of the last heartbeat reply: its Redis time (the ack of the next),
	// the live and lately lapsed members, and whether every other member
	// has seen this one (FallbackView)
	beatMS   int64
	beatSent time.Time // when the last heartbeat that got a reply was sent
	view     []string
	settled  bool
	pinned   bool  // PinView: heartbeats acknowledge pinMS, not beatMS
	pinMS    int64 // the Redis time of the list pinned

	notifyMu sync.Mutex
	notified []string // nil until the first call of cfg.Changed
}

// NewMembership returns the membership of the server cfg.Self in the pool
// cfg.Prefix, cfg.Pool, on the Redis rdb (a client, a cluster client or a
// ring: the keys share one hash tag). It fails with ErrConfig on bad input
// (a nil rdb, a bad MemberConfig). It does no I/O.
func NewMembership(rdb redis.Scripter, cfg MemberConfig) (*Membership, error) {
	if rdb == nil {
		return nil, fmt.Errorf("%w: nil Redis client", ErrConfig)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	base, _ := engine.KeyBase(cfg.Prefix, cfg.Pool) // checked by withDefaults
	var b [12]byte
	_, _ = rand.Read(b[:])
	return &Membership{
		rdb:   rdb,
		keys:  []string{base + ":members", base + ":member-owners", base + ":member-joins", base + ":member-acks", base + ":member-lapsed"},
		token: hex.EncodeToString(b[:]),
		cfg:   cfg,
	}, nil
}

// Self returns this server's member ID.
func (m *Membership) Self() string { return m.cfg.Self }

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
		return fmt.Errorf("%w: membership of %q already started", ErrConfig, m.cfg.Self)
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
	t := time.NewTicker(m.cfg.Heartbeat)
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
			m.cfg.Logger.Error("proxyswitch: another live process registered under this member ID; retrying", "member", m.cfg.Self)
		case err != nil && !wasFailing:
			m.cfg.Logger.Warn("proxyswitch: heartbeat failed; keeping the last known member list", "member", m.cfg.Self, "err", err)
		case err == nil && wasFailing:
			m.cfg.Logger.Info("proxyswitch: heartbeat back", "member", m.cfg.Self)
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
	_, err := bounded.Call(ctx, m.cfg.Timeout, false, func(ctx context.Context) (int64, error) {
		return memberLeaveScript.Run(ctx, m.rdb, m.keys, m.cfg.Self, m.token).Int64()
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
	res, err := bounded.Call(ctx, m.cfg.Timeout, false, func(ctx context.Context) ([]any, error) {
		return memberListScript.Run(ctx, m.rdb, m.keys[:1]).Slice()
	}, nil)
	if err != nil {
		return nil, redisErr("member list", err)
	}
	now, ok := engine.IntAt(res, 0)
	if !ok {
		return nil, fmt.Errorf("%w: malformed member list reply", ErrCorrupt)
	}
	list, err := memberIDs(m.keys[0], res[1:])
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

// FallbackView returns what a server may shard by while Redis is
// unreachable, as the last heartbeat read it: the live members with those
// whose registration ran out lately (LapseKeep) without leaving (they may
// be leasing from a fallback shard of their own, by a list naming this
// server), sorted; and settled, whether every other member, live or lapsed,
// holds a list read since this server's registration began (so names it);
// false too once heartbeats failed for a TTL (the registration may have run
// out). A server that is not settled must take
// no share: a member that has not seen it yet shards as if it were absent.
// With shard.Rendezvous two servers that each name the other never both own
// a proxy; nil and false before the first heartbeat. It does no I/O.
func (m *Membership) FallbackView() (members []string, settled bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.view), m.settled
}

// PinView is FallbackView for a server that starts leasing from a shard
// cut from that view: until Unpin, its heartbeats (which may still reach
// Redis while its lease calls do not: a slow or partial outage)
// acknowledge only the list of that view, never a later one. A member that
// joined since is then not settled by this server's word, and takes no
// share by a list this server's shard does not know of. Safe for
// concurrent use.
func (m *Membership) PinView() (members []string, settled bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.pinned {
		m.pinned, m.pinMS = true, m.beatMS
	}
	return slices.Clone(m.view), m.settled
}

// Unpin ends PinView: heartbeats acknowledge the list they last read
// again. Safe for concurrent use.
func (m *Membership) Unpin() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pinned = false
}

// LapseKeep is how long a member whose registration ran out without a
// leave stays in FallbackView's list: 20 member TTLs (60s by default).
func (m *Membership) LapseKeep() time.Duration { return lapseKeep(m.cfg.TTL) }

func lapseKeep(ttl time.Duration) time.Duration { return 20 * ttl }

// beat runs one heartbeat: renew, prune, read the live list.
func (m *Membership) beat(ctx context.Context) error {
	m.mu.Lock()
	ack := m.beatMS
	if m.pinned {
		ack = m.pinMS
	}
	m.mu.Unlock()
	sent := time.Now()
	res, err := bounded.Call(ctx, m.cfg.Timeout, false, func(ctx context.Context) ([]any, error) {
		return memberHeartbeatScript.Run(ctx, m.rdb, m.keys, m.cfg.Self, m.token, m.cfg.TTL.Milliseconds(),
			ack, lapseKeep(m.cfg.TTL).Milliseconds()).Slice()
	}, nil)
	if err != nil {
		m.mu.Lock()
		if time.Since(m.beatSent) >= m.cfg.TTL {
			// The registration may have run out, and a heartbeat whose reply
			// was lost may have registered this server anew: its list may
			// then miss members that joined since, which count on its first
			// list naming them.
			m.settled = false
		}
		m.mu.Unlock()
		return redisErr("heartbeat", err)
	}
	status, ok1 := engine.IntAt(res, 0)
	at, ok2 := engine.IntAt(res, 1)
	switch {
	case ok1 && ok2 && status == 0 && len(res) == 2:
		return fmt.Errorf("%w: %q is registered until %s", ErrMemberTaken, m.cfg.Self, time.UnixMilli(at).UTC().Format(time.RFC3339Nano))
	case ok1 && ok2 && status == 1:
		settled, ok3 := engine.IntAt(res, 2)
		n, ok4 := engine.IntAt(res, 3)
		if !ok3 || !ok4 || n < 0 || int(n) > len(res)-4 {
			break
		}
		list, err := memberIDs(m.keys[0], res[4:4+n])
		if err != nil {
			return err
		}
		view, err := memberIDs(m.keys[4], res[4:])
		if err != nil {
			return err
		}
		view = slices.Compact(view)
		m.mu.Lock() // heartbeats run one at a time: the last reply is the one held
		m.beatMS, m.beatSent, m.view, m.settled = at, sent, view, settled == 1
		m.mu.Unlock()
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
	if m.cfg.Changed == nil {
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
	m.cfg.Changed(slices.Clone(cur))
}

// memberIDs checks and sorts the IDs of a script reply that read them from
// the member zset key.
func memberIDs(key string, vals []any) ([]string, error) {
	out := make([]string, 0, len(vals))
	for _, v := range vals {
		id, ok := v.(string)
		if !ok || ValidMemberID(id) != nil {
			return nil, fmt.Errorf("%w: key %s: malformed member ID in the member list", ErrCorrupt, key)
		}
		out = append(out, id)
	}
	slices.Sort(out)
	return out, nil
}

// redisErr wraps a failed Redis call so that errors.Is(err, ErrRedis) and
// errors.Is(err, <the go-redis or context error>) both hold; a script's
// reply that a stored value is corrupt becomes ErrCorrupt instead.
func redisErr(op string, err error) error {
	if detail, ok := engine.Corrupt(err); ok {
		return fmt.Errorf("%w: %s: %s", ErrCorrupt, op, detail)
	}
	return fmt.Errorf("%w: %s: %w", ErrRedis, op, err)
}
