package storage

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/proxyswitch/proxyswitch/internal/engine"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// fill writes every kind of key a namespace has: visited marks, cookies,
// queued, in-flight and dead requests.
func fill(t testing.TB, s *Storage) {
	t.Helper()
	for i := range 50 {
		require.NoError(t, s.Visited(uint64(i)*7919))
	}
	u, _ := url.Parse("http://shop.example/")
	s.SetCookies(u, "a=1; Path=/")
	for i := range 3 {
		require.NoError(t, s.AddRequest(marshal(t, fmt.Sprintf("http://shop.example/%d", i))))
	}
	tok, _ := pop(t, s)
	_, err := s.nack(bg, tok, "failed", true)
	require.NoError(t, err)
	pop(t, s) // in flight
}

// allKeys lists every key of the server (a test may SCAN everything).
func allKeys(t testing.TB, rdb *redis.Client) []string {
	t.Helper()
	var keys []string
	iter := rdb.Scan(bg, 0, "*", 1000).Iterator()
	for iter.Next(bg) {
		keys = append(keys, iter.Val())
	}
	require.NoError(t, iter.Err())
	slices.Sort(keys)
	return keys
}

// Clearing one namespace removes all of its keys and none of another's,
// even when the namespaces are each other's prefixes or glob patterns.
func TestClearOnlyOwnNamespace(t *testing.T) {
	rdb := redistest.Start(t).Client(t) // a server of its own: every key is ours
	names := []string{"a", "a*", "a?", "[a]", `a\`, "a:v", "a:v:", "a:", "ab", "*"}
	stores := map[string]*Storage{}
	for _, ns := range names {
		s := newStorage(t, rdb, WithNamespace(ns), WithVisitedBuckets(8))
		fill(t, s)
		stores[ns] = s
	}
	owned := func(ns, key string) bool {
		ns = engine.EscapeName(ns) // ':' is "%3A" in the keys
		return strings.HasPrefix(key, "{"+ns+"}:") || strings.HasPrefix(key, ns+":v:{")
	}
	before := allKeys(t, rdb)
	for _, ns := range names {
		n := 0
		for _, k := range before {
			if owned(ns, k) {
				n++
			}
		}
		require.GreaterOrEqual(t, n, 10, "namespace %q wrote %d keys", ns, n)
	}
	for i, ns := range names {
		require.NoError(t, stores[ns].Clear(bg), ns)
		after := allKeys(t, rdb)
		var want []string
		for _, k := range before {
			gone := false
			for _, cleared := range names[:i+1] {
				gone = gone || owned(cleared, k)
			}
			if !gone {
				want = append(want, k)
			}
		}
		require.Equal(t, want, after, "after clearing %q", ns)
	}
	require.Empty(t, allKeys(t, rdb))
}

// keyMeter records the most keys one command named and the most items one
// read of a set returned (SMEMBERS, SSCAN) on a client, in pipelines too.
type keyMeter struct {
	mu               sync.Mutex
	maxKeys, maxRead int
	cmds             map[string]int
}

func (m *keyMeter) note(cmd redis.Cmder) {
	m.mu.Lock()
	defer m.mu.Unlock()
	name := strings.ToLower(cmd.Name())
	m.cmds[name]++
	switch name {
	case "unlink", "del":
		m.maxKeys = max(m.maxKeys, len(cmd.Args())-1)
	case "smembers":
		if c, ok := cmd.(*redis.StringSliceCmd); ok {
			m.maxRead = max(m.maxRead, len(c.Val()))
		}
	case "sscan":
		if c, ok := cmd.(*redis.ScanCmd); ok {
			keys, _ := c.Val()
			m.maxRead = max(m.maxRead, len(keys))
		}
	}
}

func (m *keyMeter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (m *keyMeter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		m.note(cmd)
		return err
	}
}
func (m *keyMeter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			m.note(c)
		}
		return err
	}
}

// Clear of a namespace whose cookie registries hold 5,000 domains and
// hosts (cookie jars, and hashes per host of an earlier version) reads
// the registries in pages (SSCAN) and deletes the cookie hashes in batches:
// no command names or returns more than a page's worth of hosts (before,
// one SMEMBERS and one UNLINK of every host: 300,000 hosts blocked Redis
// for 314 ms and 217 ms). Every cookie hash goes, another namespace's stay.
func TestClearCookieHostsInPages(t *testing.T) {
	rdb := redistest.Start(t).Client(t) // a server of its own: every key is ours
	const n = 5000
	s := newStorage(t, rdb, WithNamespace("a"), WithVisitedBuckets(8))
	other := newStorage(t, rdb, WithNamespace("b"), WithVisitedBuckets(8))
	fill(t, other)
	for i := 0; i < n; i += 1000 {
		_, err := rdb.Pipelined(bg, func(p redis.Pipeliner) error {
			for j := i; j < i+1000; j++ {
				h := fmt.Sprintf("host-%d.example", j)
				// Half in jars, half in hashes of an earlier version.
				if j%2 == 0 {
					p.HSet(bg, s.keys.cookieJar(h), h+";/;sid", "1|h|0|sid=abc; Path=/")
					p.SAdd(bg, s.keys.cookieDomains(), h)
				} else {
					p.HSet(bg, s.keys.legacyCookies(h), "sid", "sid=abc; Path=/")
					p.SAdd(bg, s.keys.cookieHosts(), h)
				}
			}
			return nil
		})
		require.NoError(t, err)
	}
	u, _ := url.Parse("http://shop.example/")
	s.SetCookies(u, "a=1; Path=/") // and one through the Storage
	otherKeys := allKeys(t, rdb)
	otherKeys = slices.DeleteFunc(otherKeys, func(k string) bool { return !strings.HasPrefix(k, "{b}:") && !strings.HasPrefix(k, "b:") })
	require.NotEmpty(t, otherKeys)

	m := &keyMeter{cmds: map[string]int{}}
	rdb.AddHook(m)
	require.NoError(t, s.Clear(bg))
	t.Logf("commands: %v; most keys in one UNLINK %d, most hosts in one read %d", m.cmds, m.maxKeys, m.maxRead)
	require.Zero(t, m.cmds["smembers"], "no SMEMBERS of the whole registry")
	require.LessOrEqual(t, m.maxRead, 2*clearBatch, "one read returned more than a page of hosts")
	require.LessOrEqual(t, m.maxKeys, 2*clearBatch, "one UNLINK named more than a page of keys")
	require.Equal(t, otherKeys, allKeys(t, rdb), "Clear left keys of its namespace, or took another's")
}
