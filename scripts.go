package proxyswitch

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// Every Lua script lives in its own file under lua/, headed by its KEYS and
// ARGV. Script.Run sends EVALSHA and falls back to EVAL on NOSCRIPT, so a
// restarted or failed-over Redis needs no manual script loading.
var (
	//go:embed lua/lease.lua
	leaseLua    string
	leaseScript = redis.NewScript(leaseLua)

	//go:embed lua/release.lua
	releaseLua    string
	releaseScript = redis.NewScript(releaseLua)

	//go:embed lua/extend.lua
	extendLua    string
	extendScript = redis.NewScript(extendLua)

	//go:embed lua/pool_update.lua
	poolUpdateLua    string
	poolUpdateScript = redis.NewScript(poolUpdateLua)

	//go:embed lua/list.lua
	listLua    string
	listScript = redis.NewScript(listLua)

	//go:embed lua/stats.lua
	statsLua    string
	statsScript = redis.NewScript(statsLua)

	//go:embed lua/penalize.lua
	penalizeLua    string
	penalizeScript = redis.NewScript(penalizeLua)

	//go:embed lua/revive.lua
	reviveLua    string
	reviveScript = redis.NewScript(reviveLua)

	//go:embed lua/dead.lua
	deadLua    string
	deadScript = redis.NewScript(deadLua)

	//go:embed lua/meta_get.lua
	metaGetLua    string
	metaGetScript = redis.NewScript(metaGetLua)

	//go:embed lua/sites.lua
	sitesLua    string
	sitesScript = redis.NewScript(sitesLua)

	//go:embed lua/state.lua
	stateLua    string
	stateScript = redis.NewScript(stateLua)

	//go:embed lua/proxy_states.lua
	proxyStatesLua    string
	proxyStatesScript = redis.NewScript(proxyStatesLua)

	// Operator actions (operator.go).
	//go:embed lua/unban.lua
	unbanLua    string
	unbanScript = redis.NewScript(unbanLua)

	//go:embed lua/drain.lua
	drainLua    string
	drainScript = redis.NewScript(drainLua)

	//go:embed lua/clear.lua
	clearLua    string
	clearScript = redis.NewScript(clearLua)

	// Membership (membership.go).
	//go:embed lua/member_heartbeat.lua
	memberHeartbeatLua    string
	memberHeartbeatScript = redis.NewScript(memberHeartbeatLua)

	//go:embed lua/member_leave.lua
	memberLeaveLua    string
	memberLeaveScript = redis.NewScript(memberLeaveLua)

	//go:embed lua/member_list.lua
	memberListLua    string
	memberListScript = redis.NewScript(memberListLua)

	// The fallback (fallbackloop.go).
	//go:embed lua/fallback_probe.lua
	fallbackProbeLua    string
	fallbackProbeScript = redis.NewScript(fallbackProbeLua)

	//go:embed lua/fallback_seed.lua
	fallbackSeedLua    string
	fallbackSeedScript = redis.NewScript(fallbackSeedLua)

	//go:embed lua/fallback_writeback.lua
	fallbackWritebackLua    string
	fallbackWritebackScript = redis.NewScript(fallbackWritebackLua)

	// Sticky sessions (sessionlease.go): each session script is
	// session_lib.lua followed by its own body, so every call is one EVALSHA.
	//go:embed lua/session_lib.lua
	sessionLibLua string

	//go:embed lua/session_use.lua
	sessionUseLua    string
	sessionUseScript = redis.NewScript(sessionLibLua + sessionUseLua)

	//go:embed lua/session_bind.lua
	sessionBindLua    string
	sessionBindScript = redis.NewScript(sessionLibLua + sessionBindLua)

	//go:embed lua/session_end.lua
	sessionEndLua    string
	sessionEndScript = redis.NewScript(sessionLibLua + sessionEndLua)

	//go:embed lua/session_cookies.lua
	sessionCookiesLua    string
	sessionCookiesScript = redis.NewScript(sessionLibLua + sessionCookiesLua)

	//go:embed lua/session_count.lua
	sessionCountLua    string
	sessionCountScript = redis.NewScript(sessionCountLua)
)

// allScripts is every script the package runs; a test loads each one.
var allScripts = map[string]*redis.Script{
	"lease":       leaseScript,
	"release":     releaseScript,
	"extend":      extendScript,
	"pool_update": poolUpdateScript,
	"stats":       statsScript,
	"list":        listScript,
	"penalize":    penalizeScript,
	"revive":      reviveScript,
	"dead":        deadScript,
	"meta_get":    metaGetScript,
	"sites":       sitesScript,
	"state":       stateScript,
	"unban":       unbanScript,
	"drain":       drainScript,
	"clear":       clearScript,

	"proxy_states": proxyStatesScript,

	"member_heartbeat": memberHeartbeatScript,
	"member_leave":     memberLeaveScript,
	"member_list":      memberListScript,

	"fallback_probe":     fallbackProbeScript,
	"fallback_seed":      fallbackSeedScript,
	"fallback_writeback": fallbackWritebackScript,

	"session_use":     sessionUseScript,
	"session_bind":    sessionBindScript,
	"session_end":     sessionEndScript,
	"session_cookies": sessionCookiesScript,
	"session_count":   sessionCountScript,
}
