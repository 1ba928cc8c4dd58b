package storage

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every script compiles on a real Redis, every file under lua/ is one the
// package runs, and every file opens with its KEYS and ARGV.
func TestScriptsLoad(t *testing.T) {
	rdb := shared.Client(t)
	for name, sc := range allScripts {
		require.NoError(t, sc.Load(bg, rdb).Err(), name)
	}
	files, err := filepath.Glob("lua/*.lua")
	require.NoError(t, err)
	require.Len(t, files, len(allScripts))
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".lua")
		require.Contains(t, allScripts, name, "%s is not in allScripts", f)
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		head := string(b[:min(len(b), 1200)])
		require.True(t, strings.HasPrefix(head, "-- "+name+".lua: "), "%s: header", f)
		require.Contains(t, head, "KEYS", "%s: header names KEYS", f)
	}
}
