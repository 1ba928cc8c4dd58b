package storage

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Every script compiles on the shared Redis (a cluster too). The engine's
// tests check the files (internal/engine).
func TestScriptsLoad(t *testing.T) {
	rdb := shared.Client(t)
	for name, sc := range allScripts {
		require.NoError(t, sc.Load(bg, rdb).Err(), name)
	}
}
