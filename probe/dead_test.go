package probe_test

import (
	"context"
	"testing"

	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/probe"
	"github.com/proxyswitch/proxyswitch/proxyswitchtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCheckDead: CheckDead revives a dead proxy only once its probe passes,
// leaves the others dead, and URL fails on a proxy's own errors (502)
// without showing its password.
func TestCheckDead(t *testing.T) {
	ctx := context.Background()
	farm := proxyswitchtest.NewFarm(t, 3)
	farm.Proxies[2].SetCredentials("user", canary)
	sw := newSwitch(t, testPrefix())
	_, err := sw.Add(ctx, farm.URLs()...)
	require.NoError(t, err)
	ec := newEcho(t, 0)
	fn := probe.URL(ec.site.URL() + "/ip")

	for _, i := range []int{0, 1} {
		_, err := sw.Drain(ctx, "test", farm.Proxies[i].URL())
		require.NoError(t, err)
	}
	farm.Proxies[0].SetMode(proxyswitchtest.ProxyDead)
	farm.Proxies[1].SetMode(proxyswitchtest.ProxyDead)
	revived, err := probe.CheckDead(ctx, sw, fn)
	require.NoError(t, err)
	assert.Empty(t, revived, "still refusing connections: still dead")

	farm.Proxies[0].SetMode(proxyswitchtest.ProxyOK)
	revived, err = probe.CheckDead(ctx, sw, fn)
	require.NoError(t, err)
	require.Len(t, revived, 1)
	assert.Equal(t, idOf(t, farm.Proxies[0].URL()), revived[0].ID())
	dead, err := sw.Dead(ctx)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	assert.Equal(t, idOf(t, farm.Proxies[1].URL()), dead[0].Proxy.ID())

	p502, err := proxyswitch.ParseProxy(farm.Proxies[2].URL())
	require.NoError(t, err)
	farm.Proxies[2].SetMode(proxyswitchtest.Proxy502)
	err = fn(ctx, p502)
	require.ErrorContains(t, err, "502")
	assert.NotContains(t, err.Error(), canary)

	_, err = probe.CheckDead(ctx, sw, nil)
	assert.ErrorIs(t, err, proxyswitch.ErrConfig)
}
