package proxyswitch

import (
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A request given up on (here: timed out) may still be under way at the
// site; its proxy stays out for abandonHold, so the next request from that
// IP does not arrive while the site still serves the old one.
func TestAbandonedRequestHoldsItsProxy(t *testing.T) {
	bed, s := bedSwitch(t, 1, 1)
	c := colly.NewCollector(colly.AllowURLRevisit())
	s.Attach(c)
	c.SetRequestTimeout(300 * time.Millisecond)
	start := time.Now()
	require.Error(t, c.Visit(bed.Sites[0].URL()+"/slow?d=1s"))
	c.SetRequestTimeout(10 * time.Second)
	require.NoError(t, c.Visit(bed.Sites[0].URL()+"/p/1"))
	assert.GreaterOrEqual(t, time.Since(start), abandonHold, "the proxy was held after the abandoned request")
	assertGroundTruth(t, bed)
	assertNoLeases(t, s, bed.Sites...)
}
