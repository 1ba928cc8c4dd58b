package proxyswitch

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// leaseArgv is lease.lua's ARGV for a plain lease of site by s to tok,
// then more tokens.
func leaseArgv(s *Switch, site, tok string, more ...string) []any {
	argv := []any{site, tok, s.cfg.leaseTTL.Milliseconds(), s.cfg.cooldown.Milliseconds(), s.cfg.slots,
		s.cfg.idleTTL.Milliseconds(), "", "", site, 1}
	for _, m := range more {
		argv = append(argv, m)
	}
	return argv
}

// leaseAlone runs lease.lua for proxy id alone on site (ARGV[8] "1": only
// that proxy will do, as a session's lease), owner token tok, lease TTL
// ttl ms (0: the Switch's), and returns the reply: {1, member, ...} when
// granted, else {0, wait ms, firm} or {-2}.
func leaseAlone(t testing.TB, rdb redis.Scripter, s *Switch, site, id, tok string, ttl int64) []any {
	t.Helper()
	argv := leaseArgv(s, site, tok)
	argv[6], argv[7] = id, "1"
	if ttl > 0 {
		argv[2] = ttl
	}
	res, err := leaseScript.Run(context.Background(), rdb, s.keys.lease(site), argv...).Slice()
	require.NoError(t, err)
	return res
}

// granted is the member a leaseAlone reply granted, or "" for a wait.
func granted(t testing.TB, res []any) string {
	t.Helper()
	if res[0].(int64) == 1 {
		return res[1].(string)
	}
	require.EqualValues(t, 0, res[0], "%v", res)
	return ""
}

// TestLeaseScriptGrantsMany: lease.lua with further owner tokens grants one
// lease per token, distinct slots, each recorded with its own token, and
// fewer when the pool runs out; a pool with nothing free answers the wait.
func TestLeaseScriptGrantsMany(t *testing.T) { leaseScriptGrantsMany(t, shared.Client(t)) }

// TestLeaseScriptGrantsManyOnMiniredis: the same on gopher-lua (the demo's
// embedded Redis).
func TestLeaseScriptGrantsManyOnMiniredis(t *testing.T) {
	rdb := miniredisClient(t)
	leaseScriptGrantsMany(t, rdb)
}

func leaseScriptGrantsMany(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	s := newSwitch(t, rdb)
	_, err := s.Add(ctx, proxyURLs(10)...)
	require.NoError(t, err)
	keys := s.keys.lease("a.example")

	res, err := leaseScript.Run(ctx, rdb, keys, leaseArgv(s, "a.example", "t1", "t2", "t3")...).Slice()
	require.NoError(t, err)
	require.Len(t, res, 4+2*3, "%v", res)
	assert.EqualValues(t, 2, res[0])
	expiry := res[2].(int64)
	assert.EqualValues(t, 0, res[3], "no wait: every token served")
	seen := map[string]bool{}
	for i, tok := range []string{"t1", "t2", "t3"} {
		m := res[4+2*i].(string)
		assert.NotEmpty(t, res[5+2*i])
		assert.False(t, seen[m], "slot %s granted twice", m)
		seen[m] = true
		v, err := rdb.HGet(ctx, s.keys.leases("a.example"), m).Result()
		require.NoError(t, err)
		assert.Equal(t, tok+"|"+strconv.FormatInt(expiry, 10), v)
	}

	// 7 proxies left, 9 tokens: 7 grants; the 2 others wait until a lease
	// ends (the TTL), not 1 ms: the whole pool was looked at.
	more := []string{"u2", "u3", "u4", "u5", "u6", "u7", "u8", "u9"}
	res, err = leaseScript.Run(ctx, rdb, keys, leaseArgv(s, "a.example", "u1", more...)...).Slice()
	require.NoError(t, err)
	require.Len(t, res, 4+2*7, "%v", res)
	assert.Greater(t, res[3].(int64), int64(time.Second/time.Millisecond), "the wait of the tokens left")
	for i := 4; i < len(res); i += 2 {
		m := res[i].(string)
		assert.False(t, seen[m], "slot %s granted twice", m)
		seen[m] = true
	}
	n, err := rdb.HLen(ctx, s.keys.leases("a.example")).Result()
	require.NoError(t, err)
	assert.EqualValues(t, 10, n)

	// Nothing free: the wait reply, as for one token.
	res, err = leaseScript.Run(ctx, rdb, keys, leaseArgv(s, "a.example", "v1", "v2")...).Slice()
	require.NoError(t, err)
	assert.EqualValues(t, 0, res[0], "%v", res)
	assert.Len(t, res, 2)

	// Further tokens with a preferred proxy: refused.
	argv := leaseArgv(s, "b.example", "w1", "w2")
	argv[6] = "0"
	err = leaseScript.Run(ctx, rdb, s.keys.lease("b.example"), argv...).Err()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "PSARGS")
}

// TestLeaseScriptOneProbePerCall: with the site's breaker half-open, a call
// of many tokens grants one lease, the probe the gate counted, to the first
// token, in the form of many grants; through a pool call, only the first
// attempt gets a proxy and the others wait (a grant answered to every
// token of a call would send them all through one proxy).
func TestLeaseScriptOneProbePerCall(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	s := newSwitch(t, rdb)
	_, err := s.Add(ctx, proxyURLs(10)...)
	require.NoError(t, err)
	require.NoError(t, rdb.HSet(ctx, s.keys.breaker(), "a.example", "1|1000|0|0").Err())
	res, err := leaseScript.Run(ctx, rdb, s.keys.lease("a.example"), leaseArgv(s, "a.example", "t1", "t2", "t3")...).Slice()
	require.NoError(t, err)
	require.Len(t, res, 6, "%v", res)
	assert.EqualValues(t, 2, res[0], "%v", res)
	n, err := rdb.HLen(ctx, s.keys.leases("a.example")).Result()
	require.NoError(t, err)
	assert.EqualValues(t, 1, n)

	require.NoError(t, rdb.HSet(ctx, s.keys.breaker(), "b.example", "1|1000|0|0").Err())
	ops := []poolOp{
		{site: "b.example", scope: "b.example", token: "u1"},
		{site: "b.example", scope: "b.example", token: "u2"},
		{site: "b.example", scope: "b.example", token: "u3"},
	}
	out, err := s.own.redis().callMany(ops)
	require.NoError(t, err)
	assert.EqualValues(t, 1, out[0].res[0], "the probe: %v", out[0].res)
	for _, r := range out[1:] {
		require.NoError(t, r.err)
		assert.EqualValues(t, 0, r.res[0], "no proxy for the others: %v", r.res)
	}
	n, err = rdb.HLen(ctx, s.keys.leases("b.example")).Result()
	require.NoError(t, err)
	assert.EqualValues(t, 1, n)
}

// TestSplitLeaseReplyOneGrant: a single grant answered to a call of many
// tokens is the first token's alone.
func TestSplitLeaseReplyOneGrant(t *testing.T) {
	grant := []any{int64(1), "p:0", "http://127.0.0.1:1", int64(99), int64(7)}
	out, err := splitLeaseReply(grant, []string{"a", "b", "c"}, func(string, string) { t.Fatal("nothing to release") })
	require.NoError(t, err)
	assert.Equal(t, grant, out[0])
	for _, r := range out[1:] {
		assert.EqualValues(t, 0, r[0])
	}
}

// TestPoolCallPartErrorIsNoOutage: the error of one part of a pool call is
// a Redis error, as the call's own would have been: the fallback does not
// take it for an outage of Redis.
func TestPoolCallPartErrorIsNoOutage(t *testing.T) {
	var re redis.Error
	err := error(partErr("OOM command not allowed when used memory > 'maxmemory'."))
	assert.ErrorAs(t, err, &re)
	assert.False(t, isOutage(context.Background(), fmt.Errorf("%w: %w", ErrNoProxy, redisErr("lease", err))))
}

// leaseGate holds the first lease.lua or pool_call.lua call in the hook until open is
// closed, and counts those calls.
type leaseGate struct {
	open  chan struct{}
	held  chan struct{} // closed when the first call is held
	once  sync.Once
	calls atomic.Int64
}

func newLeaseGate() *leaseGate {
	return &leaseGate{open: make(chan struct{}), held: make(chan struct{})}
}

func (h *leaseGate) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *leaseGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *leaseGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); len(args) > 1 && (cmd.Name() == "evalsha" || cmd.Name() == "EVALSHA") && (args[1] == leaseScript.Hash() || args[1] == poolCallScript.Hash()) {
			h.calls.Add(1)
			first := false
			h.once.Do(func() { first = true })
			if first {
				close(h.held)
				<-h.open
			}
		}
		return next(ctx, cmd)
	}
}

// TestLeasesOfASiteShareACall: plain leases of one site made while a lease
// call is in Redis go in the next call together (fails before the lease
// batches:
// one call each), each with a proxy of its own.
func TestLeasesOfASiteShareACall(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	s := newSwitch(t, rdb)
	_, err := s.Add(ctx, proxyURLs(40)...)
	require.NoError(t, err)
	g := newLeaseGate()
	rdb.AddHook(g)
	const n = 20
	leases := make(chan *Lease, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := s.Lease(ctx, "a.example")
			assert.NoError(t, err)
			leases <- l
		}()
		if i == 0 {
			<-g.held
		}
	}
	time.Sleep(300 * time.Millisecond) // the other 19 queue behind the held call
	close(g.open)
	wg.Wait()
	close(leases)
	assert.LessOrEqual(t, g.calls.Load(), int64(n/2), "lease.lua calls for %d leases", n)
	proxies := map[string]bool{}
	for l := range leases {
		require.NotNil(t, l)
		assert.False(t, proxies[l.Proxy().String()], "proxy %s leased twice", l.Proxy())
		proxies[l.Proxy().String()] = true
		require.NoError(t, l.Release(ctx))
	}
	assert.Len(t, proxies, n)
}

// TestLeaseBatchCanceledIsReleased: a lease whose caller's context ends
// while its batch waits or is in Redis fails with the context's error, and
// the lease the batch granted it goes back: nothing stays leased.
func TestLeaseBatchCanceledIsReleased(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	s := newSwitch(t, rdb)
	_, err := s.Add(ctx, proxyURLs(5)...)
	require.NoError(t, err)
	g := newLeaseGate()
	rdb.AddHook(g)
	first := make(chan *Lease, 1)
	go func() {
		l, err := s.Lease(ctx, "a.example")
		assert.NoError(t, err)
		first <- l
	}()
	<-g.held
	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		l, err := s.Lease(cctx, "a.example")
		if l != nil {
			_ = l.Release(ctx)
		}
		errc <- err
	}()
	time.Sleep(200 * time.Millisecond) // the second lease waits for its batch
	cancel()
	time.Sleep(50 * time.Millisecond)
	close(g.open)
	err = <-errc
	require.Error(t, err)
	assert.ErrorIs(t, err, context.Canceled)
	l := <-first
	require.NotNil(t, l)
	n, err := rdb.HLen(ctx, s.keys.leases("a.example")).Result()
	require.NoError(t, err)
	assert.EqualValues(t, 1, n, "only the first lease is held")
	require.NoError(t, l.Release(ctx))
	n, err = rdb.HLen(ctx, s.keys.leases("a.example")).Result()
	require.NoError(t, err)
	assert.Zero(t, n)
}

// TestPoolCallFoldsReleasesAndLeases: releases and plain leases of several
// sites asked for while a call of the pool is in Redis go together in its
// next call; the releases run first, so a proxy given back with no cooldown
// is leased again in that same call; and a site whose keys are corrupt fails
// only its own leases, while the releases and the other site's leases of
// the call succeed.
func TestPoolCallFoldsReleasesAndLeases(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	s := newSwitch(t, rdb)
	_, err := s.Add(ctx, proxyURLs(1)...)
	require.NoError(t, err)
	// The pool's one proxy, out on a.example and b.example; c.example's
	// cursor corrupt.
	la, err := s.Lease(ctx, "a.example")
	require.NoError(t, err)
	lb, err := s.Lease(ctx, "b.example")
	require.NoError(t, err)
	require.NoError(t, rdb.HSet(ctx, s.keys.cursor(), "c.example", "not a cursor").Err())

	g := newLeaseGate()
	rdb.AddHook(g)
	type got struct {
		l   *Lease
		err error
	}
	held := make(chan got, 1)
	go func() { // the call held in the hook
		l, err := s.Lease(ctx, "d.example")
		held <- got{l, err}
	}()
	<-g.held
	var wg sync.WaitGroup
	relA, relB := make(chan error, 1), make(chan error, 1)
	leaseA, leaseC := make(chan got, 1), make(chan got, 1)
	wg.Add(4)
	go func() { defer wg.Done(); relA <- la.Release(ctx) }()
	go func() { defer wg.Done(); relB <- lb.Release(ctx) }()
	go func() {
		defer wg.Done()
		l, err := s.Lease(ctx, "a.example")
		leaseA <- got{l, err}
	}()
	go func() {
		defer wg.Done()
		l, err := s.Lease(ctx, "c.example")
		leaseC <- got{l, err}
	}()
	calls := &s.own.redis().calls
	require.Eventually(t, func() bool { return calls.Waiting() == 4 }, 10*time.Second, time.Millisecond,
		"the two releases and two leases wait behind the held call")
	close(g.open)
	wg.Wait()
	d := <-held
	require.NoError(t, d.err)
	assert.EqualValues(t, 2, g.calls.Load(), "the held call, then one for two releases and two sites' leases")
	require.NoError(t, d.l.Release(ctx))
	require.NoError(t, <-relA)
	require.NoError(t, <-relB)
	a := <-leaseA
	require.NoError(t, a.err, "the proxy a.example gave back, leased in the same call")
	assert.Equal(t, la.Proxy().String(), a.l.Proxy().String())
	c := <-leaseC
	require.Error(t, c.err)
	assert.ErrorIs(t, c.err, ErrCorrupt)
	assert.Nil(t, c.l)
	require.NoError(t, a.l.Release(ctx))
	for _, site := range []string{"a.example", "b.example", "c.example", "d.example"} {
		n, err := rdb.HLen(ctx, s.keys.leases(site)).Result()
		require.NoError(t, err)
		assert.Zero(t, n, "leases left on %s", site)
	}
}

// TestPoolCallOnMiniredis: the folded call on gopher-lua (the demo's
// embedded Redis): releases and leases of two sites in one call.
func TestPoolCallOnMiniredis(t *testing.T) {
	ctx := context.Background()
	rdb := miniredisClient(t)
	s := newSwitch(t, rdb)
	_, err := s.Add(ctx, proxyURLs(4)...)
	require.NoError(t, err)
	la, err := s.Lease(ctx, "a.example")
	require.NoError(t, err)
	require.NoError(t, rdb.HSet(ctx, s.keys.cursor(), "c.example", "not a cursor").Err())
	p := s.own.redis()
	ops := []poolOp{
		{rel: queuedRelease{l: la, at: time.Now()}},
		{site: "a.example", scope: "a.example", token: "t1"},
		{site: "b.example", scope: "b.example", token: "t2"},
		{site: "a.example", scope: "a.example", token: "t3"},
		{site: "c.example", scope: "c.example", token: "t4"},
	}
	res, err := p.callMany(ops)
	require.NoError(t, err)
	require.Len(t, res, len(ops))
	require.NoError(t, res[0].err)
	assert.EqualValues(t, 1, res[0].n, "released")
	for _, i := range []int{1, 2, 3} {
		require.NoError(t, res[i].err)
		assert.EqualValues(t, 1, res[i].res[0], "op %d: %v", i, res[i].res)
	}
	assert.NotEqual(t, res[1].res[1], res[3].res[1], "two leases of a.example, two slots")
	assert.ErrorContains(t, res[4].err, "PSCORRUPT")
	n, err := rdb.HLen(ctx, s.keys.leases("a.example")).Result()
	require.NoError(t, err)
	assert.EqualValues(t, 2, n)
}
