package proxyswitch

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocListsEveryKey: every key of a pool the code builds, in Go (the
// root package, shard, probe) or in the Lua scripts, appears in the Redis
// key layout of ARCHITECTURE.md ("## Redis keys", one key at the start of a
// line of its code block), so that the list stays complete.
func TestDocListsEveryKey(t *testing.T) {
	doc, err := os.ReadFile("ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	_, layout, ok := strings.Cut(string(doc), "\n## Redis keys\n")
	if !ok {
		t.Fatal(`ARCHITECTURE.md has no "## Redis keys" section`)
	}
	if next := strings.Index(layout, "\n## "); next >= 0 {
		layout = layout[:next]
	}
	// base + ":name" in Go, base .. ':name' or base ..":name" in Lua; a
	// trailing ':' (":free:") marks a key per site, IP, session and so on.
	built := regexp.MustCompile(`(?:base \+ "|base \.\. ?['"])(:[a-z-]+:?)['"]`)
	var files []string
	for _, pattern := range []string{"*.go", "shard/*.go", "probe/*.go", "internal/engine/lua/*.lua"} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	seen := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range built.FindAllStringSubmatch(string(b), -1) {
			key := "{prefix:pool}" + m[1]
			if seen[key] {
				continue
			}
			seen[key] = true
			if !strings.Contains(layout, "\n"+key) {
				t.Errorf("%s builds the key %s..., which the Redis key layout of ARCHITECTURE.md does not list", f, key)
			}
		}
	}
	// The script-built keys are the least likely to match: make sure the
	// pattern still finds a few of each kind.
	for _, key := range []string{":proxies", ":free:", ":exit:", ":gw:", ":breaker:", ":session:", ":seed:", ":probe-leader", ":members"} {
		if !seen["{prefix:pool}"+key] {
			t.Errorf("no file builds %s: does the pattern still find the keys?", key)
		}
	}
}
