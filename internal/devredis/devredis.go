// Package devredis gives example programs and demos a Redis to talk to: the
// one at a URL when the user names one; else a private redis-server, when
// one is on PATH; else an embedded, in-process Redis-compatible server
// (miniredis), so that a demo needs nothing but Go installed.
//
// miniredis runs the library's Lua scripts with gopher-lua, which differs
// from Redis' Lua in one way that matters here: tonumber of a number
// written with an exponent and no dot ("1e+15", as miniredis and Redis 7.2+
// write the score of a dead proxy's slot) is nil. The scripts read scores
// with arithmetic ("s + 0", which both Luas read) instead, or take a score
// tonumber cannot read for a dead one (session_lib.lua), so every script,
// dead and drained proxies included, gives the same results on both
// (scripts_test.go). A real redis-server is still preferred when there is
// one: it is faster.
package devredis

import (
	"fmt"
	"os/exec"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Embedded is the URL that asks Start for the in-process miniredis even when
// a redis-server is on PATH.
const Embedded = "embedded"

// Server is a Redis to connect to: the one at a URL, or an embedded one.
// Its methods are safe for concurrent use.
type Server struct {
	url   string         // for other processes
	opt   *redis.Options // parsed once; copied for each client
	desc  string
	embed *miniredis.Miniredis // the embedded server, or nil
	child *redistest.Server    // the private redis-server, or nil

	stop, done chan struct{} // the embedded server's expiry loop
	closeOnce  sync.Once
}

// Start returns the server at url. With url "" it starts a private
// redis-server on a free loopback port if one is on PATH (never port 6379;
// it dies with this process), or else the embedded one; with url Embedded,
// the embedded one. It does not check that a remote server answers; the
// first command will. Close it when done.
func Start(url string) (*Server, error) {
	if url == "" {
		if _, err := exec.LookPath("redis-server"); err == nil {
			child, err := redistest.StartProcess()
			if err != nil {
				return nil, fmt.Errorf("start redis-server: %w", err)
			}
			return &Server{
				url:   child.URL(),
				opt:   &redis.Options{Addr: child.Addr()},
				desc:  "a private redis-server (found on PATH) at " + child.Addr(),
				child: child,
			}, nil
		}
		url = Embedded
	}
	if url != Embedded {
		opt, err := redis.ParseURL(url)
		if err != nil {
			// go-redis quotes no password in its parse errors, but keep it
			// out of ours entirely.
			return nil, fmt.Errorf("invalid Redis URL (want redis://[user:password@]host:port/db)")
		}
		return &Server{url: url, opt: opt, desc: "Redis at " + opt.Addr}, nil
	}
	mr, err := miniredis.Run()
	if err != nil {
		return nil, fmt.Errorf("start embedded Redis: %w", err)
	}
	s := &Server{
		url:   "redis://" + mr.Addr() + "/0",
		opt:   &redis.Options{Addr: mr.Addr()},
		desc:  "embedded in-process Redis (miniredis) at " + mr.Addr(),
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
func (s *Server) expire() {
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
// own (as a separate machine would have). Close it when done.
func (s *Server) Client() *redis.Client {
	opt := *s.opt // go-redis fills in an Options it is given: one copy per client
	return redis.NewClient(&opt)
}

// URL returns a URL other processes can reach the server at. It holds the
// password of a URL given to Start: hand it over privately (standard input,
// a file), never on a command line.
func (s *Server) URL() string { return s.url }

// String describes the server for people: "Redis at host:port" or the
// embedded one. It never shows a password.
func (s *Server) String() string { return s.desc }

// Close stops the embedded server or the private redis-server; it does
// nothing for a server at a URL.
func (s *Server) Close() {
	if s.embed != nil {
		s.closeOnce.Do(func() { close(s.stop) })
		<-s.done
		s.embed.Close()
	}
	if s.child != nil {
		_ = s.child.Close()
	}
}

// Open returns a client for the server Start(url) returns, and a function
// that closes both. It does not check that a remote
// server answers; the first command will.
func Open(url string) (rdb *redis.Client, desc string, closeFn func(), err error) {
	s, err := Start(url)
	if err != nil {
		return nil, "", nil, err
	}
	rdb = s.Client()
	return rdb, s.String(), func() { _ = rdb.Close(); s.Close() }, nil
}
