package shard

import (
	"fmt"
	"math"
	"math/bits"
	"slices"
)

// DefaultMaxLoad is the load bound Rendezvous uses when MaxLoad is zero: no
// member owns more than 5% above the average share.
const DefaultMaxLoad = 1.05

// rendezvousKnots bounds the quantile table kept per member: below this
// many proxies the ranks are exact, above it they are interpolated.
const rendezvousKnots = 1024

// Rendezvous is consistent hashing by rendezvous (highest random weight)
// hashing with a load bound: each proxy goes to the member that scores it
// highest among the members not yet full, where full means owning
// max(ceil(N/n), floor(MaxLoad*N/n)) of the N proxies (n members).
//
// Without the bound, a member that joins takes exactly the proxies it
// scores above every other member: 1/n of the pool in expectation, taken
// evenly from every member, and nothing else moves. With a few hundred
// proxies that share still varies by several percent from member to member;
// the bound keeps every member within MaxLoad of the average at the cost of
// a few proxies moving between old members. Two measures keep that cost
// small: proxies are placed in a fixed order (by their hash), and a
// member's score for a proxy is the proxy's rank among all the pool's
// proxies under that member's hash, not the raw hash, so every member sees
// its scores spread exactly evenly. With 500 proxies going from 3 to 4 or
// to 6 members it moves close to the ideal 25% or 50%; see BENCHMARKS.md.
//
// Computing an assignment costs O(n*N*log N) time and O(N + n*1024) memory
// (100,000 proxies over 6 members: tens of milliseconds); compute it when
// the member list or the pool changes, not per request. Rendezvous is a
// value with no state, safe for concurrent use.
type Rendezvous struct {
	// MaxLoad bounds the largest share as a multiple of the average, from
	// 1 (shares differ by at most one proxy, at the cost of more movement
	// when members come and go) to 1000. The default (zero) is
	// DefaultMaxLoad, 1.05.
	MaxLoad float64
}

// Assign implements Sharder.
func (r Rendezvous) Assign(ids, members []string) ([]int, error) {
	bound := r.MaxLoad
	if bound == 0 {
		bound = DefaultMaxLoad
	}
	if math.IsNaN(bound) || bound < 1 || bound > 1000 {
		return nil, fmt.Errorf("%w: rendezvous load bound %v is outside 1..1000", ErrConfig, r.MaxLoad)
	}
	ms, hs, order, err := canonicalInput(ids, members)
	if err != nil {
		return nil, err
	}
	N, n := len(ids), len(ms)
	owner := make([]int, N)
	if N == 0 {
		return owner, nil
	}
	limit := loadLimit(N, n, int64(math.Round(bound*1e6)))

	// Each member's quantile table: its scores of all proxies, sorted, sampled
	// at up to rendezvousKnots evenly spaced ranks.
	tables := make([]quantileTable, n)
	scores, sorted := make([]uint64, N), make([]uint64, N)
	for j := range ms {
		for i, h := range hs {
			scores[i] = fmix64(h ^ ms[j].hash)
		}
		sortUniform(scores, sorted)
		tables[j] = newQuantileTable(sorted)
	}

	load := make([]int, n)
	for _, i := range order {
		best, bestQ, bestS := -1, uint64(0), uint64(0)
		for j := range ms {
			if load[j] >= limit {
				continue
			}
			s := fmix64(hs[i] ^ ms[j].hash)
			q := tables[j].rank(s)
			// Highest rank wins; then the raw score; then the first member by name.
			if best < 0 || q > bestQ || (q == bestQ && s > bestS) {
				best, bestQ, bestS = j, q, s
			}
		}
		load[best]++
		owner[i] = ms[best].index
	}
	return owner, nil
}

// loadLimit is the most proxies one member may own: floor(N*ppm/(1e6*n)),
// never below ceil(N/n). Integer arithmetic, so every platform agrees.
func loadLimit(N, n int, ppm int64) int {
	even := (N + n - 1) / n
	hi, lo := bits.Mul64(uint64(N), uint64(ppm))
	q, _ := bits.Div64(hi, lo, uint64(n)*1_000_000)
	return max(even, int(min(q, uint64(N))))
}

// quantileTable maps a member's score of a proxy to the proxy's rank among
// all the pool's scores for that member, scaled by 2^16: exact when the pool
// has at most rendezvousKnots proxies, linearly interpolated between sampled
// ranks otherwise. Integer arithmetic only.
type quantileTable struct {
	vals  []uint64 // sampled scores, ascending
	pos   []uint32 // their ranks
	n     uint32   // number of proxies
	first []uint16 // first[b]: number of samples whose top quantileIndexBits are below b
}

// quantileIndexBits sizes the index in front of the samples: 4096 buckets
// for at most 1024 samples of uniform scores, so a lookup scans one or two.
const quantileIndexBits = 12

func newQuantileTable(sorted []uint64) quantileTable {
	N := len(sorted)
	k := min(N, rendezvousKnots)
	t := quantileTable{vals: make([]uint64, k), pos: make([]uint32, k), n: uint32(N), first: make([]uint16, 1<<quantileIndexBits+1)}
	for i := range k {
		p := int64(i) * int64(N) / int64(k) // int64: no overflow where int is 32 bits
		t.vals[i], t.pos[i] = sorted[p], uint32(p)
	}
	i := 0
	for b := range t.first {
		for i < k && t.vals[i]>>(64-quantileIndexBits) < uint64(b) {
			i++
		}
		t.first[b] = uint16(i)
	}
	return t
}

func (t quantileTable) rank(s uint64) uint64 {
	// k = the last sample <= s. Samples in earlier buckets are all below s.
	k := int(t.first[s>>(64-quantileIndexBits)]) - 1
	for k+1 < len(t.vals) && t.vals[k+1] <= s {
		k++
	}
	if k < 0 {
		return 0
	}
	v0, p0 := t.vals[k], uint64(t.pos[k])
	v1, p1 := uint64(math.MaxUint64), uint64(t.n)
	if k+1 < len(t.vals) {
		v1, p1 = t.vals[k+1], uint64(t.pos[k+1])
	}
	d := v1 - v0
	if d == 0 || s == v0 {
		return p0 << 16
	}
	// (s-v0)/(v1-v0) of the way from rank p0 to p1, in 1/65536ths; s-v0 <= d,
	// so the quotient fits and Div64 cannot panic.
	hi, lo := bits.Mul64(s-v0, (p1-p0)<<16)
	q, _ := bits.Div64(hi, lo, d)
	return p0<<16 + q
}

// sortUniform writes keys into out in ascending order. The keys are hashes,
// spread evenly, so one counting pass on their top bits leaves buckets of a
// key or two, each then sorted on its own: linear time in practice.
func sortUniform(keys, out []uint64) {
	shift, bounds := bucketBounds(keys)
	next := slices.Clone(bounds[:len(bounds)-1])
	for _, k := range keys {
		out[next[k>>shift]] = k
		next[k>>shift]++
	}
	for b := 0; b+1 < len(bounds); b++ {
		if lo, hi := bounds[b], bounds[b+1]; hi-lo > 1 {
			slices.Sort(out[lo:hi])
		}
	}
}

// bucketBounds splits uniform 64-bit keys into buckets by their top bits,
// about one key a bucket (at most 2^16 buckets): bucket b (= key>>shift)
// takes positions bounds[b] to bounds[b+1] of the sorted order.
func bucketBounds(keys []uint64) (shift uint, bounds []int32) {
	shift = 64 - uint(min(max(bits.Len(uint(len(keys))), 1), 16))
	bounds = make([]int32, 1<<(64-shift)+1)
	for _, k := range keys {
		bounds[k>>shift+1]++
	}
	for b := 1; b < len(bounds); b++ {
		bounds[b] += bounds[b-1]
	}
	return shift, bounds
}
