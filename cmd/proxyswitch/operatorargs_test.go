package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// securedRedis starts a redis-server with a password and returns it with
// the environment that points the CLI at its db 0.
func securedRedis(t *testing.T) (*redistest.Server, map[string]string) {
	t.Helper()
	srv := redistest.Start(t, "--requirepass", redisSecret)
	return srv, map[string]string{EnvRedisURL: "redis://:" + redisSecret + "@" + srv.Addr() + "/0"}
}

// Every command that writes says first, on stderr, which Redis it acts on:
// host:port/db, the prefix and the pool, never the URL's user or password.
// A command that only reads says nothing of it.
func TestCLIWritesNameTheirRedis(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", redisSecret, "--user", "admin-user", "on", ">"+redisSecret, "~*", "&*", "+@all")
	env := map[string]string{EnvRedisURL: "redis://admin-user:" + redisSecret + "@" + srv.Addr() + "/3"}
	secret := "http://u1:" + proxySecret + "@127.0.0.1:3128"
	id := proxyIDOf(t, secret)
	list := filepath.Join(t.TempDir(), "proxies.txt")
	require.NoError(t, os.WriteFile(list, []byte(secret+"\nhttp://127.0.0.2:3128\n"), 0o600))
	tr := &transcript{t: t, env: env}

	for _, tc := range []struct {
		args   []string
		writes bool
	}{
		{[]string{"load", list}, true},
		{[]string{"add", "http://127.0.0.3:3128"}, true},
		{[]string{"remove", "http://127.0.0.3:3128"}, true},
		{[]string{"list"}, false},
		{[]string{"stats"}, false},
		{[]string{"ban", id, "ozon.example", "1m"}, true},
		{[]string{"list", "ozon.example"}, false},
		{[]string{"unban", id, "ozon.example"}, true},
		{[]string{"pause", "ozon.example", "1m"}, true},
		{[]string{"resume", "ozon.example"}, true},
		{[]string{"drain", id}, true},
		{[]string{"revive", id}, true},
		{[]string{"sync", "-file", list, "-once"}, true},
		{[]string{"queue", "crawl", "stats"}, false},
		{[]string{"queue", "crawl", "requeue", "1"}, true}, // fails (no such dead letter), after saying where
		{[]string{"-pool", "other", "clear", "-yes"}, true},
	} {
		r := tr.run(tc.args...)
		cmd := tc.args[0]
		if cmd == "-pool" {
			cmd = tc.args[2]
		}
		where := "proxyswitch: " + cmd + " on Redis " + srv.Addr() + "/3, prefix \"proxyswitch\", pool "
		if !tc.writes {
			assert.Equal(t, 0, r.code, r.all())
			assert.NotContains(t, r.stderr, " on Redis ", "%v only reads", tc.args)
			continue
		}
		assert.Contains(t, r.stderr, where, tc.args)
		if cmd == "queue" {
			assert.Equal(t, 1, r.code, r.all())
		} else {
			assert.Equal(t, 0, r.code, r.all())
		}
		if i := strings.Index(r.stderr, where); i > 0 && cmd != "queue" {
			t.Errorf("%v: the Redis line is not the first thing on stderr:\n%s", tc.args, r.stderr)
		}
	}
	assert.Contains(t, tr.all.String(), `pool "other"`)
	assert.NotContains(t, tr.all.String(), redisSecret)
	assert.NotContains(t, tr.all.String(), "admin-user")
	assert.NotContains(t, tr.all.String(), proxySecret)
}

func TestRedisAddr(t *testing.T) {
	for raw, want := range map[string]string{
		"redis://u:" + redisSecret + "@10.0.0.1:6380/2":    "10.0.0.1:6380/2",
		"redis://localhost":                                "localhost:6379/0",
		"rediss://:" + redisSecret + "@r.example:6380/0":   "r.example:6380/0 (TLS)",
		"unix://:" + redisSecret + "@/run/redis.sock?db=4": "unix:/run/redis.sock db 4",
	} {
		opt, err := redis.ParseURL(raw)
		require.NoError(t, err, raw)
		assert.Equal(t, want, redisAddr(opt), raw)
	}
}

// A proxy argument that is neither an ID nor a URL is refused before any
// Redis call, saying it is neither (the library alone says only why it is
// no URL: "as host:port: missing port"), without its password.
func TestCLIProxyArgumentNeitherIDNorURL(t *testing.T) {
	_, env := securedRedis(t)
	r := cli(t, env, "", "add", "http://127.0.0.1:3128")
	assert.Equal(t, 0, r.code, r.all())
	for _, args := range [][]string{
		{"ban", "nonexist", "ozon.example"},
		{"unban", "nonexist", "ozon.example"},
		{"drain", "http://127.0.0.1:3128", "nonexist"},
		{"revive", "nonexist"},
		{"remove", "nonexist"},
		{"ban", "40ef34392f04ac2", "ozon.example"}, // 15 hex digits: no ID
		{"drain", "http://u:" + proxySecret + "@gw.example"},
	} {
		r := cli(t, env, "", args...)
		assert.Equal(t, 1, r.code, "%v: %s", args, r.all())
		assert.Contains(t, r.stderr, "a proxy argument is neither a proxy ID (16 hex digits, as list shows) nor a proxy URL: proxy ", args)
		assert.NotContains(t, r.stderr, " on Redis ", "%v: refused before acting", args)
		assert.NotContains(t, r.all(), proxySecret)
		assert.NotContains(t, r.all(), redisSecret)
	}
	r = cli(t, env, "", "list")
	assert.Regexp(t, `127\.0\.0\.1:3128\s+ok\s`, r.stdout, "drain refused all its arguments, the valid one too")
	// An ID not in the pool is no usage error: the pool says it has none.
	r = cli(t, env, "", "ban", "0123456789abcdef", "ozon.example")
	assert.Equal(t, 1, r.code, r.all())
	assert.Contains(t, r.stderr, "no proxy 0123456789abcdef")
}

// list shows each proxy's labels, and tells the sessions of a gateway
// entry apart (their masked URLs are alike): the template's SHA-1 prefix
// and the session's place among its sessions, never the template itself.
func TestCLIListLabelsAndGatewaySessions(t *testing.T) {
	srv, env := securedRedis(t)
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
