package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	redisSecret = "Canary-redis-secret"
	proxySecret = "Canary-proxy-secret"
)

type result struct {
	code           int
	stdout, stderr string
}

func (r result) all() string { return r.stdout + r.stderr }

func cli(t *testing.T, env map[string]string, stdin string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, func(k string) string { return env[k] }, strings.NewReader(stdin), &out, &errOut)
	return result{code, out.String(), errOut.String()}
}

func TestCLIEndToEnd(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", redisSecret)
	url := "redis://:" + redisSecret + "@" + srv.Addr() + "/0"
	env := map[string]string{EnvRedisURL: url}

	dir := t.TempDir()
	file := filepath.Join(dir, "proxies.txt")
	require.NoError(t, os.WriteFile(file, []byte("# pool\nhttp://u1:"+proxySecret+"@127.0.0.1:3128\nsocks5://127.0.0.2:1080\n"), 0o600))

	r := cli(t, env, "", "load", file)
	require.Equal(t, 0, r.code, r.all())
	assert.Equal(t, "added 2, removed 0, pool size 2\n", r.stdout)

	r = cli(t, env, "http://127.0.0.3:8080\n", "-pool", "residential", "load", "-")
	require.Equal(t, 0, r.code, r.all())

	r = cli(t, env, "", "list")
	require.Equal(t, 0, r.code, r.all())
	assert.Contains(t, r.stdout, "http://u1:xxxxx@127.0.0.1:3128")
	assert.Contains(t, r.stdout, "socks5://127.0.0.2:1080")
	assert.NotContains(t, r.stdout, "127.0.0.3", "pools are separate")

	// A worker leases for a site; stats shows it.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: redisSecret})
	defer rdb.Close()
	sw, err := proxyswitch.NewSwitch(rdb)
	require.NoError(t, err)
	l, err := sw.Lease(context.Background(), "ozon.example")
	require.NoError(t, err)
	r = cli(t, env, "", "stats")
	require.Equal(t, 0, r.code, r.all())
	assert.Regexp(t, `ozon\.example\s+2\s+1\s+1\s+1`, r.stdout)
	require.NoError(t, l.Release(context.Background()))

	p, err := proxyswitch.ParseProxy("socks5://127.0.0.2:1080")
	require.NoError(t, err)
	r = cli(t, env, "", "remove", p.ID())
	require.Equal(t, 0, r.code, r.all())
	assert.Equal(t, "added 0, removed 1, pool size 1\n", r.stdout)

	r = cli(t, nil, "", "-redis", url, "add", "http://u2:"+proxySecret+"@127.0.0.9:1")
	require.Equal(t, 0, r.code, r.all())
	assert.NotContains(t, r.all(), proxySecret)
}

func TestCLIErrorsAndExitCodes(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", redisSecret)
	good := map[string]string{EnvRedisURL: "redis://:" + redisSecret + "@" + srv.Addr() + "/0"}
	dead := redistest.Start(t)
	deadAddr := dead.Addr()
	require.NoError(t, dead.Kill())

	for name, tc := range map[string]struct {
		env   map[string]string
		stdin string
		args  []string
		code  int
		want  string
	}{
		"no command":      {good, "", nil, 2, "usage"},
		"unknown command": {good, "", []string{"frobnicate"}, 2, "unknown command"},
		"bad flag":        {good, "", []string{"-nope", "list"}, 2, "not defined"},
		"load arity":      {good, "", []string{"load"}, 2, "load takes one FILE"},
		"missing file":    {good, "", []string{"load", "/nonexistent/proxies.txt"}, 1, "no such file"},
		"invalid proxy":   {good, "http://ok:1\nftp://u:" + proxySecret + "@h:1\n", []string{"load", "-"}, 1, "line 2"},
		"bad redis url":   {map[string]string{EnvRedisURL: "mysql://u:" + redisSecret + "@h/"}, "", []string{"list"}, 2, "invalid Redis URL"},
		"wrong password":  {map[string]string{EnvRedisURL: "redis://:wrong-" + redisSecret + "@" + srv.Addr() + "/0"}, "", []string{"list"}, 1, "list"},
		"redis down":      {map[string]string{EnvRedisURL: "redis://:" + redisSecret + "@" + deadAddr + "/0"}, "", []string{"-timeout", "500ms", "list"}, 1, "redis error"},
		"bad prefix":      {good, "", []string{"-prefix", "a{b", "list"}, 2, "braces"},
	} {
		t.Run(name, func(t *testing.T) {
			r := cli(t, tc.env, tc.stdin, tc.args...)
			assert.Equal(t, tc.code, r.code, r.all())
			assert.Contains(t, r.all(), tc.want)
			assert.NotContains(t, r.all(), redisSecret)
			assert.NotContains(t, r.all(), proxySecret)
		})
	}
}
