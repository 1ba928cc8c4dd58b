package main

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/proxyswitch/proxyswitch/internal/testlog"
	"github.com/proxyswitch/proxyswitch/proxyswitchtest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const tokenSecret = "Canary-token-secret"

// TestCLISync: sync -once from a provider API (JSON, bearer token from a
// file) and from a file; the guard refuses an empty list with exit code 1;
// no secret is ever printed.
func TestCLISync(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", redisSecret)
	env := map[string]string{EnvRedisURL: "redis://:" + redisSecret + "@" + srv.Addr() + "/0"}
	var mu sync.Mutex
	list := []string{"127.0.0.1:3128:u1:" + proxySecret, "u2:" + proxySecret + "@127.0.0.2:3128", "127.0.0.3:3128"}
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+tokenSecret || r.Header.Get("X-Account") != "acme" {
			http.Error(w, "denied", http.StatusUnauthorized)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		json.NewEncoder(w).Encode(map[string]any{"data": map[string]any{"proxies": list}})
	}))
	defer api.Close()
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(tokenSecret+"\n"), 0o600))
	url := api.URL + "/v1/list?key=" + tokenSecret

	r := cli(t, env, "", "sync", "-url", url, "-token-file", tokenFile, "-header", "X-Account: acme", "-json", "data.proxies", "-once")
	require.Equal(t, 0, r.code, r.all())
	assert.Contains(t, r.stdout, api.URL+"/v1/list: added 3, removed 0, pool size 3")
	r = cli(t, env, "", "sync", "-url", url, "-token-file", tokenFile, "-header", "X-Account: acme", "-json", "data.proxies", "-once")
	require.Equal(t, 0, r.code, r.all())
	assert.Contains(t, r.stdout, "unchanged, pool size 3")
	all := r.all()

	mu.Lock()
	list = []string{}
	mu.Unlock()
	r = cli(t, env, "", "sync", "-url", url, "-token-file", tokenFile, "-header", "X-Account: acme", "-json", "data.proxies", "-once")
	require.Equal(t, 1, r.code, r.all())
	assert.Contains(t, r.stdout, "refused by the shrink guard")
	all += r.all()
	r = cli(t, env, "", "sync", "-url", url, "-json", "data.proxies", "-once") // no token
	require.Equal(t, 1, r.code, r.all())
	assert.Contains(t, r.stdout, "401 Unauthorized")
	all += r.all()

	file := filepath.Join(dir, "proxies.txt")
	require.NoError(t, os.WriteFile(file, []byte("127.0.0.3:3128\n127.0.0.4:3128:u4:"+proxySecret+"\n"), 0o600))
	r = cli(t, env, "", "sync", "-file", file, "-once")
	require.Equal(t, 0, r.code, r.all())
	assert.Contains(t, r.stdout, "added 1, removed 2, pool size 2")
	all += r.all()
	require.NoError(t, os.WriteFile(file, []byte("127.0.0.3:3128\n127.0.0.4:99999:u4:"+proxySecret+"\n"), 0o600))
	r = cli(t, env, "", "sync", "-file", file, "-once")
	require.Equal(t, 1, r.code, r.all())
	assert.Contains(t, r.stdout, "line 2")
	all += r.all()

	for _, bad := range [][]string{{"sync"}, {"sync", "-url", url, "-file", file}, {"sync", "-file", file, "-json", "x"},
		{"sync", "-url", url, "-min-fraction", "2"}, {"sync", "-url", url, "-header", "nocolon"}} {
		r := cli(t, env, "", bad...)
		assert.Equal(t, 2, r.code, "%v: %s", bad, r.all())
		all += r.all()
	}
	r = cli(t, env, "", "sync", "-h")
	require.Equal(t, 0, r.code)
	assert.Contains(t, r.stdout, "-min-fraction")
	for _, s := range []string{redisSecret, proxySecret, tokenSecret} {
		assert.NotContains(t, all, s)
	}
}

// TestCLIProbe: one round marks the dead proxy, prints exit IPs, and a
// second round after its recovery revives it.
func TestCLIProbe(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", redisSecret)
	env := map[string]string{EnvRedisURL: "redis://:" + redisSecret + "@" + srv.Addr() + "/0"}
	farm := proxyswitchtest.NewFarm(t, 3)
	farm.Proxies[0].SetCredentials("u", proxySecret)
	r := cli(t, env, "", append([]string{"add"}, farm.URLs()...)...)
	require.Equal(t, 0, r.code, r.all())
	echo := proxyswitchtest.NewSite(t, "echo", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		w.Write([]byte(host))
	}))
	farm.Proxies[1].SetMode(proxyswitchtest.ProxyDead)
	r = cli(t, env, "", "probe", "-echo", echo.URL(), "-timeout", "2s")
	require.Equal(t, 0, r.code, r.all())
	assert.Contains(t, r.stdout, farm.Proxies[0].SourceIP().String())
	assert.Contains(t, r.stdout, farm.Proxies[2].SourceIP().String())
	assert.Contains(t, r.stdout, "probed 3, skipped 0 (busy), marked dead 1, revived 0")
	all := r.all()
	r = cli(t, env, "", "list")
	assert.Contains(t, r.stdout, "probe")
	farm.Proxies[1].SetMode(proxyswitchtest.ProxyOK)
	r = cli(t, env, "", "probe", "-echo", echo.URL())
	require.Equal(t, 0, r.code, r.all())
	assert.Contains(t, r.stdout, "marked dead 0, revived 1")
	all += r.all()
	r = cli(t, env, "", "probe")
	assert.Equal(t, 2, r.code)
	assert.Contains(t, r.stderr, "probe takes -echo URL")
	assert.NotContains(t, all, proxySecret)
	assert.NotContains(t, all, redisSecret)
}

// probeBed starts a Redis and a farm of n proxies, loaded into the
// default pool; env points the CLI at that Redis.
func probeBed(t *testing.T, n int) (*redistest.Server, map[string]string, *proxyswitchtest.Farm) {
	t.Helper()
	srv := redistest.Start(t)
	env := map[string]string{EnvRedisURL: "redis://" + srv.Addr() + "/0"}
	farm := proxyswitchtest.NewFarm(t, n)
	r := cli(t, env, "", append([]string{"add"}, farm.URLs()...)...)
	require.Equal(t, 0, r.code, r.all())
	return srv, env, farm
}

// TestCLIProbeExits: probe -exits records the exit IPs; a later round
// that finds one changed prints it ("was") and counts it.
func TestCLIProbeExits(t *testing.T) {
	srv, env, farm := probeBed(t, 2)
	a, b := farm.Proxies[0].SourceIP().String(), farm.Proxies[1].SourceIP().String()
	var moved atomic.Bool
	echo := proxyswitchtest.NewSite(t, "echo", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		if moved.Load() && host == a {
			host = "10.9.8.7"
		}
		w.Write([]byte(host))
	}))
	r := cli(t, env, "", "probe", "-echo", echo.URL(), "-exits")
	require.Equal(t, 0, r.code, r.all())
	assert.Contains(t, r.stdout, a)
	assert.Contains(t, r.stdout, b)
	assert.NotContains(t, r.stdout, "was")
	assert.NotContains(t, r.stdout, "exit IPs changed")
	moved.Store(true)
	r = cli(t, env, "", "probe", "-echo", echo.URL(), "-exits")
	require.Equal(t, 0, r.code, r.all())
	assert.Contains(t, r.stdout, "10.9.8.7 (was "+a+")")
	assert.Contains(t, r.stdout, "exit IPs changed: 1")
	r = cli(t, env, "", "probe", "-echo", echo.URL(), "-exits", "-new-every", "0s")
	assert.Equal(t, 2, r.code, r.all())

	// -strict holds proxies whose exit is not recorded (the pool's meta).
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	r = cli(t, env, "", "probe", "-echo", echo.URL(), "-strict")
	assert.Equal(t, 2, r.code, "-strict without -exits: "+r.all())
	r = cli(t, env, "", "probe", "-echo", echo.URL(), "-exits", "-strict")
	require.Equal(t, 0, r.code, r.all())
	metas, err := rdb.Keys(context.Background(), "*:meta").Result()
	require.NoError(t, err)
	require.Len(t, metas, 1)
	until, err := rdb.HGet(context.Background(), metas[0], "strict").Int64()
	require.NoError(t, err)
	assert.Greater(t, until, time.Now().UnixMilli()+int64(2*time.Minute/time.Millisecond), "held for 3 rounds of the default minute")
}

// TestCLIProbeWarnsWhenLockHeld: a one-shot probe takes no lock; while a
// probe -every holds the fleet's probe lock, it says so on stderr (and
// still runs its round); once that one stopped, no warning.
func TestCLIProbeWarnsWhenLockHeld(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", redisSecret)
	env := map[string]string{EnvRedisURL: "redis://:" + redisSecret + "@" + srv.Addr() + "/0"}
	farm := proxyswitchtest.NewFarm(t, 2)
	r := cli(t, env, "", append([]string{"add"}, farm.URLs()...)...)
	require.Equal(t, 0, r.code, r.all())
	echo := proxyswitchtest.NewSite(t, "echo", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		w.Write([]byte(host))
	}))
	const warning = `holds the probe lock of pool "default"`

	r = cli(t, env, "", "probe", "-echo", echo.URL())
	require.Equal(t, 0, r.code, r.all())
	assert.NotContains(t, r.stderr, "warning")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut testlog.Buffer
	code := make(chan int, 1)
	go func() {
		code <- run(ctx, []string{"probe", "-echo", echo.URL(), "-every", "1h"}, func(k string) string { return env[k] },
			strings.NewReader(""), &out, &errOut)
	}()
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "probed") }, 10*time.Second, 10*time.Millisecond,
		"stdout %q, stderr %q", out.String(), errOut.String())
	r = cli(t, env, "", "probe", "-echo", echo.URL())
	require.Equal(t, 0, r.code, r.all())
	assert.Contains(t, r.stderr, "proxyswitch: warning: ")
	assert.Contains(t, r.stderr, warning)
	assert.Contains(t, r.stdout, "probed")
	cancel()
	require.Equal(t, 0, <-code, errOut.String())

	r = cli(t, env, "", "probe", "-echo", echo.URL())
	require.Equal(t, 0, r.code, r.all())
	assert.NotContains(t, r.stderr, "warning")
	assert.NotContains(t, r.all()+out.String()+errOut.String(), redisSecret)
}

// TestCLIProbeEchoDown: probe with an echo URL nothing listens on (every
// proxy answers 502) marks nobody dead, says the echo URL is down and
// exits 1; an echo URL with an empty port is a usage error (exit 2),
// before any probe.
func TestCLIProbeEchoDown(t *testing.T) {
	_, env, _ := probeBed(t, 3)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := "http://" + ln.Addr().String() + "/ip"
	require.NoError(t, ln.Close())

	r := cli(t, env, "", "probe", "-echo", closed, "-timeout", "2s")
	assert.Equal(t, 1, r.code, r.all())
	assert.Contains(t, r.stdout, "marked dead 0")
	assert.Contains(t, r.stdout, "echo URL down")
	assert.Contains(t, r.stdout, "502")
	assert.Contains(t, r.stderr, "echo URL down")
	assert.NotContains(t, r.stdout, " in -", "the round's duration")
	r = cli(t, env, "", "list")
	require.Equal(t, 0, r.code, r.all())
	// The STATE column (an ID is hex: "06dead0749e1151a" names a live proxy).
	rows := strings.Split(strings.TrimSpace(r.stdout), "\n")
	require.Len(t, rows, 4, r.stdout)
	for _, row := range rows[1:] {
		f := strings.Fields(row)
		require.GreaterOrEqual(t, len(f), 3, row)
		assert.Equal(t, "ok", f[2], "no proxy marked dead: %s", row)
	}

	for _, bad := range []string{"http://127.0.0.1:/ip", "http://127.0.0.1:70000/ip"} {
		r = cli(t, env, "", "probe", "-echo", bad)
		assert.Equal(t, 2, r.code, r.all())
		assert.Contains(t, r.stderr, "want a number from 1 to 65535")
		assert.Empty(t, r.stdout)
	}
	r = cli(t, env, "", "probe", "-echo", "http://127.0.0.1:/ip", "-every", "1h")
	assert.Equal(t, 2, r.code, r.all())
}
