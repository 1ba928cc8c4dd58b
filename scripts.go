package proxyswitch

import "github.com/proxyswitch/proxyswitch/internal/engine"

// The Lua scripts live in internal/engine/lua/, one file each, headed by its
// KEYS and ARGV; the engine builds each into a *redis.Script (lib.lua and
// the libraries it includes first). engine.Root.Script panics at init for a
// name with no file, and the engine's tests check that every file is a
// script and loads on a real Redis. The scripts of pool.go, operator.go,
// state.go, sites.go and proxystate.go are called through the engine's
// typed calls (engine.List, engine.PoolUpdate, ...) instead, and those of
// the member list by shard.Membership.
var (
	leaseScript      = engine.Root.Script("lease")
	releaseScript    = engine.Root.Script("release")
	poolCallScript   = engine.Root.Script("pool_call") // a pool's releases and plain leases in one call (poolcall.go)
	extendScript     = engine.Root.Script("extend")
	extendManyScript = engine.Root.Script("extend_many") // the renewer (renew.go)
	reclaimScript    = engine.Root.Script("reclaim")     // the leases of lease calls of unknown outcome (reclaim.go)
	penalizeScript   = engine.Root.Script("penalize")
	liftScript       = engine.Root.Script("lift")   // the page-or-IP rule (ban.go)
	unfailScript     = engine.Root.Script("unfail") // a page failing for everyone (storm.go)
	workedScript     = engine.Root.Script("worked") // a proxy failure in a storm (storm.go)
	reviveScript     = engine.Root.Script("revive")

	// The copy of a pool and its re-seed (snapshot.go).
	poolSnapshotScript = engine.Root.Script("pool_snapshot")
	poolSeedScript     = engine.Root.Script("pool_seed")

	// The fallback (fallbackloop.go).
	fallbackProbeScript     = engine.Root.Script("fallback_probe")
	fallbackWritebackScript = engine.Root.Script("fallback_writeback")

	// Sticky sessions (sessionlease.go, sessionjar.go, session.go).
	sessionUseScript     = engine.Root.Script("session_use")
	sessionBindScript    = engine.Root.Script("session_bind")
	sessionEndScript     = engine.Root.Script("session_end")
	sessionCookiesScript = engine.Root.Script("session_cookies")
	sessionCountScript   = engine.Root.Script("session_count")
)

// allScripts is every script of the package, by name; a test loads each one.
var allScripts = engine.Root.All()
