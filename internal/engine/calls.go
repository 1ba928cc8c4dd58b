package engine

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Typed calls of the root scripts that the pool administration (pool.go),
// the operator actions (operator.go) and the state reads (state.go,
// sites.go, proxystate.go) run: one struct per script, a field per KEYS or
// ARGV entry as the script's header names it, and Run to send it (EVALSHA,
// EVAL on NOSCRIPT). Zero fields are sent as they are: the caller fills
// every one.

var (
	listScript        = Root.Script("list")
	statsScript       = Root.Script("stats")
	poolUpdateScript  = Root.Script("pool_update")
	findScript        = Root.Script("find")
	unbanScript       = Root.Script("unban")
	siteHoldScript    = Root.Script("site_hold")
	drainScript       = Root.Script("drain")
	clearScript       = Root.Script("clear")
	sitesScript       = Root.Script("sites")
	stateScript       = Root.Script("state")
	proxyStatesScript = Root.Script("proxy_states")
)

// List runs list.lua: one page of a hash of the pool keyed by proxy ID,
// {next cursor, id, value, ...}, with Join {next cursor, id, value,
// joined value, ...}.
type List struct {
	Hash   string // KEYS[1] the hash read
	Join   string // KEYS[2] if not empty: a hash joined on the id (ids it lacks are left out)
	Cursor string // ARGV[1] HSCAN cursor, "0" for the first page
	Count  int    // ARGV[2] HSCAN count
}

// Run sends the call.
func (c List) Run(ctx context.Context, rdb redis.Scripter) *redis.Cmd {
	keys := []string{c.Hash}
	if c.Join != "" {
		keys = append(keys, c.Join)
	}
	return listScript.Run(ctx, rdb, keys, c.Cursor, c.Count)
}

// Stats runs stats.lua: the counts of the pool as one scope sees it, and
// one page of the scope's live leases.
type Stats struct {
	Pool  string // KEYS[1] pool hash
	Free  string // KEYS[2] the scope's free zset
	Lease string // KEYS[3] the scope's lease hash
	Meta  string // KEYS[4] the pool's meta hash

	Cursor string // ARGV[1] HSCAN cursor of the lease hash, "0" for the first page
	Count  int    // ARGV[2] HSCAN count
}

// Run sends the call.
func (c Stats) Run(ctx context.Context, rdb redis.Scripter) *redis.Cmd {
	return statsScript.Run(ctx, rdb, []string{c.Pool, c.Free, c.Lease, c.Meta}, c.Cursor, c.Count)
}

// PoolUpdate runs pool_update.lua: add, remove or replace proxies, or rotate
// a gateway's session. "add" and "remove" do bounded work per call: the
// reply's fourth item is the number of entries consumed, and the caller
// sends the rest again; its fifth is 1 while the gateway index is built or
// a gateway relabelled ("index" calls finish that; a call that needs the
// index before fails with "PSINDEX").
type PoolUpdate struct {
	Pool, Sites, Meta, Dead, Fails, Quarantine, Order, Cursor, Gateways, Labels string // KEYS[1..10]
	// GatewayIndex (KEYS[11]) registers the templates with an index zset
	// (digest -> their members' labels); Relabel (KEYS[12]) holds the
	// relabellings under way (digest -> cursor). See pool_update.lua.
	GatewayIndex, Relabel string

	Mode    string        // ARGV[1] "add", "remove", "replace", "rotate", "done" or "index"
	Prefix  string        // ARGV[2] the pool's key prefix "{prefix:pool}"
	IdleTTL time.Duration // ARGV[3] sites not leased for that long are forgotten
	Changed bool          // ARGV[4] earlier calls of the same change changed the pool
	// ARGV[5..] add, replace: id, URL, gateway template ("" for a plain
	// proxy), gateway size N ("" for a plain proxy), labels ("k=v,k=v" or
	// ""), ...; remove: id or "gw:<template>", ...; rotate: old id, new id,
	// new URL, lease member, token (see pool_update.lua)
	Entries []any
}

// Run sends the call.
func (c PoolUpdate) Run(ctx context.Context, rdb redis.Scripter) *redis.Cmd {
	changed := "0"
	if c.Changed {
		changed = "1"
	}
	argv := append([]any{c.Mode, c.Prefix, c.IdleTTL.Milliseconds(), changed}, c.Entries...)
	return poolUpdateScript.Run(ctx, rdb, []string{c.Pool, c.Sites, c.Meta, c.Dead, c.Fails, c.Quarantine, c.Order, c.Cursor,
		c.Gateways, c.Labels, c.GatewayIndex, c.Relabel}, argv...)
}

// Find runs find.lua: one proxy by ID, {URL, labels}, {} when not in the pool.
type Find struct {
	Pool, Labels string // KEYS[1..2] the pool's hash and its labels hash
	Proxy        string // ARGV[1] proxy id
}

// Run sends the call.
func (c Find) Run(ctx context.Context, rdb redis.Scripter) *redis.Cmd {
	return findScript.Run(ctx, rdb, []string{c.Pool, c.Labels}, c.Proxy)
}

// Unban runs unban.lua: end a proxy's quarantine on one scope.
type Unban struct {
	Free, Lease, Strikes string // KEYS[1..3] of the scope

	Proxy string // ARGV[1] proxy id
	Slots int    // ARGV[2] slots per proxy (K)
}

// Run sends the call.
func (c Unban) Run(ctx context.Context, rdb redis.Scripter) *redis.Cmd {
	return unbanScript.Run(ctx, rdb, []string{c.Free, c.Lease, c.Strikes}, c.Proxy, c.Slots)
}

// SiteHold runs site_hold.lua: the ledger of the quarantines site probes
// put proxies under on one scope ("note", "list", "lift"); the reply is
// the ids noted, still held or lifted.
type SiteHold struct {
	Ledger, Free, Lease, Strikes string // KEYS[1..4] of the scope

	Mode  string        // ARGV[1] "note", "list" or "lift"
	Slots int           // ARGV[2] slots per proxy (K)
	TTL   time.Duration // ARGV[3] how long the ledger outlives its latest quarantine ("note")
	Site  string        // ARGV[4] the probed site (its scope's may be every site's)
	IDs   []string      // ARGV[5..] proxy ids ("note", "lift"); "list": HSCAN cursor and count
}

// Run sends the call.
func (c SiteHold) Run(ctx context.Context, rdb redis.Scripter) *redis.Cmd {
	argv := []any{c.Mode, c.Slots, c.TTL.Milliseconds(), c.Site}
	for _, id := range c.IDs {
		argv = append(argv, id)
	}
	return siteHoldScript.Run(ctx, rdb, []string{c.Ledger, c.Free, c.Lease, c.Strikes}, argv...)
}

// Drain runs drain.lua: take proxies out of every site's rotation,
// {marked, ids consumed}.
type Drain struct {
	Dead, Sites, Pool string // KEYS[1..3]

	Prefix  string   // ARGV[1] the pool's key prefix "{prefix:pool}"
	Slots   int      // ARGV[2] slots per proxy (K)
	Reason  string   // ARGV[3] "drained", or a probe's reason (marks only unmarked proxies)
	Budget  int      // ARGV[4] the most proxies one call marks (one at least)
	Proxies []string // ARGV[5..] proxy ids; the reply says how many the call did
}

// Run sends the call.
func (c Drain) Run(ctx context.Context, rdb redis.Scripter) *redis.Cmd {
	argv := []any{c.Prefix, c.Slots, c.Reason, c.Budget}
	for _, id := range c.Proxies {
		argv = append(argv, id)
	}
	return drainScript.Run(ctx, rdb, []string{c.Dead, c.Sites, c.Pool}, argv...)
}

// Clear runs clear.lua: delete every key of one pool.
type Clear struct {
	Sites  string   // KEYS[1] sites zset
	Others []string // KEYS[2..] the other pool-wide keys

	Prefix string // ARGV[1] the pool's key prefix "{prefix:pool}"
	Budget int    // ARGV[2] sites one call may clear when more are left (it returns -1)
	// ARGV[3] breaker or exit entries one call may delete when more are
	// left (it returns -1)
	Entries int
}

// Run sends the call.
func (c Clear) Run(ctx context.Context, rdb redis.Scripter) *redis.Cmd {
	return clearScript.Run(ctx, rdb, append([]string{c.Sites}, c.Others...), c.Prefix, c.Budget, c.Entries)
}

// Sites runs sites.lua: one page of the sites leased within the idle TTL,
// oldest first after the continuation, {next score, next site, site, ms,
// site, ms, ...} (next site "" after the last page).
type Sites struct {
	Sites   string        // KEYS[1] sites zset
	IdleTTL time.Duration // ARGV[1]
	Score   string        // ARGV[2] the continuation's score, "" for the first page
	Site    string        // ARGV[3] the continuation's site, "" for the first page
	Count   int           // ARGV[4] most sites in the page
}

// Run sends the call.
func (c Sites) Run(ctx context.Context, rdb redis.Scripter) *redis.Cmd {
	return sitesScript.Run(ctx, rdb, []string{c.Sites}, c.IdleTTL.Milliseconds(), c.Score, c.Site, c.Count)
}

// StateKeys are the KEYS of state.lua and proxy_states.lua for one scope.
type StateKeys struct {
	Pool, Free, Lease, Strikes, Quarantine, Dead, Meta string // KEYS[1..7]
	Pace                                               string // KEYS[8]: the scope's learned pace (state.lua reads it)
	Fails                                              string // KEYS[9]: the pool's failures in a row (a failing proxy's slots out are quarantined)
}

func (k StateKeys) keys() []string {
	return []string{k.Pool, k.Free, k.Lease, k.Strikes, k.Quarantine, k.Dead, k.Meta, k.Pace, k.Fails}
}

// State runs state.lua: one page of the counts of the pool's slots by
// state on one scope, {proxies, slots, learned ms, next phase, its cursor,
// item, n, ...}.
type State struct {
	StateKeys
	Slots  int    // ARGV[1] the caller's concurrency (a pool that recorded none)
	Phase  string // ARGV[2] "busy" (the first call), "dead" or "quarantine"
	Cursor string // ARGV[3] the phase's SCAN cursor, "0" to start it
	Budget int    // ARGV[4] entries one call may scan
	Site   string // ARGV[5] the site whose proxy failures quarantine on this scope, "" for every site (a global scope)
}

// Run sends the call.
func (c State) Run(ctx context.Context, rdb redis.Scripter) *redis.Cmd {
	return stateScript.Run(ctx, rdb, c.keys(), c.Slots, c.Phase, c.Cursor, c.Budget, c.Site)
}

// ProxyStates runs proxy_states.lua: the state on one scope of one page of
// the pool's proxies, {next cursor, now, slots, n, 13 items per proxy}.
type ProxyStates struct {
	StateKeys
	Slots  int    // ARGV[1] the caller's concurrency (a pool that recorded none)
	Cursor string // ARGV[2] HSCAN cursor of the pool hash, "0" for the first page
	Count  int    // ARGV[3] HSCAN count
	Site   string // ARGV[4] the site whose proxy failures quarantine on this scope, "" for every site (a global scope)
}

// Run sends the call.
func (c ProxyStates) Run(ctx context.Context, rdb redis.Scripter) *redis.Cmd {
	return proxyStatesScript.Run(ctx, rdb, c.keys(), c.Slots, c.Cursor, c.Count, c.Site)
}

// IntAt returns element i of a script's reply if it is an integer.
func IntAt(res []any, i int) (int64, bool) {
	if i >= len(res) {
		return 0, false
	}
	v, ok := res[i].(int64)
	return v, ok
}

// KeyBase returns "{prefix:pool}", the hash tag every key of a pool starts
// with, or an error saying what is wrong with prefix or pool (empty, or
// holding braces, spaces or line breaks); the caller wraps it in its
// ErrConfig.
//
// The pool name is escaped (EscapeName), the prefix is not: the pool is
// what follows the last ':' of the tag, so two distinct (prefix, pool) pairs
// never share a tag ("a:b" and "default" give "{a:b:default}", "a" and
// "b:default" give "{a:b%3Adefault}"), while names without ':' or '%' keep
// the keys they always had. A tag always holds a ':', which no storage
// namespace's tag does (storage escapes its namespace with EscapeName), so
// pools and storage namespaces never share a key either.
func KeyBase(prefix, pool string) (string, error) {
	for _, v := range []struct{ name, val string }{{"prefix", prefix}, {"pool", pool}} {
		if v.val == "" {
			return "", fmt.Errorf("empty %s", v.name)
		}
		if strings.ContainsAny(v.val, "{}\r\n ") {
			return "", fmt.Errorf("%s %q must not contain braces, spaces or line breaks", v.name, v.val)
		}
	}
	return "{" + prefix + ":" + EscapeName(pool) + "}", nil
}

// nameEscaper escapes the two bytes a name component of a key must not
// hold as they are: ':', which separates components, and '%', the escape.
var nameEscaper = strings.NewReplacer("%", "%25", ":", "%3A")

// EscapeName returns name with every '%' as "%25" and every ':' as "%3A":
// one-to-one, free of ':', and name itself when it holds neither (the keys
// of existing deployments stay where they were).
func EscapeName(name string) string {
	if !strings.ContainsAny(name, "%:") {
		return name
	}
	return nameEscaper.Replace(name)
}

// CorruptPrefix starts the error a script raises when it finds a stored
// value it did not write (lib.lua's corrupt, checked and meta_slots; the
// storage scripts reply it too).
const CorruptPrefix = "PSCORRUPT"

// maxCorruptDetail bounds what Corrupt returns: an error about a corrupt
// value never carries the value whole.
const maxCorruptDetail = 320

// Corrupt reports whether err is a script's reply that a stored value is
// not what the module writes, and returns what it says (the key, what is
// wrong, the value clipped), at most 320 bytes: a PSCORRUPT error, or a
// WRONGTYPE one (a key holding another kind of value than the script asks
// of it, which Redis does not name; the caller names the keys it passed).
// Safe for concurrent use.
func Corrupt(err error) (detail string, ok bool) {
	if err == nil {
		return "", false
	}
	msg := err.Error()
	switch i := strings.Index(msg, CorruptPrefix); {
	case i >= 0:
		detail = strings.TrimSpace(msg[i+len(CorruptPrefix):])
	case strings.HasPrefix(msg, "WRONGTYPE"):
		detail = "a key holds the wrong kind of value"
	default:
		return "", false
	}
	// Redis 7 appends where the script raised it: " script: <sha>, on @user_script:<n>."
	if j := strings.Index(detail, " script: "); j >= 0 {
		detail = detail[:j]
	}
	if len(detail) > maxCorruptDetail {
		detail = strings.ToValidUTF8(detail[:maxCorruptDetail], "") + "..."
	}
	return detail, true
}
