// Package engine holds every Lua script of proxyswitch and of its storage
// package, and builds them into registries by construction: each .lua file
// under lua/ (the root package's scripts) and lua/storage/ (storage's) is one
// *redis.Script, named after its file, with no list to keep in step.
//
// Every script is lua/lib.lua (DEAD, now_ms, num, checked, corrupt,
// meta_slots, pool_prefix), then the
// libraries its header names on "-- include: <file>" lines (such as
// session_lib.lua), then the scripts it names on "-- embed: <file> as
// <name>" lines, each as a local function <name>(KEYS, ARGV) (its body
// as it is, KEYS and ARGV its parameters: pool_call.lua runs
// release.lua and lease.lua this way, without a second copy of them), then
// its own body, so every call stays one EVALSHA.
// Library files (lib.lua and *_lib.lua) are not scripts of their own.
//
// Script.Run sends EVALSHA and falls back to EVAL on NOSCRIPT, so a
// restarted or failed-over Redis needs no manual script loading.
package engine

import (
	"embed"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"
)

//go:embed lua
var luaFS embed.FS

// The registries of the two packages. Building one panics (at init) on a
// malformed directory: an include naming no library, for one.
var (
	// Root holds the scripts of package proxyswitch (lua/*.lua).
	Root = mustNew(luaFS, "lua")
	// Storage holds the scripts of package storage (lua/storage/*.lua).
	Storage = mustNew(luaFS, "lua/storage")
)

// LibFile is the library every script of every registry starts with; it is
// at the root of the file system given to New.
const LibFile = "lib.lua"

// includePrefix starts a header line naming a library to put in front of a
// script's body.
const includePrefix = "-- include: "

// embedPrefix starts a header line naming a script of the same directory to
// put in front of a script's body as a local function: "-- embed: <file> as
// <name>".
const embedPrefix = "-- embed: "

// Registry is the scripts of one directory, by name (file name without
// ".lua").
type Registry struct {
	dir     string
	scripts map[string]*redis.Script
}

// IsLibrary reports whether the file name is a library (lib.lua or
// *_lib.lua), included by scripts rather than run.
func IsLibrary(file string) bool {
	return file == LibFile || strings.HasSuffix(file, "_lib.lua")
}

// New builds the registry of directory dir of fsys: every .lua file of dir
// that is not a library, each after lib.lua (read from the parent of the
// first "lua" element of dir, i.e. the root of the Lua tree: "lua/lib.lua")
// and its includes (libraries of dir).
func New(fsys fs.FS, dir string) (*Registry, error) {
	root, _, _ := strings.Cut(dir, "/")
	lib, err := fs.ReadFile(fsys, path.Join(root, LibFile))
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	r := &Registry{dir: dir, scripts: map[string]*redis.Script{}}
	for _, e := range entries {
		file := e.Name()
		if e.IsDir() || !strings.HasSuffix(file, ".lua") || IsLibrary(file) {
			continue
		}
		body, err := fs.ReadFile(fsys, path.Join(dir, file))
		if err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		src, err := compose(fsys, dir, file, string(body))
		if err != nil {
			return nil, err
		}
		r.scripts[strings.TrimSuffix(file, ".lua")] = redis.NewScript(string(lib) + src)
	}
	if len(r.scripts) == 0 {
		return nil, fmt.Errorf("engine: no script in %s", dir)
	}
	return r, nil
}

func mustNew(fsys fs.FS, dir string) *Registry {
	r, err := New(fsys, dir)
	if err != nil {
		panic(err)
	}
	return r
}

// compose returns the source of script file of dir after lib.lua: its
// includes, its embedded scripts (each with its own includes, a library
// named twice put in once) and its body.
func compose(fsys fs.FS, dir, file, body string) (string, error) {
	var libs, funcs string
	seen := map[string]bool{}
	include := func(of, src string) error {
		for _, inc := range Includes(src) {
			if !IsLibrary(inc) || inc == LibFile {
				return fmt.Errorf("engine: %s/%s includes %q, which is not a *_lib.lua library", dir, of, inc)
			}
			if seen[inc] {
				continue
			}
			seen[inc] = true
			b, err := fs.ReadFile(fsys, path.Join(dir, inc))
			if err != nil {
				return fmt.Errorf("engine: %s/%s: include: %w", dir, of, err)
			}
			libs += string(b)
		}
		return nil
	}
	if err := include(file, body); err != nil {
		return "", err
	}
	for line := range strings.Lines(body) {
		spec, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), embedPrefix)
		if !ok {
			continue
		}
		inner, name, ok := strings.Cut(strings.TrimSpace(spec), " as ")
		inner, name = strings.TrimSpace(inner), strings.TrimSpace(name)
		if !ok || !luaName(name) || IsLibrary(inner) || inner == file || !strings.HasSuffix(inner, ".lua") {
			return "", fmt.Errorf("engine: %s/%s: malformed embed %q (want \"-- embed: <script>.lua as <name>\")", dir, file, spec)
		}
		b, err := fs.ReadFile(fsys, path.Join(dir, inner))
		if err != nil {
			return "", fmt.Errorf("engine: %s/%s: embed: %w", dir, file, err)
		}
		if strings.Contains(string(b), embedPrefix) {
			return "", fmt.Errorf("engine: %s/%s: embed: %s embeds scripts itself", dir, file, inner)
		}
		if err := include(inner, string(b)); err != nil {
			return "", err
		}
		funcs += "local function " + name + "(KEYS, ARGV)\n" + string(b) + "\nend\n"
	}
	return libs + funcs + body, nil
}

// luaName reports whether s is a plain Lua identifier.
func luaName(s string) bool {
	for i, c := range s {
		if c != '_' && (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return s != ""
}

// Includes returns the libraries a script's source names on its
// "-- include: <file>" lines, in order.
func Includes(src string) []string {
	var out []string
	for line := range strings.Lines(src) {
		if f, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), includePrefix); ok {
			out = append(out, strings.TrimSpace(f))
		}
	}
	return out
}

// Script returns the script of that name. It panics when there is none: a
// package-level variable naming a script that does not exist stops its
// package at init, which any test of the package catches.
func (r *Registry) Script(name string) *redis.Script {
	sc, ok := r.scripts[name]
	if !ok {
		panic(fmt.Sprintf("engine: no script %q in %s (no %s/%s.lua)", name, r.dir, r.dir, name))
	}
	return sc
}

// Names returns the names of every script, sorted.
func (r *Registry) Names() []string { return slices.Sorted(maps.Keys(r.scripts)) }

// All returns every script by name (a copy: the registry does not change).
func (r *Registry) All() map[string]*redis.Script { return maps.Clone(r.scripts) }

// Dir is the directory of the registry's files in the engine's file system.
func (r *Registry) Dir() string { return r.dir }

// FS is the file system of the Lua sources (lua/ and lua/storage/).
func FS() fs.FS { return luaFS }
