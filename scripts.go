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
	leaseScript = newScript(leaseLua)

	//go:embed lua/release.lua
	releaseLua    string
	releaseScript = newScript(releaseLua)

	//go:embed lua/extend.lua
	extendLua    string
	extendScript = newScript(extendLua)

	//go:embed lua/pool_update.lua
	poolUpdateLua    string
	poolUpdateScript = newScript(poolUpdateLua)

	//go:embed lua/list.lua
	listLua    string
	listScript = newScript(listLua)

	//go:embed lua/stats.lua
	statsLua    string
	statsScript = newScript(statsLua)

	//go:embed lua/penalize.lua
	penalizeLua    string
	penalizeScript = newScript(penalizeLua)

	//go:embed lua/revive.lua
	reviveLua    string
	reviveScript = newScript(reviveLua)

	//go:embed lua/dead.lua
	deadLua    string
	deadScript = newScript(deadLua)

	//go:embed lua/meta_get.lua
	metaGetLua    string
	metaGetScript = newScript(metaGetLua)

	//go:embed lua/sites.lua
	sitesLua    string
	sitesScript = newScript(sitesLua)

	//go:embed lua/state.lua
	stateLua    string
	stateScript = newScript(stateLua)

	//go:embed lua/proxy_states.lua
	proxyStatesLua    string
	proxyStatesScript = newScript(proxyStatesLua)

	// Operator actions (operator.go).
	//go:embed lua/unban.lua
	unbanLua    string
	unbanScript = newScript(unbanLua)

	//go:embed lua/drain.lua
	drainLua    string
	drainScript = newScript(drainLua)

	//go:embed lua/clear.lua
	clearLua    string
	clearScript = newScript(clearLua)

	// Membership (membership.go).
	//go:embed lua/member_heartbeat.lua
	memberHeartbeatLua    string
	memberHeartbeatScript = newScript(memberHeartbeatLua)

	//go:embed lua/member_leave.lua
	memberLeaveLua    string
	memberLeaveScript = newScript(memberLeaveLua)

	//go:embed lua/member_list.lua
	memberListLua    string
	memberListScript = newScript(memberListLua)

	// The fallback (fallbackloop.go).
	//go:embed lua/fallback_probe.lua
	fallbackProbeLua    string
	fallbackProbeScript = newScript(fallbackProbeLua)

	//go:embed lua/fallback_seed.lua
	fallbackSeedLua    string
	fallbackSeedScript = newScript(fallbackSeedLua)

	//go:embed lua/fallback_writeback.lua
	fallbackWritebackLua    string
	fallbackWritebackScript = newScript(fallbackWritebackLua)

	// Sticky sessions (sessionlease.go): each session script is
	// session_lib.lua followed by its own body, so every call is one EVALSHA.
	//go:embed lua/session_lib.lua
	sessionLibLua string

	//go:embed lua/session_use.lua
	sessionUseLua    string
	sessionUseScript = newScript(sessionLibLua + sessionUseLua)

	//go:embed lua/session_bind.lua
	sessionBindLua    string
	sessionBindScript = newScript(sessionLibLua + sessionBindLua)

	//go:embed lua/session_end.lua
	sessionEndLua    string
	sessionEndScript = newScript(sessionLibLua + sessionEndLua)

	//go:embed lua/session_cookies.lua
	sessionCookiesLua    string
	sessionCookiesScript = newScript(sessionLibLua + sessionCookiesLua)

	//go:embed lua/session_count.lua
	sessionCountLua    string
	sessionCountScript = newScript(sessionCountLua)
)

//go:embed lua/lib.lua
var libLua string

// newScript makes a script of body with lib.lua (DEAD, now_ms, num) in
// front of it.
func newScript(body string) *redis.Script { return redis.NewScript(libLua + body) }

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
