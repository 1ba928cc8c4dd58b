package storage

import (
	"bytes"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// A hung Redis (SIGSTOP) costs each call no more than the storage's own
// timeout, even with a client whose read timeout is far longer and which
// ignores context deadlines; every error wraps ErrRedis.
func TestHungRedisIsBounded(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t, func(o *redis.Options) { o.ReadTimeout = 30 * time.Second; o.WriteTimeout = 30 * time.Second })
	s := newStorage(t, rdb, WithRedisTimeout(150*time.Millisecond))
	require.NoError(t, s.AddRequest(marshal(t, "http://a.example/")))
	require.NoError(t, srv.Pause())
	defer func() { _ = srv.Resume() }()

	check := func(name string, err error) {
		t.Helper()
		require.ErrorIs(t, err, ErrRedis, name)
		require.Contains(t, err.Error(), "no reply within 150ms", name)
	}
	start := time.Now()
	_, err := s.IsVisited(1)
	check("IsVisited", err)
	check("Visited", s.Visited(1))
	check("AddRequest", s.AddRequest(marshal(t, "http://a.example/")))
	_, err = s.GetRequest()
	check("GetRequest", err)
	_, err = s.QueueSize()
	check("QueueSize", err)
	check("Init", s.Init())
	check("Clear", s.Clear(bg))
	require.Less(t, time.Since(start), 3*time.Second)

	// Colly fails closed: a URL whose visited check failed is not fetched.
	site := newCountingSite(t, nil)
	c := colly.NewCollector()
	require.NoError(t, srv.Resume())
	require.NoError(t, c.SetStorage(s))
	require.NoError(t, srv.Pause())
	require.ErrorIs(t, c.Visit(site.URL+"/x"), ErrRedis)
	hits, _ := site.total()
	require.Zero(t, hits)
}

// A dead Redis gives ErrRedis wrapping the connection error.
func TestDeadRedis(t *testing.T) {
	srv := redistest.Start(t)
	s := newStorage(t, srv.Client(t, func(o *redis.Options) { o.MaxRetries = -1 }))
	require.NoError(t, srv.Kill())
	_, err := s.IsVisited(1)
	require.ErrorIs(t, err, ErrRedis)
	require.Contains(t, err.Error(), "connection refused")
	require.NoError(t, srv.Restart())
	require.NoError(t, s.Init())
	v, err := s.IsVisited(1)
	require.NoError(t, err)
	require.False(t, v)
}

// Redis passwords never show in errors or logs.
func TestPasswordNeverShown(t *testing.T) {
	const secret = "hunter2-Pa55word"
	srv := redistest.Start(t, "--requirepass", "right-"+secret)
	var log bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&log, nil))
	wrong := srv.Client(t, func(o *redis.Options) { o.Password = "wrong-" + secret })
	s, err := New(wrong, WithLogger(logger))
	require.NoError(t, err)
	var errs []error
	errs = append(errs, s.Init(), s.Visited(1), s.AddRequest(marshal(t, "http://a.example/")))
	_, e := s.GetRequest()
	errs = append(errs, e)
	u, _ := url.Parse("http://a.example/")
	s.SetCookies(u, "a=1")
	_ = s.Cookies(u)
	for _, err := range errs {
		require.Error(t, err)
		require.NotContains(t, err.Error(), secret)
	}
	require.Contains(t, log.String(), "WRONGPASS")
	require.NotContains(t, log.String(), secret)
	require.True(t, errors.Is(errs[0], ErrRedis))
	require.False(t, strings.Contains(errs[0].Error(), "right-"))
}
