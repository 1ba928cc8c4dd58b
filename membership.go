package proxyswitch

import (
	"context"
	"time"

	"github.com/proxyswitch/proxyswitch/shard"
)

// Cluster membership is shard.Membership: every server of a pool registers
// under the pool's hash tag and renews its registration with a heartbeat
// (keys in keys.go). This file holds the Switch's side of it: the options
// of the Membership that Start registers for WithFallback or WithSharding
// (WithMembership), and Members, which reads the list.

// memberConfig is what the Membership of WithFallback or WithSharding is
// configured with (WithMembership).
type memberConfig struct {
	interval time.Duration
	ttl      time.Duration
	onChange func([]string)
}

// defaultMemberConfig: a heartbeat every second, a member TTL of 3s.
func defaultMemberConfig() memberConfig {
	return memberConfig{interval: time.Second, ttl: 3 * time.Second}
}

func (mc *memberConfig) validate() error {
	switch {
	case mc.interval <= 0 || mc.ttl < 0:
		return configErr("heartbeat interval %v and member TTL %v must be positive", mc.interval, mc.ttl)
	case mc.ttl < 2*mc.interval:
		return configErr("member TTL %v must be at least twice the heartbeat interval %v", mc.ttl, mc.interval)
	}
	return nil
}

// WithMembership sets the member registration of WithFallback and
// WithSharding: mc.Heartbeat (default 1s), mc.TTL (how soon a crashed server
// drops out; default three heartbeats) and mc.Changed (called with each new
// member list; must not block). Its other fields are the Switch's own.
func WithMembership(mc shard.MemberConfig) Option {
	return func(c *config) {
		c.member = memberConfig{interval: mc.Heartbeat, ttl: mc.TTL, onChange: mc.Changed}
		if c.member.interval == 0 {
			c.member.interval = time.Second
		}
		if c.member.ttl == 0 {
			c.member.ttl = 3 * c.member.interval
		}
	}
}

// membership returns a Membership of server self in the Switch's pool, with
// the Switch's Redis client, prefix, Redis timeout and logger; member
// settings from mc.
func (s *Switch) membership(self string, mc memberConfig) (*shard.Membership, error) {
	return shard.NewMembership(s.rdb, shard.MemberConfig{
		Prefix:    s.cfg.prefix,
		Pool:      s.cfg.pool,
		Self:      self,
		Heartbeat: mc.interval,
		TTL:       mc.ttl,
		Timeout:   s.cfg.redisTimeout,
		Changed:   mc.onChange,
		Logger:    s.cfg.logger,
	})
}

// memberReader is the member ID of the Membership Members reads through; it
// is never registered.
const memberReader = "proxyswitch-reader"

// Members reads the live member list of the Switch's pool from Redis, sorted;
// it registers nothing. It is one round trip and safe for concurrent use.
func (s *Switch) Members(ctx context.Context) ([]string, error) {
	mc := s.cfg.member
	mc.onChange = nil
	m, err := s.membership(memberReader, mc)
	if err != nil {
		return nil, err
	}
	return m.Members(ctx)
}
