package main

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCLIPauseResume: pause holds a site's leases on every worker (here a
// Switch of its own), stats lists it, resume frees it; bad input is a
// usage error.
func TestCLIPauseResume(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t, "--requirepass", redisSecret)
	env := map[string]string{EnvRedisURL: "redis://:" + redisSecret + "@" + srv.Addr() + "/0"}
	tr := &transcript{t: t, env: env}
	r := tr.run("add", "http://127.0.0.2:3128")
	require.Equal(t, 0, r.code, r.all())
	sw, err := proxyswitch.NewSwitch(srv.Client(t), proxyswitch.WithTimeouts(proxyswitch.Timeouts{MaxWait: proxyswitch.Off}))
	require.NoError(t, err)

	r = tr.run("pause", "ozon.example", "10m")
	require.Equal(t, 0, r.code, r.all())
	assert.Regexp(t, `^paused ozon\.example until \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\n$`, r.stdout)
	_, err = sw.Lease(ctx, "ozon.example")
	assert.ErrorIs(t, err, proxyswitch.ErrSitePaused)
	r = tr.run("pause", "avito.example")
	require.Equal(t, 0, r.code, r.all())
	assert.Equal(t, "paused avito.example until resumed\n", r.stdout)
	assert.Contains(t, r.stderr, `warning: site "avito.example" was not leased`, "no worker leased there: perhaps misnamed")
	assert.NotContains(t, r.stderr, "lower case")

	// A site named in upper case is not the default site function's name:
	// the ban holds under that name, and the CLI says so. An empty one is
	// no site.
	r = tr.run("ban", "http://127.0.0.2:3128", "AVITO.example", "1m")
	require.Equal(t, 0, r.code, r.all())
	assert.Contains(t, r.stderr, "the default site function names sites in lower case")
	r = tr.run("ban", "http://127.0.0.2:3128", "", "1m")
	assert.Equal(t, 2, r.code, r.all())
	assert.Contains(t, r.stderr, "empty SITE")
	require.ErrorIs(t, sw.Ban(ctx, "http://127.0.0.2:3128", "", time.Minute), proxyswitch.ErrConfig)
	require.ErrorIs(t, sw.Unban(ctx, "http://127.0.0.2:3128", ""), proxyswitch.ErrConfig)

	r = tr.run("stats")
	require.Equal(t, 0, r.code, r.all())
	assert.Contains(t, r.stdout, "paused sites (circuit breaker):\n")
	assert.Regexp(t, `\n  avito\.example open until resumed \(paused by hand\)\n  ozon\.example open until \S+ \(pause 10m0s\)\n`, r.stdout)

	r = tr.run("resume", "ozon.example")
	require.Equal(t, 0, r.code, r.all())
	assert.Equal(t, "resumed ozon.example: its circuit breaker is closed\n", r.stdout)
	l, err := sw.Lease(ctx, "ozon.example")
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	paused, err := sw.PausedSites(ctx)
	require.NoError(t, err)
	require.Len(t, paused, 1)
	assert.Equal(t, "avito.example", paused[0].Site)
	assert.True(t, paused[0].Until.After(time.Now().Add(24*time.Hour)), "until resumed")

	for _, bad := range [][]string{{"pause"}, {"pause", "a.example", "-1s"}, {"pause", "a.example", "soon"},
		{"pause", "a b"}, {"resume"}, {"resume", "a.example", "b.example"}} {
		r = tr.run(bad...)
		assert.Equal(t, 2, r.code, "%v: %s", bad, r.all())
	}
}

// TestStatusPagePausedSites: the status page lists each pool's paused
// sites with their state, the end of the pause and the probes.
func TestStatusPagePausedSites(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	sw, err := proxyswitch.NewSwitch(srv.Client(t))
	require.NoError(t, err)
	_, err = sw.Add(ctx, "http://127.0.0.2:3128")
	require.NoError(t, err)
	page := newStatusPage([]*proxyswitch.Switch{sw}, DefaultScrapeTimeout, quietLogger)
	code, doc, body, _ := renderStatus(t, page)
	require.Equal(t, http.StatusOK, code, body)
	assert.Zero(t, doc.Find("table.paused").Length(), "no paused site: no section")

	_, err = sw.PauseSite(ctx, "ozon.example", time.Hour)
	require.NoError(t, err)
	_, err = sw.PauseSite(ctx, "avito.example", 10*time.Millisecond)
	require.NoError(t, err)
	time.Sleep(20 * time.Millisecond)
	code, doc, body, _ = renderStatus(t, page)
	require.Equal(t, http.StatusOK, code, body)
	rows := doc.Find(`section[data-pool="default"] table.paused tbody tr`)
	require.Equal(t, 2, rows.Length(), body)
	ozon := doc.Find(`table.paused tr[data-site="ozon.example"]`)
	assert.Equal(t, proxyswitch.BreakerOpen, ozon.Find("td.state").Text())
	left, err := time.ParseDuration(ozon.Find("td.left").Text())
	require.NoError(t, err)
	assert.InDelta(t, time.Hour.Seconds(), left.Seconds(), 10)
	assert.Equal(t, "1h0m0s", ozon.Find("td.pause").Text())
	avito := doc.Find(`table.paused tr[data-site="avito.example"]`)
	assert.Equal(t, proxyswitch.BreakerHalfOpen, avito.Find("td.state").Text())
	assert.Equal(t, "0s", avito.Find("td.left").Text())
	assert.Zero(t, doc.Find(".error").Length(), body)
}
