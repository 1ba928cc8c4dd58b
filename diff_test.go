package proxyswitch

import (
	"context"
	"strings"
	"testing"

	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/hooks"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDiff: Switch.diff counts what ReplaceProxies would change, a gateway
// template by template, N and labels: a fresh parse of the pool's list
// (new session ids) is no change, nor is it after a ban rotated a
// session; N, the template's labels, a plain proxy's labels, a proxy or
// the template gone or new are.
func TestDiff(t *testing.T) {
	ctx := context.Background()
	s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: Off}))
	const tmpl = "http://user-session-{session:3}:pw@gw.example:7000 type=res"
	const plain = "http://plain:pw@127.0.0.2:8080 country=kz"
	diff := func(lines ...string) hooks.PoolDiff {
		t.Helper()
		ps, err := ParseProxies(lines)
		require.NoError(t, err)
		d, err := s.diff(ctx, ps)
		require.NoError(t, err)
		return d
	}
	assert.Equal(t, hooks.PoolDiff{Added: 4}, diff(tmpl, plain), "an empty pool")
	_, err := s.Replace(ctx, []string{tmpl, plain})
	require.NoError(t, err)
	assert.Equal(t, hooks.PoolDiff{Size: 4}, diff(tmpl, plain))
	assert.False(t, diff(tmpl, plain).Changed())

	// A ban rotates a session: the pool still holds 3 of the template.
	before := poolIDs(t, s)
	ps, err := s.List(ctx)
	require.NoError(t, err)
	for _, p := range ps {
		if p.URL().Host == "gw.example:7000" {
			_, err = s.penalize(ctx, "shop.example", p, nil, ban.Verdict{Kind: ban.Ban, Reason: "http_403"})
			require.NoError(t, err)
			break
		}
	}
	require.NotEqual(t, before, poolIDs(t, s), "no session rotated")
	assert.Equal(t, hooks.PoolDiff{Size: 4}, diff(tmpl, plain))

	more := strings.Replace(tmpl, ":3}", ":5}", 1)
	fewer := strings.Replace(tmpl, ":3}", ":2}", 1)
	for _, c := range []struct {
		name  string
		lines []string
		want  hooks.PoolDiff
	}{
		{"N up", []string{more, plain}, hooks.PoolDiff{Size: 4, Added: 2}},
		{"N down", []string{fewer, plain}, hooks.PoolDiff{Size: 4, Removed: 1}},
		{"N down, relabelled", []string{strings.Replace(fewer, "res", "dc", 1), plain}, hooks.PoolDiff{Size: 4, Removed: 1, Relabelled: 2}},
		{"template relabelled", []string{strings.Replace(tmpl, "res", "dc", 1), plain}, hooks.PoolDiff{Size: 4, Relabelled: 3}},
		{"plain relabelled", []string{tmpl, strings.Replace(plain, "kz", "ru", 1)}, hooks.PoolDiff{Size: 4, Relabelled: 1}},
		{"plain gone", []string{tmpl}, hooks.PoolDiff{Size: 4, Removed: 1}},
		{"template gone", []string{plain}, hooks.PoolDiff{Size: 4, Removed: 3}},
		{"plain new", []string{tmpl, plain, "127.0.0.3:8080"}, hooks.PoolDiff{Size: 4, Added: 1}},
		{"another template", []string{strings.Replace(tmpl, "user-", "other-", 1), plain}, hooks.PoolDiff{Size: 4, Added: 3, Removed: 3}},
	} {
		assert.Equal(t, c.want, diff(c.lines...), c.name)
		assert.True(t, c.want.Changed(), c.name)
	}
}
