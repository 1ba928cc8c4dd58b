package proxyswitch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"net/http"
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
	noProxySurvivesClientTimeout(t, true, time.Second)
}

// TestNoProxyErrorSurvivesFarClientTimeout: as
// TestNoProxyErrorSurvivesClientTimeout, with a request timeout far enough
// (more than byNear Redis timeouts) that the wait starts without a context
// of its own (acquireBy) and makes it on the way.
func TestNoProxyErrorSurvivesFarClientTimeout(t *testing.T) {
	noProxySurvivesClientTimeout(t, false, 2*time.Second, WithTimeouts(Timeouts{Redis: 200 * time.Millisecond}))
}

// noProxySurvivesClientTimeout sends 20 requests (of a task each, with
// tasks) that wait for the only proxy, held by another, until Colly's
// request timeout: every error matches ErrNoProxy, in OnError and in Visit,
// and no request leaves without a proxy.
//
// A timeout of a second: the wait ends 100ms before it (leaseMargin), room
// enough for a loaded machine to hand the error over before net/http's timer.
func noProxySurvivesClientTimeout(t *testing.T, tasks bool, timeout time.Duration, opts ...Option) {
	ctx := context.Background()
	site := testbed.NewSite(t, "busy", nil)
	s := newSwitch(t, shared.Client(t), append([]Option{WithTimeouts(Timeouts{MaxWait: time.Minute})}, opts...)...)
	_, err := s.Add(ctx, testbed.NewProxies(t, 1)[0].URL())
	require.NoError(t, err)
	held, err := s.Lease(ctx, site.Host()) // the only proxy stays busy
	require.NoError(t, err)
	defer held.Release(ctx)
	request := func(c *colly.Collector, u, task string) error {
		var cc *colly.Context
		if tasks {
			cc = NewTaskContext(task)
		}
		return c.Request("GET", u, nil, cc, nil)
	}

	const requests = 20
	c := colly.NewCollector(colly.AllowURLRevisit(), colly.Async(true))
	c.SetRequestTimeout(timeout)
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
		require.NoError(t, request(c, fmt.Sprintf("%s/p/%d", site.URL(), i+1), fmt.Sprintf("t%d", i)))
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
	sync.SetRequestTimeout(timeout)
	s.Attach(sync)
	err = request(sync, site.URL()+"/p/1", "sync")
	assert.ErrorIs(t, err, ErrNoProxy, "Visit: %v", err)
	assert.Zero(t, site.Recorder().Count(), "no request left without a proxy")
}

// TestFailedRequestNamesItsCause: every failed request's error names its
// cause (issue 16, item 6), for requests of no task and of a task's
// session alike, through Attach: in its text, and for errors.Is and
// errors.As. No request ever leaves without a proxy.
func TestFailedRequestNamesItsCause(t *testing.T) {
	forbid := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "no", http.StatusForbidden) })
	type setup struct {
		s    *Switch
		site *testbed.Site
	}
	cases := []struct {
		name    string
		timeout time.Duration // Colly's request timeout
		prepare func(t *testing.T) setup
		is      []error
		text    string // a regexp the message matches
		check   func(t *testing.T, err error)
	}{{
		name: "the site's answer",
		prepare: func(t *testing.T) setup {
			site := testbed.NewSite(t, "forbids", forbid)
			s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: 200 * time.Millisecond}))
			_, err := s.Add(context.Background(), testbed.NewProxies(t, 1)[0].URL())
			require.NoError(t, err)
			return setup{s, site}
		},
		is:   []error{ErrBanned},
		text: `403 Forbidden, http_403`,
		check: func(t *testing.T, err error) {
			var be *BlockedError
			require.ErrorAs(t, err, &be)
			assert.Equal(t, http.StatusForbidden, be.Status)
		},
	}, {
		name: "a quarantine",
		prepare: func(t *testing.T) setup {
			site := testbed.NewSite(t, "quarantined", nil)
			s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: 200 * time.Millisecond}))
			p := testbed.NewProxies(t, 1)[0].URL()
			_, err := s.Add(context.Background(), p)
			require.NoError(t, err)
			require.NoError(t, s.Ban(context.Background(), p, site.Host(), time.Hour))
			return setup{s, site}
		},
		is:   []error{ErrNoProxy},
		text: `quarantined.*the next proxy frees in (59m\d\ds|1h0m0s)`,
	}, {
		name: "a paused site",
		prepare: func(t *testing.T) setup {
			site := testbed.NewSite(t, "paused", nil)
			s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: 200 * time.Millisecond}))
			_, err := s.Add(context.Background(), testbed.NewProxies(t, 1)[0].URL())
			require.NoError(t, err)
			_, err = s.PauseSite(context.Background(), site.Host(), time.Hour)
			require.NoError(t, err)
			return setup{s, site}
		},
		is:    []error{ErrNoProxy, ErrSitePaused},
		text:  `paused \(circuit breaker or PauseSite\) until 2`,
		check: func(t *testing.T, err error) { var pe *SitePausedError; require.ErrorAs(t, err, &pe) },
	}, {
		name: "a site paused until resumed",
		prepare: func(t *testing.T) setup {
			site := testbed.NewSite(t, "paused-by-hand", nil)
			s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: 200 * time.Millisecond}))
			_, err := s.Add(context.Background(), testbed.NewProxies(t, 1)[0].URL())
			require.NoError(t, err)
			_, err = s.PauseSite(context.Background(), site.Host(), 0)
			require.NoError(t, err)
			return setup{s, site}
		},
		is:    []error{ErrNoProxy, ErrSitePaused},
		text:  `site [^ ]+ paused until resumed \(PauseSite\)`,
		check: func(t *testing.T, err error) { var pe *SitePausedError; require.ErrorAs(t, err, &pe) },
	}, {
		name:    "a paused site, the request's deadline first",
		timeout: 600 * time.Millisecond,
		prepare: func(t *testing.T) setup {
			site := testbed.NewSite(t, "paused-deadline", nil)
			s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: time.Minute}))
			_, err := s.Add(context.Background(), testbed.NewProxies(t, 1)[0].URL())
			require.NoError(t, err)
			_, err = s.PauseSite(context.Background(), site.Host(), 30*time.Second)
			require.NoError(t, err)
			return setup{s, site}
		},
		is:    []error{ErrNoProxy, ErrSitePaused},
		text:  `paused \(circuit breaker or PauseSite\) until 2`,
		check: func(t *testing.T, err error) { var pe *SitePausedError; require.ErrorAs(t, err, &pe) },
	}, {
		name: "an empty pool",
		prepare: func(t *testing.T) setup {
			return setup{newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: 200 * time.Millisecond})), testbed.NewSite(t, "empty", nil)}
		},
		is:   []error{ErrNoProxy, ErrEmptyPool},
		text: `pool is empty`,
	}, {
		name: "a dead Redis",
		prepare: func(t *testing.T) setup {
			srv := redistest.Start(t)
			s := newSwitch(t, srv.Client(t), WithTimeouts(Timeouts{MaxWait: 200 * time.Millisecond, Redis: 300 * time.Millisecond}))
			_, err := s.Add(context.Background(), testbed.NewProxies(t, 1)[0].URL())
			require.NoError(t, err)
			require.NoError(t, srv.Kill())
			return setup{s, testbed.NewSite(t, "no-redis", nil)}
		},
		is:   []error{ErrNoProxy, ErrRedis},
		text: `no proxy available: proxyswitch: redis error`,
	}}
	for _, tc := range cases {
		for _, task := range []string{"", "shopper"} {
			name := tc.name
			if task != "" {
				name += ", session"
			}
			t.Run(name, func(t *testing.T) {
				st := tc.prepare(t)
				c := colly.NewCollector(colly.AllowURLRevisit())
				c.SetRequestTimeout(cmp.Or(tc.timeout, 5*time.Second))
				st.s.Attach(c)
				var inError error
				c.OnError(func(_ *colly.Response, err error) { inError = err })
				var ctx *colly.Context
				if task != "" {
					ctx = NewTaskContext(task)
				}
				err := c.Request("GET", st.site.URL()+"/p/1", nil, ctx, nil)
				require.Error(t, err)
				for _, got := range []error{err, inError} {
					for _, want := range tc.is {
						assert.ErrorIs(t, got, want, "%v", got)
					}
					assert.Regexp(t, tc.text, got.Error())
					assert.NotContains(t, got.Error(), "\n", "one line, for one log line")
					if tc.check != nil {
						tc.check(t, got)
					}
				}
				t.Logf("%v", err)
				assert.Zero(t, st.site.Recorder().DirectHits(), "no request left without a proxy")
			})
		}
	}
}
