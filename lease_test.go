package proxyswitch

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// proxyURLs gives n distinct loopback proxy URLs (valid addresses up to
// 250 x 250 x 256 of them).
func proxyURLs(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("http://user%d:pw@127.%d.%d.%d:%d", i, i/62_500, 1+i/250%250, 1+i%250, 3128)
	}
	return out
}

func TestEveryScriptLoads(t *testing.T) {
	rdb := shared.Client(t)
	for name, sc := range allScripts {
		require.NoError(t, sc.Load(context.Background(), rdb).Err(), name)
	}
}

// A wait hint of a pool whose proxies are all dead (the dead score, 1e15
// ms away) stays a positive, bounded Duration.
func TestWaitHintBounds(t *testing.T) {
	assert.Equal(t, time.Millisecond, waitHint(0))
	assert.Equal(t, time.Millisecond, waitHint(-5))
	assert.Equal(t, 250*time.Millisecond, waitHint(250))
	assert.Equal(t, maxWaitHint, waitHint(1e15-time.Now().UnixMilli()))
	assert.Equal(t, maxWaitHint, waitHint(math.MaxInt64))
}

func TestLeaseReleaseLRU(t *testing.T) {
	ctx := context.Background()
	s := newSwitch(t, shared.Client(t))
	_, err := s.Add(ctx, proxyURLs(3)...)
	require.NoError(t, err)

	seen := map[string]bool{}
	for range 3 {
		l, err := s.Lease(ctx, "shop.example")
		require.NoError(t, err)
		seen[l.Proxy().ID()] = true
		require.NoError(t, l.Release(ctx))
		require.NoError(t, l.Release(ctx), "a second release is a no-op")
	}
	assert.Len(t, seen, 3, "least recently used first: three leases in a row use three proxies")

	st, err := s.Stats(ctx, "shop.example")
	require.NoError(t, err)
	assert.Equal(t, SiteStats{Proxies: 3, FreeSlots: 3, Concurrency: 1}, st)
}

func TestExclusivePerSite(t *testing.T) {
	ctx := context.Background()
	s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: 150 * time.Millisecond}))
	_, err := s.Add(ctx, proxyURLs(2)...)
	require.NoError(t, err)

	a1, err := s.Lease(ctx, "ozon.example")
	require.NoError(t, err)
	a2, err := s.Lease(ctx, "ozon.example")
	require.NoError(t, err)
	assert.NotEqual(t, a1.Proxy().ID(), a2.Proxy().ID())

	start := time.Now()
	_, err = s.Lease(ctx, "ozon.example")
	assert.ErrorIs(t, err, ErrNoProxy)
	assert.NotErrorIs(t, err, ErrEmptyPool)
	assert.GreaterOrEqual(t, time.Since(start), 140*time.Millisecond, "waited the max wait")

	// Another site may use the same IPs at the same time.
	b1, err := s.Lease(ctx, "avito.example")
	require.NoError(t, err)
	b2, err := s.Lease(ctx, "avito.example")
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{a1.Proxy().ID(), a2.Proxy().ID()}, []string{b1.Proxy().ID(), b2.Proxy().ID()})

	st, err := s.Stats(ctx, "ozon.example")
	require.NoError(t, err)
	assert.Equal(t, 2, st.Leased)
	assert.Equal(t, 0, st.FreeSlots)
}

func TestScopeGlobal(t *testing.T) {
	ctx := context.Background()
	s := newSwitch(t, shared.Client(t), WithRotation(Rotation{Scope: ScopeGlobal}), WithTimeouts(Timeouts{MaxWait: Off}))
	_, err := s.Add(ctx, proxyURLs(1)...)
	require.NoError(t, err)
	l, err := s.Lease(ctx, "ozon.example")
	require.NoError(t, err)
	_, err = s.Lease(ctx, "avito.example")
	require.ErrorIs(t, err, ErrNoProxy, "one request at a time across all sites")
	require.NoError(t, l.Release(ctx))
	_, err = s.Lease(ctx, "avito.example")
	require.NoError(t, err)
}

func TestConcurrencyK(t *testing.T) {
	ctx := context.Background()
	s := newSwitch(t, shared.Client(t), WithRotation(Rotation{Concurrency: 2}), WithTimeouts(Timeouts{MaxWait: Off}))
	_, err := s.Add(ctx, proxyURLs(1)...)
	require.NoError(t, err)
	l1, err := s.Lease(ctx, "wb.example")
	require.NoError(t, err)
	l2, err := s.Lease(ctx, "wb.example")
	require.NoError(t, err)
	assert.Equal(t, l1.Proxy().ID(), l2.Proxy().ID(), "two slots of one proxy")
	_, err = s.Lease(ctx, "wb.example")
	require.ErrorIs(t, err, ErrNoProxy)

	// A worker that disagrees on K is refused, not silently inconsistent.
	other, err := NewSwitch(shared.Client(t), WithPrefix(s.cfg.prefix), WithRotation(Rotation{Concurrency: 3}))
	require.NoError(t, err)
	_, err = other.Lease(ctx, "wb.example")
	require.ErrorIs(t, err, ErrConfig)
	assert.Contains(t, err.Error(), "2 concurrent requests")
}

func TestCooldownPacesAnIP(t *testing.T) {
	ctx := context.Background()
	const cooldown = 300 * time.Millisecond
	s := newSwitch(t, shared.Client(t), WithRotation(Rotation{Cooldown: cooldown}))
	_, err := s.Add(ctx, proxyURLs(1)...)
	require.NoError(t, err)
	l, err := s.Lease(ctx, "ozon.example")
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	released := time.Now()
	_, err = s.Lease(ctx, "avito.example") // other sites are not paced
	require.NoError(t, err)
	l2, err := s.Lease(ctx, "ozon.example")
	require.NoError(t, err)
	assert.GreaterOrEqual(t, time.Since(released), cooldown-20*time.Millisecond)
	require.NoError(t, l2.Release(ctx))

	// With K=2 the cooldown also spaces two starts.
	k := newSwitch(t, shared.Client(t), WithRotation(Rotation{Cooldown: cooldown, Concurrency: 2}))
	_, err = k.Add(ctx, proxyURLs(1)...)
	require.NoError(t, err)
	_, err = k.Lease(ctx, "ozon.example")
	require.NoError(t, err)
	first := time.Now()
	_, err = k.Lease(ctx, "ozon.example")
	require.NoError(t, err)
	assert.GreaterOrEqual(t, time.Since(first), cooldown-20*time.Millisecond)
}

func TestExpiredHolderCannotTouchNextHoldersLease(t *testing.T) {
	ctx := context.Background()
	s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{LeaseTTL: 200 * time.Millisecond, MaxWait: Off}))
	_, err := s.Add(ctx, proxyURLs(1)...)
	require.NoError(t, err)

	old, err := s.Lease(ctx, "ozon.example")
	require.NoError(t, err)
	_, err = s.Lease(ctx, "ozon.example")
	require.ErrorIs(t, err, ErrNoProxy, "held")
	time.Sleep(300 * time.Millisecond)

	next, err := sibling(t, s, shared.Client(t)).Lease(ctx, "ozon.example")
	require.NoError(t, err, "an expired lease frees the proxy by itself")
	require.Equal(t, old.Proxy().ID(), next.Proxy().ID())

	assert.ErrorIs(t, old.Extend(ctx, time.Minute), ErrLeaseLost)
	assert.ErrorIs(t, old.Release(ctx), ErrLeaseLost)
	_, err = s.Lease(ctx, "ozon.example")
	require.ErrorIs(t, err, ErrNoProxy, "the next holder still holds it")

	require.NoError(t, next.Extend(ctx, time.Second))
	assert.WithinDuration(t, time.Now().Add(time.Second), next.Expiry(), 300*time.Millisecond)
	require.NoError(t, next.Release(ctx))
	assert.ErrorIs(t, next.Extend(ctx, 0), ErrLeaseLost, "no extension after release")
}

// A lease lives for the lease TTL whatever the caller's deadline: a long
// request keeps its proxy by renewal (renew_test.go), so that a holder that
// dies frees it within one TTL.
func TestLeaseTTLIgnoresRequestDeadline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{LeaseTTL: time.Second}))
	_, err := s.Add(ctx, proxyURLs(1)...)
	require.NoError(t, err)
	l, err := s.Lease(ctx, "ozon.example")
	require.NoError(t, err)
	assert.Less(t, time.Until(l.Expiry()), 1500*time.Millisecond, "the lease TTL, not the deadline")
	assert.Greater(t, time.Until(l.Expiry()), 500*time.Millisecond)
}

func TestWaitForRelease(t *testing.T) {
	ctx := context.Background()
	s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: 5 * time.Second}))
	_, err := s.Add(ctx, proxyURLs(1)...)
	require.NoError(t, err)
	l, err := s.Lease(ctx, "ozon.example")
	require.NoError(t, err)
	go func() {
		time.Sleep(100 * time.Millisecond)
		_ = l.Release(ctx)
	}()
	start := time.Now()
	l2, err := s.Lease(ctx, "ozon.example")
	require.NoError(t, err)
	waited := time.Since(start)
	assert.GreaterOrEqual(t, waited, 90*time.Millisecond)
	assert.Less(t, waited, 500*time.Millisecond, "the waiter wakes soon after the release")
	require.NoError(t, l2.Release(ctx))

	// The request's context ends the wait early, and says so.
	l3, err := s.Lease(ctx, "ozon.example")
	require.NoError(t, err)
	defer l3.Release(ctx)
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err = s.Lease(cctx, "ozon.example")
	assert.ErrorIs(t, err, ErrNoProxy)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestWaitDoesNotSpinOnRedis(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	var calls atomic.Int64
	rdb.AddHook(countHook{&calls})
	s := newSwitch(t, rdb, WithTimeouts(Timeouts{MaxWait: time.Second}))
	_, err := s.Add(ctx, proxyURLs(1)...)
	require.NoError(t, err)
	_, err = s.Lease(ctx, "ozon.example")
	require.NoError(t, err)
	calls.Store(0)
	_, err = s.Lease(ctx, "ozon.example")
	require.ErrorIs(t, err, ErrNoProxy)
	// Backoff from 5ms to 250ms with jitter: well under 40 attempts a second.
	assert.Less(t, calls.Load(), int64(40), "attempts in one second of waiting")
	assert.Greater(t, calls.Load(), int64(3))
}

type countHook struct{ n *atomic.Int64 }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func TestEmptyPool(t *testing.T) {
	s := newSwitch(t, shared.Client(t))
	start := time.Now()
	_, err := s.Lease(context.Background(), "ozon.example")
	require.ErrorIs(t, err, ErrNoProxy)
	require.ErrorIs(t, err, ErrEmptyPool)
	assert.Less(t, time.Since(start), time.Second, "an empty pool fails at once")
}

func TestRedisDown(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t, func(o *redis.Options) { o.Password = "Canary-redis-pw" })
	s := newSwitch(t, rdb, WithTimeouts(Timeouts{Redis: 500 * time.Millisecond}))
	require.NoError(t, srv.Kill())
	start := time.Now()
	_, err := s.Lease(context.Background(), "ozon.example")
	require.ErrorIs(t, err, ErrNoProxy)
	require.ErrorIs(t, err, ErrRedis)
	assert.NotContains(t, err.Error(), "Canary-redis-pw")
	assert.Less(t, time.Since(start), 2*time.Second)
	_, err = s.Add(context.Background(), proxyURLs(1)...)
	require.ErrorIs(t, err, ErrRedis)
}

func TestRedisHung(t *testing.T) {
	srv := redistest.Start(t)
	s := newSwitch(t, srv.Client(t), WithTimeouts(Timeouts{Redis: 300 * time.Millisecond}))
	_, err := s.Add(context.Background(), proxyURLs(1)...)
	require.NoError(t, err)
	require.NoError(t, srv.Pause())
	defer srv.Resume()
	start := time.Now()
	_, err = s.Lease(context.Background(), "ozon.example")
	require.ErrorIs(t, err, ErrNoProxy)
	require.ErrorIs(t, err, ErrRedis)
	assert.Less(t, time.Since(start), 1500*time.Millisecond, "each round trip is bounded by its own timeout")
}

func TestCorruptPoolEntry(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	s := newSwitch(t, rdb, WithTimeouts(Timeouts{MaxWait: Off}))
	require.NoError(t, rdb.HSet(ctx, s.keys.proxies(), "0123456789abcdef", "gopher://u:Canary@x:1").Err())
	_, err := s.Lease(ctx, "ozon.example")
	require.ErrorIs(t, err, ErrNoProxy)
	require.ErrorIs(t, err, ErrCorrupt)
	assert.NotContains(t, err.Error(), "Canary")
	st, err := s.Stats(ctx, "ozon.example")
	require.NoError(t, err)
	assert.Equal(t, 0, st.Leased, "the unusable proxy's slot was handed back")
	_, err = s.List(ctx)
	require.ErrorIs(t, err, ErrCorrupt)

	// A damaged lease record does not break release or lease.
	s2 := newSwitch(t, rdb, WithTimeouts(Timeouts{MaxWait: Off}))
	_, err = s2.Add(ctx, proxyURLs(1)...)
	require.NoError(t, err)
	l, err := s2.Lease(ctx, "ozon.example")
	require.NoError(t, err)
	require.NoError(t, rdb.HSet(ctx, s2.keys.leases("ozon.example"), l.member, "garbage").Err())
	assert.ErrorIs(t, l.Release(ctx), ErrLeaseLost)
}

func TestPoolAdministration(t *testing.T) {
	ctx := context.Background()
	s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: Off}))
	urls := proxyURLs(4)
	ch, err := s.Add(ctx, urls[:2]...)
	require.NoError(t, err)
	assert.Equal(t, PoolChange{Added: 2, Size: 2}, ch)
	ch, err = s.Add(ctx, urls[:2]...)
	require.NoError(t, err)
	assert.Equal(t, PoolChange{Size: 2}, ch, "adding twice is a no-op")

	// The site's free set exists now; later changes must reach it.
	l, err := s.Lease(ctx, "ozon.example")
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))

	_, err = s.Add(ctx, urls[2])
	require.NoError(t, err)
	_, err = s.Remove(ctx, urls[0])
	require.NoError(t, err)
	p1, _ := ParseProxy(urls[1])
	ch, err = s.Remove(ctx, p1.ID()) // by ID, as List shows it
	require.NoError(t, err)
	assert.Equal(t, PoolChange{Removed: 1, Size: 1}, ch)

	only, _ := ParseProxy(urls[2])
	for range 3 {
		l, err := s.Lease(ctx, "ozon.example")
		require.NoError(t, err)
		assert.Equal(t, only.ID(), l.Proxy().ID(), "removed proxies are never leased again")
		require.NoError(t, l.Release(ctx))
	}

	ch, err = s.Replace(ctx, []string{urls[2], urls[3]})
	require.NoError(t, err)
	assert.Equal(t, PoolChange{Added: 1, Size: 2}, ch)
	list, err := s.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 2)
	for _, p := range list {
		assert.NotContains(t, p.String(), ":pw@", "List shows redacted URLs")
	}

	// Invalid input changes nothing.
	_, err = s.Replace(ctx, []string{urls[0], "http://u:Canary@nohost"})
	require.ErrorIs(t, err, ErrInvalidProxy)
	assert.NotContains(t, err.Error(), "Canary")
	list, err = s.List(ctx)
	require.NoError(t, err)
	assert.Len(t, list, 2)

	// A removed proxy in use stays with its holder and never comes back.
	l, err = s.Lease(ctx, "ozon.example")
	require.NoError(t, err)
	_, err = s.Replace(ctx, []string{urls[0]})
	require.NoError(t, err)
	assert.NoError(t, l.Release(ctx), "its holder gives it back")
	l, err = s.Lease(ctx, "ozon.example")
	require.NoError(t, err)
	p0, _ := ParseProxy(urls[0])
	assert.Equal(t, p0.ID(), l.Proxy().ID())

	ch, err = s.Replace(ctx, nil)
	require.NoError(t, err)
	assert.Equal(t, 0, ch.Size)
	_, err = s.Lease(ctx, "avito.example")
	require.ErrorIs(t, err, ErrEmptyPool)
}

func TestKeysShareOneSlotAndExpire(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	s := newSwitch(t, rdb, WithPool("residential"))
	_, err := s.Add(ctx, proxyURLs(3)...)
	require.NoError(t, err)
	for _, site := range []string{"ozon.example", "avito.example:8443"} {
		l, err := s.Lease(ctx, site)
		require.NoError(t, err)
		defer l.Release(ctx)
	}
	keys := keysMatching(t, rdb, "{"+s.cfg.prefix+":*")
	require.Len(t, keys, 10) // proxies, meta, order, sites, cursor, swept, 2 x (free, lease)
	slot := -1
	for _, k := range keys {
		assert.True(t, strings.HasPrefix(k, "{"+s.cfg.prefix+":residential}:"), k)
		ks, err := rdb.Do(ctx, "CLUSTER", "KEYSLOT", k).Int()
		if err != nil { // not a cluster-enabled server: compute from the tag
			ks = int(redisKeySlot(k))
		}
		if slot == -1 {
			slot = ks
		}
		assert.Equal(t, slot, ks, k)
		ttl, err := rdb.PTTL(ctx, k).Result()
		require.NoError(t, err)
		if strings.HasSuffix(k, ":proxies") || strings.HasSuffix(k, ":meta") || strings.HasSuffix(k, ":order") {
			assert.Equal(t, time.Duration(-1), ttl, "%s is configuration and lives on", k)
		} else {
			assert.Greater(t, ttl, time.Hour, "%s carries a TTL", k)
		}
	}
}

// redisKeySlot is CRC16(hash tag) mod 16384, as Redis Cluster computes it.
func redisKeySlot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for _, b := range []byte(key) {
		crc ^= uint16(b) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}

func TestBadOptions(t *testing.T) {
	rdb := shared.Client(t)
	for name, opt := range map[string]Option{
		"ttl":         WithTimeouts(Timeouts{LeaseTTL: time.Millisecond}),
		"wait":        WithTimeouts(Timeouts{MaxWait: -time.Second}),
		"cooldown":    WithRotation(Rotation{Cooldown: -time.Second}),
		"concurrency": WithRotation(Rotation{Concurrency: Off}),
		"prefix":      WithPrefix("a{b}"),
		"pool":        WithPool(""),
		"site func":   WithSiteFunc(nil),
		"timeout":     WithTimeouts(Timeouts{Redis: Off}),
		"idle":        WithTimeouts(Timeouts{IdleTTL: time.Second}),
		"scope":       WithRotation(Rotation{Scope: Scope(7)}),
	} {
		_, err := NewSwitch(rdb, opt)
		assert.ErrorIs(t, err, ErrConfig, name)
	}
	_, err := NewSwitch(nil)
	assert.ErrorIs(t, err, ErrConfig)
	var nilClient *redis.Client
	_, err = NewSwitch(nilClient)
	assert.ErrorIs(t, err, ErrConfig, "a typed nil client is caught, not dereferenced")

	pf := New(rdb, WithRotation(Rotation{Concurrency: -1}))
	u, err := pf(nil)
	assert.Nil(t, u)
	assert.ErrorIs(t, err, ErrNoProxy)
	assert.ErrorIs(t, err, ErrConfig)
}

// TestNoTwoHoldersAtOnce is the engine-level collision test: three workers
// with separate Redis clients, 50 goroutines each, lease and release one
// pool for two sites as fast as they can, and an in-memory ledger checks that
// no proxy is ever held twice for one site.
func TestNoTwoHoldersAtOnce(t *testing.T) {
	ctx := context.Background()
	base := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: 10 * time.Second}))
	_, err := base.Add(ctx, proxyURLs(20)...)
	require.NoError(t, err)

	var holders ledger
	var leases atomic.Int64
	var wg sync.WaitGroup
	for w := range 3 {
		sw := sibling(t, base, shared.Client(t))
		for g := range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				site := []string{"ozon.example", "avito.example"}[(w+g)%2]
				for range 40 {
					l, err := sw.Lease(ctx, site)
					if !assert.NoError(t, err) {
						return
					}
					holders.hold(site, l, time.Duration(g%3)*time.Millisecond)
					leases.Add(1)
					if !assert.NoError(t, l.Release(ctx)) {
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	assert.Equal(t, int64(3*50*40), leases.Load())
	assert.Zero(t, holders.collisions.Load(), "a proxy held twice for one site")
	for _, site := range []string{"ozon.example", "avito.example"} {
		st, err := base.Stats(ctx, site)
		require.NoError(t, err)
		assert.Zero(t, st.LeaseRecords, site)
	}
	t.Logf("%d leases, 0 collisions", leases.Load())
}

// ledger counts the holders of each proxy on each site, as they see
// themselves: a second holder at once is a collision.
type ledger struct {
	mu         sync.Mutex
	holders    map[string]int
	collisions atomic.Int64
}

// hold records l's holder on site for d.
func (g *ledger) hold(site string, l *Lease, d time.Duration) {
	key := site + "|" + l.Proxy().ID()
	g.mu.Lock()
	if g.holders == nil {
		g.holders = map[string]int{}
	}
	g.holders[key]++
	if g.holders[key] > 1 {
		g.collisions.Add(1)
	}
	g.mu.Unlock()
	time.Sleep(d)
	g.mu.Lock()
	g.holders[key]--
	g.mu.Unlock()
}

func TestErrorsAreMatchable(t *testing.T) {
	_, err := ParseProxy("ftp://x:1")
	var pe *ProxyError
	require.True(t, errors.As(fmt.Errorf("wrapped: %w", err), &pe))
	assert.ErrorIs(t, fmt.Errorf("wrapped: %w", err), ErrInvalidProxy)
}

// TestNoProxyNamesWhatBlocked: a wait that fails says when the next proxy
// frees, so that the error tells a busy pool (all leased) from one held out
// by quarantines (issue 16, item 6).
func TestNoProxyNamesWhatBlocked(t *testing.T) {
	ctx := context.Background()
	s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: 100 * time.Millisecond}))
	urls := proxyURLs(2)
	_, err := s.Add(ctx, urls...)
	require.NoError(t, err)

	held, err := s.Lease(ctx, "ozon.example")
	require.NoError(t, err)
	other := urls[0]
	if p, _ := ParseProxy(other); p.ID() == held.Proxy().ID() {
		other = urls[1]
	}
	require.NoError(t, s.Ban(ctx, other, "ozon.example", time.Hour))
	_, err = s.Lease(ctx, "ozon.example")
	require.ErrorIs(t, err, ErrNoProxy)
	assert.Regexp(t, `the next proxy frees in (29|30)s\)`, err.Error(), "a held lease frees within the lease TTL")

	require.NoError(t, held.Release(ctx))
	require.NoError(t, s.Ban(ctx, held.Proxy().ID(), "ozon.example", 2*time.Hour))
	_, err = s.Lease(ctx, "ozon.example")
	require.ErrorIs(t, err, ErrNoProxy)
	assert.Regexp(t, `the next proxy frees in (59m\d\ds|1h0m0s)\)`, err.Error())
}
