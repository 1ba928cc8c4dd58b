package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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
