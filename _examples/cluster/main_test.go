package main

// The demo's core on a small cluster, so that CI catches a regression in
// what the README promises. ./... skips _examples: .ci/run names this
// package (go test ./_examples/cluster).

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch/proxyswitchtest"
	"github.com/redis/go-redis/v9"
)

func TestDemo(t *testing.T) {
	farm := proxyswitchtest.NewFarm(t, 30)
	s := setup{
		Servers: 2,
		Workers: 8,
		Market:  proxyswitchtest.MarketConfig{Categories: 2, PagesPerCategory: 3, ProductsPerPage: 10, Burnt: farm.SpreadIPs(3)},
		Retries: 2,
		Prefix:  "clusterdemo-test",
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		Proxies: farm.URLs(),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	without, err := runUncoordinated(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("without coordination: %+v", without)
	if without.Market.Direct != 0 {
		t.Errorf("without coordination: %d requests reached a marketplace without a proxy", without.Market.Direct)
	}

	for _, backend := range []string{proxyswitchtest.RedisEmbedded, proxyswitchtest.RedisServer} {
		t.Run(backend, func(t *testing.T) {
			rs, err := proxyswitchtest.StartRedis(backend)
			if err != nil {
				t.Fatal(err)
			}
			defer rs.Close()
			s := s
			s.Redis = func() redis.UniversalClient { return rs.Client() }
			with, err := runProxyswitch(ctx, s)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("with proxyswitch: %+v", with)
			m := with.Market
			if m.Collisions != 0 || m.MaxPerIP != 1 {
				t.Errorf("with proxyswitch: %d IP collisions, up to %d requests at once from one IP; want none and 1", m.Collisions, m.MaxPerIP)
			}
			if m.Direct != 0 {
				t.Errorf("with proxyswitch: %d requests reached a marketplace without a proxy", m.Direct)
			}
			if m.Bans >= without.Market.Bans {
				t.Errorf("bans: %d with proxyswitch, %d without; want fewer with", m.Bans, without.Market.Bans)
			}
			if m.Refused["429"] != 0 {
				t.Errorf("with proxyswitch: %d rate-limit answers despite the cooldown", m.Refused["429"])
			}
			if with.Scraped < with.Products*9/10 {
				t.Errorf("with proxyswitch: scraped %d of %d product pages", with.Scraped, with.Products)
			}
			if with.LeasesLeft != 0 {
				t.Errorf("with proxyswitch: %d leases left in Redis", with.LeasesLeft)
			}
			if with.Quarantined < len(s.Market.Burnt) {
				t.Errorf("with proxyswitch: %d proxies quarantined, want the %d burnt ones at least", with.Quarantined, len(s.Market.Burnt))
			}
		})
	}
}
