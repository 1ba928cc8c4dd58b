package proxyswitch

import (
	"errors"
	"net/http"
	"net/url"
	"sync"
	"testing"

	"github.com/gocolly/colly/v2"
	"github.com/gocolly/colly/v2/proxy"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// These tests pin the Colly and net/http behaviour the binding in binding.go
// leans on (shared/DESIGN.md §5). If an upgrade of either changes it, they
// fail here first, with a name that says which fact broke.

// recordingProxyFunc sends every hop through p and records, per call, the
// identity of the hop's header map and of the previous hop's.
type recordingProxyFunc struct {
	mu    sync.Mutex
	p     *url.URL
	fail  int // hops from this index on fail (0: none)
	hops  []uintptr
	prevs []uintptr
}

func (f *recordingProxyFunc) proxy(req *http.Request) (*url.URL, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hops = append(f.hops, headerKey(req.Header))
	var prev uintptr
	if req.Response != nil && req.Response.Request != nil {
		prev = headerKey(req.Response.Request.Header)
	}
	f.prevs = append(f.prevs, prev)
	if f.fail > 0 && len(f.hops) > f.fail {
		return nil, errors.New("hop refused")
	}
	return f.p, nil
}

func newRecordingCollector(t *testing.T) (*colly.Collector, *recordingProxyFunc, *testbed.Site) {
	site := testbed.NewSite(t, "facts", nil)
	pu, err := url.Parse(testbed.NewProxy(t, testbed.SourceIP(0)).URL())
	require.NoError(t, err)
	f := &recordingProxyFunc{p: pu}
	c := colly.NewCollector(colly.AllowURLRevisit())
	c.SetProxyFunc(f.proxy)
	return c, f, site
}

func TestCollyFactProxyURLIsEmptyUnderDefaults(t *testing.T) {
	site := testbed.NewSite(t, "facts", nil)
	pf, err := proxy.RoundRobinProxySwitcher(testbed.NewProxy(t, testbed.SourceIP(0)).URL())
	require.NoError(t, err)
	c := colly.NewCollector()
	c.SetProxyFunc(pf)
	var got = "unset"
	c.OnResponse(func(r *colly.Response) { got = r.Request.ProxyURL })
	require.NoError(t, c.Visit(site.URL()+"/p/1"))
	assert.Equal(t, "", got, "colly's own ProxyURL bookkeeping is lost in net/http's request copy")
}

func TestCollyFactHeaderMapReachesProxyFunc(t *testing.T) {
	c, f, site := newRecordingCollector(t)
	var fromHook, atResponse uintptr
	c.OnRequestHeaders(func(r *colly.Request) { fromHook = headerKey(*r.Headers) })
	c.OnResponse(func(r *colly.Response) { atResponse = headerKey(*r.Request.Headers) })
	require.NoError(t, c.Visit(site.URL()+"/p/1"))
	require.Len(t, f.hops, 1)
	assert.Equal(t, fromHook, f.hops[0], "the ProxyFunc sees the map OnRequestHeaders sees")
	assert.Equal(t, fromHook, atResponse, "and OnResponse sees it too")
}

func TestCollyFactRedirectHopsChainTheirMaps(t *testing.T) {
	c, f, site := newRecordingCollector(t)
	var first, atResponse uintptr
	c.OnRequestHeaders(func(r *colly.Request) { first = headerKey(*r.Headers) })
	c.OnResponse(func(r *colly.Response) { atResponse = headerKey(*r.Request.Headers) })
	require.NoError(t, c.Visit(site.URL()+"/redirect?n=2"))
	require.Len(t, f.hops, 3)
	assert.Equal(t, first, f.hops[0])
	assert.Zero(t, f.prevs[0], "the first hop has no previous response")
	for i := 1; i < 3; i++ {
		assert.NotEqual(t, f.hops[i-1], f.hops[i], "each hop gets a new map")
		assert.Equal(t, f.hops[i-1], f.prevs[i], "req.Response.Request.Header is the previous hop's map")
	}
	assert.Equal(t, f.hops[2], atResponse, "OnResponse sees the last hop's map")
}

func TestCollyFactFailedHopReportsFirstMap(t *testing.T) {
	c, f, site := newRecordingCollector(t)
	f.fail = 1 // the second hop fails inside the transport
	var first, atError uintptr
	c.OnRequestHeaders(func(r *colly.Request) { first = headerKey(*r.Headers) })
	c.OnError(func(r *colly.Response, _ error) { atError = headerKey(*r.Request.Headers) })
	_ = c.Visit(site.URL() + "/redirect?n=1")
	require.Len(t, f.hops, 2)
	assert.Equal(t, first, atError, "a chain that fails midway reports the first hop's map to OnError")
}

func TestCollyFactRetryReusesTheHeaderMap(t *testing.T) {
	c, _, site := newRecordingCollector(t)
	var maps []uintptr
	c.OnRequest(func(r *colly.Request) { maps = append(maps, headerKey(*r.Headers)) })
	c.OnError(func(r *colly.Response, _ error) {
		if len(maps) == 1 {
			_ = r.Request.Retry()
		}
	})
	_ = c.Visit(site.URL() + "/status/500")
	require.Len(t, maps, 2)
	assert.Equal(t, maps[0], maps[1], "Retry passes the same map: the hooks must give each request its own")
}
