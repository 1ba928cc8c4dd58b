package metrics

import (
	"context"
	"log/slog"
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
	s      *storage.Storage
	cfg    config
	health readHealth

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
	up, _ := q.health.report(q.cfg.logger, err, "proxyswitch metrics: reading the queue from Redis failed", "namespace", q.s.Namespace())
	if err == nil {
		for _, v := range []struct {
			state string
			n     int
		}{{"ready", st.Ready}, {"in_flight", st.InFlight}, {"dead", st.Dead}} {
			ch <- prometheus.MustNewConstMetric(q.requests, prometheus.GaugeValue, float64(v.n), v.state)
		}
	}
	ch <- prometheus.MustNewConstMetric(q.up, prometheus.GaugeValue, up)
}

// readHealth gives the "up" gauge of a collector that reads Redis at
// scrape time (StateCollector, QueueCollector) and logs a failed read once
// per run of failures. It is safe for concurrent use.
type readHealth struct {
	failing atomic.Bool // the last scrape failed
}

// report returns the up gauge's value for a scrape whose read returned err
// (1 for nil, else 0). A failure that starts a run is logged as a warning:
// msg, then attrs and the error. recovered tells that err is nil and ends
// a run of failures.
func (h *readHealth) report(logger *slog.Logger, err error, msg string, attrs ...any) (up float64, recovered bool) {
	if err != nil {
		if !h.failing.Swap(true) {
			logger.Warn(msg, append(attrs, "err", err)...)
		}
		return 0, false
	}
	return 1, h.failing.Swap(false)
}
