package proxyswitch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSessionNoProxyErrorSurvivesClientTimeout: a request of a task whose
// session waits for a proxy until Colly's request timeout (net/http's
// Client.Timeout) fails with an error that still matches ErrNoProxy, in
// OnError and in Visit, as a request of no task does
// (TestNoProxyErrorSurvivesClientTimeout).
func TestSessionNoProxyErrorSurvivesClientTimeout(t *testing.T) {
	ctx := context.Background()
	site := testbed.NewSite(t, "busy", nil)
	s := newSwitch(t, shared.Client(t), WithMaxWait(time.Minute))
	_, err := s.Add(ctx, testbed.NewProxies(t, 1)[0].URL())
	require.NoError(t, err)
	held, err := s.Lease(ctx, site.Host()) // the only proxy stays busy
	require.NoError(t, err)
	defer held.Release(ctx)

	const requests = 10
	c := colly.NewCollector(colly.AllowURLRevisit(), colly.Async(true))
	c.SetRequestTimeout(300 * time.Millisecond)
	s.Attach(c)
	require.NoError(t, c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: requests}))
	var mu sync.Mutex
	var errs []error
	c.OnError(func(_ *colly.Response, err error) {
		mu.Lock()
		defer mu.Unlock()
		errs = append(errs, err)
	})
	for i := range requests {
		require.NoError(t, c.Request("GET", fmt.Sprintf("%s/p/%d", site.URL(), i+1), nil, NewTaskContext(fmt.Sprintf("t%d", i)), nil))
	}
	c.Wait()
	require.Len(t, errs, requests)
	lost := 0
	for _, err := range errs {
		if !errors.Is(err, ErrNoProxy) {
			lost++
			t.Logf("not ErrNoProxy: %v", err)
		}
	}
	assert.Zero(t, lost, "errors that lost ErrNoProxy, of %d", requests)

	sync := colly.NewCollector(colly.AllowURLRevisit())
	sync.SetRequestTimeout(300 * time.Millisecond)
	s.Attach(sync)
	err = sync.Request("GET", site.URL()+"/p/1", nil, NewTaskContext("sync"), nil)
	assert.ErrorIs(t, err, ErrNoProxy, "Visit: %v", err)
	assert.Zero(t, site.Recorder().Count(), "no request left without a proxy")
}
