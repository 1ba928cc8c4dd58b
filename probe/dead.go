package probe

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/proxyswitch/proxyswitch"
)

// CheckDead probes every dead proxy of sw's pool (Switch.Dead: those dead of
// their failures, see proxyswitch.Bans.DeadAfter, and those drained or marked),
// one after the other, and revives (Switch.Revive) those for which fn returns
// nil. It returns the revived proxies. It starts no goroutine: call it from
// yours, on a ticker; any number of workers may run it at once (a revive is
// idempotent). URL makes an fn. A Checker is the fuller tool: it probes live
// proxies too, under leases, and revives only what it marked.
func CheckDead(ctx context.Context, sw *proxyswitch.Switch, fn func(context.Context, *proxyswitch.Proxy) error) ([]*proxyswitch.Proxy, error) {
	if sw == nil || fn == nil {
		return nil, fmt.Errorf("%w: probe.CheckDead needs a Switch and a probe function", proxyswitch.ErrConfig)
	}
	dead, err := sw.Dead(ctx)
	if err != nil {
		return nil, err
	}
	var alive []*proxyswitch.Proxy
	for _, d := range dead {
		if ctx.Err() != nil {
			break
		}
		if fn(ctx, d.Proxy) == nil {
			alive = append(alive, d.Proxy)
		}
	}
	if len(alive) == 0 {
		return nil, ctx.Err()
	}
	ids := make([]string, len(alive))
	for i, p := range alive {
		ids[i] = p.ID()
	}
	if _, err := sw.Revive(ctx, "", ids...); err != nil {
		return nil, err
	}
	return alive, nil
}

// URL returns a probe function for CheckDead: a GET of target through the
// proxy, within the context's deadline (10s at most), that passes when an
// HTTP answer comes back from the site, whatever its status, other than the
// proxy's own 407, 502 or 504. Its errors never show the proxy's password.
// The function is safe for concurrent use.
func URL(target string) func(context.Context, *proxyswitch.Proxy) error {
	return func(ctx context.Context, p *proxyswitch.Proxy) error {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		tr := &http.Transport{Proxy: http.ProxyURL(p.URL()), DisableKeepAlives: true}
		defer tr.CloseIdleConnections()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
		if err != nil {
			return fmt.Errorf("probe: %w", err)
		}
		resp, err := tr.RoundTrip(req)
		if err != nil {
			return redactErr(err, p)
		}
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusProxyAuthRequired, http.StatusBadGateway, http.StatusGatewayTimeout:
			return errors.New("probe: proxy " + p.String() + " answered " + resp.Status)
		}
		return nil
	}
}
