package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCLISyncRefusesNaNMinFraction: -min-fraction NaN is a usage error, as
// any value outside (0, 1] is, not a shrink guard switched off.
func TestCLISyncRefusesNaNMinFraction(t *testing.T) {
	srv := redistest.Start(t)
	env := map[string]string{EnvRedisURL: "redis://" + srv.Addr() + "/0"}
	r := cli(t, env, "http://127.0.0.1:1001\nhttp://127.0.0.1:1002\nhttp://127.0.0.1:1003\n", "load", "-")
	require.Equal(t, 0, r.code, r.all())
	file := filepath.Join(t.TempDir(), "list.txt")
	require.NoError(t, os.WriteFile(file, []byte("http://127.0.0.1:1001\n"), 0o600))
	r = cli(t, env, "", "sync", "-file", file, "-once", "-min-fraction", "NaN")
	assert.Equal(t, 2, r.code, r.all())
	r = cli(t, env, "", "list")
	assert.Equal(t, 3, strings.Count(r.stdout, "127.0.0.1:100"), "the pool is untouched: %s", r.all())
}
