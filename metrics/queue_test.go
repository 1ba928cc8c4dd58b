package metrics

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gocolly/colly/v2/queue"
	"github.com/proxyswitch/proxyswitch/internal/testlog"
	"github.com/proxyswitch/proxyswitch/storage"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// newQueueStorage returns a Storage in a namespace of its own on rdb, with
// n requests queued.
func newQueueStorage(t *testing.T, rdb redis.UniversalClient, n int, opts ...storage.Option) *storage.Storage {
	t.Helper()
	ns := fmt.Sprintf("mq%d", prefixSeq.Add(1))
	s, err := storage.New(rdb, append([]storage.Option{storage.WithNamespace(ns)}, opts...)...)
	require.NoError(t, err)
	require.NoError(t, s.Init())
	q, err := queue.New(1, s)
	require.NoError(t, err)
	for i := range n {
		require.NoError(t, q.AddURL(fmt.Sprintf("http://127.0.0.1:1/p/%d", i)))
	}
	return s
}

// The queue's counts, as the storage package reports them, reach the
// scrape: ready, in flight and dead-lettered requests.
func TestQueueCollector(t *testing.T) {
	rdb := shared.Client(t)
	s := newQueueStorage(t, rdb, 3, storage.WithVisibilityTimeout(100*time.Millisecond), storage.WithMaxDeliveries(1),
		storage.WithPollInterval(time.Millisecond))
	col := NewQueue(s)
	f, _ := scrape(t, col)
	ns := "namespace=" + s.Namespace()
	f.expect(t, []want{
		{"proxyswitch_queue_requests", []string{ns, "state=ready"}, 3},
		{"proxyswitch_queue_requests", []string{ns, "state=in_flight"}, 0},
		{"proxyswitch_queue_requests", []string{ns, "state=dead"}, 0},
		{"proxyswitch_queue_up", []string{ns}, 1},
	}...)

	_, err := s.GetRequest() // delivered, never acknowledged
	require.NoError(t, err)
	f, _ = scrape(t, col)
	f.expect(t, []want{
		{"proxyswitch_queue_requests", []string{"state=ready"}, 2},
		{"proxyswitch_queue_requests", []string{"state=in_flight"}, 1},
	}...)
	time.Sleep(150 * time.Millisecond) // its visibility timeout passes: its one delivery is spent
	_, err = s.GetRequest()
	require.NoError(t, err)
	f, _ = scrape(t, col)
	f.expect(t, []want{
		{"proxyswitch_queue_requests", []string{"state=ready"}, 1},
		{"proxyswitch_queue_requests", []string{"state=in_flight"}, 1},
		{"proxyswitch_queue_requests", []string{"state=dead"}, 1},
	}...)
	st, err := s.Stats(context.Background())
	require.NoError(t, err)
	assert.Equal(t, storage.Stats{Ready: 1, InFlight: 1, Dead: 1}, st, "the ground truth")
	assert.Panics(t, func() { NewQueue(nil) })
}

// With Redis out of reach the scrape still answers: up 0, no counts, one
// warning however many scrapes fail, and no password anywhere.
func TestQueueCollectorWhenRedisFails(t *testing.T) {
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", Password: redisSecret, MaxRetries: -1})
	t.Cleanup(func() { _ = dead.Close() })
	s, err := storage.New(dead, storage.WithNamespace("down"), storage.WithRedisTimeout(200*time.Millisecond))
	require.NoError(t, err)
	var logs testlog.Buffer
	col := NewQueue(s, WithLogger(logs.Logger()), WithScrapeTimeout(300*time.Millisecond))
	for range 3 {
		f, page := scrape(t, col)
		f.expect(t, want{"proxyswitch_queue_up", []string{"namespace=down"}, 0})
		assert.Empty(t, f.find("proxyswitch_queue_requests", nil))
		assert.NotContains(t, page, redisSecret)
	}
	assert.Equal(t, 1, strings.Count(logs.String(), "reading the queue from Redis failed"), logs.String())
	assert.NotContains(t, logs.String(), redisSecret)
}
