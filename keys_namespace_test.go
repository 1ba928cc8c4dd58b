package proxyswitch

import (
	"context"
	"strings"
	"testing"

	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/stretchr/testify/require"
)

// poolKeys are every key of one pool's keyspace, sites and tasks included.
func poolKeys(k keyspace) []string {
	out := []string{k.proxies(), k.meta(), k.sites(), k.fails(), k.quarantine(), k.dead(), k.liveSessions(),
		k.members(), k.memberOwners(), k.modes(), k.session("t:1"), k.sessionJar("j:1"),
		k.gateways(), k.labels(), k.gatewayIndex(), k.relabel(), k.gatewayMembers("http://u-{session}:p@gw.example:1")}
	for _, site := range []string{globalSite, "example.com", "a:b"} {
		out = append(out, k.free(site), k.leases(site), k.strikes(site), k.health(site), k.pace(site))
	}
	return out
}

// Two distinct (prefix, pool) pairs never share a key, nor is a key of one
// within the other's pattern "<tag>:*" (issue 13, item 9): every key of a
// pool starts with its own tag, whose only '}' closes it, and the tags of
// distinct pairs differ.
func TestKeyspaceDisjoint(t *testing.T) {
	names := testbed.Spellings("a:%3A", 3)
	owner := map[string][2]string{} // tag -> (prefix, pool)
	for _, prefix := range names {
		for _, pool := range names {
			k, err := newKeyspace(prefix, pool)
			require.NoError(t, err)
			if o, dup := owner[k.base]; dup {
				t.Fatalf("prefix %q pool %q and prefix %q pool %q share the keys %s:*", o[0], o[1], prefix, pool, k.base)
			}
			owner[k.base] = [2]string{prefix, pool}
			for _, key := range poolKeys(k) {
				if !strings.HasPrefix(key, k.base+":") || strings.IndexByte(key, '}') != len(k.base)-1 {
					t.Fatalf("key %q of prefix %q pool %q is not under its tag %s", key, prefix, pool, k.base)
				}
			}
		}
	}
	// Names without ':' or '%' keep the keys of earlier releases.
	k, err := newKeyspace("proxyswitch", "default")
	require.NoError(t, err)
	require.Equal(t, "{proxyswitch:default}:proxies", k.proxies())
	k, err = newKeyspace("app:crawl", "dc-1")
	require.NoError(t, err)
	require.Equal(t, "{app:crawl:dc-1}:proxies", k.proxies())
}

// The case of the issue on a real Redis: prefix "a:b" with pool "default"
// and prefix "a" with pool "b:default" each keep their own list.
func TestKeyspaceDisjointRedis(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	p := testPrefix()
	one, err := NewSwitch(rdb, WithPrefix(p+":b"), WithPool("default"))
	require.NoError(t, err)
	two, err := NewSwitch(rdb, WithPrefix(p), WithPool("b:default"))
	require.NoError(t, err)

	_, err = one.Replace(ctx, []string{"http://10.0.0.1:8080", "http://10.0.0.2:8080"})
	require.NoError(t, err)
	_, err = two.Replace(ctx, []string{"http://10.0.0.3:8080"})
	require.NoError(t, err)

	urls := func(s *Switch) []string {
		ps, err := s.List(ctx)
		require.NoError(t, err)
		var out []string
		for _, p := range ps {
			out = append(out, p.String())
		}
		return out
	}
	require.Equal(t, []string{"http://10.0.0.1:8080", "http://10.0.0.2:8080"}, urls(one))
	require.Equal(t, []string{"http://10.0.0.3:8080"}, urls(two))

	_, err = one.Remove(ctx, "http://10.0.0.1:8080")
	require.NoError(t, err)
	require.Equal(t, []string{"http://10.0.0.3:8080"}, urls(two))
	require.NoError(t, two.Clear(ctx))
	require.Equal(t, []string{"http://10.0.0.2:8080"}, urls(one))
}
