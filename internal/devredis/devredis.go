// Package devredis gives example programs and demos a Redis to talk to: the
// one at a URL when the user names one, or else an embedded, in-process
// Redis-compatible server (miniredis, which runs the same Lua scripts), so
// that a demo needs nothing but Go installed.
package devredis

import (
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Server is a Redis to connect to: the one at a URL, or an embedded one.
// Its methods are safe for concurrent use.
type Server struct {
	opt   *redis.Options // parsed once; copied for each client
	desc  string
	embed *miniredis.Miniredis // nil for a URL
}

// Start returns the server at url, or starts an embedded one when url is
// empty. It does not check that a remote server answers; the first command
// will. Close it when done.
func Start(url string) (*Server, error) {
	if url != "" {
		opt, err := redis.ParseURL(url)
		if err != nil {
			// go-redis quotes no password in its parse errors, but keep it
			// out of ours entirely.
			return nil, fmt.Errorf("invalid Redis URL (want redis://[user:password@]host:port/db)")
		}
		return &Server{opt: opt, desc: "Redis at " + opt.Addr}, nil
	}
	mr, err := miniredis.Run()
	if err != nil {
		return nil, fmt.Errorf("start embedded Redis: %w", err)
	}
	// Let keys expire with the clock, as in Redis (miniredis otherwise
	// keeps every TTL until told to fast-forward).
	mr.ClockTTL(true)
	return &Server{
		opt:   &redis.Options{Addr: mr.Addr()},
		desc:  "embedded in-process Redis (miniredis) at " + mr.Addr(),
		embed: mr,
	}, nil
}

// Client returns a new client to the server, with a connection pool of its
// own (as a separate machine would have). Close it when done.
func (s *Server) Client() *redis.Client {
	opt := *s.opt // go-redis fills in an Options it is given: one copy per client
	return redis.NewClient(&opt)
}

// String describes the server for people: "Redis at host:port" or the
// embedded one. It never shows a password.
func (s *Server) String() string { return s.desc }

// Close stops the embedded server; it does nothing for a server at a URL.
func (s *Server) Close() {
	if s.embed != nil {
		s.embed.Close()
	}
}

// Open returns a client for url, or for a fresh embedded server when url is
// empty, and a function that closes both. It does not check that a remote
// server answers; the first command will.
func Open(url string) (rdb *redis.Client, desc string, closeFn func(), err error) {
	s, err := Start(url)
	if err != nil {
		return nil, "", nil, err
	}
	rdb = s.Client()
	return rdb, s.String(), func() { _ = rdb.Close(); s.Close() }, nil
}
