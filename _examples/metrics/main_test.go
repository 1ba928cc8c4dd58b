package main

// The deployment this example shows, checked: every worker's /metrics and
// the cluster state's answer with the metric families the dashboard reads,
// and the sums over the workers are what the marketplaces saw. ./... skips
// _examples: .ci/run names this package (go test ./_examples/metrics).

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/proxyswitch/proxyswitch/proxyswitchtest"
)

func TestEveryProcessExportsItsMetrics(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, backend := range []string{proxyswitchtest.RedisEmbedded, proxyswitchtest.RedisServer} {
		t.Run(backend, func(t *testing.T) {
			cfg := config{redis: backend, host: "127.0.0.1", port: 0, workers: 3, proxies: 30, burnt: 4}
			d, err := start(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			if err := d.crawl(ctx); err != nil {
				t.Fatal(err)
			}
			if len(d.endpoints) != 1+cfg.workers {
				t.Fatalf("%d endpoints, want the state's and one per worker", len(d.endpoints))
			}
			ms := d.stage.Market.Stats()
			if ms.Bans == 0 {
				t.Fatal("the marketplaces refused nothing: no ban to count (the burnt proxies should have been)")
			}
			var attempts, bans, ok float64
			for _, e := range d.endpoints {
				fams, err := scrape(e.addr)
				if err != nil {
					t.Fatal(err)
				}
				if e.name == "state" {
					expect(t, e.name, fams, map[string]dto.MetricType{
						"proxyswitch_pool_proxies": dto.MetricType_GAUGE, "proxyswitch_site_slots": dto.MetricType_GAUGE,
						"proxyswitch_sites":        dto.MetricType_GAUGE,
						"proxyswitch_pool_members": dto.MetricType_GAUGE, "proxyswitch_sessions_live": dto.MetricType_GAUGE,
						"proxyswitch_state_up": dto.MetricType_GAUGE,
					})
					for name, want := range map[string]float64{
						"proxyswitch_pool_proxies":  float64(cfg.proxies),
						"proxyswitch_state_up":      1,
						"proxyswitch_sites":         3,
						"proxyswitch_pool_members":  float64(cfg.workers),
						"proxyswitch_sessions_live": float64(2 * cfg.workers),
					} {
						if got := sum(fams, name, nil); got != want {
							t.Errorf("state: %s = %v, want %v", name, got, want)
						}
					}
					continue
				}
				expect(t, e.name, fams, map[string]dto.MetricType{
					"proxyswitch_attempts_total":           dto.MetricType_COUNTER,
					"proxyswitch_attempt_duration_seconds": dto.MetricType_HISTOGRAM,
					"proxyswitch_sessions_started_total":   dto.MetricType_COUNTER,
					"proxyswitch_members":                  dto.MetricType_GAUGE,
				}) // and proxyswitch_bans_total once the worker saw a ban: summed below
				for _, m := range fams["proxyswitch_attempts_total"].GetMetric() {
					if server := label(m, "server"); server != e.name {
						t.Errorf("%s exports server=%q", e.name, server)
					}
				}
				if got := sum(fams, "proxyswitch_sessions_started_total", nil); got != 2 {
					t.Errorf("%s: %v sessions started, want its two shoppers'", e.name, got)
				}
				if got := sum(fams, "proxyswitch_members", nil); got != float64(cfg.workers) {
					t.Errorf("%s sees %v members, want %d", e.name, got, cfg.workers)
				}
				attempts += sum(fams, "proxyswitch_attempts_total", nil)
				ok += sum(fams, "proxyswitch_attempts_total", map[string]string{"outcome": "ok"})
				bans += sum(fams, "proxyswitch_bans_total", nil)
			}
			// The sums the dashboard shows are the marketplaces' ground truth.
			if attempts != float64(ms.Requests) || bans != float64(ms.Bans) {
				t.Errorf("the workers count %v attempts and %v bans; the marketplaces saw %d requests and refused %d",
					attempts, bans, ms.Requests, ms.Bans)
			}
			if ok < float64(d.stage.Market.Products()) {
				t.Errorf("%v good attempts, fewer than the %d product pages", ok, d.stage.Market.Products())
			}
			if ms.Collisions != 0 || ms.Direct != 0 {
				t.Errorf("%d IP collisions, %d requests without a proxy", ms.Collisions, ms.Direct)
			}
			var out strings.Builder
			if err := d.summary(&out); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out.String(), fmt.Sprintf("workers  attempts %v, bans %v", attempts, bans)) {
				t.Errorf("summary:\n%s", out.String())
			}
		})
	}
}

// expect checks that fams has each family, of the given type.
func expect(t *testing.T, who string, fams map[string]*dto.MetricFamily, want map[string]dto.MetricType) {
	t.Helper()
	for name, typ := range want {
		f, ok := fams[name]
		if !ok {
			t.Errorf("%s: no %s", who, name)
			continue
		}
		if f.GetType() != typ {
			t.Errorf("%s: %s is a %v, want a %v", who, name, f.GetType(), typ)
		}
	}
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// TestPrometheusConfigScrapesTheDefaults: prometheus.yml's targets are the
// ports the example listens on by default.
func TestPrometheusConfigScrapesTheDefaults(t *testing.T) {
	b, err := os.ReadFile("prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{"'127.0.0.1:9465'", "'127.0.0.1:9466'", "'127.0.0.1:9467'", "'127.0.0.1:9468'"} {
		if !strings.Contains(string(b), target) {
			t.Errorf("prometheus.yml does not scrape %s", target)
		}
	}
}
