package shard

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
)

// Sentinel errors. Callers branch on them with errors.Is. Package
// proxyswitch exports the same values as proxyswitch.ErrConfig and
// proxyswitch.ErrNotMember.
var (
	// ErrConfig means the input of a sharder is invalid: no members, an
	// empty or duplicate proxy ID or member name, a nil Sharder, a setting
	// out of range, or a Sharder whose answer breaks its contract; or a bad
	// MemberConfig, or a Membership started twice.
	ErrConfig = errors.New("proxyswitch: invalid configuration")

	// ErrNotMember means a server asked for its share of a member list it is
	// not in (it never registered, or its heartbeat ran out).
	ErrNotMember = errors.New("proxyswitch: not in the member list")
)

// Sharder assigns every proxy of a pool to exactly one member of a cluster.
//
// Assign returns, for each ID of ids, the index in members of the member
// that owns it. The result must depend only on the set of ids and the set
// of members, never on their order, so that every server computes the same
// assignment. ids and members must each be free of empty strings and
// duplicates; an implementation reports bad input with an error wrapping
// ErrConfig, never a panic, and must not modify either slice.
// Implementations must be safe for concurrent use. Modulo and Rendezvous
// are the implementations of this package.
type Sharder interface {
	Assign(ids, members []string) ([]int, error)
}

// Share returns the IDs of ids that member self owns under sh, in the order
// of ids. It fails with ErrNotMember if self is not one of members, and
// with ErrConfig on bad input (a nil sh included). It does not modify ids or
// members, and is safe for concurrent use whenever sh is (every Sharder of
// this package is).
func Share(sh Sharder, ids, members []string, self string) ([]string, error) {
	owner, me, err := assignFor(sh, ids, members, self)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(ids)/len(members)+1)
	for i, o := range owner {
		if o == me {
			out = append(out, ids[i])
		}
	}
	return out, nil
}

// Partition splits ids between keys (sites or task types) under sh, so that
// no proxy ever serves two keys: the per-site scheme, which keeps one IP
// from showing up on marketplaces that share their blacklists. It returns
// every key's part (an empty slice for a key that got nothing), each in the
// order of ids. keys must be free of empty strings and duplicates, like a
// member list; bad input fails with ErrConfig. Split a key's part again
// between servers with Share:
//
//	parts, err := shard.Partition(shard.Rendezvous{}, ids, []string{"ozon.ru", "wildberries.ru"})
//	mine, err := shard.Share(shard.Rendezvous{}, parts["ozon.ru"], members, self)
//
// Like Share it does not modify its inputs and is safe for concurrent use
// whenever sh is.
func Partition(sh Sharder, ids, keys []string) (map[string][]string, error) {
	owner, _, err := assignFor(sh, ids, keys, "")
	if err != nil {
		return nil, err
	}
	out := make(map[string][]string, len(keys))
	for _, k := range keys {
		out[k] = []string{}
	}
	for i, o := range owner {
		out[keys[o]] = append(out[keys[o]], ids[i])
	}
	return out, nil
}

// assignFor runs sh and checks its answer; me is the index of self in
// members (-1 when self is "").
func assignFor(sh Sharder, ids, members []string, self string) (owner []int, me int, err error) {
	if isNil(sh) {
		return nil, 0, fmt.Errorf("%w: nil sharder", ErrConfig)
	}
	me = -1
	if self != "" {
		if me = slices.Index(members, self); me < 0 {
			return nil, 0, fmt.Errorf("%w: %q is not among %d members", ErrNotMember, self, len(members))
		}
	}
	owner, err = sh.Assign(ids, members)
	if err != nil {
		return nil, 0, err
	}
	if len(owner) != len(ids) {
		return nil, 0, fmt.Errorf("%w: sharder assigned %d of %d proxies", ErrConfig, len(owner), len(ids))
	}
	for _, o := range owner {
		if o < 0 || o >= len(members) {
			return nil, 0, fmt.Errorf("%w: sharder assigned a proxy to member #%d of %d", ErrConfig, o, len(members))
		}
	}
	return owner, me, nil
}

// Modulo is the static modulo shard: with the members sorted by name, the
// proxy with ID p goes to member number Hash(p) mod n. It is perfectly
// simple and evenly loaded on average, but a change in the number of members
// moves almost the whole pool (3 to 4 servers: 75%), so it suits a cluster
// of fixed size. It is a stateless value, safe for concurrent use.
type Modulo struct{}

// Assign implements Sharder.
func (Modulo) Assign(ids, members []string) ([]int, error) {
	sorted, hs, _, err := canonicalInput(ids, members)
	if err != nil {
		return nil, err
	}
	n := uint64(len(sorted))
	owner := make([]int, len(ids))
	for i, h := range hs {
		owner[i] = sorted[h%n].index
	}
	return owner, nil
}

// isNil reports whether sh is nil, or a typed nil (pointer, func, map...)
// whose Assign could not run.
func isNil(sh Sharder) bool {
	if sh == nil {
		return true
	}
	switch v := reflect.ValueOf(sh); v.Kind() {
	case reflect.Pointer, reflect.Func, reflect.Map, reflect.Slice, reflect.Chan, reflect.Interface:
		return v.IsNil()
	default:
		return false
	}
}

// shardMember is a member in canonical (name) order.
type shardMember struct {
	name  string
	index int    // position in the caller's list
	hash  uint64 // Hash(name)
}

// canonicalInput validates both lists and puts them in canonical order: the
// members sorted by name; the IDs' hashes, and the order to place them in.
func canonicalInput(ids, members []string) ([]shardMember, []uint64, []int32, error) {
	ms, err := canonicalMembers(members)
	if err != nil {
		return nil, nil, nil, err
	}
	hs, order, err := canonicalIDs(ids)
	if err != nil {
		return nil, nil, nil, err
	}
	return ms, hs, order, nil
}

// canonicalMembers validates members and returns them sorted by name.
func canonicalMembers(members []string) ([]shardMember, error) {
	if len(members) == 0 {
		return nil, fmt.Errorf("%w: no members to share the pool between", ErrConfig)
	}
	out := make([]shardMember, len(members))
	for i, m := range members {
		if m == "" {
			return nil, fmt.Errorf("%w: empty member name (#%d)", ErrConfig, i+1)
		}
		out[i] = shardMember{name: m, index: i, hash: Hash(m)}
	}
	slices.SortFunc(out, func(a, b shardMember) int { return strings.Compare(a.name, b.name) })
	for i := 1; i < len(out); i++ {
		if out[i].name == out[i-1].name {
			return nil, fmt.Errorf("%w: member %q listed twice", ErrConfig, out[i].name)
		}
	}
	return out, nil
}

// canonicalIDs validates ids and returns their hashes (in the order of ids)
// and the canonical processing order: indices of ids sorted by hash, then
// by ID, which no input order can change.
func canonicalIDs(ids []string) ([]uint64, []int32, error) {
	if len(ids) > math.MaxInt32 {
		return nil, nil, fmt.Errorf("%w: %d proxies are too many to shard", ErrConfig, len(ids))
	}
	hs := make([]uint64, len(ids))
	for i, id := range ids {
		if id == "" {
			return nil, nil, fmt.Errorf("%w: empty proxy ID (#%d)", ErrConfig, i+1)
		}
		hs[i] = Hash(id)
	}
	// Bucket by the top bits of the hash (hashes are uniform: a bucket holds
	// an index or two), then sort each bucket by hash and ID.
	shift, bounds := bucketBounds(hs)
	order := make([]int32, len(ids))
	next := slices.Clone(bounds[:len(bounds)-1])
	for i, h := range hs {
		order[next[h>>shift]] = int32(i)
		next[h>>shift]++
	}
	byHashThenID := func(a, b int32) int {
		if c := cmp.Compare(hs[a], hs[b]); c != 0 {
			return c
		}
		return strings.Compare(ids[a], ids[b])
	}
	for b := 0; b+1 < len(bounds); b++ {
		if lo, hi := bounds[b], bounds[b+1]; hi-lo > 1 {
			slices.SortFunc(order[lo:hi], byHashThenID)
		}
	}
	for k := 1; k < len(order); k++ {
		if hs[order[k]] == hs[order[k-1]] && ids[order[k]] == ids[order[k-1]] {
			return nil, nil, fmt.Errorf("%w: proxy ID %q listed twice", ErrConfig, ids[order[k]])
		}
	}
	return hs, order, nil
}

// Hash is the hash every server of a cluster must compute alike, for proxy
// IDs and member names: 64-bit FNV-1a of s, then the MurmurHash3 64-bit
// finalizer for avalanche. Modulo, Rendezvous and Split are built on it. It is part of the cluster's contract, pinned by tests:
// changing it reshuffles every share. It is a pure function, safe for
// concurrent use.
func Hash(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return fmix64(h)
}

// fmix64 is the MurmurHash3 64-bit finalizer, a bijection.
func fmix64(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	k *= 0xc4ceb9fe1a85ec53
	k ^= k >> 33
	return k
}

// PoolNames names n pools that split the pool name: "name.0" to
// "name.<n-1>". Each has a hash tag of its own, hence a Redis Cluster slot
// of its own: give them to proxyswitch.WithSpread, and load part i of Split
// into pool i.
func PoolNames(name string, n int) []string {
	out := make([]string, max(n, 0))
	for i := range out {
		out[i] = fmt.Sprintf("%s.%d", name, i)
	}
	return out
}

// Split deals items out to n parts by Hash of their id, evenly and the same
// way on every server; for proxies:
//
//	parts := shard.Split(proxies, 3, (*proxyswitch.Proxy).ID)
//
// n <= 0 gives no parts. It is a pure function, safe for concurrent use.
func Split[T any](items []T, n int, id func(T) string) [][]T {
	out := make([][]T, max(n, 0))
	if n <= 0 {
		return out
	}
	for _, it := range items {
		i := Hash(id(it)) % uint64(n)
		out[i] = append(out[i], it)
	}
	return out
}
