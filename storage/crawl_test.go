package storage

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/stretchr/testify/require"
)

// Three collectors with 50 parallel requests each, on three Redis clients,
// are seeded with the same 10,000 URLs (revisits off), fed forwards and
// backwards at once so that every URL is raced six times: the site sees
// every URL exactly once.
func TestThreeCollectorsFetchEachURLOnce(t *testing.T) {
	const urls, collectors, parallel = 10000, 3, 50
	site := testbed.NewSite(t, "shop", testbed.DefaultHandler())
	list := make([]string, urls)
	for i := range list {
		list[i] = fmt.Sprintf("%s/p/%d", site.URL(), i+1)
	}
	base := newStorage(t, shared.Client(t))

	var fetched, failed, won, refused atomic.Int64
	var wg sync.WaitGroup
	cs := make([]*colly.Collector, collectors)
	for i := range cs {
		s := base
		if i > 0 {
			s = twin(t, base, shared.Client(t))
		}
		c := colly.NewCollector(colly.Async(true))
		require.NoError(t, c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: parallel}))
		require.NoError(t, c.SetStorage(s))
		c.OnResponse(func(*colly.Response) { fetched.Add(1) })
		c.OnError(func(_ *colly.Response, err error) {
			failed.Add(1)
			t.Errorf("request failed: %v", err)
		})
		cs[i] = c
		for _, backwards := range []bool{false, true} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range list {
					if backwards {
						j = len(list) - 1 - j
					}
					var av *colly.AlreadyVisitedError
					switch err := c.Visit(list[j]); {
					case err == nil:
						won.Add(1)
					case errors.Is(err, ErrAlreadyVisited) || errors.As(err, &av):
						refused.Add(1)
					default:
						t.Errorf("visit %s: %v", list[j], err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	for _, c := range cs {
		c.Wait()
	}

	perPath := map[string]int{}
	for _, h := range site.Recorder().Hits() {
		perPath[h.Path]++
	}
	dups := 0
	for p, n := range perPath {
		if n != 1 {
			dups += n - 1
			t.Errorf("%s fetched %d times", p, n)
		}
	}
	require.Zero(t, dups)
	require.Len(t, perPath, urls)
	require.EqualValues(t, urls, won.Load())
	require.EqualValues(t, urls, fetched.Load())
	require.EqualValues(t, 2*collectors*urls-urls, refused.Load())
	require.Zero(t, failed.Load())
	t.Logf("%d URLs, %d visits: %d fetched, %d refused as already visited", urls, 2*collectors*urls, won.Load(), refused.Load())
}
