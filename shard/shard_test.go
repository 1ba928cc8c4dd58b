package shard

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// shardIDs returns the IDs of n valid proxies, as the pool stores them:
// what proxyswitch.ParseProxy gives their URLs (16 hex digits of the
// SHA-256 of the canonical URL; these URLs are canonical already).
// TestShardIDsAreProxyIDs in package proxyswitch checks that they agree.
func shardIDs(t testing.TB, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		sum := sha256.Sum256([]byte(fmt.Sprintf("http://u%d:pw@10.%d.%d.%d:3128", i, i>>16&255, i>>8&255, i&255)))
		ids[i] = hex.EncodeToString(sum[:8])
	}
	return ids
}

func memberNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("crawler-%d", i+1)
	}
	return out
}

var sharders = map[string]Sharder{"modulo": Modulo{}, "rendezvous": Rendezvous{}}

// Every member's share, together: each proxy exactly once.
func TestSharesAreDisjointAndCoverThePool(t *testing.T) {
	for name, sh := range sharders {
		for _, size := range []int{0, 1, 7, 500, 3000} {
			t.Run(fmt.Sprintf("%s/%d", name, size), func(t *testing.T) {
				ids := shardIDs(t, size)
				members := memberNames(5)
				seen := map[string]string{}
				for _, m := range members {
					share, err := Share(sh, ids, members, m)
					require.NoError(t, err)
					for _, id := range share {
						require.Empty(t, seen[id], "proxy %s in the shares of %s and %s", id, seen[id], m)
						seen[id] = m
					}
				}
				assert.Len(t, seen, size)
			})
		}
	}
}

// No server may depend on the order in which it learnt the pool or the
// members: every permutation gives every member the same share.
func TestShareIgnoresInputOrder(t *testing.T) {
	ids := shardIDs(t, 2000)
	members := memberNames(6)
	for name, sh := range sharders {
		want := map[string][]string{}
		for _, m := range members {
			s, err := Share(sh, ids, members, m)
			require.NoError(t, err)
			slices.Sort(s)
			want[m] = s
		}
		r := rand.New(rand.NewPCG(1, 2))
		for range 3 {
			ids2, members2 := slices.Clone(ids), slices.Clone(members)
			r.Shuffle(len(ids2), func(i, j int) { ids2[i], ids2[j] = ids2[j], ids2[i] })
			r.Shuffle(len(members2), func(i, j int) { members2[i], members2[j] = members2[j], members2[i] })
			for _, m := range members {
				s, err := Share(sh, ids2, members2, m)
				require.NoError(t, err)
				slices.Sort(s)
				assert.Equal(t, want[m], s, "%s: share of %s changed with the input order", name, m)
			}
		}
	}
}

func TestRendezvousLoadBound(t *testing.T) {
	for _, tc := range []struct {
		proxies, members int
		maxLoad          float64
		limit            int
	}{
		{500, 3, 0, 175}, {500, 4, 0, 131}, {500, 6, 0, 87},
		{500, 6, 1, 84}, {10, 3, 0, 4}, {3, 5, 0, 1}, {100_000, 6, 1.02, 17_000},
	} {
		ids, members := shardIDs(t, tc.proxies), memberNames(tc.members)
		owner, err := Rendezvous{MaxLoad: tc.maxLoad}.Assign(ids, members)
		require.NoError(t, err)
		load := make([]int, tc.members)
		for _, o := range owner {
			load[o]++
		}
		assert.LessOrEqual(t, slices.Max(load), tc.limit, "%+v: loads %v", tc, load)
	}
}

// A member that joins takes proxies only: between old members nothing moves
// while no member is at its bound (MaxLoad large: plain rendezvous hashing).
func TestRendezvousMovesOnlyToTheNewMember(t *testing.T) {
	ids := shardIDs(t, 3000)
	sh := Rendezvous{MaxLoad: 1000}
	before, err := sh.Assign(ids, memberNames(3))
	require.NoError(t, err)
	after, err := sh.Assign(ids, memberNames(4))
	require.NoError(t, err)
	moved := 0
	for i := range ids {
		if before[i] != after[i] {
			moved++
			assert.Equal(t, 3, after[i], "a proxy moved between old members")
		}
	}
	assert.InDelta(t, 750, moved, 75, "about a quarter of the pool moves to the fourth member")
}

func TestModuloByIndexOfSortedMembers(t *testing.T) {
	ids := shardIDs(t, 50)
	members := []string{"c", "a", "b"} // sorted: a, b, c
	owner, err := Modulo{}.Assign(ids, members)
	require.NoError(t, err)
	sorted := []int{1, 2, 0} // positions in members of a, b, c
	for i, id := range ids {
		assert.Equal(t, sorted[Hash(id)%3], owner[i])
	}
}

// The hash is the cluster's contract: servers running different versions of
// the package must compute the same shares. The values were computed
// independently (FNV-1a 64 and the MurmurHash3 finalizer in Python, and the
// assignment rule by hand from them).
func TestShardHashIsPinned(t *testing.T) {
	assert.Equal(t, uint64(0xd6cc076eddb5e4fa), Hash("crawler-1"))
	assert.Equal(t, uint64(0x9fe524d33625dec6), Hash("0123456789abcdef"))
	owner, err := Rendezvous{}.Assign([]string{"p1", "p2", "p3", "p4", "p5", "p6"}, []string{"a", "b", "c"})
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1, 0, 2, 1, 2}, owner)
}

// Above rendezvousKnots proxies ranks are interpolated: still increasing
// with the score and within a fraction of a percent of the exact rank.
func TestQuantileTableInterpolates(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	scores := make([]uint64, 50_000)
	for i := range scores {
		scores[i] = r.Uint64()
	}
	slices.Sort(scores)
	tab := newQuantileTable(scores)
	prev := uint64(0)
	for i, s := range scores {
		q := tab.rank(s)
		require.GreaterOrEqual(t, q, prev, "rank must not decrease")
		prev = q
		assert.InDelta(t, float64(i), float64(q)/65536, 150, "rank of the %dth score", i)
	}
	exact := newQuantileTable(scores[:1000])
	for i, s := range scores[:1000] {
		require.Equal(t, uint64(i)<<16, exact.rank(s))
	}
}

type brokenSharder struct{ owner []int }

func (b brokenSharder) Assign([]string, []string) ([]int, error) { return b.owner, nil }

func TestShardBadInput(t *testing.T) {
	ids := shardIDs(t, 3)
	members := memberNames(2)
	for _, sh := range []Sharder{Modulo{}, Rendezvous{}} {
		for name, tc := range map[string]struct {
			ids, members []string
		}{
			"no members":       {ids, nil},
			"empty member":     {ids, []string{"a", ""}},
			"duplicate member": {ids, []string{"a", "b", "a"}},
			"empty ID":         {[]string{ids[0], ""}, members},
			"duplicate ID":     {[]string{ids[0], ids[1], ids[0]}, members},
		} {
			_, err := sh.Assign(tc.ids, tc.members)
			assert.ErrorIs(t, err, ErrConfig, "%T: %s", sh, name)
		}
	}
	for _, bound := range []float64{0.99, -1, 1001} {
		_, err := Rendezvous{MaxLoad: bound}.Assign(ids, members)
		assert.ErrorIs(t, err, ErrConfig, "MaxLoad %v", bound)
	}

	_, err := Share(Rendezvous{}, ids, members, "crawler-9")
	assert.ErrorIs(t, err, ErrNotMember)
	_, err = Share(nil, ids, members, members[0])
	assert.ErrorIs(t, err, ErrConfig)
	var nilSharder *Rendezvous
	_, err = Share(nilSharder, ids, members, members[0])
	assert.ErrorIs(t, err, ErrConfig)
	_, err = Share(brokenSharder{owner: []int{0}}, ids, members, members[0])
	assert.ErrorIs(t, err, ErrConfig, "wrong length")
	_, err = Partition(brokenSharder{owner: []int{0, 5, 1}}, ids, members)
	assert.ErrorIs(t, err, ErrConfig, "member out of range")
	assert.False(t, errors.Is(err, ErrNotMember))
}

func TestPartitionBySite(t *testing.T) {
	ids := shardIDs(t, 600)
	sites := []string{"ozon.ru", "wildberries.ru", "avito.ru"}
	parts, err := Partition(Rendezvous{}, ids, sites)
	require.NoError(t, err)
	seen := map[string]bool{}
	for _, site := range sites {
		assert.InDelta(t, 200, len(parts[site]), 10, site)
		for _, id := range parts[site] {
			require.False(t, seen[id], "proxy %s serves two sites", id)
			seen[id] = true
		}
	}
	assert.Len(t, seen, 600)

	// A site's part split again between servers stays inside that part.
	members := memberNames(3)
	n := 0
	for _, m := range members {
		mine, err := Share(Rendezvous{}, parts["ozon.ru"], members, m)
		require.NoError(t, err)
		for _, id := range mine {
			assert.Contains(t, parts["ozon.ru"], id)
		}
		n += len(mine)
	}
	assert.Equal(t, len(parts["ozon.ru"]), n)

	parts, err = Partition(Modulo{}, nil, sites)
	require.NoError(t, err)
	assert.Equal(t, map[string][]string{"ozon.ru": {}, "wildberries.ru": {}, "avito.ru": {}}, parts)
}
