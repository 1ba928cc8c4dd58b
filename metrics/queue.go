package metrics

import (
	"context"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/proxyswitch/proxyswitch/storage"
)

var _ prometheus.Collector = (*QueueCollector)(nil)

// QueueCollector reads the request queue of one storage namespace
// (package storage) from Redis at scrape time: requests ready, in flight
// (running somewhere, or waiting for a retry) and dead-lettered. The
// numbers are cluster-wide: run it in one process (the one running the
// StateCollector, say), not in every worker. A queue whose ready count
// stays flat while nothing is in flight has stalled; a growing dead count
// means requests fail on every delivery.
//
// A scrape is one Redis round trip, bounded by WithScrapeTimeout. When
// Redis fails the scrape still answers, with proxyswitch_queue_up 0.
//
// A QueueCollector is safe for concurrent use; it starts no goroutine.
type QueueCollector struct {
	s       *storage.Storage
	cfg     config
	failing atomic.Bool // the last scrape failed (logged once per run)

	requests, up *prometheus.Desc
}

// NewQueue returns a QueueCollector for s's namespace. Its series carry the
// constant label namespace. It does no I/O. It panics on a nil Storage.
func NewQueue(s *storage.Storage, opts ...Option) *QueueCollector {
	if s == nil {
		panic("metrics: NewQueue with a nil *storage.Storage")
	}
	cl := prometheus.Labels{"namespace": s.Namespace()}
	return &QueueCollector{
		s:   s,
		cfg: newConfig(opts),
		requests: prometheus.NewDesc("proxyswitch_queue_requests",
			"Requests of the shared Colly queue by state: ready (waiting for delivery), in_flight (delivered and not yet acknowledged, or waiting for a retry), dead (dead-lettered).",
			[]string{"state"}, cl),
		up: prometheus.NewDesc("proxyswitch_queue_up",
			"1 if the last read of the queue from Redis succeeded, else 0.", nil, cl),
	}
}

// Describe sends the descriptors of every metric the QueueCollector exports.
func (q *QueueCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- q.requests
	ch <- q.up
}

// Collect reads the queue's counts from Redis and sends them.
func (q *QueueCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), q.cfg.scrapeTimeout)
	defer cancel()
	st, err := q.s.Stats(ctx)
	up := 1.0
	if err != nil {
		up = 0
		if !q.failing.Swap(true) {
			q.cfg.logger.Warn("proxyswitch metrics: reading the queue from Redis failed",
				"namespace", q.s.Namespace(), "err", err)
		}
	} else {
		q.failing.Store(false)
		for _, v := range []struct {
			state string
			n     int
		}{{"ready", st.Ready}, {"in_flight", st.InFlight}, {"dead", st.Dead}} {
			ch <- prometheus.MustNewConstMetric(q.requests, prometheus.GaugeValue, float64(v.n), v.state)
		}
	}
	ch <- prometheus.MustNewConstMetric(q.up, prometheus.GaugeValue, up)
}
