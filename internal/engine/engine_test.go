package engine

import (
	"context"
	"io/fs"
	"maps"
	"path"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var registries = []*Registry{Root, Storage}

// luaFiles returns the .lua files of dir (not of its subdirectories).
func luaFiles(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := fs.ReadDir(FS(), dir)
	require.NoError(t, err)
	var out []string
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".lua") {
			out = append(out, e.Name())
		}
	}
	return out
}

// Every .lua file of the tree is a script of the registry of its directory,
// or a library; no directory holds Lua but the two registries'.
func TestEveryFileIsRegistered(t *testing.T) {
	dirs := map[string]*Registry{}
	for _, r := range registries {
		dirs[r.Dir()] = r
	}
	n := 0
	require.NoError(t, fs.WalkDir(FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		require.True(t, strings.HasSuffix(p, ".lua"), "%s: only Lua under lua/", p)
		r, ok := dirs[path.Dir(p)]
		require.True(t, ok, "%s: its directory is no registry's", p)
		file := path.Base(p)
		if IsLibrary(file) {
			return nil
		}
		n++
		assert.Contains(t, r.Names(), strings.TrimSuffix(file, ".lua"), "%s is not registered", p)
		return nil
	}))
	assert.Equal(t, len(Root.Names())+len(Storage.Names()), n)
}

// No script is registered that has no file.
func TestEveryScriptHasAFile(t *testing.T) {
	for _, r := range registries {
		files := luaFiles(t, r.Dir())
		for _, name := range r.Names() {
			assert.Contains(t, files, name+".lua", "%s: script %q has no file", r.Dir(), name)
			assert.False(t, IsLibrary(name+".lua"), "%s: library %q registered as a script", r.Dir(), name)
		}
	}
}

// Every script opens with its contract: "-- <file>: what it does", then
// its KEYS (and ARGV, if it takes any) before any code; every include names
// a library of its directory.
func TestHeaders(t *testing.T) {
	for _, r := range registries {
		for _, file := range luaFiles(t, r.Dir()) {
			b, err := fs.ReadFile(FS(), path.Join(r.Dir(), file))
			require.NoError(t, err)
			src := string(b)
			require.True(t, strings.HasPrefix(src, "-- "+file+": "), "%s/%s: header", r.Dir(), file)
			if IsLibrary(file) {
				assert.Empty(t, Includes(src), "%s/%s: a library includes nothing", r.Dir(), file)
				continue
			}
			var head strings.Builder
			for line := range strings.Lines(src) {
				if !strings.HasPrefix(line, "--") {
					break
				}
				head.WriteString(line)
			}
			assert.Contains(t, head.String(), "KEYS[1]", "%s/%s: header names KEYS", r.Dir(), file)
			if strings.Contains(src[head.Len():], "ARGV[") {
				assert.Contains(t, head.String(), "ARGV[1]", "%s/%s: header names ARGV", r.Dir(), file)
			}
			for _, inc := range Includes(src) {
				assert.True(t, IsLibrary(inc), "%s/%s: include %q", r.Dir(), file, inc)
				assert.Contains(t, luaFiles(t, r.Dir()), inc, "%s/%s: include %q", r.Dir(), file, inc)
			}
		}
	}
}

// Every registered script compiles on a real redis-server, lib.lua and its
// includes in front of it.
func TestEveryScriptLoads(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	for _, r := range registries {
		for name, sc := range r.All() {
			assert.NoError(t, sc.Load(ctx, rdb).Err(), "%s/%s", r.Dir(), name)
		}
	}
}

// A name with no file fails loudly.
func TestUnknownScriptPanics(t *testing.T) {
	assert.PanicsWithValue(t, `engine: no script "nope" in lua (no lua/nope.lua)`, func() { Root.Script("nope") })
	assert.Panics(t, func() { Storage.Script("lease") }, "a root script is not storage's")
	assert.Panics(t, func() { Root.Script("session_lib") }, "a library is no script")
	assert.Panics(t, func() { Root.Script("lib") }, "a library is no script")
	assert.NotNil(t, Root.Script("lease"))
	assert.NotNil(t, Storage.Script("q_pop"))
}

// A script is lib.lua, its includes in order, then its body; New rejects an
// include that is missing or no library.
func TestNew(t *testing.T) {
	fsys := fstest.MapFS{
		"lua/lib.lua":       {Data: []byte("-- lib\n")},
		"lua/a_lib.lua":     {Data: []byte("-- a\n")},
		"lua/b_lib.lua":     {Data: []byte("-- b\n")},
		"lua/one.lua":       {Data: []byte("-- one.lua: x\n-- include: b_lib.lua\n-- include: a_lib.lua\nreturn 1\n")},
		"lua/two.lua":       {Data: []byte("-- two.lua: x\nreturn 2\n")},
		"lua/README":        {Data: []byte("not Lua")},
		"lua/sub/three.lua": {Data: []byte("-- three.lua: x\nreturn 3\n")},
	}
	r, err := New(fsys, "lua")
	require.NoError(t, err)
	assert.Equal(t, []string{"one", "two"}, r.Names())
	want := "-- lib\n-- b\n-- a\n-- one.lua: x\n-- include: b_lib.lua\n-- include: a_lib.lua\nreturn 1\n"
	assert.Equal(t, redis.NewScript(want).Hash(), r.Script("one").Hash(), "lib.lua, the includes in order, the body")

	sub, err := New(fsys, "lua/sub")
	require.NoError(t, err, "lib.lua comes from the tree's root")
	assert.Equal(t, []string{"three"}, sub.Names())

	for name, inc := range map[string]string{"missing": "c_lib.lua", "not a library": "two.lua", "lib.lua twice": "lib.lua"} {
		bad := maps.Clone(fsys)
		bad["lua/one.lua"] = &fstest.MapFile{Data: []byte("-- include: " + inc + "\nreturn 1\n")}
		_, err := New(bad, "lua")
		assert.Error(t, err, name)
	}
	// An embedded script: its includes (each library once), then its body
	// as a local function, then the embedding script's body.
	emb := maps.Clone(fsys)
	emb["lua/many.lua"] = &fstest.MapFile{Data: []byte("-- many.lua: x\n-- include: b_lib.lua\n-- embed: one.lua as one_of\nreturn one_of({}, {})\n")}
	r, err = New(emb, "lua")
	require.NoError(t, err)
	want = "-- lib\n-- b\n-- a\nlocal function one_of(KEYS, ARGV)\n" + string(fsys["lua/one.lua"].Data) + "\nend\n" + string(emb["lua/many.lua"].Data)
	assert.Equal(t, redis.NewScript(want).Hash(), r.Script("many").Hash(), "lib.lua, the includes once, the embedded script as a function, the body")
	for name, spec := range map[string]string{"missing": "three.lua as f", "a library": "a_lib.lua as f", "no name": "one.lua", "bad name": "one.lua as 1f", "itself": "many.lua as f"} {
		bad := maps.Clone(emb)
		bad["lua/many.lua"] = &fstest.MapFile{Data: []byte("-- many.lua: x\n-- embed: " + spec + "\nreturn 1\n")}
		_, err := New(bad, "lua")
		assert.Error(t, err, name)
	}

	_, err = New(fstest.MapFS{"lua/one.lua": {Data: []byte("return 1")}}, "lua")
	assert.Error(t, err, "no lib.lua")
	_, err = New(fstest.MapFS{"lua/lib.lua": {Data: []byte("")}}, "lua")
	assert.Error(t, err, "no script")
}

// The scripts that name keys from a prefix in ARGV (those of every site of
// the pool, or of a session's scopes) check that it is the hash tag of
// KEYS[1] before touching anything: every key stays in the pool's slot.
func TestPoolPrefixChecked(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	at := map[string]int{ // script -> ARGV index (1-based) of the prefix
		"clear": 1, "drain": 1, "revive": 1, "pool_update": 2, "penalize": 10,
		"fallback_writeback": 1, "session_use": 1, "session_bind": 1, "session_end": 1,
	}
	keys := []string{"{p:q}:k1", "{p:q}:k2", "{p:q}:k3", "{p:q}:k4", "{p:q}:k5", "{p:q}:k6", "{p:q}:k7"}
	for name, i := range at {
		for _, bad := range []string{"{x:y}", "{p:q", "{p:q}:k1", "p:q", "{p:q}}", "{p}"} {
			argv := make([]any, 16)
			for j := range argv {
				argv[j] = "1"
			}
			argv[i-1] = bad
			err := Root.Script(name).Run(ctx, rdb, keys, argv...).Err()
			require.Error(t, err, "%s with prefix %q", name, bad)
			assert.True(t, strings.HasPrefix(err.Error(), "PSKEYS "), "%s with prefix %q: %v", name, bad, err)
		}
	}
	// pool_seed.lua's commit names the gateway index zsets from ARGV[6].
	for _, bad := range []string{"{x:y}", "{p:q", "{p:q}:k1", "p:q", "{p:q}}", "{p}"} {
		err := Root.Script("pool_seed").Run(ctx, rdb, keys, "commit", "0", "0", "1", "1", bad).Err()
		require.Error(t, err, "pool_seed with prefix %q", bad)
		assert.True(t, strings.HasPrefix(err.Error(), "PSKEYS "), "pool_seed with prefix %q: %v", bad, err)
	}
	keysLeft, err := rdb.Keys(ctx, "*").Result()
	require.NoError(t, err)
	assert.Empty(t, keysLeft, "a rejected call writes nothing")
	n, err := Root.Script("clear").Run(ctx, rdb, keys[:1], "{p:q}").Int()
	require.NoError(t, err, "the pool's own hash tag")
	assert.Zero(t, n)
	keysLeft, err = rdb.Keys(ctx, "*").Result()
	require.NoError(t, err)
	assert.Equal(t, []string{"{p:q}:meta"}, keysLeft, "clear leaves only the mark that the pool was emptied on purpose")
}
