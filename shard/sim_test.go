package shard

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The acceptance simulation of issue 6: 500 and 100,000 proxies, a cluster
// growing from 3 to 4 and from 3 to 6 servers, consistent hashing
// (Rendezvous with its default load bound) beside the modulo shard. Run:
//
//	go test -count=1 -run 'TestShardingSimulation' -v .
//
// and see BENCHMARKS.md ("## sharding") for the table it prints.

// simResult is one scheme on one pool going from one member list to another.
type simResult struct {
	moved      int     // proxies whose owner changed
	ideal      float64 // the fewest that must move for even shares: N*(added)/(after)
	maxAvgPre  float64 // largest share / average share, before
	maxAvgPost float64 // the same, after
}

func (r simResult) movedRatio() float64 { return float64(r.moved) / r.ideal }

func simulate(t testing.TB, sh Sharder, ids, before, after []string) simResult {
	t.Helper()
	pre, err := sh.Assign(ids, before)
	require.NoError(t, err)
	post, err := sh.Assign(ids, after)
	require.NoError(t, err)
	var r simResult
	for i := range ids {
		if before[pre[i]] != after[post[i]] {
			r.moved++
		}
	}
	r.ideal = float64(len(ids)) * float64(len(after)-len(before)) / float64(len(after))
	r.maxAvgPre, r.maxAvgPost = maxOverAvg(pre, len(before)), maxOverAvg(post, len(after))
	return r
}

func maxOverAvg(owner []int, members int) float64 {
	load := make([]int, members)
	for _, o := range owner {
		load[o]++
	}
	return float64(slices.Max(load)) * float64(members) / float64(len(owner))
}

// The targets for consistent hashing.
const (
	simMaxMoved = 1.05 // moved / ideal
	simMaxLoad  = 1.05 // largest share / average share
)

func (r simResult) meetsTargets() bool {
	return r.movedRatio() <= simMaxMoved && r.maxAvgPre <= simMaxLoad && r.maxAvgPost <= simMaxLoad
}

func TestShardingSimulation(t *testing.T) {
	schemes := []struct {
		name string
		sh   Sharder
	}{{"rendezvous", Rendezvous{}}, {"modulo", Modulo{}}}
	var table strings.Builder
	table.WriteString("| proxies | servers | scheme | moved | ideal | moved/ideal | max/avg before | max/avg after |\n")
	table.WriteString("|---:|---|---|---:|---:|---:|---:|---:|\n")
	for _, size := range []int{500, 100_000} {
		ids := shardIDs(t, size) // real proxy IDs, as the pool stores them
		for _, to := range []int{4, 6} {
			for _, s := range schemes {
				r := simulate(t, s.sh, ids, memberNames(3), memberNames(to))
				fmt.Fprintf(&table, "| %d | 3 → %d | %s | %d (%.1f%%) | %.0f (%.1f%%) | %.3f | %.3f | %.3f |\n",
					size, to, s.name, r.moved, 100*float64(r.moved)/float64(size), r.ideal, 100*r.ideal/float64(size),
					r.movedRatio(), r.maxAvgPre, r.maxAvgPost)
				if s.name == "rendezvous" {
					assert.LessOrEqual(t, r.movedRatio(), simMaxMoved, "%d proxies, 3 → %d: moved/ideal", size, to)
					assert.LessOrEqual(t, r.maxAvgPre, simMaxLoad, "%d proxies, 3 servers: max/avg", size)
					assert.LessOrEqual(t, r.maxAvgPost, simMaxLoad, "%d proxies, %d servers: max/avg", size, to)
				}
			}
		}
	}
	t.Log("\n" + table.String())

	// One pool can be lucky. Over many random pools and member names, how
	// often does rendezvous meet both targets, and how far off is the worst?
	var robust strings.Builder
	robust.WriteString("| proxies | servers | random pools | meeting both targets | worst moved/ideal | worst max/avg |\n")
	robust.WriteString("|---:|---|---:|---:|---:|---:|\n")
	for _, tc := range []struct {
		size, to, pools int
		minShare        float64 // regression floor for the fraction of pools meeting the targets
	}{{500, 4, 300, 0.85}, {500, 6, 300, 0.97}, {100_000, 4, 3, 1}, {100_000, 6, 3, 1}} {
		rnd := rand.New(rand.NewPCG(uint64(tc.size), uint64(tc.to)))
		ok, worstMoved, worstLoad := 0, 0.0, 0.0
		for range tc.pools {
			ids := make([]string, tc.size)
			for i := range ids {
				ids[i] = fmt.Sprintf("%016x", rnd.Uint64())
			}
			names := make([]string, tc.to)
			for i := range names {
				names[i] = fmt.Sprintf("node-%08x", rnd.Uint32())
			}
			r := simulate(t, Rendezvous{}, ids, names[:3], names)
			if r.meetsTargets() {
				ok++
			}
			worstMoved = max(worstMoved, r.movedRatio())
			worstLoad = max(worstLoad, r.maxAvgPre, r.maxAvgPost)
		}
		fmt.Fprintf(&robust, "| %d | 3 → %d | %d | %d (%.0f%%) | %.3f | %.3f |\n",
			tc.size, tc.to, tc.pools, ok, 100*float64(ok)/float64(tc.pools), worstMoved, worstLoad)
		assert.GreaterOrEqual(t, float64(ok)/float64(tc.pools), tc.minShare, "%d proxies, 3 → %d", tc.size, tc.to)
		assert.LessOrEqual(t, worstLoad, simMaxLoad, "the load bound holds on every pool")
	}
	t.Log("\n" + robust.String())
}

// BenchmarkShare measures one server computing its share: the whole
// assignment, as done when the member list or the pool changes.
//
//	go test -run '^$' -bench 'BenchmarkShare' -benchtime 20x .
func BenchmarkShare(b *testing.B) {
	for _, size := range []int{500, 100_000} {
		ids := shardIDs(b, size)
		for _, n := range []int{3, 6} {
			members := memberNames(n)
			for _, s := range []struct {
				name string
				sh   Sharder
			}{{"rendezvous", Rendezvous{}}, {"modulo", Modulo{}}} {
				b.Run(fmt.Sprintf("scheme=%s/proxies=%d/servers=%d", s.name, size, n), func(b *testing.B) {
					b.ReportAllocs()
					for b.Loop() {
						if _, err := Share(s.sh, ids, members, members[0]); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}
