package metrics

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/probe"
	"github.com/proxyswitch/proxyswitch/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const dashboardFile = "../dashboards/proxyswitch.json"

var (
	metricNameRE = regexp.MustCompile(`proxyswitch_[a-z0-9_]+`)
	selectorRE   = regexp.MustCompile(`(proxyswitch_[a-z0-9_]+)\{([^}]*)\}`)
	matcherRE    = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
)

// everything returns a scrape in which every metric of both collectors
// has at least one series: a Collector fed every kind of event, and a
// StateCollector on a pool with a leased site, a drained proxy and a live
// member.
func everything(t *testing.T) families {
	t.Helper()
	ctx := context.Background()
	prefix := nextPrefix()
	sw := switchOn(t, shared.Client(t), prefix)
	_, err := sw.Add(ctx, "http://127.0.0.1:3128", "http://127.0.0.2:3128")
	require.NoError(t, err)
	l, err := sw.Lease(ctx, "ozon.example")
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	require.NoError(t, func() error { _, err := sw.Drain(ctx, "", "http://127.0.0.2:3128"); return err }())
	startMember(t, sw, prefix, "w1", shard.MemberConfig{})

	c, _ := testCollector(WithTopProxies(5))
	c.ObserveMembers([]string{"w1"})
	c.ObserveAttempt(attempt("ozon.example", "p1", ban.Ban, "http_403", time.Second))
	c.ObserveQuarantine(proxyswitch.QuarantineEvent{Site: "ozon.example", ProxyID: "p1", Kind: ban.Ban, Reason: "http_403", Duration: time.Hour})
	c.ObserveQuarantine(proxyswitch.QuarantineEvent{Site: "ozon.example", ProxyID: "p2", Kind: ban.ProxyFailure, Reason: "proxy_connect", Dead: true})
	c.ObserveMembers([]string{"w1", "w2"})
	c.ObserveAttempt(attempt("ozon.example", "p1", ban.OK, "", time.Second))
	c.ObserveSession(proxyswitch.SessionEvent{Site: "ozon.example", ProxyID: "p1"})
	c.ObserveEvidence(proxyswitch.EvidenceEvent{Site: "ozon.example", ProxyID: "p1", What: "confirmed"})
	c.ObserveProbe(probe.Event{Site: "echo.example", ProxyID: "p1", Echo: true, OK: true, Latency: time.Second, ExitIP: "10.0.0.1", ExitChanged: true})
	_, err = sw.PauseSite(ctx, "avito.example", time.Hour)
	require.NoError(t, err)
	c.ObserveSession(proxyswitch.SessionEvent{Site: "ozon.example", ProxyID: "p1", Ended: true, Reason: "http_403", Requests: 7, Age: time.Minute})
	q := newQueueStorage(t, shared.Client(t), 1)
	f, _ := scrape(t, c, NewState(sw), NewQueue(q))
	return f
}

// TestDashboard parses the Grafana dashboard and checks that every metric
// its queries name is one the collectors export (histograms through their
// _bucket, _sum and _count series), with the labels the queries select on,
// and that every exported metric is on the dashboard.
func TestDashboard(t *testing.T) {
	raw, err := os.ReadFile(dashboardFile)
	require.NoError(t, err)
	var dash map[string]any
	require.NoError(t, json.Unmarshal(raw, &dash), "the dashboard is not valid JSON")
	assert.Equal(t, "proxyswitch", dash["uid"])

	// Panels: unique IDs, each one with queries on the chosen data source,
	// laid out on Grafana's 24-column grid.
	ids := map[float64]bool{}
	panels, _ := dash["panels"].([]any)
	require.NotEmpty(t, panels)
	for _, p := range panels {
		panel := p.(map[string]any)
		id := panel["id"].(float64)
		assert.False(t, ids[id], "panel id %v twice", id)
		ids[id] = true
		pos := panel["gridPos"].(map[string]any)
		assert.LessOrEqual(t, pos["x"].(float64)+pos["w"].(float64), 24.0, "panel %q", panel["title"])
		if panel["type"] == "row" {
			continue
		}
		targets, _ := panel["targets"].([]any)
		assert.NotEmpty(t, targets, "panel %q has no query", panel["title"])
		assert.Equal(t, "${datasource}", panel["datasource"].(map[string]any)["uid"], "panel %q", panel["title"])
		for _, tg := range targets {
			assert.NotEmpty(t, tg.(map[string]any)["expr"], "panel %q", panel["title"])
		}
	}

	var queries []string
	collectQueries(dash, &queries)
	require.Greater(t, len(queries), 30)
	f := everything(t)
	used := map[string]bool{}
	for _, q := range queries {
		assert.True(t, balanced(q), "unbalanced brackets or quotes in %q", q)
		for _, name := range metricNameRE.FindAllString(q, -1) {
			fam := family(f, name)
			if !assert.NotNil(t, fam, "query %q names %s, which no collector exports", q, name) {
				continue
			}
			used[fam.GetName()] = true
		}
		for _, sel := range selectorRE.FindAllStringSubmatch(q, -1) {
			fam := family(f, sel[1])
			if fam == nil {
				continue
			}
			have := map[string]bool{}
			for _, m := range fam.GetMetric() {
				for k := range labelMap(m) {
					have[k] = true
				}
			}
			for _, mt := range matcherRE.FindAllStringSubmatch(sel[2], -1) {
				assert.True(t, have[mt[1]], "query %q selects %s on label %q, which it does not have", q, sel[1], mt[1])
			}
		}
	}
	var missing []string
	for name := range f {
		if strings.HasPrefix(name, "proxyswitch_") && !used[name] {
			missing = append(missing, name)
		}
	}
	slices.Sort(missing)
	assert.Empty(t, missing, "exported but not on the dashboard")
	assert.Len(t, used, 36)
}

// balanced reports whether the brackets of a query pair up outside its
// string literals and every literal is closed: a cheap syntax check.
func balanced(q string) bool {
	var stack []rune
	pair := map[rune]rune{')': '(', '}': '{', ']': '['}
	inString := false
	for _, r := range q {
		switch {
		case r == '"':
			inString = !inString
		case inString:
		case r == '(' || r == '{' || r == '[':
			stack = append(stack, r)
		case pair[r] != 0:
			if len(stack) == 0 || stack[len(stack)-1] != pair[r] {
				return false
			}
			stack = stack[:len(stack)-1]
		}
	}
	return !inString && len(stack) == 0
}

// family finds the metric family a series name in PromQL belongs to.
func family(f families, name string) *dto.MetricFamily {
	if fam := f[name]; fam != nil {
		return fam
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			if fam := f[base]; fam != nil && fam.GetType() == dto.MetricType_HISTOGRAM {
				return fam
			}
		}
	}
	return nil
}

// collectQueries gathers every PromQL string of the dashboard: panel
// targets, annotations and template variables.
func collectQueries(v any, out *[]string) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(string); ok && (k == "expr" || k == "query" || k == "definition") && strings.Contains(s, "proxyswitch_") {
				*out = append(*out, s)
			}
			collectQueries(x, out)
		}
	case []any:
		for _, x := range v {
			collectQueries(x, out)
		}
	}
}
