package main

import (
	"strings"
	"testing"

	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCLIHelpAndUsage: an explicit -h prints the whole help on stdout and
// exits 0, as Go's flag convention has it; a usage mistake says what it was
// in one line, then the usage line, and exits 2.
func TestCLIHelpAndUsage(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"-help"}, {"--help"}, {"-pool", "x", "-h", "list"}} {
		r := cli(t, nil, "", args...)
		assert.Equal(t, 0, r.code, "%v: %s", args, r.all())
		assert.Contains(t, r.stdout, "commands:", args)
		assert.Contains(t, r.stdout, "-redis string", args)
		assert.Contains(t, r.stdout, "BUSY", args)
		assert.Empty(t, r.stderr, args)
	}
	for name, args := range map[string][]string{
		"no command":      nil,
		"unknown command": {"frobnicate"},
		"bad flag":        {"-nope", "list"},
		"arity":           {"list", "a.example", "b.example"},
	} {
		r := cli(t, nil, "", args...)
		assert.Equal(t, 2, r.code, "%s: %s", name, r.all())
		assert.Empty(t, r.stdout, name)
		lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
		assert.Len(t, lines, 2, "%s: one line about the mistake and the usage line, not the whole help: %q", name, r.stderr)
		assert.Equal(t, usageLine, lines[len(lines)-1], name)
		assert.NotContains(t, r.stderr, "commands:", name)
	}
}

// TestCLIMessagesNameTheirCause covers the reports the CLI gives: one
// "proxyswitch: " prefix per message, remove's and revive's counts, unban
// of a proxy that was not quarantined, and the legend of stats' BUSY.
func TestCLIMessagesNameTheirCause(t *testing.T) {
	srv := redistest.Start(t)
	env := map[string]string{EnvRedisURL: "redis://" + srv.Addr() + "/0"}
	a, b, c := "http://127.0.0.1:3128", "http://127.0.0.2:3128", "http://127.0.0.9:1"
	r := cli(t, env, "", "add", a, b)
	require.Equal(t, 0, r.code, r.all())

	// One prefix, on a library error (Redis down) and a usage error from
	// the library (a bad pool name).
	dead := redistest.Start(t)
	deadURL := "redis://" + dead.Addr() + "/0"
	require.NoError(t, dead.Kill())
	for _, args := range [][]string{
		{"-redis", deadURL, "-timeout", "300ms", "list"},
		{"-pool", "a{b", "list"},
	} {
		r = cli(t, env, "", args...)
		assert.NotEqual(t, 0, r.code, r.all())
		assert.Equal(t, 1, strings.Count(r.stderr, "proxyswitch:"), "%v: %q", args, r.stderr)
	}

	// remove reports what it removed, and what it did not find.
	r = cli(t, env, "", "remove", proxyIDOf(t, b), c)
	require.Equal(t, 0, r.code, r.all())
	assert.Equal(t, "removed 1 of 2 proxies (the others were not in the pool), pool size 1\n", r.stdout)
	r = cli(t, env, "", "remove", a)
	require.Equal(t, 0, r.code, r.all())
	assert.Equal(t, "removed 1 of 1 proxies, pool size 0\n", r.stdout)
	// A gateway template, as the library's Remove takes it: all its proxies.
	gw := "http://cust-session-{session:3}:pw@127.0.0.7:9999"
	r = cli(t, env, "", "add", gw)
	require.Equal(t, 0, r.code, r.all())
	r = cli(t, env, "", "remove", gw)
	require.Equal(t, 0, r.code, r.all())
	assert.Equal(t, "removed 3 proxies (a gateway template names all its proxies; any other not found was not in the pool), pool size 0\n", r.stdout)
	r = cli(t, env, "", "remove", "http://cust-session-{sesion:3}:pw@127.0.0.7:9999")
	assert.Equal(t, 1, r.code, r.all())
	assert.NotContains(t, r.all(), ":pw@")

	r = cli(t, env, "", "add", a, b)
	require.Equal(t, 0, r.code, r.all())
	idA, idB := proxyIDOf(t, a), proxyIDOf(t, b)

	// unban: of a proxy that is not quarantined, and of one that is.
	r = cli(t, env, "", "unban", idA, "ozon.example")
	require.Equal(t, 0, r.code, r.all())
	assert.Equal(t, "proxy "+idA+" was not quarantined on ozon.example (free): nothing to unban but its backoff and any hold of its exit IP there\n", r.stdout)
	r = cli(t, env, "", "ban", idA, "ozon.example", "1h")
	require.Equal(t, 0, r.code, r.all())
	r = cli(t, env, "", "unban", idA, "ozon.example")
	require.Equal(t, 0, r.code, r.all())
	assert.Equal(t, "unbanned proxy "+idA+" on ozon.example\n", r.stdout)

	// stats explains BUSY.
	sw, err := proxyswitch.NewSwitch(srv.Client(t))
	require.NoError(t, err)
	l, err := sw.Lease(t.Context(), "ozon.example")
	require.NoError(t, err)
	r = cli(t, env, "", "stats", "ozon.example")
	require.Equal(t, 0, r.code, r.all())
	assert.Regexp(t, `ozon\.example\s+2\s+1\s+1\s+1\s+0\s+0\s+0\s*\n`, r.stdout)
	assert.Contains(t, r.stdout, "BUSY = every slot not FREE: LEASED + COOLING + QUARANTINED + DEAD")
	require.NoError(t, l.Release(t.Context()))

	// revive: all of them, some of them, none of them.
	for _, id := range []string{idA, idB} {
		require.NoError(t, func() error { _, err := sw.Drain(t.Context(), "", id); return err }())
	}
	r = cli(t, env, "", "revive", idA, idB)
	require.Equal(t, 0, r.code, r.all())
	assert.Equal(t, "revived 2 of 2 proxies\n", r.stdout)
	require.NoError(t, func() error { _, err := sw.Drain(t.Context(), "", idA); return err }())
	r = cli(t, env, "", "revive", idA, idB)
	require.Equal(t, 0, r.code, r.all())
	assert.Equal(t, "revived 1 of 2 proxies (the others were neither dead nor drained)\n", r.stdout)
	r = cli(t, env, "", "revive", idA)
	require.Equal(t, 0, r.code, r.all())
	assert.Equal(t, "revived 0 of 1 proxies (none was dead or drained)\n", r.stdout)
}

// TestCLICommandHelp: every command's explicit -h (-help, --help) prints
// that command's help on stdout and exits 0, without touching Redis (the
// URL given is of a Redis that is gone); serve and clear list their flags.
func TestCLICommandHelp(t *testing.T) {
	dead := redistest.Start(t)
	env := map[string]string{EnvRedisURL: "redis://" + dead.Addr() + "/0"}
	require.NoError(t, dead.Kill())
	commands := []string{"load", "add", "remove", "list", "stats", "ban", "unban", "pause", "resume", "drain", "revive", "clear", "queue", "serve", "sync", "probe"}
	assert.Len(t, commandHelp, len(commands), "a help for every command, and a test of it")
	flags := map[string][]string{"clear": {"-yes"}, "serve": {"-addr string", "-queue string", "-scrape-timeout duration", "(default 700ms)"}}
	for _, cmd := range commands {
		for _, h := range []string{"-h", "-help", "--help"} {
			args := []string{"-timeout", "300ms", cmd, h}
			r := cli(t, env, "", args...)
			assert.Equal(t, 0, r.code, "%v: %s", args, r.all())
			assert.True(t, strings.HasPrefix(r.stdout, "usage: proxyswitch [flags] "+cmd+" "), "%v: %q", args, r.stdout)
			assert.Empty(t, r.stderr, args)
			for _, f := range flags[cmd] {
				assert.Contains(t, r.stdout, f, args)
			}
		}
	}
	// After other flags of the command too, as the flag package reads them.
	for _, args := range [][]string{{"serve", "-addr", "127.0.0.1:0", "-h"}, {"clear", "-yes", "-h"}} {
		r := cli(t, env, "", args...)
		assert.Equal(t, 0, r.code, "%v: %s", args, r.all())
		assert.True(t, strings.HasPrefix(r.stdout, "usage: proxyswitch [flags] "+args[0]+" "), "%v: %q", args, r.stdout)
	}
}
