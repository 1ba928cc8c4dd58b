package storage

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisStorageBaseline is a minimal, faithful port of gocolly/redisstorage
// (the approach this package replaces) to go-redis v9, for the benchmarks:
// Visited is SET <prefix>:request:<id> "1" (with an optional expiry),
// IsVisited is GET, the queue is RPUSH / LPOP / LLEN on one list (a popped
// request is gone: nothing to acknowledge), cookies are one string per
// host rewritten whole, and Clear runs KEYS with a glob built from the
// prefix.
type redisStorageBaseline struct {
	Client  redis.UniversalClient
	Prefix  string
	Expires time.Duration
}

func (s *redisStorageBaseline) Init() error {
	return s.Client.Ping(context.Background()).Err()
}

func (s *redisStorageBaseline) Visited(requestID uint64) error {
	return s.Client.Set(context.Background(), s.idKey(requestID), "1", s.Expires).Err()
}

func (s *redisStorageBaseline) IsVisited(requestID uint64) (bool, error) {
	_, err := s.Client.Get(context.Background(), s.idKey(requestID)).Result()
	if err == redis.Nil {
		return false, nil
	}
	return err == nil, err
}

func (s *redisStorageBaseline) AddRequest(r []byte) error {
	return s.Client.RPush(context.Background(), s.queueKey(), r).Err()
}

func (s *redisStorageBaseline) GetRequest() ([]byte, error) {
	return s.Client.LPop(context.Background(), s.queueKey()).Bytes()
}

func (s *redisStorageBaseline) QueueSize() (int, error) {
	n, err := s.Client.LLen(context.Background(), s.queueKey()).Result()
	return int(n), err
}

func (s *redisStorageBaseline) Clear() error {
	ctx := context.Background()
	keys, err := s.Client.Keys(ctx, s.Prefix+":cookie:*").Result()
	if err != nil {
		return err
	}
	more, err := s.Client.Keys(ctx, s.Prefix+":request:*").Result()
	if err != nil {
		return err
	}
	keys = append(append(keys, more...), s.queueKey())
	return s.Client.Del(ctx, keys...).Err()
}

func (s *redisStorageBaseline) idKey(id uint64) string {
	return fmt.Sprintf("%s:request:%d", s.Prefix, id)
}
func (s *redisStorageBaseline) queueKey() string { return s.Prefix + ":queue" }
