package proxyswitch

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"testing"

	"github.com/proxyswitch/proxyswitch/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The pure sharding tests are in package shard, on IDs it computes the way
// ParseProxy does: 16 hex digits of the SHA-256 of the canonical URL.
func TestShardIDsAreProxyIDs(t *testing.T) {
	for _, i := range []int{0, 1, 255, 256, 65_537, 99_999} {
		raw := fmt.Sprintf("http://u%d:pw@10.%d.%d.%d:3128", i, i>>16&255, i>>8&255, i&255)
		p, err := ParseProxy(raw)
		require.NoError(t, err)
		sum := sha256.Sum256([]byte(raw))
		assert.Equal(t, hex.EncodeToString(sum[:8]), p.ID(), raw)
	}
}

func TestShareProxies(t *testing.T) {
	ps, err := ParseProxies(proxyURLsForShard(40))
	require.NoError(t, err)
	members := []string{"crawler-1", "crawler-2", "crawler-3"}
	total := 0
	for _, m := range members {
		mine, err := shareProxies(shard.Rendezvous{}, ps, members, m)
		require.NoError(t, err)
		ids := make([]string, len(mine))
		for i, p := range mine {
			ids[i] = p.ID()
		}
		all := make([]string, len(ps))
		for i, p := range ps {
			all[i] = p.ID()
		}
		want, err := shard.Share(shard.Rendezvous{}, all, members, m)
		require.NoError(t, err)
		assert.Equal(t, want, ids)
		total += len(mine)
	}
	assert.Equal(t, 40, total)

	_, err = shareProxies(shard.Modulo{}, []*Proxy{nil}, members, members[0])
	assert.ErrorIs(t, err, ErrConfig)
	_, err = shareProxies(shard.Rendezvous{}, ps, members, "crawler-9")
	assert.ErrorIs(t, err, ErrNotMember)
}

func proxyURLsForShard(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("http://u%d:secret@192.0.2.%d:8080", i, i+1)
	}
	return out
}
