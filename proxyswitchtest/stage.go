package proxyswitchtest

import (
	"fmt"
)

// StageConfig says what [StartStage] starts.
type StageConfig struct {
	// Redis is the argument of [StartRedis]: "" or [RedisEmbedded] (the
	// default, an embedded Redis), [RedisServer] or a Redis URL.
	Redis string
	// Proxies is the size of the farm, 1 to [MaxSourceIPs].
	Proxies int
	// Burnt is how many of the proxies (0 to Proxies, spread evenly over
	// the farm: [Farm.SpreadIPs]) are on the marketplaces' blacklist before
	// the crawl.
	Burnt int
	// Market sizes the marketplaces; nil starts none. Its Burnt field is
	// ignored: the stage sets it from Burnt.
	Market *MarketConfig
}

// Stage is a whole world for a demo or a test: a Redis, a proxy farm and,
// when asked, the fake marketplaces. Its fields are not changed after the
// start.
type Stage struct {
	Redis  *Redis   // started by StartRedis(StageConfig.Redis)
	Farm   *Farm    // StageConfig.Proxies proxies
	Burnt  []string // source IPs of the proxies on the blacklist before the crawl
	Market *Market  // nil unless StageConfig.Market was set
}

// StartStage starts what cfg says; on an error it stops what it started.
// The caller must Close the stage.
func StartStage(cfg StageConfig) (*Stage, error) {
	if cfg.Proxies < 1 || cfg.Proxies > MaxSourceIPs || cfg.Burnt < 0 || cfg.Burnt > cfg.Proxies {
		return nil, fmt.Errorf("proxyswitchtest: need 1 <= proxies <= %d and 0 <= burnt <= proxies", MaxSourceIPs)
	}
	rs, err := StartRedis(cfg.Redis)
	if err != nil {
		return nil, err
	}
	farm, err := StartFarm(cfg.Proxies)
	if err != nil {
		rs.Close()
		return nil, err
	}
	s := &Stage{Redis: rs, Farm: farm, Burnt: farm.SpreadIPs(cfg.Burnt)}
	if cfg.Market != nil {
		mc := *cfg.Market
		mc.Burnt = s.Burnt
		s.Market = StartMarket(mc)
	}
	return s, nil
}

// Close stops everything StartStage started.
func (s *Stage) Close() {
	if s.Market != nil {
		s.Market.Close()
	}
	s.Farm.Close()
	s.Redis.Close()
}
