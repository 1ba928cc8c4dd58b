package proxyswitch

import (
	"time"
)

// Observer receives what the Switch sees and does, as it happens, for
// metrics (package metrics implements it for Prometheus). Its methods are
// called on request goroutines: they must be fast, must not block and must
// not panic. Events carry proxy IDs, never URLs or credentials.
type Observer interface {
	// ObserveAttempt is called for every attempt the transport installed by
	// Attach classified.
	ObserveAttempt(AttemptEvent)
	// ObserveQuarantine is called for every quarantine or dead-marking the
	// Switch applied, operator bans (Switch.Ban) included.
	ObserveQuarantine(QuarantineEvent)
}

// AttemptEvent is one classified attempt of a request.
type AttemptEvent struct {
	Pool, Site, ProxyID string
	Kind                Kind          // OK, Neutral, Ban or ProxyFailure
	Reason              string        // the verdict's reason ("" for OK)
	Latency             time.Duration // from sending the attempt to its verdict
}

// QuarantineEvent is one quarantine applied to a proxy on a site.
type QuarantineEvent struct {
	Pool, Site, ProxyID, Reason string
	Kind                        Kind          // Ban or ProxyFailure
	Duration                    time.Duration // the quarantine applied
	InARow                      int           // offences in a row, this one included
	Dead                        bool          // the proxy was marked dead
}

// observerBox lets an interface value live in an atomic.Pointer.
type observerBox struct{ o Observer }

// SetObserver makes o receive the Switch's events from now on; nil removes
// it. There is one observer at a time. It is safe for concurrent use.
func (s *Switch) SetObserver(o Observer) {
	if o == nil {
		s.observer.Store(nil)
		return
	}
	s.observer.Store(&observerBox{o})
}

// Pool returns the name of the pool the Switch leases from.
func (s *Switch) Pool() string { return s.cfg.pool }

func (s *Switch) observeAttempt(site string, p *Proxy, v Verdict, latency time.Duration) {
	if b := s.observer.Load(); b != nil {
		b.o.ObserveAttempt(AttemptEvent{Pool: s.cfg.pool, Site: site, ProxyID: p.id, Kind: v.Kind, Reason: v.Reason, Latency: latency})
	}
}

func (s *Switch) observeQuarantine(site string, p *Proxy, v Verdict, pen penalty) {
	if b := s.observer.Load(); b != nil {
		b.o.ObserveQuarantine(QuarantineEvent{Pool: s.cfg.pool, Site: site, ProxyID: p.id, Reason: v.Reason, Kind: v.Kind,
			Duration: pen.quarantine, InARow: pen.strikes, Dead: pen.dead})
	}
}
