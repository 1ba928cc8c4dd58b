package probe_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"testing"

	"github.com/proxyswitch/proxyswitch/probe"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestProbeErrorsHideUserName: a probe transport's error that names the
// proxy's user name (an account, a token) reaches neither the Result nor
// the log line of the proxy's death.
func TestProbeErrorsHideUserName(t *testing.T) {
	e := newEcho(t, 0)
	ctx := context.Background()
	sw := newSwitch(t, testPrefix())
	_, err := sw.Add(ctx, "http://Canary7U-acct:Canary7P@127.0.0.1:9")
	require.NoError(t, err)
	var logs bytes.Buffer
	c := &probe.Checker{Switch: sw, EchoURL: e.site.URL(),
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Transport: func(u *url.URL) http.RoundTripper {
			return roundTripper(func(*http.Request) (*http.Response, error) {
				return nil, fmt.Errorf("proxy %v refused the credentials of user %s", u, u.User.Username())
			})
		}}
	rep, err := c.Check(ctx)
	require.NoError(t, err)
	require.Len(t, rep.Results, 1)
	require.Error(t, rep.Results[0].Err)
	all := rep.Results[0].Err.Error() + "\n" + logs.String()
	assert.NotContains(t, all, "Canary7U")
	assert.NotContains(t, all, "Canary7P")
	assert.Contains(t, rep.Results[0].Err.Error(), "127.0.0.1:9")
}
