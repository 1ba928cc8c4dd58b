package proxyswitch

import (
	"context"
	"time"

	"github.com/proxyswitch/proxyswitch/shard"
)

// Cluster membership is shard.Membership: every server of a pool registers
// under the pool's hash tag and renews its registration with a heartbeat
// (keys in keys.go). This file holds the Switch's side of it: the options
// of the Membership that Start registers for WithFallback or WithSharding,
// and Members, which reads the list.

// memberConfig is what the Membership of WithFallback or WithSharding is
// configured with: WithHeartbeat, WithMemberTTL and WithMembersChanged.
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
	case mc.interval <= 0:
		return configErr("heartbeat interval %v must be positive", mc.interval)
	case mc.ttl < 2*mc.interval:
		return configErr("member TTL %v must be at least twice the heartbeat interval %v", mc.ttl, mc.interval)
	}
	return nil
}

// WithHeartbeat sets how often the Membership that Start registers for
// WithFallback or WithSharding renews its registration (shard.MemberConfig
// Heartbeat). Each renewal is one Redis round trip, bounded by the Switch's
// Redis timeout; a renewal slower than the interval delays the next one. It
// must be positive. The default is 1s.
func WithHeartbeat(d time.Duration) Option { return func(c *config) { c.member.interval = d } }

// WithMemberTTL sets how long the registration of WithFallback or
// WithSharding lives without renewal (shard.MemberConfig TTL): a server
// that stops heartbeating (crashed, cut off) drops out of every member list
// that long after its last heartbeat. It must be at least twice the
// heartbeat interval, so that one late heartbeat does not drop a server.
// The default is 3s.
func WithMemberTTL(d time.Duration) Option { return func(c *config) { c.member.ttl = d } }

// WithMembersChanged sets a function called with the member list (sorted,
// a copy) each time the list the Membership of WithFallback or WithSharding
// reads differs from the one it last reported (shard.MemberConfig Changed),
// for instance to feed metrics.Collector.ObserveMembers. Calls are one at a
// time, in the order the lists were read. The function must not block and
// must not panic. The default is none.
func WithMembersChanged(f func(members []string)) Option {
	return func(c *config) { c.member.onChange = f }
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

// Members reads the live member list of the Switch's pool from Redis: the
// IDs of the servers registered (by WithFallback, WithSharding or a
// shard.Membership of their own) whose registration has not run out,
// sorted. It registers nothing and calls no WithMembersChanged function.
// It is one round trip, bounded by the Redis timeout, and safe for
// concurrent use.
func (s *Switch) Members(ctx context.Context) ([]string, error) {
	mc := s.cfg.member
	mc.onChange = nil
	m, err := s.membership(memberReader, mc)
	if err != nil {
		return nil, err
	}
	return m.Members(ctx)
}
