package metrics

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/proxyswitch/proxyswitch/shard"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Canary secrets: the shared Redis requires redisSecret and test proxies
// require proxyUser-N and proxySecret. None may appear in a scrape, a log line or an
// error.
const (
	redisSecret = "Canary-redis-secret-m7"
	proxySecret = "Canary-proxy-secret-m7"
	proxyUser   = "Canary-proxy-user-m7" // gateway users carry account and session
)

// shared is one redis-server (with a password) for the tests that need no
// fault injection; each test works under a key prefix of its own.
var shared *redistest.Server

func TestMain(m *testing.M) {
	var err error
	shared, err = redistest.StartProcess("--requirepass", redisSecret)
	if err != nil {
		fmt.Fprintln(os.Stderr, "metrics tests:", err)
		os.Exit(2)
	}
	code := m.Run()
	_ = shared.Close()
	os.Exit(code)
}

var prefixSeq atomic.Int64

// nextPrefix returns a key prefix no other test uses.
func nextPrefix() string { return fmt.Sprintf("m%d", prefixSeq.Add(1)) }

// newSwitch builds a Switch on the shared server under a fresh prefix.
func newSwitch(t testing.TB, opts ...proxyswitch.Option) *proxyswitch.Switch {
	t.Helper()
	return switchOn(t, shared.Client(t), nextPrefix(), opts...)
}

// startMember registers server self in the pool of sw (under prefix, the
// one sw was built with) on the shared server, with cfg's other settings,
// until the test ends.
func startMember(t testing.TB, sw *proxyswitch.Switch, prefix, self string, cfg shard.MemberConfig) {
	t.Helper()
	cfg.Prefix, cfg.Pool, cfg.Self = prefix, sw.Pool(), self
	m, err := shard.NewMembership(shared.Client(t), cfg)
	require.NoError(t, err)
	require.NoError(t, m.Start(context.Background()))
	t.Cleanup(func() { _ = m.Stop(context.Background()) })
}

func switchOn(t testing.TB, rdb redis.Scripter, prefix string, opts ...proxyswitch.Option) *proxyswitch.Switch {
	t.Helper()
	sw, err := proxyswitch.NewSwitch(rdb, append([]proxyswitch.Option{proxyswitch.WithPrefix(prefix)}, opts...)...)
	require.NoError(t, err)
	return sw
}

// scrape serves the collectors on /metrics, as an exporter would, fetches
// the page and parses it with the Prometheus text-format parser. It also
// returns the raw page.
func scrape(t testing.TB, cs ...prometheus.Collector) (families, string) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	for _, c := range cs {
		require.NoError(t, reg.Register(c))
	}
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
	defer srv.Close()
	req, err := http.NewRequest(http.MethodGet, srv.URL+"/metrics", nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	return parse(t, string(body)), string(body)
}

// families is a parsed scrape.
type families map[string]*dto.MetricFamily

func parse(t testing.TB, page string) families {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(page))
	require.NoError(t, err, page)
	return fams
}

// find returns the series of name whose labels include want.
func (f families) find(name string, want map[string]string) []*dto.Metric {
	fam := f[name]
	if fam == nil {
		return nil
	}
	var out []*dto.Metric
outer:
	for _, m := range fam.GetMetric() {
		have := labelMap(m)
		for k, v := range want {
			if have[k] != v {
				continue outer
			}
		}
		out = append(out, m)
	}
	return out
}

// value is the value of the one counter, gauge or untyped series of name
// with labels want (labels as "k=v" pairs); ok is false if there is none.
func (f families) value(name string, kv ...string) (float64, bool) {
	ms := f.find(name, pairs(kv))
	if len(ms) != 1 {
		return 0, false
	}
	m := ms[0]
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue(), true
	case m.Gauge != nil:
		return m.Gauge.GetValue(), true
	case m.Untyped != nil:
		return m.Untyped.GetValue(), true
	}
	return 0, false
}

// want is one expected series value: name{kv...} = val.
type want struct {
	name string
	kv   []string
	val  float64
}

// expect checks the scrape holds each series with its value (to 1e-9).
func (f families) expect(t *testing.T, wants ...want) {
	t.Helper()
	for _, w := range wants {
		v, ok := f.value(w.name, w.kv...)
		if assert.True(t, ok, "%s%v missing", w.name, w.kv) {
			assert.InDelta(t, w.val, v, 1e-9, "%s%v", w.name, w.kv)
		}
	}
}

// sum adds up every counter or gauge series of name matching the labels.
func (f families) sum(name string, kv ...string) float64 {
	total := 0.0
	for _, m := range f.find(name, pairs(kv)) {
		total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return total
}

// histogram returns the count and sum of the one histogram series of name
// with labels kv.
func (f families) histogram(name string, kv ...string) (count uint64, sum float64, ok bool) {
	ms := f.find(name, pairs(kv))
	if len(ms) != 1 || ms[0].Histogram == nil {
		return 0, 0, false
	}
	return ms[0].Histogram.GetSampleCount(), ms[0].Histogram.GetSampleSum(), true
}

// labelValues lists the values label takes among the series of name.
func (f families) labelValues(name, label string) []string {
	var out []string
	for _, m := range f.find(name, nil) {
		if v, ok := labelMap(m)[label]; ok {
			out = append(out, v)
		}
	}
	sort.Strings(out)
	return out
}

func labelMap(m *dto.Metric) map[string]string {
	out := make(map[string]string, len(m.GetLabel()))
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

func pairs(kv []string) map[string]string {
	out := make(map[string]string, len(kv))
	for _, p := range kv {
		k, v, _ := strings.Cut(p, "=")
		out[k] = v
	}
	return out
}
