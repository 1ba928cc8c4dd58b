package proxyswitch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// localShard returns the local shard of s's own pool (WithFallback).
func localShard(t *testing.T, s *Switch) *localPool {
	t.Helper()
	fp, ok := s.own.(*fbPool)
	require.True(t, ok, "a Switch with a fallback")
	fp.mu.Lock()
	defer fp.mu.Unlock()
	require.NotNil(t, fp.local)
	return fp.local
}

// TestLocalShardEvidence: while Redis is down, the local shard weighs
// refusals as Redis does. A marketplace refuses every 5th page to everyone
// and answers one burnt proxy 403 on every page; 20 pages are crawled
// through Attach from the local shard. Every other page is served, each
// refused page fails with ErrPageRefused naming its 403, the first strikes
// the refused pages cost are lifted (only the burnt proxy stays
// quarantined, confirmed into the base quarantine), and a site the
// breaker had paused before Redis went stays paused (ErrSitePaused).
// Before, every refusal quarantined its proxy for the base 30 minutes and
// the refused pages burnt the shard.
func TestLocalShardEvidence(t *testing.T) {
	ctx := context.Background()
	h := &testbed.RefusedPages{Next: testbed.DefaultHandler(), Every: 5}
	market := testbed.NewMarketplace(h)
	site := testbed.NewSite(t, "refusing", market)
	paused := testbed.NewSite(t, "paused", nil)
	proxies := testbed.NewProxies(t, 4)
	urls := make([]string, len(proxies))
	for i, p := range proxies {
		urls[i] = p.URL()
	}
	burnt, err := ParseProxy(proxies[0].URL())
	require.NoError(t, err)
	market.Burn(proxies[0].SourceIP().String(), testbed.Forbid)

	srv := redistest.Start(t)
	s := newSwitch(t, srv.Client(t), append(fastFallback("crawler-1"), WithBreaker(Breaker{Disabled: true}),
		WithBans(Bans{EvidenceFirst: time.Minute, PageProxies: 2, Quarantine: 30 * time.Minute, QuarantineMax: time.Hour}))...)
	obs := &recordingObserver{}
	s.SetObserver(obs)
	_, err = s.Add(ctx, urls...)
	require.NoError(t, err)
	startSwitch(t, s)
	_, err = s.PauseSite(ctx, paused.Host(), time.Hour) // known to this Switch before Redis goes
	require.NoError(t, err)

	require.NoError(t, srv.Kill())
	_, _ = s.Lease(ctx, "warm.example") // finds Redis gone
	waitMode(t, s, modeLocal, 5*time.Second)
	time.Sleep(700 * time.Millisecond) // the switch-over hold

	c := colly.NewCollector(colly.AllowURLRevisit())
	c.SetRequestTimeout(10 * time.Second)
	s.Attach(c)
	var mu sync.Mutex
	failed := map[string]error{}
	c.OnError(func(r *colly.Response, err error) {
		mu.Lock()
		defer mu.Unlock()
		failed[r.Request.URL.Path] = err
	})
	const pages = 20
	for i := range pages {
		_ = c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), i+1))
	}
	require.Equal(t, modeLocal.String(), s.FallbackStatus().Mode, "the crawl ran on the local shard")
	for i := range pages {
		path := fmt.Sprintf("/p/%d", i+1)
		err := failed[path]
		if !h.Refused(path) {
			assert.NoError(t, err, path)
			continue
		}
		var be *BlockedError
		if assert.ErrorIs(t, err, ErrPageRefused, path) && assert.ErrorAs(t, err, &be) {
			assert.Equal(t, http.StatusForbidden, be.Status)
		}
	}
	ev := obs.evidenceOf()
	t.Logf("evidence: %v", ev)
	assert.Equal(t, pages/5, ev["page_refused"])
	assert.GreaterOrEqual(t, ev["lifted"], pages/5)

	lp := localShard(t, s)
	for _, b := range lp.Bans() {
		assert.Equal(t, burnt.ID(), b.ProxyID, "only the burnt proxy stays quarantined (its strike confirmed or repeated): %+v", b)
		assert.Greater(t, time.Until(b.Until), 20*time.Minute, "the base quarantine")
	}

	_, err = s.Lease(ctx, paused.Host())
	var pe *SitePausedError
	require.ErrorAs(t, err, &pe, "the pause the breaker last reported holds on the local shard: %v", err)
	assert.ErrorIs(t, err, ErrNoProxy)
	assert.Zero(t, paused.Recorder().Count())
	assert.True(t, errors.Is(err, ErrSitePaused))
}
