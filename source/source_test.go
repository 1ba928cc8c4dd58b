package source_test

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/proxyswitch/proxyswitch/internal/testlog"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/source"
	"github.com/stretchr/testify/require"
)

// The canaries: no log line, error or Result may ever hold them.
const (
	canaryPass  = "CANARYpw7731"
	canaryToken = "CANARYtok5150"
	canaryQuery = "CANARYkey0042"
)

// provider is a fake provider API: GET /list answers the current list in
// the current mode, and only with the right bearer token.
type provider struct {
	mu    sync.Mutex
	mode  string // "lines", "json", "error", "slow", "garbage", "badjson"
	lines []string
	hits  atomic.Int64
}

func (p *provider) set(mode string, lines ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode, p.lines = mode, lines
}

func (p *provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.hits.Add(1)
	if r.Header.Get("Authorization") != "Bearer "+canaryToken || r.URL.Query().Get("key") != canaryQuery {
		http.Error(w, "no", http.StatusUnauthorized)
		return
	}
	p.mu.Lock()
	mode, lines := p.mode, slices.Clone(p.lines)
	p.mu.Unlock()
	switch mode {
	case "lines":
		w.Write([]byte("# provider export\n" + strings.Join(lines, "\n") + "\n"))
	case "json":
		json.NewEncoder(w).Encode(map[string]any{"data": map[string]any{"proxies": lines}})
	case "error":
		http.Error(w, "upstream "+canaryPass, http.StatusInternalServerError)
	case "slow":
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	case "garbage":
		w.Write([]byte("203.0.113.1:8080\n<html>oops " + canaryPass + "</html>\n10.0.0.1:99999:u:" + canaryPass + "\n"))
	case "badjson":
		w.Write([]byte(`{"data": {"proxies": "` + canaryPass + `"}}`))
	}
}

// providerLines are the four forms users have, with canary passwords.
func providerLines(from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		host := "198.51.100." + itoa(i)
		switch i % 4 {
		case 0:
			out = append(out, "http://user"+itoa(i)+":"+canaryPass+"@"+host+":8080")
		case 1:
			out = append(out, host+":8080")
		case 2:
			out = append(out, host+":8080:user"+itoa(i)+":"+canaryPass)
		case 3:
			out = append(out, "user"+itoa(i)+":"+canaryPass+"@"+host+":8080")
		}
	}
	return out
}

func itoa(i int) string { return strconv.Itoa(i) }

func noCanary(t *testing.T, what, s string) {
	t.Helper()
	for _, c := range []string{canaryPass, canaryToken, canaryQuery} {
		require.NotContains(t, s, c, "%s leaks a secret", what)
	}
}

func newSwitch(t *testing.T) *proxyswitch.Switch {
	t.Helper()
	sw, err := proxyswitch.NewSwitch(shared.Client(t), proxyswitch.WithPrefix(testPrefix()))
	require.NoError(t, err)
	t.Cleanup(func() { sw.Close(context.Background()) })
	return sw
}

func ids(t *testing.T, sw *proxyswitch.Switch) []string {
	t.Helper()
	ps, err := sw.List(context.Background())
	require.NoError(t, err)
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.ID()
	}
	slices.Sort(out)
	return out
}

func wantIDs(t *testing.T, lines []string) []string {
	t.Helper()
	ps, err := proxyswitch.ParseProxies(lines)
	require.NoError(t, err)
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.ID()
	}
	slices.Sort(out)
	return out
}

// TestSyncerFollowsProvider: a provider whose list changes over time, as
// lines and as JSON; each sync writes only when the list changed, applies
// exactly the difference, and keeps the state of the proxies it keeps.
func TestSyncerFollowsProvider(t *testing.T) {
	ctx := context.Background()
	prov := &provider{}
	srv := httptest.NewServer(prov)
	defer srv.Close()
	sw := newSwitch(t)
	var logs testlog.Buffer
	var results []source.Result
	sy := &source.Syncer{Switch: sw,
		Source: &source.HTTP{URL: srv.URL + "/list?key=" + canaryQuery, Token: canaryToken},
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		OnSync: func(r source.Result) { results = append(results, r) }}

	v1 := providerLines(0, 20)
	prov.set("lines", v1...)
	r, err := sy.Sync(ctx)
	require.NoError(t, err)
	require.Equal(t, source.Result{Source: r.Source, At: r.At, Fetched: 20, Before: 0, Added: 20, Size: 20, Written: true}, r)
	require.Equal(t, wantIDs(t, v1), ids(t, sw))

	// A ban on a proxy the next list keeps survives the sync.
	kept := v1[5]
	require.NoError(t, sw.Ban(ctx, kept, "shop.example", time.Hour))

	// Unchanged: nothing written.
	r, err = sy.Sync(ctx)
	require.NoError(t, err)
	require.False(t, r.Written)
	require.Equal(t, 0, r.Added+r.Removed)

	// v2: 4 gone, 6 new, served as JSON.
	v2 := append(slices.Clone(v1[4:]), providerLines(20, 26)...)
	prov.set("json", v2...)
	sy.Source.(*source.HTTP).Extract = source.JSON("data", "proxies")
	r, err = sy.Sync(ctx)
	require.NoError(t, err)
	require.True(t, r.Written)
	require.Equal(t, []int{22, 20, 6, 4, 22}, []int{r.Fetched, r.Before, r.Added, r.Removed, r.Size})
	require.Equal(t, wantIDs(t, v2), ids(t, sw))
	st, err := sw.ProxyStates(ctx, "shop.example")
	require.NoError(t, err)
	keptP, _ := proxyswitch.ParseProxy(kept)
	for _, s := range st {
		if s.Proxy.ID() == keptP.ID() {
			require.Equal(t, proxyswitch.StateQuarantined, s.State, "the sync reset a kept proxy's ban")
		}
	}
	require.Len(t, results, 3)
	noCanary(t, "logs", logs.String())
	require.Contains(t, logs.String(), "added=6 removed=4")
	for _, r := range results {
		noCanary(t, "result", r.Source)
	}
}

// TestSyncerFailuresNeverEmptyThePool: errors, time-outs, garbage, bad
// JSON, an empty list and a far shorter one all leave the pool as it was,
// and no error or log line holds a password, the token or the URL's key.
func TestSyncerFailuresNeverEmptyThePool(t *testing.T) {
	ctx := context.Background()
	prov := &provider{}
	srv := httptest.NewServer(prov)
	defer srv.Close()
	sw := newSwitch(t)
	var logs testlog.Buffer
	src := &source.HTTP{URL: srv.URL + "/list?key=" + canaryQuery, Token: canaryToken,
		Client: &http.Client{Timeout: 300 * time.Millisecond}}
	sy := &source.Syncer{Switch: sw, Source: src, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	full := providerLines(0, 40)
	prov.set("lines", full...)
	_, err := sy.Sync(ctx)
	require.NoError(t, err)
	want := wantIDs(t, full)

	cases := []struct {
		name    string
		mode    string
		lines   []string
		extract func([]byte) ([]string, error)
		guard   bool
	}{
		{name: "500", mode: "error"},
		{name: "timeout", mode: "slow"},
		{name: "garbage", mode: "garbage"},
		{name: "bad JSON", mode: "badjson", extract: source.JSON("data", "proxies")},
		{name: "lines read as JSON", mode: "lines", lines: full, extract: source.JSON()},
		{name: "empty", mode: "lines", guard: true},
		{name: "empty JSON", mode: "json", lines: []string{}, extract: source.JSON("data", "proxies"), guard: true},
		{name: "far fewer", mode: "lines", lines: full[:19], guard: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			prov.set(c.mode, c.lines...)
			src.Extract = c.extract
			r, err := sy.Sync(ctx)
			require.Error(t, err)
			require.Equal(t, err, r.Err)
			require.False(t, r.Written)
			require.Equal(t, c.guard, errors.Is(err, source.ErrGuard), "%v", err)
			noCanary(t, "error", err.Error())
			require.Equal(t, want, ids(t, sw), "the pool changed")
		})
	}
	noCanary(t, "logs", logs.String())
	require.Contains(t, logs.String(), "sync failed")

	// Half the pool passes the guard (the threshold is inclusive); with
	// NoGuard even an empty list does.
	prov.set("lines", full[:20]...)
	src.Extract = nil
	r, err := sy.Sync(ctx)
	require.NoError(t, err)
	require.Equal(t, 20, r.Size)
	sy.NoGuard = true
	prov.set("lines")
	r, err = sy.Sync(ctx)
	require.NoError(t, err)
	require.Equal(t, 0, r.Size)
}

// TestFileSourceRun: Run re-reads a file on its interval; an invalid edit
// leaves the pool as it was and names the line, not the password.
func TestFileSourceRun(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sw := newSwitch(t)
	path := filepath.Join(t.TempDir(), "proxies.txt")
	write := func(lines ...string) {
		tmp := path + ".tmp"
		require.NoError(t, os.WriteFile(tmp, []byte(strings.Join(lines, "\n")), 0o600))
		require.NoError(t, os.Rename(tmp, path))
	}
	v1 := providerLines(0, 8)
	write(v1...)
	var mu sync.Mutex
	var errs []error
	sy := &source.Syncer{Switch: sw, Source: source.File{Path: path}, Every: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&testlog.Buffer{}, nil)),
		OnSync: func(r source.Result) {
			mu.Lock()
			errs = append(errs, r.Err)
			mu.Unlock()
		}}
	done := make(chan error)
	go func() { done <- sy.Run(ctx) }()
	require.Eventually(t, func() bool { return slices.Equal(ids(t, sw), wantIDs(t, v1)) }, 5*time.Second, 10*time.Millisecond)
	write(append(slices.Clone(v1), "198.51.100.77:99999:bob:"+canaryPass)...)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(errs) > 0 && errs[len(errs)-1] != nil
	}, 5*time.Second, 10*time.Millisecond)
	mu.Lock()
	last := errs[len(errs)-1]
	mu.Unlock()
	require.Contains(t, last.Error(), "line 9")
	noCanary(t, "error", last.Error())
	require.Equal(t, wantIDs(t, v1), ids(t, sw))
	v2 := providerLines(3, 12)
	write(v2...)
	require.Eventually(t, func() bool { return slices.Equal(ids(t, sw), wantIDs(t, v2)) }, 5*time.Second, 10*time.Millisecond)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
}

// TestSyncersConcurrent: three processes' Syncers (three Redis clients)
// sync one pool from one provider whose list keeps changing, under -race;
// every list the pool ever holds is one the provider served (never a mix,
// never empty), and at the end it is the last one.
func TestSyncersConcurrent(t *testing.T) {
	ctx := context.Background()
	prov := &provider{}
	srv := httptest.NewServer(prov)
	defer srv.Close()
	prefix := testPrefix()
	lists := make([][]string, 6)
	served := map[string]bool{}
	for i := range lists {
		lists[i] = providerLines(i*3, i*3+30)
		served[strings.Join(wantIDs(t, lists[i]), ",")] = true
	}
	prov.set("lines", lists[0]...)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := 0; w < 3; w++ {
		sw, err := proxyswitch.NewSwitch(shared.Client(t), proxyswitch.WithPrefix(prefix))
		require.NoError(t, err)
		defer sw.Close(ctx)
		sy := &source.Syncer{Switch: sw, Source: &source.HTTP{URL: srv.URL + "/list?key=" + canaryQuery, Token: canaryToken},
			Logger: slog.New(slog.NewTextHandler(&testlog.Buffer{}, nil))}
		for g := 0; g < 3; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					_, _ = sy.Sync(ctx)
				}
			}()
		}
	}
	reader2, err := proxyswitch.NewSwitch(shared.Client(t), proxyswitch.WithPrefix(prefix))
	require.NoError(t, err)
	defer reader2.Close(ctx)
	for i := 1; i < len(lists); i++ {
		prov.set("lines", lists[i]...)
		deadline := time.Now().Add(100 * time.Millisecond)
		for time.Now().Before(deadline) {
			got := ids(t, reader2)
			if len(got) > 0 {
				require.True(t, served[strings.Join(got, ",")], "the pool holds a list no source served")
			}
		}
	}
	last := wantIDs(t, lists[len(lists)-1])
	require.Eventually(t, func() bool { return slices.Equal(ids(t, reader2), last) }, 5*time.Second, 10*time.Millisecond)
	close(stop)
	wg.Wait()
	require.Equal(t, last, ids(t, reader2))
}

// TestSyncerConfig: a Syncer without a Switch or a Source, or with a
// threshold out of range, and an HTTP source with a bad URL fail with a
// clear error, never a panic.
func TestSyncerConfig(t *testing.T) {
	ctx := context.Background()
	sw := newSwitch(t)
	for _, sy := range []*source.Syncer{{}, {Switch: sw}, {Source: source.File{Path: "x"}},
		{Switch: sw, Source: source.File{Path: "x"}, MinFraction: 2}, {Switch: sw, Source: source.File{Path: "x"}, Every: -1}} {
		_, err := sy.Sync(ctx)
		require.ErrorIs(t, err, proxyswitch.ErrConfig)
		require.ErrorIs(t, sy.Run(ctx), proxyswitch.ErrConfig)
	}
	for _, u := range []string{"", "ftp://x/y", "http://", "://" + canaryPass} {
		_, err := (&source.HTTP{URL: u}).Fetch(ctx)
		require.Error(t, err)
		noCanary(t, "error", err.Error())
	}
	_, err := source.File{Path: filepath.Join(t.TempDir(), "missing")}.Fetch(ctx)
	require.ErrorIs(t, err, os.ErrNotExist)
}

// TestSyncerRelabels: a list whose proxies stay but whose labels change is
// a change: the sync writes it, and the pool's proxies carry the new labels.
func TestSyncerRelabels(t *testing.T) {
	ctx := context.Background()
	sw := newSwitch(t)
	path := filepath.Join(t.TempDir(), "proxies.txt")
	write := func(lines ...string) {
		require.NoError(t, os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o600))
	}
	sy := &source.Syncer{Switch: sw, Source: source.File{Path: path}, Logger: slog.New(slog.NewTextHandler(&testlog.Buffer{}, nil))}
	labels := func() []string {
		ps, err := sw.List(ctx)
		require.NoError(t, err)
		var out []string
		for _, p := range ps {
			out = append(out, p.Labels()["country"])
		}
		return out
	}
	write("http://10.0.0.1:3128 country=ru", "http://10.0.0.2:3128 country=ru")
	r, err := sy.Sync(ctx)
	require.NoError(t, err)
	require.True(t, r.Written)
	require.Equal(t, []string{"ru", "ru"}, labels())
	r, err = sy.Sync(ctx)
	require.NoError(t, err)
	require.False(t, r.Written, "nothing changed")
	write("http://10.0.0.1:3128 country=ru", "http://10.0.0.2:3128 country=kz")
	r, err = sy.Sync(ctx)
	require.NoError(t, err)
	require.True(t, r.Written, "a label changed")
	require.Equal(t, []string{"ru", "kz"}, labels())
}
