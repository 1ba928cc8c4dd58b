package proxyswitch

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBadProxyValues: a nil entry or a zero Proxy (not made by ParseProxy)
// given to ReplaceProxies fails with ErrInvalidProxy and changes nothing
// (it used to panic); a zero Proxy's URL is nil, not a panic.
func TestBadProxyValues(t *testing.T) {
	ctx := context.Background()
	s := newSwitch(t, shared.Client(t))
	_, err := s.Add(ctx, "http://127.0.0.1:10001")
	require.NoError(t, err)
	ok, err := ParseProxy("http://127.0.0.1:10002")
	require.NoError(t, err)
	for _, ps := range [][]*Proxy{{nil}, {ok, {}}, {ok, nil}} {
		_, err := s.ReplaceProxies(ctx, ps)
		require.ErrorIs(t, err, ErrInvalidProxy)
	}
	_, err = s.diff(ctx, []*Proxy{ok, nil})
	require.ErrorIs(t, err, ErrInvalidProxy)
	list, err := s.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, "http://127.0.0.1:10001", list[0].String())
	assert.Nil(t, (&Proxy{}).URL())
	assert.Nil(t, (*Proxy)(nil).URL())
}

// TestSizeDropNaN: WithSizeDrop(NaN) is refused as any ratio outside
// [0, 1) is (it used to pass and switch the size check off).
func TestSizeDropNaN(t *testing.T) {
	for _, r := range []float64{math.NaN(), -0.1, 1, math.Inf(1)} {
		_, err := NewSwitch(shared.Client(t), WithPrefix(testPrefix()), WithSizeDrop(r))
		assert.ErrorIs(t, err, ErrConfig, "WithSizeDrop(%v)", r)
	}
}

// TestMalformedUserInfoHint: a character url.Parse refuses in the user info
// ('{' here) is named in the error's hint, and the password is not shown.
func TestMalformedUserInfoHint(t *testing.T) {
	_, err := ParseProxy("http://u:" + canary + "{w@127.0.0.1:1")
	require.ErrorIs(t, err, ErrInvalidProxy)
	assert.Contains(t, err.Error(), "'{'")
	assert.NotContains(t, err.Error(), canary)
}

// TestZeroLease: a nil or zero Lease fails its methods with ErrConfig
// instead of panicking.
func TestZeroLease(t *testing.T) {
	ctx := context.Background()
	for _, l := range []*Lease{nil, {}} {
		require.ErrorIs(t, l.Release(ctx), ErrConfig)
		require.ErrorIs(t, l.Extend(ctx, time.Second), ErrConfig)
		require.ErrorIs(t, l.Report(ctx, ban.Verdict{Kind: ban.Ban, Reason: ban.ReasonSizeDrop}), ErrConfig)
	}
}
