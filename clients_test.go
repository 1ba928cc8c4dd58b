package proxyswitch

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every go-redis client kind runs the whole cycle: pool administration (its
// script touches per-site keys it derives itself, under the pool's hash
// tag), leases, a Colly crawl, release.
func TestEveryClientKind(t *testing.T) {
	clients := map[string]func(t *testing.T) redis.Scripter{
		"single node": func(t *testing.T) redis.Scripter { return redistest.Start(t).Client(t) },
		"sentinel": func(t *testing.T) redis.Scripter {
			return redistest.StartSentinel(t, redistest.Start(t)).Client(t)
		},
		"cluster": func(t *testing.T) redis.Scripter { return redistest.StartCluster(t, 3).Client(t) },
		"universal": func(t *testing.T) redis.Scripter {
			return redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{redistest.Start(t).Addr()}})
		},
	}
	for name, mk := range clients {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			rdb := mk(t)
			bed := testbed.NewBed(t, 2, 4)
			s := newSwitch(t, rdb)
			_, err := s.Add(ctx, bed.ProxyURLs()[:3]...)
			require.NoError(t, err)

			c := colly.NewCollector(colly.Async(true), colly.AllowURLRevisit())
			s.Attach(c)
			require.NoError(t, c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: 6}))
			var ok atomic.Int64
			c.OnResponse(func(*colly.Response) { ok.Add(1) })
			for i := range 30 {
				require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", bed.Sites[i%2].URL(), i+1)))
			}
			c.Wait()
			assert.Equal(t, int64(30), ok.Load())

			// Pool changes reach the per-site keys on every client kind.
			_, err = s.Replace(ctx, bed.ProxyURLs()[1:])
			require.NoError(t, err)
			// The rotation offers each proxy of the pool once per turn: the
			// added one, never used, serves one of the next three pages.
			for i := range 3 {
				require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", bed.Sites[0].URL(), 99+i)))
				c.Wait()
			}
			assert.Equal(t, int64(33), ok.Load())
			added := bed.Proxies[3].SourceIP().String()
			assert.Equal(t, 1, bed.Sites[0].Recorder().IPs()[added], "the added proxy, never used, took one of the next three requests")
			assertGroundTruth(t, bed)
			assertNoLeases(t, s, bed.Sites...)
		})
	}
}
