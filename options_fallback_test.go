package proxyswitch

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestConfigFallbackOff: Timeouts.Fallback has no "off"; zero and Off both
// give its default, as its doc says.
func TestConfigFallbackOff(t *testing.T) {
	for _, v := range []time.Duration{0, Off} {
		cfg, err := newConfig([]Option{WithFallback("a", nil), WithTimeouts(Timeouts{Fallback: 3 * time.Second}), WithTimeouts(Timeouts{Fallback: v})})
		require.NoError(t, err)
		want := 3 * time.Second // zero keeps the earlier value
		if v == Off {
			want = defaultFallbackTimeout
		}
		assert.Equal(t, want, cfg.fallback.timeout, "Fallback %v", v)
	}
	assert.Equal(t, time.Second, defaultFallbackTimeout, "the default Timeouts.Fallback documents")
}
