// Package engine holds every Lua script of proxyswitch and of its storage
// package, and builds them into registries by construction: each .lua file
// under lua/ (the root package's scripts) and lua/storage/ (storage's) is one
// *redis.Script, named after its file, with no list to keep in step.
//
// Every script is lua/lib.lua (DEAD, now_ms, num, checked, corrupt,
// meta_slots, pool_prefix), then the
// libraries its header names on "-- include: <file>" lines (such as
// session_lib.lua), then its own body, so every call stays one EVALSHA.
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
		src := string(lib)
		for _, inc := range Includes(string(body)) {
			if !IsLibrary(inc) || inc == LibFile {
				return nil, fmt.Errorf("engine: %s/%s includes %q, which is not a *_lib.lua library", dir, file, inc)
			}
			b, err := fs.ReadFile(fsys, path.Join(dir, inc))
			if err != nil {
				return nil, fmt.Errorf("engine: %s/%s: include: %w", dir, file, err)
			}
			src += string(b)
		}
		r.scripts[strings.TrimSuffix(file, ".lua")] = redis.NewScript(src + string(body))
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
