package proxyswitch

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The engine's own tests are in internal/localpool; these are the ones
// that need the root: options, errors, shares.

// newLocalPoolWith returns an empty local shard that follows opts, the
// Switch's own options; it fails with ErrConfig on an invalid option.
func newLocalPoolWith(opts ...Option) (*localPool, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	return newLocalPool(cfg), nil
}

// The local shard takes the Switch's options, and its errors are the
// package's own.
func TestLocalPoolOptionsAndErrors(t *testing.T) {
	_, err := newLocalPoolWith(WithRotation(Rotation{Concurrency: Off}))
	assert.ErrorIs(t, err, ErrConfig)
	p, err := newLocalPoolWith(nil)
	require.NoError(t, err, "a nil option is skipped")
	_, _, err = p.TryLease("ozon.ru", "", 0)
	err = localErr(err)
	assert.ErrorIs(t, err, ErrNoProxy)
	assert.ErrorIs(t, err, ErrEmptyPool)
	assert.EqualError(t, err, `proxyswitch: no proxy available: proxyswitch: proxy pool is empty: the local share of pool "default" has no proxies`)
	_, _, err = p.TryLease("", "", 0)
	assert.ErrorIs(t, localErr(err), ErrNoProxy)
	assert.ErrorIs(t, localErr(p.Ban("", "ozon.ru", time.Second)), ErrConfig)
	_, err = p.SetProxies([]*Proxy{nil})
	assert.ErrorIs(t, localErr(err), ErrConfig)

	p, err = newLocalPoolWith(WithRotation(Rotation{Scope: ScopeGlobal}), WithTimeouts(Timeouts{LeaseTTL: time.Minute}), WithPool("dc"))
	require.NoError(t, err)
	ps, err := ParseProxies(proxyURLsForShard(1))
	require.NoError(t, err)
	_, err = p.SetProxies(ps)
	require.NoError(t, err)
	l, _, err := p.TryLease("ozon.ru", "", 0)
	require.NoError(t, err)
	require.NotNil(t, l)
	assert.Equal(t, globalSite, l.Site())
	assert.InDelta(t, time.Minute.Seconds(), time.Until(l.Expiry()).Seconds(), 1)
	require.NoError(t, l.Release())
	err = localErr(l.Extend(0))
	require.ErrorIs(t, err, ErrLeaseLost)
	var pe *ProxyError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, ps[0].String(), pe.Proxy)
	assert.NotContains(t, err.Error(), "secret", "no password in errors")
	assert.Equal(t, "proxyswitch: proxy \""+ps[0].String()+"\": local lease on * lost: already released", err.Error())
}

// Three servers that lost Redis build their local pools from the same last
// known member list and pool: each hands out only its own share, so no
// proxy serves two servers at once, and together they use the whole pool.
func TestLocalPoolsOfThreeServersNeverShareAProxy(t *testing.T) {
	ps, err := ParseProxies(proxyURLsForShard(60))
	require.NoError(t, err)
	members := []string{"crawler-2", "crawler-3", "crawler-1"} // as each learnt it: order does not matter
	pools := map[string]*localPool{}
	for _, m := range members {
		share, err := shareProxies(shard.Rendezvous{}, ps, members, m)
		require.NoError(t, err)
		p, err := newLocalPoolWith(WithTimeouts(Timeouts{MaxWait: 5 * time.Second}))
		require.NoError(t, err)
		_, err = p.SetProxies(share)
		require.NoError(t, err)
		pools[m] = p
	}

	var owner sync.Map // proxy ID -> server that used it
	var inUse sync.Map // "site|id" -> *atomic.Int32
	var overlap, collisions atomic.Int64
	var wg sync.WaitGroup
	for server, p := range pools {
		for g := range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 100 {
					site := fmt.Sprintf("site%d.example", (g+i)%2)
					l, err := p.Lease(context.Background(), site)
					if !assert.NoError(t, err) {
						return
					}
					if prev, loaded := owner.LoadOrStore(l.Proxy().ID(), server); loaded && prev != server {
						overlap.Add(1)
					}
					c, _ := inUse.LoadOrStore(site+"|"+l.Proxy().ID(), new(atomic.Int32))
					if c.(*atomic.Int32).Add(1) > 1 {
						collisions.Add(1)
					}
					time.Sleep(50 * time.Microsecond)
					c.(*atomic.Int32).Add(-1)
					assert.NoError(t, l.Release())
				}
			}()
		}
	}
	wg.Wait()
	assert.Zero(t, overlap.Load(), "a proxy was used by two servers")
	assert.Zero(t, collisions.Load(), "one IP on one site twice at once")
	used := 0
	owner.Range(func(any, any) bool { used++; return true })
	assert.Equal(t, 60, used, "the shares cover the whole pool")
	total := 0
	for _, p := range pools {
		total += p.Len()
	}
	assert.Equal(t, 60, total)
}
