package metrics

import (
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch/probe"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCollectorCountsProbes: probes by site, kind and result, their
// duration by kind, and the exit IP changes.
func TestCollectorCountsProbes(t *testing.T) {
	c, _ := testCollector()
	ev := probe.Event{Pool: "main", Site: "echo.example", ProxyID: "p1", Echo: true, OK: true, Latency: 200 * time.Millisecond, ExitIP: "10.0.0.1"}
	c.ObserveProbe(ev)
	ev.ExitChanged = true
	c.ObserveProbe(ev)
	c.ObserveProbe(probe.Event{Pool: "main", Site: "echo.example", ProxyID: "p2", Echo: true, Latency: time.Second})
	c.ObserveProbe(probe.Event{Pool: "main", Site: "ozon.example", ProxyID: "p1", OK: true, Latency: -time.Second})
	f, _ := scrape(t, c)
	f.expect(t, []want{
		{"proxyswitch_probes_total", []string{"site=echo.example", "kind=echo", "result=ok"}, 2},
		{"proxyswitch_probes_total", []string{"site=echo.example", "kind=echo", "result=fail"}, 1},
		{"proxyswitch_probes_total", []string{"site=ozon.example", "kind=site", "result=ok"}, 1},
		{"proxyswitch_exit_changes_total", []string{"pool=main", "server=w1"}, 1},
	}...)
	n, sum, ok := f.histogram("proxyswitch_probe_duration_seconds", "kind=echo")
	require.True(t, ok)
	assert.EqualValues(t, 3, n)
	assert.InDelta(t, 0.2+0.2+1, sum, 1e-9)
	n, sum, ok = f.histogram("proxyswitch_probe_duration_seconds", "kind=site")
	require.True(t, ok)
	assert.EqualValues(t, 1, n)
	assert.Zero(t, sum, "a negative latency is observed as 0")
}
