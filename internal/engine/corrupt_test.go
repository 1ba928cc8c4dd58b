package engine

import (
	"context"
	"errors"
	"io/fs"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// libScript is body after lib.lua, as the registries build every script.
func libScript(t *testing.T, body string) *redis.Script {
	lib, err := fs.ReadFile(FS(), "lua/"+LibFile)
	require.NoError(t, err)
	return redis.NewScript(string(lib) + body)
}

// lib.lua turns a damaged value into a PSCORRUPT reply naming the key, with
// the value clipped, on redis-server and on miniredis (gopher-lua): a key of
// another type (WRONGTYPE, which Redis does not name), an INCR of a
// non-integer, a number checked out of range. Other errors pass through
// as redis.call raises them; Corrupt maps the first and not the second.
func TestLibCorrupt(t *testing.T) {
	ctx := context.Background()
	mr := miniredis.RunT(t)
	for name, rdb := range map[string]redis.UniversalClient{
		"redis-server": redistest.Start(t).Client(t),
		"miniredis":    redis.NewClient(&redis.Options{Addr: mr.Addr()}),
	} {
		t.Run(name, func(t *testing.T) {
			huge := strings.Repeat("7x", 20000)
			require.NoError(t, rdb.Set(ctx, "{k}:str", huge, 0).Err())
			require.NoError(t, rdb.HSet(ctx, "{k}:h", "n", huge, "inf", "inf", "ok", "12").Err())
			for what, tc := range map[string]struct{ body, key string }{
				"wrong type": {"return redis.call('HGET', KEYS[1], 'x')", "{k}:str"},
				"incr":       {"return redis.call('INCR', KEYS[1])", "{k}:str"},
				"hincrby":    {"return redis.call('HINCRBY', KEYS[1], 'n', 1)", "{k}:h"},
				"checked":    {"return checked(redis.call('HGET', KEYS[1], 'n'), KEYS[1], 'field n', 0, 10)", "{k}:h"},
				"inf":        {"return checked(redis.call('HGET', KEYS[1], 'inf'), KEYS[1], 'field inf', 0, MAX_MS)", "{k}:h"},
				"range":      {"return checked(redis.call('HGET', KEYS[1], 'ok'), KEYS[1], 'field ok', 0, 10)", "{k}:h"},
				"meta_slots": {"return meta_slots(KEYS[1], 1)", "{k}:str"},
			} {
				err := libScript(t, tc.body).Run(ctx, rdb, []string{tc.key}).Err()
				require.Error(t, err, what)
				detail, ok := Corrupt(err)
				require.True(t, ok, "%s: %v", what, err)
				assert.Contains(t, detail, "key "+tc.key, what)
				assert.Less(t, len(detail), 400, what)
				assert.NotContains(t, detail, " script: ", what)
			}
			n, err := libScript(t, "return checked(redis.call('HGET', KEYS[1], 'ok'), KEYS[1], 'ok', 0, 100)").Run(ctx, rdb, []string{"{k}:h"}).Int()
			require.NoError(t, err)
			assert.Equal(t, 12, n)
			n, err = libScript(t, "return checked(redis.call('HGET', KEYS[1], 'none'), KEYS[1], 'x', 0, 1) or 7").Run(ctx, rdb, []string{"{k}:h"}).Int()
			require.NoError(t, err)
			assert.Equal(t, 7, n, "no value is nil")

			err = libScript(t, "return redis.call('HSET', KEYS[1])").Run(ctx, rdb, []string{"{k}:h"}).Err()
			require.Error(t, err)
			_, ok := Corrupt(err)
			assert.False(t, ok, "another error is no corrupt value: %v", err)
			assert.Contains(t, strings.ToLower(err.Error()), "wrong number of arg")
		})
	}
	_, ok := Corrupt(errors.New("ERR something else"))
	assert.False(t, ok)
	_, ok = Corrupt(nil)
	assert.False(t, ok)
}

// lib.lua's tonumber returns nil for nil on both Lua engines: a pattern
// that does not match (tonumber(string.match(...))) must not fail a script
// on miniredis (gopher-lua raises "value expected" for a bare nil), as it
// failed every release of a crawl on an embedded Redis once.
func TestLibTonumberNil(t *testing.T) {
	ctx := context.Background()
	mr := miniredis.RunT(t)
	for name, rdb := range map[string]redis.UniversalClient{
		"redis-server": redistest.Start(t).Client(t),
		"miniredis":    redis.NewClient(&redis.Options{Addr: mr.Addr()}),
	} {
		t.Run(name, func(t *testing.T) {
			body := "local a = tonumber(string.match('x', '^(%d+)$'))\n" +
				"local b = tonumber(ARGV[9])\n" +
				"if a == nil and b == nil then return tonumber('ff', 16) + tonumber('12') end\n" +
				"return -1"
			n, err := libScript(t, body).Run(ctx, rdb, []string{"{k}:none"}).Int()
			require.NoError(t, err)
			assert.Equal(t, 255+12, n)
		})
	}
}
