package storage

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// Every Lua script lives in its own file under lua/, headed by its KEYS and
// ARGV. Script.Run sends EVALSHA and falls back to EVAL on NOSCRIPT, so a
// restarted or failed-over Redis needs no manual script loading.
var (
	//go:embed lua/visit.lua
	visitLua    string
	visitScript = redis.NewScript(visitLua)

	//go:embed lua/isvisited.lua
	isVisitedLua    string
	isVisitedScript = redis.NewScript(isVisitedLua)

	//go:embed lua/settle.lua
	settleLua    string
	settleScript = redis.NewScript(settleLua)

	//go:embed lua/cookies_set.lua
	cookiesSetLua    string
	cookiesSetScript = redis.NewScript(cookiesSetLua)

	//go:embed lua/cookies_get.lua
	cookiesGetLua    string
	cookiesGetScript = redis.NewScript(cookiesGetLua)

	//go:embed lua/q_add.lua
	qAddLua    string
	qAddScript = redis.NewScript(qAddLua)

	//go:embed lua/q_pop.lua
	qPopLua    string
	qPopScript = redis.NewScript(qPopLua)

	//go:embed lua/q_ack.lua
	qAckLua    string
	qAckScript = redis.NewScript(qAckLua)

	//go:embed lua/q_nack.lua
	qNackLua    string
	qNackScript = redis.NewScript(qNackLua)

	//go:embed lua/q_extend.lua
	qExtendLua    string
	qExtendScript = redis.NewScript(qExtendLua)

	//go:embed lua/q_release.lua
	qReleaseLua    string
	qReleaseScript = redis.NewScript(qReleaseLua)

	//go:embed lua/q_stats.lua
	qStatsLua    string
	qStatsScript = redis.NewScript(qStatsLua)

	//go:embed lua/q_requeue.lua
	qRequeueLua    string
	qRequeueScript = redis.NewScript(qRequeueLua)

	//go:embed lua/q_dead.lua
	qDeadLua    string
	qDeadScript = redis.NewScript(qDeadLua)
)

// allScripts is every script the package runs; a test loads each one.
var allScripts = map[string]*redis.Script{
	"visit":       visitScript,
	"isvisited":   isVisitedScript,
	"settle":      settleScript,
	"cookies_set": cookiesSetScript,
	"cookies_get": cookiesGetScript,
	"q_add":       qAddScript,
	"q_pop":       qPopScript,
	"q_ack":       qAckScript,
	"q_nack":      qNackScript,
	"q_extend":    qExtendScript,
	"q_release":   qReleaseScript,
	"q_stats":     qStatsScript,
	"q_requeue":   qRequeueScript,
	"q_dead":      qDeadScript,
}
