package metrics

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestStateCollectorPausedSites: the sites whose circuit breaker is open
// or half-open, per state and per site; none once resumed.
func TestStateCollectorPausedSites(t *testing.T) {
	ctx := context.Background()
	sw := newSwitch(t)
	_, err := sw.Add(ctx, "http://127.0.0.2:3128")
	require.NoError(t, err)
	state := NewState(sw)
	f, _ := scrape(t, state)
	f.expect(t, want{"proxyswitch_sites_paused", []string{"state=open"}, 0}, want{"proxyswitch_sites_paused", []string{"state=half-open"}, 0})

	_, err = sw.PauseSite(ctx, "ozon.example", time.Hour)
	require.NoError(t, err)
	_, err = sw.PauseSite(ctx, "avito.example", 10*time.Millisecond)
	require.NoError(t, err)
	time.Sleep(20 * time.Millisecond) // avito's pause ends: half-open
	f, _ = scrape(t, state)
	f.expect(t,
		want{"proxyswitch_sites_paused", []string{"pool=default", "state=open"}, 1},
		want{"proxyswitch_sites_paused", []string{"state=half-open"}, 1},
		want{"proxyswitch_site_breaker", []string{"site=ozon.example", "state=open"}, 1},
		want{"proxyswitch_site_breaker", []string{"site=avito.example", "state=half-open"}, 1},
		want{"proxyswitch_state_up", nil, 1})

	require.NoError(t, sw.ResumeSite(ctx, "ozon.example"))
	require.NoError(t, sw.ResumeSite(ctx, "avito.example"))
	f, _ = scrape(t, state)
	f.expect(t, want{"proxyswitch_sites_paused", []string{"state=open"}, 0})
	_, ok := f.value("proxyswitch_site_breaker")
	assert.False(t, ok, "no series for closed sites")
}
