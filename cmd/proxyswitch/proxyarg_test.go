package main

import (
	"testing"

	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/stretchr/testify/assert"
)

// A proxy argument that is neither an ID nor a URL is refused before any
// Redis call, saying it is neither (the library alone says only why it is
// no URL: "as host:port: missing port"), without its password.
func TestCLIProxyArgumentNeitherIDNorURL(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", redisSecret)
	env := map[string]string{EnvRedisURL: "redis://:" + redisSecret + "@" + srv.Addr() + "/0"}
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
