package proxyswitchtest

// miniredis runs the library's Lua scripts with gopher-lua, which differs
// from Redis' Lua in one way that matters here: tonumber of a number
// written with an exponent and no dot ("1e+15", as miniredis and Redis 7.2+
// write the score of a dead proxy's slot) is nil. The scripts read scores
// with arithmetic ("s + 0", which both Luas read) instead, or take a score
// tonumber cannot read for a dead one (session_lib.lua), so every script,
// dead and drained proxies included, gives the same results on both
// (scripts_test.go). A real redis-server is faster: ask for one with
// RedisServer.

import (
	"flag"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Arguments of [StartRedis] other than a URL.
const (
	// RedisEmbedded (or "") asks for an embedded, in-process
	// Redis-compatible server (miniredis): nothing to install.
	RedisEmbedded = "embedded"
	// RedisServer asks for a private redis-server, started from PATH on a
	// free loopback port (never 6379) with persistence off.
	RedisServer = "server"
)

// RedisFlag defines the -redis flag of a demo program on the default
// flag.CommandLine, with the choices of StartRedis in its help, and
// returns where its value will be. The default is RedisEmbedded. Call it
// before flag.Parse.
func RedisFlag() *string {
	return flag.String("redis", RedisEmbedded,
		`"embedded" (an in-process Redis), "server" (a private redis-server from PATH on a free port), or your Redis URL, e.g. redis://127.0.0.1:6379/0`)
}

// Redis is a Redis for demos and tests: an embedded one, a private
// redis-server, or the one at a URL. Its methods are safe for concurrent
// use.
type Redis struct {
	url   string         // for other processes
	opt   *redis.Options // parsed once; copied for each client
	desc  string
	embed *miniredis.Miniredis // the embedded server, or nil
	child *redistest.Server    // the private redis-server, or nil

	stop, done chan struct{} // the embedded server's expiry loop
	closeOnce  sync.Once     // Close
}

// StartRedis returns a Redis according to arg:
//
//   - "" or [RedisEmbedded]: an embedded, in-process server (miniredis) on a
//     free loopback port, whose keys expire with the clock (checked every
//     250ms) as in Redis. It needs nothing installed and runs every
//     proxyswitch script, about half as fast as a real Redis.
//   - [RedisServer]: a private redis-server from PATH on a free loopback
//     port (never 6379), persistence off; it dies with this process (on
//     Linux, even if the process is killed). An error if none is on PATH.
//   - anything else: the URL of your Redis, redis://[user:password@]host:port/db.
//     StartRedis does not check that it answers; the first command will.
//
// Close it when done.
func StartRedis(arg string) (*Redis, error) {
	switch arg {
	case "", RedisEmbedded:
		return startEmbedded()
	case RedisServer:
		child, err := redistest.StartProcess()
		if err != nil {
			return nil, fmt.Errorf("start redis-server: %w", err)
		}
		return &Redis{
			url:   child.URL(),
			opt:   &redis.Options{Addr: child.Addr()},
			desc:  "a private redis-server at " + child.Addr(),
			child: child,
		}, nil
	}
	if !strings.Contains(arg, "://") {
		return nil, fmt.Errorf("want a Redis URL (redis://[user:password@]host:port/db), %q or %q", RedisEmbedded, RedisServer)
	}
	opt, err := redis.ParseURL(arg)
	if err != nil {
		// go-redis quotes no password in its parse errors, but keep it
		// out of ours entirely.
		return nil, fmt.Errorf("invalid Redis URL (want redis://[user:password@]host:port/db)")
	}
	return &Redis{url: arg, opt: opt, desc: "Redis at " + opt.Addr}, nil
}

func startEmbedded() (*Redis, error) {
	mr, err := miniredis.Run()
	if err != nil {
		return nil, fmt.Errorf("start embedded Redis: %w", err)
	}
	s := &Redis{
		url:   "redis://" + mr.Addr() + "/0",
		opt:   &redis.Options{Addr: mr.Addr()},
		desc:  "an embedded in-process Redis (miniredis) at " + mr.Addr(),
		embed: mr,
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	go s.expire()
	return s, nil
}

// expireEvery is how often the embedded server's TTLs are brought up to
// the clock: keys outlive their TTL by this much at most.
const expireEvery = 250 * time.Millisecond

// expire lets the embedded server's keys expire with the clock, as in
// Redis: miniredis keeps every TTL until told to fast-forward. (Its
// ClockTTL mode does it on every command, sorting all keys each time, which
// slows a crawl with a large visited set to a crawl.)
func (s *Redis) expire() {
	defer close(s.done)
	t := time.NewTicker(expireEvery)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-s.stop:
			return
		case now := <-t.C:
			s.embed.FastForward(now.Sub(last))
			last = now
		}
	}
}

// Client returns a new client to the server, with a connection pool of its
// own (as a separate machine would have), with ContextTimeoutEnabled set
// as the package proxyswitch recommends (each call bounded by its context,
// on the caller's goroutine). Close it when done.
func (s *Redis) Client() *redis.Client {
	opt := *s.opt // go-redis fills in an Options it is given: one copy per client
	opt.ContextTimeoutEnabled = true
	return redis.NewClient(&opt)
}

// URL returns a URL other processes can reach the server at. It holds the
// password of a URL given to StartRedis: hand it over privately (standard input,
// a file), never on a command line.
func (s *Redis) URL() string { return s.url }

// String describes the server for people: "Redis at host:port", "an
// embedded in-process Redis (miniredis) at host:port" or "a private
// redis-server at host:port". It never shows a password.
func (s *Redis) String() string { return s.desc }

// Close stops the embedded server or the private redis-server; it does
// nothing for a server at a URL. Clients must not be used after it. It may
// be called more than once.
func (s *Redis) Close() {
	s.closeOnce.Do(func() {
		if s.embed != nil {
			close(s.stop)
			<-s.done
			s.embed.Close()
		}
		if s.child != nil {
			_ = s.child.Close()
		}
	})
}
