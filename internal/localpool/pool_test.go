package localpool

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testProxy is a proxy as the root's *Proxy looks to a Pool: an ID, and a
// String without the password.
type testProxy struct{ id, url string }

func (p *testProxy) ID() string     { return p.id }
func (p *testProxy) String() string { return p.url }

// testProxies returns n proxies, the same for the same n.
func testProxies(n int) []*testProxy {
	out := make([]*testProxy, n)
	for i := range out {
		out[i] = &testProxy{id: fmt.Sprintf("%016x", i+1), url: fmt.Sprintf("http://u%d:xxxxx@192.0.2.%d:8080", i, i+1)}
	}
	return out
}

// testConfig returns the Switch's default rules changed by opts.
func testConfig(opts ...func(*Config)) Config {
	cfg := Config{Pool: "default", Slots: 1, LeaseTTL: 30 * time.Second, MaxWait: 30 * time.Second, IdleTTL: 24 * time.Hour}
	for _, o := range opts {
		o(&cfg)
	}
	return cfg
}

// newTestPool returns an empty Pool with testConfig(opts...).
func newTestPool(opts ...func(*Config)) *Pool[*testProxy] {
	return New[*testProxy](testConfig(opts...))
}

// fakeShard returns a Pool over n proxies (testProxies) on a fake clock
// that starts at 1,000,000 ms and moves only when told.
func fakeShard(t *testing.T, n int, opts ...func(*Config)) (*Pool[*testProxy], *atomic.Int64, []*testProxy) {
	t.Helper()
	p := newTestPool(opts...)
	clock := &atomic.Int64{}
	clock.Store(1_000_000)
	p.clock = clock.Load
	ps := testProxies(n)
	ch, err := p.SetProxies(ps)
	require.NoError(t, err)
	require.Equal(t, Change{Added: n, Size: n}, ch)
	return p, clock, ps
}

func mustLease(t *testing.T, p *Pool[*testProxy], site string) *Lease[*testProxy] {
	t.Helper()
	l, wait, err := p.TryLease(site, "", 0)
	require.NoError(t, err)
	require.NotNil(t, l, "no proxy free (next in %v)", wait)
	return l
}

func noLease(t *testing.T, p *Pool[*testProxy], site string) time.Duration {
	t.Helper()
	l, wait, err := p.TryLease(site, "", 0)
	require.NoError(t, err)
	require.Nil(t, l, "leased %v", l)
	return wait
}

func TestLocalPoolExclusivePerSiteAndLRU(t *testing.T) {
	p, _, ps := fakeShard(t, 3)
	var held []*Lease[*testProxy]
	for range 3 {
		held = append(held, mustLease(t, p, "ozon.ru"))
	}
	assert.Equal(t, ps[0].ID(), held[0].Proxy().ID(), "proxies start free in the order given")
	assert.Equal(t, 30*time.Second, noLease(t, p, "ozon.ru"), "all busy: the wait is the time to the first expiry")
	other := mustLease(t, p, "avito.ru")
	assert.Equal(t, "avito.ru", other.Site(), "a proxy busy on one site serves another")

	for _, l := range held {
		require.NoError(t, l.Release())
		require.NoError(t, l.Release(), "a second release is a no-op")
	}
	seen := map[string]bool{}
	for range 3 {
		l := mustLease(t, p, "ozon.ru")
		seen[l.Proxy().ID()] = true
		require.NoError(t, l.Release())
	}
	assert.Len(t, seen, 3, "least recently used first: three leases in a row use three proxies")
	assert.Equal(t, Stats{Proxies: 3, FreeSlots: 3}, p.Stats("ozon.ru"))
	assert.Equal(t, Stats{Proxies: 3, FreeSlots: 2, Leased: 1, BusySlots: 1, LeaseRecords: 1}, p.Stats("avito.ru"))
	assert.Equal(t, Stats{Proxies: 3, FreeSlots: 3}, p.Stats("never.example"))
}

func TestLocalPoolScopeGlobal(t *testing.T) {
	p, _, _ := fakeShard(t, 1, func(c *Config) { c.Global = true })
	l := mustLease(t, p, "ozon.ru")
	assert.Equal(t, "*", l.Site())
	noLease(t, p, "avito.ru")
	require.NoError(t, l.Release())
	mustLease(t, p, "avito.ru")
}

func TestLocalPoolConcurrencyAndPacing(t *testing.T) {
	p, clock, _ := fakeShard(t, 1, func(c *Config) { c.Slots, c.Cooldown = 2, time.Second })
	a := mustLease(t, p, "ozon.ru")
	assert.Equal(t, time.Second, noLease(t, p, "ozon.ru"), "the second slot waits for the cooldown after a start")
	clock.Add(1000)
	b := mustLease(t, p, "ozon.ru")
	assert.Equal(t, a.Proxy().ID(), b.Proxy().ID())
	noLease(t, p, "ozon.ru")

	require.NoError(t, a.Release())
	assert.Equal(t, time.Second, noLease(t, p, "ozon.ru"), "a released slot cools down")
	clock.Add(1000)
	mustLease(t, p, "ozon.ru")
}

// A lease ends by itself; its late holder can then neither release nor
// extend the next holder's lease.
func TestLocalPoolTTLAndOwnerTokens(t *testing.T) {
	p, clock, _ := fakeShard(t, 1, func(c *Config) { c.LeaseTTL = time.Second })
	old, _, err := p.TryLease("ozon.ru", "", 0)
	require.NoError(t, err)
	assert.Equal(t, time.UnixMilli(1_001_000), old.Expiry())
	clock.Add(999)
	noLease(t, p, "ozon.ru")
	clock.Add(1)
	next := mustLease(t, p, "ozon.ru")
	require.Equal(t, old.Proxy().ID(), next.Proxy().ID())

	assert.ErrorIs(t, old.Extend(0), ErrLeaseLost)
	err = old.Release()
	require.ErrorIs(t, err, ErrLeaseLost)
	var pe *Error
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, old.Proxy().String(), pe.Proxy, "the proxy's String, without its password")
	assert.Equal(t, "local lease on ozon.ru lost: expired and leased again", pe.Msg)
	noLease(t, p, "ozon.ru")

	require.NoError(t, next.Extend(5*time.Second))
	assert.Equal(t, time.UnixMilli(1_006_000), next.Expiry())
	clock.Add(4000)
	noLease(t, p, "ozon.ru")
	require.NoError(t, next.Release())
	assert.ErrorIs(t, next.Extend(0), ErrLeaseLost, "released")

	// Released after its expiry, with nobody in between: fine.
	late := mustLease(t, p, "ozon.ru")
	clock.Add(2000)
	require.NoError(t, late.Release())
}

func TestLocalPoolBans(t *testing.T) {
	p, clock, ps := fakeShard(t, 2)
	id := ps[0].ID()
	require.NoError(t, p.Ban(id, "ozon.ru", 10*time.Second))
	require.NoError(t, p.Ban(id, "ozon.ru", time.Second), "a shorter ban never shortens a longer one")
	l := mustLease(t, p, "ozon.ru")
	assert.Equal(t, ps[1].ID(), l.Proxy().ID(), "the banned proxy is skipped on its site")
	assert.Equal(t, ps[0].ID(), mustLease(t, p, "avito.ru").Proxy().ID(), "and serves other sites")
	assert.Equal(t, []Ban{{ProxyID: id, Site: "ozon.ru"}}, clearUntil(p.Bans()))
	assert.Equal(t, 10*time.Second, noLease(t, p, "ozon.ru"))

	// A ban caught on a lease ends it; a release after that changes nothing.
	require.NoError(t, l.Ban(20*time.Second))
	require.NoError(t, l.Release())
	clock.Add(10_000)
	assert.Equal(t, ps[0].ID(), mustLease(t, p, "ozon.ru").Proxy().ID(), "the first ban ended by itself")
	assert.Equal(t, 10*time.Second, noLease(t, p, "ozon.ru"))

	require.NoError(t, p.BanAllSites(ps[1].ID(), time.Minute))
	assert.Equal(t, ps[0].ID(), mustLease(t, p, "new.example").Proxy().ID(), "a ban on every site holds on sites leased later too")
	clock.Add(1000) // past sweepEvery: the ended ban is forgotten
	assert.Equal(t, []Ban{{ProxyID: ps[1].ID()}, {ProxyID: ps[1].ID(), Site: "ozon.ru"}}, clearUntil(p.Bans()))
	bans := p.Bans()
	assert.InDelta(t, (time.Minute - time.Second).Seconds(), time.Until(bans[0].Until).Seconds(), 1)

	for _, bad := range []func() error{
		func() error { return p.Ban("", "ozon.ru", time.Second) },
		func() error { return p.Ban(id, "", time.Second) },
		func() error { return p.Ban(id, "ozon.ru", 0) },
		func() error { return p.BanAllSites(id, -time.Second) },
	} {
		assert.ErrorIs(t, bad(), ErrInvalid)
	}
}

func clearUntil(bs []Ban) []Ban {
	for i := range bs {
		bs[i].Until = time.Time{}
	}
	return bs
}

func TestLocalPoolPrefer(t *testing.T) {
	p, _, ps := fakeShard(t, 3)
	l, _, err := p.TryLease("ozon.ru", ps[2].ID(), 0)
	require.NoError(t, err)
	assert.Equal(t, ps[2].ID(), l.Proxy().ID())
	l2, _, err := p.TryLease("ozon.ru", ps[2].ID(), 0)
	require.NoError(t, err)
	assert.Equal(t, ps[0].ID(), l2.Proxy().ID(), "the preferred proxy is busy: the least recently used instead")
}

// TryLeaseWhere leases only proxies that match, least recently used first,
// waits for a busy one rather than take another, and fails with ErrNoMatch
// when none matches.
func TestLocalPoolLeaseWhere(t *testing.T) {
	p, clock, ps := fakeShard(t, 6, func(c *Config) { c.Cooldown = time.Second })
	odd := func(px *testProxy) bool { return px.ID() == ps[1].ID() || px.ID() == ps[3].ID() }
	var held []*Lease[*testProxy]
	for _, want := range []int{1, 3} {
		l, _, err := p.TryLeaseWhere("ozon.ru", ps[0].ID(), odd, 0) // preferring a proxy that does not match
		require.NoError(t, err)
		require.NotNil(t, l)
		assert.Equal(t, ps[want].ID(), l.Proxy().ID())
		held = append(held, l)
	}
	for _, l := range held {
		require.NoError(t, l.Release())
	}
	clock.Add(1000)
	l, _, err := p.TryLeaseWhere("ozon.ru", ps[3].ID(), odd, 0)
	require.NoError(t, err)
	assert.Equal(t, ps[3].ID(), l.Proxy().ID(), "the preferred proxy, when it matches")
	require.NoError(t, l.Release())
	clock.Add(1000)
	held = nil
	for _, want := range []int{1, 3} {
		l, _, err := p.TryLeaseWhere("ozon.ru", "", odd, 0)
		require.NoError(t, err)
		require.NotNil(t, l)
		assert.Equal(t, ps[want].ID(), l.Proxy().ID())
		held = append(held, l)
	}
	l, wait, err := p.TryLeaseWhere("ozon.ru", "", odd, 0)
	require.NoError(t, err)
	assert.Nil(t, l, "the matching proxies are busy: no other one")
	assert.Equal(t, 30*time.Second, wait, "until the first matching lease ends")
	require.NoError(t, held[1].Release())
	clock.Add(999)
	_, wait, _ = p.TryLeaseWhere("ozon.ru", "", odd, 0)
	assert.Equal(t, time.Millisecond, wait, "the cooldown")
	clock.Add(1)
	l, _, err = p.TryLeaseWhere("ozon.ru", "", odd, 0)
	require.NoError(t, err)
	assert.Equal(t, ps[3].ID(), l.Proxy().ID())
	mustLease(t, p, "ozon.ru") // the others stay free for any lease

	_, _, err = p.TryLeaseWhere("ozon.ru", "", func(*testProxy) bool { return false }, 0)
	require.ErrorIs(t, err, ErrNoMatch)
	require.ErrorIs(t, err, ErrNoProxy)
	_, _, err = p.TryLeaseWhere("ozon.ru", "", nil, 0)
	require.ErrorIs(t, err, ErrInvalid)
}

func TestLocalPoolSetProxies(t *testing.T) {
	p, _, ps := fakeShard(t, 3, func(c *Config) { c.Cooldown = time.Minute })
	gone := mustLease(t, p, "ozon.ru")
	cooling := mustLease(t, p, "ozon.ru")
	require.NoError(t, cooling.Release())

	more := testProxies(5)
	ch, err := p.SetProxies(append(more[1:], more[1])) // drops ps[0], adds 3 and 4, a duplicate
	require.NoError(t, err)
	assert.Equal(t, Change{Added: 2, Removed: 1, Size: 4}, ch)
	assert.Equal(t, 4, p.Len())

	got := map[string]bool{}
	for range 3 {
		got[mustLease(t, p, "ozon.ru").Proxy().ID()] = true
	}
	assert.Equal(t, map[string]bool{ps[2].ID(): true, more[3].ID(): true, more[4].ID(): true}, got,
		"the removed proxy is never handed out; the kept one still cools down; added ones are free")
	noLease(t, p, "ozon.ru")
	require.NoError(t, gone.Release(), "the lease of a removed proxy ends quietly")

	_, err = p.SetProxies([]*testProxy{ps[0], nil})
	require.ErrorIs(t, err, ErrInvalid)
	assert.Equal(t, 4, p.Len(), "a rejected call changes nothing")
}

func TestLocalPoolHold(t *testing.T) {
	p, clock, _ := fakeShard(t, 2)
	mustLease(t, p, "ozon.ru")
	p.Hold(2 * time.Second)
	p.Hold(time.Second) // never shortens
	assert.Equal(t, 2*time.Second, noLease(t, p, "avito.ru"), "sites built later are held too")
	extra := []*testProxy{{id: "0000000000000099", url: "http://xxxxx:xxxxx@192.0.2.99:8080"}}
	_, err := p.SetProxies(append(extra, p.proxiesInOrder()...))
	require.NoError(t, err)
	assert.Equal(t, 2*time.Second, noLease(t, p, "ozon.ru"), "proxies added later are held too")
	clock.Add(2000)
	mustLease(t, p, "ozon.ru")
}

// A proxy leased from Redis before the fallback stays busy locally until its
// lease ends, on the sites it was leased for only, and is no ban.
func TestLocalPoolReserve(t *testing.T) {
	p, clock, ps := fakeShard(t, 2)
	require.NoError(t, mustLease(t, p, "avito.ru").Release()) // one site built before the reservation
	require.NoError(t, p.Reserve(ps[0].ID(), "avito.ru", time.Now().Add(5*time.Second)))
	require.NoError(t, p.Reserve(ps[1].ID(), "ozon.ru", time.Now().Add(3*time.Second)))
	require.NoError(t, p.Reserve(ps[1].ID(), "ozon.ru", time.Now().Add(-time.Second)), "a time past does nothing")
	assert.Equal(t, ps[1].ID(), mustLease(t, p, "avito.ru").Proxy().ID(), "the reserved proxy is skipped")
	assert.InDelta(t, 5, noLease(t, p, "avito.ru").Seconds(), 0.1, "until the reservation ends")
	assert.Equal(t, ps[0].ID(), mustLease(t, p, "ozon.ru").Proxy().ID(), "a site built later skips it too")
	assert.InDelta(t, 3, noLease(t, p, "ozon.ru").Seconds(), 0.1)
	assert.Equal(t, ps[0].ID(), mustLease(t, p, "wildberries.ru").Proxy().ID(), "other sites are not affected")
	assert.Empty(t, p.Bans())
	clock.Add(3000)
	assert.Equal(t, ps[1].ID(), mustLease(t, p, "ozon.ru").Proxy().ID())
	assert.ErrorIs(t, p.Reserve("", "ozon.ru", time.Now().Add(time.Second)), ErrInvalid)
	assert.ErrorIs(t, p.Reserve(ps[0].ID(), "", time.Now().Add(time.Second)), ErrInvalid)
}

func (p *Pool[P]) proxiesInOrder() []P {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]P, len(p.ids))
	for i, id := range p.ids {
		out[i] = p.proxies[id]
	}
	return out
}

// Lease blocks until a release (woken at once, not polling), the max wait
// or the context's end.
func TestLocalPoolLeaseWaits(t *testing.T) {
	p := newTestPool(func(c *Config) { c.MaxWait = 2 * time.Second })
	_, err := p.SetProxies(testProxies(1))
	require.NoError(t, err)
	ctx := context.Background()

	held, err := p.Lease(ctx, "ozon.ru")
	require.NoError(t, err)
	go func() {
		time.Sleep(50 * time.Millisecond)
		_ = held.Release()
	}()
	start := time.Now()
	l, err := p.Lease(ctx, "ozon.ru")
	require.NoError(t, err)
	assert.Less(t, time.Since(start), time.Second, "woken by the release")

	cctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	_, err = p.Lease(cctx, "ozon.ru")
	assert.ErrorIs(t, err, ErrNoProxy)
	assert.ErrorIs(t, err, context.DeadlineExceeded)

	p.cfg.MaxWait = 20 * time.Millisecond
	_, err = p.Lease(ctx, "ozon.ru")
	assert.ErrorIs(t, err, ErrNoProxy)
	require.NoError(t, l.Release())
}

func TestLocalPoolBadInput(t *testing.T) {
	p := New[*testProxy](Config{Pool: "default"})
	assert.Equal(t, 1, p.cfg.Slots, "Slots below 1 count as 1")
	_, _, err := p.TryLease("ozon.ru", "", 0)
	assert.ErrorIs(t, err, ErrNoProxy)
	assert.ErrorIs(t, err, ErrEmptyPool)
	_, _, err = p.TryLease("", "", 0)
	assert.ErrorIs(t, err, ErrNoProxy)
	_, err = p.Lease(context.Background(), "ozon.ru")
	assert.ErrorIs(t, err, ErrEmptyPool, "an empty share fails at once, no waiting")
}

// Sites nobody leased for the idle TTL are forgotten, unless a lease or a
// cooldown is still running there.
func TestLocalPoolForgetsIdleSites(t *testing.T) {
	p, clock, _ := fakeShard(t, 2, func(c *Config) { c.IdleTTL, c.LeaseTTL = time.Minute, 20*time.Second })
	mustLease(t, p, "a.example")
	require.NoError(t, mustLease(t, p, "b.example").Release())
	clock.Add(61_000)
	mustLease(t, p, "c.example") // sweeps
	p.mu.Lock()
	_, a := p.sites["a.example"]
	_, b := p.sites["b.example"]
	p.mu.Unlock()
	assert.False(t, a, "its lease ended long ago")
	assert.False(t, b)
}

// Many goroutines on one Pool: never two holders of one slot, under
// -race, with releases, extensions, bans and expiries mixed in.
func TestLocalPoolNoTwoHoldersAtOnce(t *testing.T) {
	p := newTestPool(func(c *Config) { c.Slots, c.MaxWait, c.LeaseTTL = 2, 5*time.Second, time.Second })
	_, err := p.SetProxies(testProxies(8))
	require.NoError(t, err)

	sites := []string{"ozon.ru", "avito.ru", "wildberries.ru"}
	var inUse sync.Map // "site|id" -> *atomic.Int32
	var over, leases atomic.Int64
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 7))
			for range 150 {
				site := sites[r.IntN(len(sites))]
				l, err := p.Lease(context.Background(), site)
				if !assert.NoError(t, err) {
					return
				}
				leases.Add(1)
				c, _ := inUse.LoadOrStore(site+"|"+l.Proxy().ID(), new(atomic.Int32))
				if c.(*atomic.Int32).Add(1) > 2 {
					over.Add(1)
				}
				if r.IntN(4) == 0 {
					_ = l.Extend(time.Second)
				}
				time.Sleep(time.Duration(r.IntN(200)) * time.Microsecond)
				c.(*atomic.Int32).Add(-1)
				if r.IntN(50) == 0 {
					_ = l.Ban(time.Duration(1+r.IntN(20)) * time.Millisecond)
				} else {
					_ = l.Release()
				}
			}
		}()
	}
	wg.Wait()
	assert.Zero(t, over.Load(), "a slot had two holders at once")
	assert.Equal(t, int64(64*150), leases.Load())
	for _, site := range sites {
		assert.Zero(t, p.Stats(site).Leased, site)
	}
}
