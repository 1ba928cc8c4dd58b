package storage

import (
	"context"
	"errors"
	"math"
	"net/url"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// TestCorruptValues damages every kind of key of a namespace, one way at a
// time, and drives every operation that reads it: each fails with
// ErrCorrupt naming the key in a message of bounded size, or handles the
// value (ignores it, dead-letters the request); none surfaces a raw Redis or
// script error, and nothing panics (issue 13, item 10).
func TestCorruptValues(t *testing.T) {
	rdb := shared.Client(t)
	huge := strings.Repeat("9z", 32<<10)
	site, _ := url.Parse("http://a.example/")
	type spoil struct {
		key   func(s *Storage) string
		write func(key string) error
	}
	hset := func(field, v string) func(string) error {
		return func(key string) error { return rdb.HSet(bg, key, field, v).Err() }
	}
	str := func(key string) error { return errors.Join(rdb.Del(bg, key).Err(), rdb.Set(bg, key, huge, 0).Err()) }
	hash := func(key string) error { return errors.Join(rdb.Del(bg, key).Err(), rdb.HSet(bg, key, "x", "y").Err()) }
	zadd := func(score float64, member string) func(string) error {
		return func(key string) error { return rdb.ZAdd(bg, key, redis.Z{Score: score, Member: member}).Err() }
	}
	meta := func(s *Storage) string { return s.keys.meta() }
	hosts := func(s *Storage) string { return s.keys.cookieHosts() }
	domains := func(s *Storage) string { return s.keys.cookieDomains() }
	jar := func(s *Storage) string { return s.keys.cookieJar(site.Host) }
	legacyJar := func(s *Storage) string { return s.keys.legacyCookies(site.Host) }
	bucket := func(s *Storage) string { return s.keys.bucket(0) }
	q := func(f func(queueKeys) string) func(s *Storage) string {
		return func(s *Storage) string { return f(s.q) }
	}
	seq, data, ready := q(func(k queueKeys) string { return k.seq }), q(func(k queueKeys) string { return k.data }), q(func(k queueKeys) string { return k.ready })
	inflight, tries, dead, why := q(func(k queueKeys) string { return k.inflight }), q(func(k queueKeys) string { return k.tries }),
		q(func(k queueKeys) string { return k.dead }), q(func(k queueKeys) string { return k.why })
	spoils := map[string]spoil{
		"meta buckets x":      {meta, hset("buckets", "x")},
		"meta buckets huge":   {meta, hset("buckets", huge)},
		"meta a string":       {meta, str},
		"cookie hosts a hash": {hosts, hash},
		"cookie jar a string": {jar, str},
		"cookie jar huge":     {jar, hset("a.example;/;n", huge)},
		"cookie jar garbage":  {jar, hset("a.example;/;n", "x|y|z")},
		"cookie domains hash": {domains, hash},
		"legacy jar a string": {legacyJar, str},
		"legacy jar huge":     {legacyJar, hset("n;/;", huge)},
		"legacy jar garbage":  {legacyJar, hset("n;/;", "=;;\x00")},
		"seq x":               {seq, func(key string) error { return rdb.Set(bg, key, "x", 0).Err() }},
		"seq huge":            {seq, func(key string) error { return rdb.Set(bg, key, huge, 0).Err() }},
		"seq a hash":          {seq, hash},
		"data a string":       {data, str},
		"data huge":           {data, hset("1", huge)},
		"ready a string":      {ready, str},
		"ready a hash":        {ready, hash},
		"ready huge id":       {ready, func(key string) error { return rdb.RPush(bg, key, huge).Err() }},
		"inflight a string":   {inflight, str},
		"inflight +inf":       {inflight, zadd(math.Inf(1), "1")},
		"inflight -inf":       {inflight, zadd(math.Inf(-1), "1")},
		"inflight huge":       {inflight, zadd(1, huge)},
		"tries x":             {tries, hset("1", "x")},
		"tries huge":          {tries, hset("1", huge)},
		"tries a string":      {tries, str},
		"dead a string":       {dead, str},
		"dead huge":           {dead, zadd(1, huge)},
		"why a string":        {why, str},
		"why huge":            {why, hset("2", huge)},
		"visited x":           {bucket, func(key string) error { return rdb.HSet(bg, key, "\x00\x00\x00\x00\x00\x00\x00\x01", "x").Err() }},
		"visited a string":    {bucket, str},
	}
	for name, sp := range spoils {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			s := newStorage(t, rdb, WithVisitedBuckets(1), WithMaxRequestSize(1000))
			for _, u := range []string{"http://a.example/1", "http://a.example/2", "http://a.example/3"} {
				require.NoError(t, s.AddRequest(marshal(t, u)))
			}
			tok, _ := pop(t, s)
			tok2, _ := pop(t, s)
			_, err := s.nack(ctx, tok2, "failed", true)
			require.NoError(t, err)
			require.NoError(t, s.Visited(1))
			s.SetCookies(site, "n=v")
			key := sp.key(s)
			require.NoError(t, sp.write(key))

			call := func(op string, f func() error) {
				t.Helper()
				defer func() {
					if r := recover(); r != nil {
						t.Errorf("%s panicked: %v", op, r)
					}
				}()
				err := f()
				if err == nil {
					return
				}
				msg := err.Error()
				switch {
				case errors.Is(err, ErrCorrupt):
					if !strings.Contains(msg, key) {
						t.Errorf("%s: ErrCorrupt does not name the key %s: %.300s", op, key, msg)
					}
					if len(msg) > 512 {
						t.Errorf("%s: error of %d bytes: %.300s...", op, len(msg), msg)
					}
				case errors.Is(err, ErrRedis), strings.Contains(msg, "script"), strings.Contains(msg, "attempt to"):
					t.Errorf("%s: %.300s", op, msg)
				default:
					t.Logf("%s: %.200s", op, msg)
				}
			}
			call("Init", func() error {
				n, err := New(rdb, WithNamespace(s.cfg.namespace), WithVisitedBuckets(1))
				require.NoError(t, err)
				return n.Init()
			})
			call("IsVisited", func() error { _, err := s.IsVisited(1); return err })
			call("Visited", func() error { return s.Visited(2) })
			call("Cookies", func() error { _ = s.Cookies(site); return nil })
			call("SetCookies", func() error { s.SetCookies(site, "m=w"); return nil })
			call("QueueSize", func() error { _, err := s.QueueSize(); return err })
			call("Stats", func() error { _, err := s.Stats(ctx); return err })
			call("DeadLetters", func() error { _, err := s.DeadLetters(ctx, 0, 10); return err })
			call("AddRequest", func() error { return s.AddRequest(marshal(t, "http://a.example/4")) })
			call("AddURLs", func() error { _, err := s.AddURLs(ctx, "http://a.example/5"); return err })
			call("GetRequest", func() error { _, err := s.GetRequest(); return err })
			call("ack", func() error { return s.ack(tok) })
			call("nack", func() error { _, err := s.nack(ctx, tok, "x", false); return err })
			call("Requeue", func() error { return s.Requeue(ctx, "2") })
			call("Clear", func() error { return s.Clear(ctx) })
		})
	}
}
