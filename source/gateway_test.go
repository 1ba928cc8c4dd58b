package source_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/internal/engine"
	"github.com/proxyswitch/proxyswitch/internal/testlog"
	"github.com/proxyswitch/proxyswitch/source"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// poolWrites counts the pool_update.lua calls a client sends: the only
// script of a sync whose keys hold the pool's ":gwrelabel" key.
type poolWrites struct{ n atomic.Int64 }

func (w *poolWrites) DialHook(next redis.DialHook) redis.DialHook { return next }

func (w *poolWrites) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		for _, a := range cmd.Args() {
			if s, ok := a.(string); ok && strings.HasSuffix(s, ":gwrelabel") {
				w.n.Add(1)
				break
			}
		}
		return next(ctx, cmd)
	}
}

func (w *poolWrites) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestSyncerGatewayTemplate: a list holding a gateway template
// ({session:N}) expands to new session ids at every fetch, yet a sync of
// the unchanged list writes nothing (no pool_update.lua call, the pool's
// generation and sessions as they were, no "pool updated" line), while a
// change of N, of the template's labels, or the template's going or
// coming back is written.
func TestSyncerGatewayTemplate(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	writes := &poolWrites{}
	rdb.AddHook(writes)
	prefix := testPrefix()
	sw, err := proxyswitch.NewSwitch(rdb, proxyswitch.WithPrefix(prefix))
	require.NoError(t, err)
	t.Cleanup(func() { sw.Close(context.Background()) })
	base, err := engine.KeyBase(prefix, sw.Pool())
	require.NoError(t, err)
	generation := func() string {
		v, err := rdb.HGet(ctx, base+":meta", "version").Result()
		require.NoError(t, err)
		return v
	}

	path := filepath.Join(t.TempDir(), "proxies.txt")
	plain := providerLines(0, 4)
	gateway := func(n, labels string) string {
		return "gw.example:7000:cust-acme-session-{session:" + n + "}:" + canaryPass + " " + labels
	}
	write := func(lines ...string) {
		require.NoError(t, os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o600))
	}
	var logs testlog.Buffer
	sy := &source.Syncer{Switch: sw, Source: source.File{Path: path}, NoGuard: true,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	sync := func() source.Result {
		t.Helper()
		r, err := sy.Sync(ctx)
		require.NoError(t, err)
		return r
	}
	// unchanged syncs the list twice more and checks that neither wrote.
	unchanged := func(size int) {
		t.Helper()
		before, gen, w, lines := ids(t, sw), generation(), writes.n.Load(), strings.Count(logs.String(), "pool updated")
		for range 2 {
			r := sync()
			require.Equal(t, source.Result{Source: r.Source, At: r.At, Fetched: size, Before: size, Size: size}, r)
		}
		require.Equal(t, w, writes.n.Load(), "pool_update.lua calls for an unchanged list")
		require.Equal(t, gen, generation(), "the pool's generation moved")
		require.Equal(t, before, ids(t, sw), "the gateway's sessions changed")
		require.Equal(t, lines, strings.Count(logs.String(), "pool updated"))
	}
	gatewayLabels := func() map[string]int {
		ps, err := sw.List(ctx)
		require.NoError(t, err)
		out := map[string]int{}
		for _, p := range ps {
			if p.URL().Host == "gw.example:7000" {
				out[p.Labels()["type"]]++
			}
		}
		return out
	}

	write(append(slices.Clone(plain), gateway("5", "type=res"))...)
	r := sync()
	require.True(t, r.Written)
	require.Equal(t, []int{9, 0, 9, 0, 9}, []int{r.Fetched, r.Before, r.Added, r.Removed, r.Size})
	require.Positive(t, writes.n.Load(), "the hook sees no pool_update.lua call")
	unchanged(9)

	// N grows: the 5 sessions stay, 2 join.
	sessions := ids(t, sw)
	write(append(slices.Clone(plain), gateway("7", "type=res"))...)
	r = sync()
	require.True(t, r.Written)
	require.Equal(t, []int{2, 0, 11}, []int{r.Added, r.Removed, r.Size})
	require.Subset(t, ids(t, sw), sessions)
	unchanged(11)

	// N shrinks.
	write(append(slices.Clone(plain), gateway("3", "type=res"))...)
	r = sync()
	require.True(t, r.Written)
	require.Equal(t, []int{0, 4, 7}, []int{r.Added, r.Removed, r.Size})
	unchanged(7)

	// The template's labels change: written, every session relabelled.
	write(append(slices.Clone(plain), gateway("3", "type=dc"))...)
	r = sync()
	require.True(t, r.Written)
	require.Equal(t, map[string]int{"dc": 3}, gatewayLabels())
	unchanged(7)

	// The template goes, then comes back.
	write(plain...)
	r = sync()
	require.True(t, r.Written)
	require.Equal(t, []int{0, 3, 4}, []int{r.Added, r.Removed, r.Size})
	unchanged(4)
	write(append(slices.Clone(plain), gateway("3", "type=dc"))...)
	r = sync()
	require.True(t, r.Written)
	require.Equal(t, []int{3, 0, 7}, []int{r.Added, r.Removed, r.Size})
	unchanged(7)

	// A plain proxy relabelled beside the template.
	write(plain[0]+" type=dc", plain[1], plain[2], plain[3], gateway("3", "type=dc"))
	r = sync()
	require.True(t, r.Written)
	unchanged(7)

	// A gateway larger than one call (500 proxies): replaced and
	// compared in pages, still no write when unchanged.
	write(append(slices.Clone(plain), gateway("600", "type=dc"))...)
	r = sync()
	require.True(t, r.Written)
	require.Equal(t, []int{597, 0, 604}, []int{r.Added, r.Removed, r.Size})
	unchanged(604)

	noCanary(t, "logs", logs.String())
}
