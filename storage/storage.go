package storage

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"sync/atomic"

	"github.com/gocolly/colly/v2/queue"
	collystorage "github.com/gocolly/colly/v2/storage"
	"github.com/proxyswitch/proxyswitch/internal/bounded"
	"github.com/proxyswitch/proxyswitch/internal/group"
	"github.com/redis/go-redis/v9"
)

// Storage is Colly's storage.Storage (visited set, cookies) and
// queue.Storage (request queue) on Redis, under one namespace.
//
// A Storage is safe for concurrent use by multiple goroutines, and any
// number of Storages in any number of processes may share a namespace:
// across all of them, Visited grants each request ID to exactly one caller,
// cookie writes replace single cookies (never a domain's whole set), and
// every queued request is delivered to one worker at a time, again after
// its visibility timeout if that worker dies, until it is acknowledged or
// dead-lettered (at-least-once). It holds no connection of its own. While
// fetches of its deliveries run, it keeps one renewer goroutine that
// extends their visibility (see WithVisibilityTimeout): the first fetch to
// start launches it, and it exits at its next tick (a third of the
// visibility timeout) once none runs, or WithMaxFetchTime after the last
// fetch that never settled started. A round trip given up at its timeout
// finishes in the background. It needs no Close.
type Storage struct {
	rdb      redis.UniversalClient
	cfg      config
	keys     keyspace
	q        queueKeys
	qkeys    []string
	pending  pending
	cookies  cookieMemo
	revisits revisits // IDs IsVisited just found visited (visited.go)
	inline   bool     // the client bounds round trips by the context itself

	// The queue's round trips that concurrent calls share (internal/group).
	adds group.Group[[]byte, error]
	pops group.Group[string, popped]
	lost lostPops // pop IDs whose reply never came (queue.go)
	acks group.Group[ackItem, struct{}]
	// The visited check's (visited_group.go): reads and claims.
	reads  group.Group[uint64, mark]
	claims group.Group[claimItem, mark]

	attached         atomic.Bool // Attach was called (on some collector)
	warnedUnattached atomic.Bool // QueueSize reported ErrNotAttached (logged once)
}

// Compile-time checks: a Storage is both of Colly's backends, and every
// go-redis client kind fits.
var (
	_ collystorage.Storage = (*Storage)(nil)
	_ queue.Storage        = (*Storage)(nil)

	_ redis.UniversalClient = (*redis.Client)(nil) // also NewFailoverClient (Sentinel)
	_ redis.UniversalClient = (*redis.ClusterClient)(nil)
	_ redis.UniversalClient = (*redis.Ring)(nil)
)

// New returns a Storage on rdb: a single-node, Sentinel (failover), Cluster
// or Ring client. A nil client (or a nil pointer of a client type), a nil
// Option or an invalid option value is ErrConfig. It does no I/O; Init
// (called by Collector.SetStorage and queue.New) checks the namespace's
// shared settings.
func New(rdb redis.UniversalClient, opts ...Option) (*Storage, error) {
	if rdb == nil || isNilPointer(rdb) {
		return nil, fmt.Errorf("%w: nil redis client", ErrConfig)
	}
	cfg := defaultConfig()
	for i, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: option %d is nil", ErrConfig, i+1)
		}
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	k := newKeyspace(cfg.namespace)
	s := &Storage{rdb: rdb, cfg: cfg, keys: k, q: k.queue(), inline: bounded.HonoursDeadlines(rdb)}
	s.qkeys = s.q.all()
	s.initGroups()
	s.initVisitedGroups()
	s.pending.init(cfg.visibility, cfg.maxFetch)
	s.cookies.init()
	return s, nil
}

// isNilPointer reports whether v, an interface value that is not nil, holds a
// nil pointer (a (*redis.Client)(nil), say), as the root package checks.
func isNilPointer(v any) bool {
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return rv.IsNil()
	}
	return false
}

// Namespace returns the namespace the Storage works in.
func (s *Storage) Namespace() string { return s.cfg.namespace }

// Init implements Colly's storage.Storage and queue.Storage. It records the
// number of visited buckets in Redis, or checks it against the one recorded
// by the first collector of the namespace (ErrConfig if they differ, since
// the two would look for the same URL in different buckets). It is
// idempotent.
func (s *Storage) Init() error {
	want := strconv.Itoa(s.cfg.buckets)
	got, err := s.run(context.Background(), "init", settleScript, []string{s.keys.meta()}, "buckets", want)
	if err != nil {
		return err
	}
	str, _ := got.(string)
	if n, err := strconv.Atoi(str); err != nil || n < 1 || n > maxBuckets {
		return fmt.Errorf("%w: key %s, field buckets: not a count of visited buckets: %s", ErrCorrupt, s.keys.meta(), clip(str))
	}
	if str != want {
		return fmt.Errorf("%w: namespace %q uses %v visited buckets, this Storage %s (see WithVisitedBuckets)",
			ErrConfig, s.cfg.namespace, got, want)
	}
	return nil
}

// Clear deletes every key of the namespace: visited marks, cookies, the
// queue with its in-flight requests and dead letters, and the recorded
// settings. It never touches another namespace: it runs no KEYS or SCAN
// glob, but deletes the names the layout derives from the namespace (the
// visited buckets are a fixed, numbered set; cookie hosts are listed in a
// registry set written in the same script as the cookies, which Clear reads
// page by page). No command it sends names more than about a thousand
// keys, whatever the namespace's size. Keys written by collectors still
// running during Clear may survive it; stop them first.
func (s *Storage) Clear(ctx context.Context) error {
	buckets := s.cfg.buckets
	recorded, err := call(ctx, s.cfg.redisTimeout, s.inline, "clear", func(ctx context.Context) (string, error) {
		return s.rdb.HGet(ctx, s.keys.meta(), "buckets").Result()
	})
	if err != nil && err != redis.Nil && !errors.Is(err, ErrCorrupt) { // corrupt: Clear deletes it anyway
		return err
	}
	if n, perr := strconv.Atoi(recorded); perr == nil && n > buckets && n <= maxBuckets {
		buckets = n
	}
	// One UNLINK per key: the buckets live in different cluster slots.
	const batch = 1024
	for start := 0; start < buckets; start += batch {
		end := min(start+batch, buckets)
		keys := make([]string, 0, end-start)
		for b := start; b < end; b++ {
			keys = append(keys, s.keys.bucket(uint64(b)))
		}
		if err := s.unlinkEach(ctx, keys); err != nil {
			return err
		}
	}
	if err := s.clearCookies(ctx, s.keys.cookieDomains(), s.keys.cookieJar); err != nil {
		return err
	}
	if err := s.clearCookies(ctx, s.keys.cookieHosts(), s.keys.legacyCookies); err != nil {
		return err
	}
	keys := append([]string{s.keys.meta(), s.keys.cookieDomains(), s.keys.cookieHosts()}, s.qkeys...)
	return s.unlinkEach(ctx, keys)
}

// clearBatch is the SSCAN count of one page of a cookie registry,
// and so about the number of cookie hashes one UNLINK pipeline deletes.
const clearBatch = 1000

// clearCookies deletes the cookie hash (key(member)) of every member of a
// registry (the domains of the cookie jars, or the hosts of an earlier
// version's cookie hashes): it reads the registry page by page (SSCAN) and deletes each page's hashes
// before it reads the next, so that no command's work follows the number
// of hosts (one SMEMBERS and one UNLINK of 300,000 hosts blocked Redis for
// 0.3 s and 0.2 s). The registry itself stays until Clear's last UNLINK:
// SSCAN returns every host in it from the first page to the last.
func (s *Storage) clearCookies(ctx context.Context, registry string, key func(string) string) error {
	type page struct {
		members []string
		cursor  uint64
	}
	var cursor uint64
	for {
		pg, err := call(ctx, s.cfg.redisTimeout, s.inline, "clear", func(ctx context.Context) (page, error) {
			members, next, err := s.rdb.SScan(ctx, registry, cursor, "", clearBatch).Result()
			return page{members, next}, err
		})
		if errors.Is(err, ErrCorrupt) { // no cookie hash to find: Clear deletes the registry anyway
			return nil
		}
		if err != nil {
			return err
		}
		if len(pg.members) > 0 {
			keys := make([]string, len(pg.members))
			for i, m := range pg.members {
				keys[i] = key(m)
			}
			if err := s.unlinkEach(ctx, keys); err != nil {
				return err
			}
		}
		if cursor = pg.cursor; cursor == 0 {
			return nil
		}
	}
}

// unlinkEach deletes keys in one pipeline: one UNLINK per key on a Cluster
// or Ring client (the keys live in different slots), one UNLINK for all on
// a single-node or Sentinel client.
func (s *Storage) unlinkEach(ctx context.Context, keys []string) error {
	_, single := s.rdb.(*redis.Client)
	_, err := call(ctx, s.cfg.redisTimeout, s.inline, "clear", func(ctx context.Context) ([]redis.Cmder, error) {
		return s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			if single {
				p.Unlink(ctx, keys...)
				return nil
			}
			for _, k := range keys {
				p.Unlink(ctx, k)
			}
			return nil
		})
	})
	return err
}
