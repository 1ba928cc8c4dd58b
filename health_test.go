package proxyswitch

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/stretchr/testify/require"
)

func deadReasons(t *testing.T, s *Switch) map[string]string {
	t.Helper()
	dead, err := s.Dead(context.Background())
	require.NoError(t, err)
	out := map[string]string{}
	for _, d := range dead {
		out[d.Proxy.ID()] = d.Reason
	}
	return out
}

// TestDrainReasonKeepsOthersMarks: a probe's mark never hides an operator's
// drain or a failure's mark, and Revive with a reason brings back only its own.
func TestDrainReasonKeepsOthersMarks(t *testing.T) {
	ctx := context.Background()
	s := newSwitch(t, shared.Client(t), WithBans(Bans{DeadAfter: 1}), WithTimeouts(Timeouts{MaxWait: Off}))
	urls := proxyURLs(5)
	_, err := s.Add(ctx, urls...)
	require.NoError(t, err)
	id := func(i int) string { p, _ := ParseProxy(urls[i]); return p.ID() }
	const site = "shop.example"
	_, err = s.SiteState(ctx, site)
	require.NoError(t, err)

	// 0: drained by the operator; 1: dead of a failure; 2, 3: the probe's.
	require.NoError(t, func() error { _, err := s.Drain(ctx, "", urls[0]); return err }())
	l, err := s.LeaseProxy(ctx, site, urls[1])
	require.NoError(t, err)
	require.NoError(t, l.Report(ctx, ban.Verdict{Kind: ban.ProxyFailure, Reason: ban.ReasonProxyConnect}))
	before := deadReasons(t, s)
	require.Contains(t, before, id(1))

	n, err := s.Drain(ctx, "probe", urls[0], urls[1], urls[2], id(3))
	require.NoError(t, err)
	require.Equal(t, 2, n, "only the unmarked proxies are marked")
	got := deadReasons(t, s)
	require.Equal(t, "drained", got[id(0)])
	require.Equal(t, before[id(1)], got[id(1)])
	require.Equal(t, "probe", got[id(2)])
	require.Equal(t, "probe", got[id(3)])
	_, err = s.LeaseProxy(ctx, site, urls[2])
	require.ErrorIs(t, err, ErrNoProxy, "a marked proxy is leased")

	// The operator drains 3 after the probe marked it: the drain wins.
	require.NoError(t, func() error { _, err := s.Drain(ctx, "", urls[3]); return err }())
	n, err = s.Revive(ctx, "probe", urls[0], urls[1], urls[2], urls[3], urls[4])
	require.NoError(t, err)
	require.Equal(t, 1, n)
	got = deadReasons(t, s)
	require.Equal(t, map[string]string{id(0): "drained", id(1): before[id(1)], id(3): "drained"}, got)
	l, err = s.LeaseProxy(ctx, site, urls[2])
	require.NoError(t, err, "the revived proxy is not leasable")
	require.NoError(t, l.Release(ctx))

	for _, bad := range []string{"drained", "a|b", "two words", string(make([]byte, 65))} {
		_, err := s.Drain(ctx, bad, urls[4])
		require.ErrorIs(t, err, ErrConfig, "%q", bad)
		_, err = s.Revive(ctx, bad, urls[4])
		require.ErrorIs(t, err, ErrConfig, "%q", bad)
	}
	n, err = s.Revive(ctx, "", urls[0], urls[1], urls[3])
	require.NoError(t, err)
	require.Equal(t, 3, n, "Revive still revives any mark")

	// An operator's drain (reason "") takes several proxies, all in the
	// pool or none: one not in the pool drains nothing.
	_, err = s.Drain(ctx, "", urls[4], proxyURLs(6)[5])
	require.ErrorIs(t, err, ErrNotInPool)
	require.Empty(t, deadReasons(t, s), "nothing drained")
	n, err = s.Drain(ctx, "", urls[4], id(0))
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, map[string]string{id(0): "drained", id(4): "drained"}, deadReasons(t, s))
	n, err = s.Revive(ctx, "", urls[4], id(0))
	require.NoError(t, err)
	require.Equal(t, 2, n)
}

// TestLeaseProxy: it leases the named proxy or fails at once; many
// goroutines on several clients racing for one proxy never both hold it.
func TestLeaseProxy(t *testing.T) {
	ctx := context.Background()
	s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: Off}))
	urls := proxyURLs(4)
	_, err := s.Add(ctx, urls...)
	require.NoError(t, err)
	const site = "shop.example"
	l, err := s.LeaseProxy(ctx, site, urls[2])
	require.NoError(t, err)
	require.Equal(t, urls[2], l.Proxy().URL().String())
	_, err = s.LeaseProxy(ctx, site, urls[2])
	require.ErrorIs(t, err, ErrNoProxy)
	other, err := s.LeaseProxy(ctx, "other.example", urls[2])
	require.NoError(t, err, "a proxy is exclusive per site")
	require.NoError(t, other.Release(ctx))
	require.NoError(t, l.Release(ctx))
	_, err = s.LeaseProxy(ctx, site, "http://203.0.113.99:1")
	require.ErrorIs(t, err, ErrNoProxy)
	_, err = s.LeaseProxy(ctx, "", urls[2])
	require.ErrorIs(t, err, ErrConfig)

	sws := []*Switch{s, sibling(t, s, shared.Client(t)), sibling(t, s, shared.Client(t))}
	var mu sync.Mutex
	holders, maxHolders, got := 0, 0, 0
	var wg sync.WaitGroup
	for g := 0; g < 24; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sw := sws[g%len(sws)]
			for i := 0; i < 20; i++ {
				var l *Lease
				var err error
				if g%2 == 0 {
					l, err = sw.LeaseProxy(ctx, site, urls[1])
				} else {
					l, err = sw.Lease(ctx, site) // crawl requests take any proxy
				}
				if errors.Is(err, ErrNoProxy) {
					continue
				}
				if !assertNoErr(t, err) {
					return
				}
				mine := l.Proxy().ID() == sws[0].mustID(urls[1])
				if mine {
					mu.Lock()
					holders++
					got++
					maxHolders = max(maxHolders, holders)
					mu.Unlock()
				}
				time.Sleep(time.Millisecond)
				if mine {
					mu.Lock()
					holders--
					mu.Unlock()
				}
				assertNoErr(t, l.Release(ctx))
			}
		}()
	}
	wg.Wait()
	require.Equal(t, 1, maxHolders, "two holders of one proxy on one site")
	require.Positive(t, got)
}

func assertNoErr(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Error(err)
		return false
	}
	return true
}

func (s *Switch) mustID(u string) string {
	p, err := ParseProxy(u)
	if err != nil {
		panic(err)
	}
	return p.ID()
}
