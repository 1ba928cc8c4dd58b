package main

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// list shows each proxy's labels, and tells the sessions of a gateway
// entry apart (their masked URLs are alike): the template's SHA-1 prefix
// and the session's place among its sessions, never the template itself.
func TestCLIListLabelsAndGatewaySessions(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", redisSecret)
	env := map[string]string{EnvRedisURL: "redis://:" + redisSecret + "@" + srv.Addr() + "/0"}
	const template = "http://acct-session-{session:3}:" + proxySecret + "@gw.example:7000"
	lines := template + " type=residential country=ru\nhttp://127.0.0.7:3128 country=de\nhttp://127.0.0.8:3128\n"
	r := cli(t, env, lines, "load", "-")
	require.Equal(t, 0, r.code, r.all())

	r = cli(t, env, "", "list")
	require.Equal(t, 0, r.code, r.all())
	assert.Regexp(t, `(?m)^ID\s+PROXY\s+STATE\s+SINCE\s+REASON\s+LABELS\s+GATEWAY\s*$`, r.stdout)
	assert.Regexp(t, `(?m)^\S+\s+http://127\.0\.0\.7:3128\s+ok\s+-\s+-\s+country=de\s+-\s*$`, r.stdout)
	assert.Regexp(t, `(?m)^\S+\s+http://127\.0\.0\.8:3128\s+ok\s+-\s+-\s+-\s+-\s*$`, r.stdout)
	// The tag is the start of the template's index key, gw:<SHA-1>.
	keys, err := srv.Client(t).Keys(context.Background(), "{proxyswitch:default}:gw:*").Result()
	require.NoError(t, err)
	require.Len(t, keys, 1)
	tag := strings.TrimPrefix(keys[0], "{proxyswitch:default}:gw:")[:8]
	rows := regexp.MustCompile(`(?m)^\S+\s+http://xxxxx:xxxxx@gw\.example:7000\s+ok\s+-\s+-\s+country=ru,type=residential\s+(\S+)\s*$`).FindAllStringSubmatch(r.stdout, -1)
	require.Len(t, rows, 3, r.stdout)
	var got []string
	for _, row := range rows {
		got = append(got, row[1])
	}
	assert.ElementsMatch(t, []string{tag + "#1/3", tag + "#2/3", tag + "#3/3"}, got, "one row per session, told apart")
	assert.NotContains(t, r.all(), proxySecret)
	assert.NotContains(t, r.all(), "acct-session")
	assert.NotContains(t, strings.ToLower(r.all()), redisSecret)
}
