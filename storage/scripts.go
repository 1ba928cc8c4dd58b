package storage

import "github.com/proxyswitch/proxyswitch/internal/engine"

// The Lua scripts live in internal/engine/lua/storage/, one file each,
// headed by its KEYS and ARGV; the engine builds each into a *redis.Script
// (lib.lua first). engine.Storage.Script panics at init for a name with no
// file, and the engine's tests check that every file is a script and loads
// on a real Redis.
var (
	visitScript          = engine.Storage.Script("visit")
	isVisitedScript      = engine.Storage.Script("isvisited")
	settleScript         = engine.Storage.Script("settle")
	cookiesSetScript     = engine.Storage.Script("cookies_set")
	cookiesGetScript     = engine.Storage.Script("cookies_get")
	cookiesMigrateScript = engine.Storage.Script("cookies_migrate")
	qAddScript           = engine.Storage.Script("q_add")
	qPopScript           = engine.Storage.Script("q_pop")
	qAckScript           = engine.Storage.Script("q_ack")
	qNackScript          = engine.Storage.Script("q_nack")
	qExtendScript        = engine.Storage.Script("q_extend")
	qReleaseScript       = engine.Storage.Script("q_release")
	qStatsScript         = engine.Storage.Script("q_stats")
	qRequeueScript       = engine.Storage.Script("q_requeue")
	qDeadScript          = engine.Storage.Script("q_dead")
)

// allScripts is every script of the package, by name; a test loads each one.
var allScripts = engine.Storage.All()
