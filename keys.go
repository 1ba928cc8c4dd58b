package proxyswitch

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"

	"github.com/proxyswitch/proxyswitch/internal/engine"
)

// globalSite is the scope name used when a proxy is exclusive across all
// sites (ScopeGlobal). Host names cannot contain '*'.
const globalSite = "*"

// keyspace names the Redis keys of one pool. Every key starts with the same
// hash tag, "{prefix:pool}", so all of them live in one Redis Cluster slot and
// one Lua script may touch them together. In the keys, pool is the pool's
// name escaped by engine.EscapeName (':' as "%3A", '%' as "%25"), so two
// distinct (prefix, pool) pairs never share a tag (see engine.KeyBase).
//
//	{prefix:pool}:proxies        hash  proxy ID -> proxy URL (the pool; no TTL)
//	{prefix:pool}:meta           hash  shared settings and marks (no TTL): "slots"; "version", the
//	                                   generation of the pool and its dead list (lib.lua's bump_version);
//	                                   "emptied" while an operator left the pool empty (an empty pool
//	                                   without it was lost by Redis and is re-seeded: snapshot.go);
//	                                   "hold", ms until which a re-seeded pool leases nothing; "index" and
//	                                   "gwindex", how far the order and the gateway index are built (lease.lua,
//	                                   pool_update.lua: an HSCAN cursor, then "done"); "strict", ms until
//	                                   which entries with no recorded exit are held (exit_strict.lua);
//	                                   "exitidx", how far the exit indexes are built from what is out, and
//	                                   "exitall", whether every proxy has a recorded exit (lease.lua)
//	{prefix:pool}:order          zset  proxy ID -> its place in the rotation (pool_update.lua; no TTL)
//	{prefix:pool}:cursor         hash  site -> "<place last offered>|<ms of its last bookkeeping>" (lease.lua); TTL: idle TTL
//	{prefix:pool}:sites          zset  site -> last lease (ms, refreshed at most once a second); TTL: idle TTL
//	{prefix:pool}:free:<site>    zset  "<id>:<slot>" -> time (ms) until which the slot is out on the site
//	                                   (leased, cooling, quarantined, dead); no entry: free there; TTL: idle TTL
//	{prefix:pool}:lease:<site>   hash  "<id>:<slot>" -> "<token>|<expiry ms>"; TTL: idle TTL
//	{prefix:pool}:strikes:<site> hash  proxy ID -> "<bans in a row>|<ms of the last>|<its end>"; "f:<ID>" -> ms of the
//	                                   proxy's last failure on the site that stands (worked_lib.lua); "served" -> ms of
//	                                   the site's latest healthy answer (release.lua); TTL: idle TTL
//	{prefix:pool}:siteprobe:<site> hash  proxy ID -> "<site>|<end ms>" of the quarantine a site probe (package probe) of
//	                                   site put it under on the scope (every site's under ScopeGlobal), for a later
//	                                   passing probe to lift (site_hold.lua); TTL: the longest entry's need
//	{prefix:pool}:health:<site>  hash  proxy ID -> its recent failure rate there, 0 < r <= 1 (lib.lua's health_note); TTL: idle TTL
//	{prefix:pool}:pace:<site>    hash  the cooldown learned for the site: "c", "cut", "ok", "step" (lib.lua's pace_refused); TTL: idle TTL
//	{prefix:pool}:fails          hash  proxy ID -> proxy failures in a row (see penalize.lua); TTL: idle TTL
//	{prefix:pool}:quarantine     zset  proxy ID -> end (ms) of a ban on every site; TTL: max quarantine
//	{prefix:pool}:dead           hash  proxy ID -> "<ms>|<reason>" (operator state: no TTL, until Revive)
//	{prefix:pool}:gateways       hash  proxy ID -> gateway template, for the virtual proxies of gateway entries (gateway.go; no TTL)
//	{prefix:pool}:gwindex        hash  SHA-1 (hex) of a gateway template -> the labels of its members, for each
//	                                   template with members (pool_update.lua; no TTL); its index is:
//	{prefix:pool}:gw:<SHA-1>     zset  proxy ID -> 0: the template's members in the pool, by ID (pool_update.lua;
//	                                   no TTL; built from the gateways hash in pages where it was written
//	                                   without it: meta "gwindex", the HSCAN cursor, then "done")
//	{prefix:pool}:gwrelabel      hash  SHA-1 of a template -> the last member given its new labels, while a
//	                                   change of its labels goes through its members in pages (no TTL)
//	{prefix:pool}:labels         hash  proxy ID -> its labels "k=v,k=v" (labels.go; no TTL)
//	{prefix:pool}:exit           hash  proxy ID -> its exit IP, as probe.Checker with Exits found it (exit_note.lua; no TTL)
//	{prefix:pool}:exit:<IP>      set   the proxy IDs leaving from IP (exit_note.lua; no TTL): lease.lua lets
//	                                   them have at most the slots of one proxy out on a site at once
//	{prefix:pool}:exitips        zset  exit IP -> the proxy IDs in its set (exit_note.lua; no TTL): lease.lua's
//	                                   exit_all_out lists the IPs of a pool saturated by them
//	{prefix:pool}:exitout:<site> zset  "<IP>|<id>" -> 0, read by lex range per IP: every proxy with an exit IP that
//	                                   may have a slot out on the site (lib.lua's exit_mark; lease.lua checks
//	                                   each it reads and drops the stale); TTL: the busy set's, idle TTL
//	{prefix:pool}:exitban:<IP>   zset  proxy ID -> end (ms) of its ban on every site, or later: each entry of IP
//	                                   so banned (lib.lua's exit_ban); TTL: the quarantine zset's
//	{prefix:pool}:exithold       zset  "<site>|<IP>" -> end (ms) of the IP's hold on the site, "<IP>" -> on every
//	                                   site: what an entry that left the IP earned there (exit_note.lua; lease.lua
//	                                   counts the IP out until then; unban.lua lifts a site's); TTL: the latest end
//	{prefix:pool}:members        zset  member ID -> end of its registration, ms (shard/membership.go); TTL: the last registration's end
//	{prefix:pool}:member-owners  hash  member ID -> token of the process holding it; same TTL
//	{prefix:pool}:breaker        hash  site -> "<until>|<pause>|<probes>|<passed>" while its circuit breaker is open or
//	                                   half-open (breaker.go, breaker_lib.lua; no TTL, until it closes)
//	{prefix:pool}:breaker:<site> hash  the site's ban-rate window (breaker.lua); TTL: twice the window
//	{prefix:pool}:modes          zset  member ID -> Redis ms at which it last leased from the broker (fallback.go); TTL: member TTL
//	{prefix:pool}:sweep          zset  "<kind>:<id>" -> ms x 1000 + a count (unique, rising): a removal ("g") or a
//	                                   revival ("r") each site applies to its keys at its next leases (lib.lua's
//	                                   sweep_add, lease.lua's sweep); an event goes after the idle TTL; no TTL
//	{prefix:pool}:swept          hash  site -> the sweep zset's score up to which the site applied it; TTL: idle TTL
//
// A ban is not a key of its own: it is the score of the proxy's slots in the
// site's busy set ("free:<site>"), pushed to the end of the quarantine, so it
// ends by itself. A site's busy set holds only the slots out on the site:
// entries whose score passed are pruned by leases (two per lease), so a
// site costs memory for what is in use on it, not for the pool. A death, a
// drain or a ban on every site writes the pool's dead hash or quarantine
// zset, and the busy set of the one site it happened on: lease.lua checks
// both for each proxy it offers, and records a dead proxy's slots out on
// its site at DEAD (lib.lua) when it first meets it. A removal writes the
// sweep zset, and each site forgets the proxy's state at its next leases.
// No death, ban, drain, revival or removal visits every site. lease.lua sets
// the TTLs of a site's keys at most once a second: a busy set or lease hash
// emptied and written again within that second (a release took its last
// entry) carries no TTL until the site's next lease a second later.
type keyspace struct {
	base string // "{prefix:pool}"
}

func newKeyspace(prefix, pool string) (keyspace, error) {
	base, err := engine.KeyBase(prefix, pool)
	if err != nil {
		return keyspace{}, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	return keyspace{base: base}, nil
}

func (k keyspace) proxies() string             { return k.base + ":proxies" }
func (k keyspace) meta() string                { return k.base + ":meta" }
func (k keyspace) sites() string               { return k.base + ":sites" }
func (k keyspace) free(site string) string     { return k.base + ":free:" + site }
func (k keyspace) leases(site string) string   { return k.base + ":lease:" + site }
func (k keyspace) strikes(site string) string  { return k.base + ":strikes:" + site }
func (k keyspace) siteHold(site string) string { return k.base + ":siteprobe:" + site }
func (k keyspace) health(site string) string   { return k.base + ":health:" + site }
func (k keyspace) pace(site string) string     { return k.base + ":pace:" + site }
func (k keyspace) fails() string               { return k.base + ":fails" }
func (k keyspace) quarantine() string          { return k.base + ":quarantine" }
func (k keyspace) dead() string                { return k.base + ":dead" }
func (k keyspace) gateways() string            { return k.base + ":gateways" }
func (k keyspace) labels() string              { return k.base + ":labels" }
func (k keyspace) gatewayIndex() string        { return k.base + ":gwindex" }
func (k keyspace) relabel() string             { return k.base + ":gwrelabel" }
func (k keyspace) liveSessions() string        { return k.base + ":sessions" }
func (k keyspace) members() string             { return k.base + ":members" }
func (k keyspace) memberOwners() string        { return k.base + ":member-owners" }
func (k keyspace) modes() string               { return k.base + ":modes" }
func (k keyspace) breaker() string             { return k.base + ":breaker" }
func (k keyspace) order() string               { return k.base + ":order" }
func (k keyspace) cursor() string              { return k.base + ":cursor" }
func (k keyspace) exits() string               { return k.base + ":exit" }
func (k keyspace) sweep() string               { return k.base + ":sweep" }
func (k keyspace) swept() string               { return k.base + ":swept" }

// gatewayMembers is the index zset of gateway template t's members
// (pool_update.lua's index_key): named by the template's SHA-1, never by
// the template, which holds credentials.
func (k keyspace) gatewayMembers(t string) string {
	d := sha1.Sum([]byte(t))
	return k.base + ":gw:" + hex.EncodeToString(d[:])
}

func (k keyspace) breakerWindow(site string) string { return k.base + ":breaker:" + site }

// lease is the KEYS of lease.lua for scope.
func (k keyspace) lease(scope string) []string {
	return []string{k.proxies(), k.free(scope), k.leases(scope), k.sites(), k.meta(), k.dead(), k.quarantine(), k.breaker(), k.order(), k.cursor(), k.exits()}
}

// sessionKeys are the KEYS of session_use.lua and session_end.lua
// for task; session_bind.lua takes the session's jar after them.
func (k keyspace) sessionKeys(task string) []string {
	return []string{k.session(task), k.proxies(), k.liveSessions()}
}

// states are the KEYS of state.lua and proxy_states.lua for scope.
func (k keyspace) states(scope string) engine.StateKeys {
	return engine.StateKeys{Pool: k.proxies(), Free: k.free(scope), Lease: k.leases(scope), Strikes: k.strikes(scope),
		Quarantine: k.quarantine(), Dead: k.dead(), Meta: k.meta(), Pace: k.pace(scope), Fails: k.fails()}
}
