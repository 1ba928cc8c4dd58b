package proxyswitch

import (
	"strings"
	"time"

	"github.com/proxyswitch/proxyswitch/ban"
)

// Observer receives what the Switch sees and does, as it happens, for
// metrics (package metrics implements it for Prometheus). Its methods are
// called on request goroutines: they must be fast, must not block and must
// not panic. Events carry proxy IDs, never URLs or credentials.
type Observer interface {
	// ObserveAttempt: every attempt Attach's transport classified.
	ObserveAttempt(AttemptEvent)
	// ObserveQuarantine: every quarantine or dead mark, Ban included.
	ObserveQuarantine(QuarantineEvent)
	// ObserveSession: a session this process starts, retires or ends.
	ObserveSession(SessionEvent)
	// ObserveEvidence: what the evidence or a session's error score made
	// of a refusal.
	ObserveEvidence(EvidenceEvent)
}

// AttemptEvent is one classified attempt of a request.
type AttemptEvent struct {
	Pool, Site, ProxyID string
	Kind                ban.Kind      // ban.OK, ban.Neutral, ban.Ban or ban.ProxyFailure
	Reason              string        // the verdict's reason ("" for OK; ban.ReasonUnchecked for a Neutral page the content checks could not read)
	Latency             time.Duration // from sending the attempt to its verdict
	// Labels are the proxy's labels, "k=v,k=v" (possibly stale for 10s).
	Labels string
}

// QuarantineEvent is one quarantine applied to a proxy on a site.
type QuarantineEvent struct {
	Pool, Site, ProxyID, Reason string
	Kind                        ban.Kind      // ban.Ban or ban.ProxyFailure
	Duration                    time.Duration // the quarantine applied
	InARow                      int           // offences in a row, this one included
	Dead                        bool          // the proxy was marked dead
	// Rotated says the proxy, a virtual proxy of a gateway entry, was
	// replaced by a new session of its gateway instead of quarantined
	// (Duration is 0).
	Rotated bool
}

// SessionEvent is a sticky session starting, or ending in this process.
type SessionEvent struct {
	Pool    string // the pool the session leases from (Sessions.Pool)
	ProxyID string
	Ended   bool   // false: the session started; true: it was retired or ended
	Site    string // where it started, or where its end's reason showed
	// Reason is why it ended: a verdict's reason or a Session... reason.
	Reason   string
	Requests int           // Ended: the requests it served
	Age      time.Duration // Ended: from its start to its end (Redis clock)
}

// EvidenceEvent is a step of the evidence against a proxy on a site, or a
// soft refusal a sticky session scored. What is one of "confirmed" (a strike
// became a ban), "lifted" (a strike was taken back), "page_refused" (a
// request failed with ErrPageRefused), "session_kept" (a soft refusal the
// session survived) and "session_spent" (one that retired the session).
type EvidenceEvent struct {
	Pool, Site, ProxyID string
	What                string
	Reason              string // the refusal's verdict reason ("http_403"...); "" for confirmed and lifted
}

// observers returns an Observer that hands every event to each of os in
// turn (nil ones are skipped); nil for none, the observer itself for one.
func observers(os ...Observer) Observer {
	var fan multiObserver
	for _, o := range os {
		if o != nil {
			fan = append(fan, o)
		}
	}
	switch len(fan) {
	case 0:
		return nil
	case 1:
		return fan[0]
	}
	return fan
}

type multiObserver []Observer

func (m multiObserver) ObserveEvidence(e EvidenceEvent) {
	for _, o := range m {
		o.ObserveEvidence(e)
	}
}

func (m multiObserver) ObserveAttempt(e AttemptEvent) {
	for _, o := range m {
		o.ObserveAttempt(e)
	}
}

func (m multiObserver) ObserveQuarantine(e QuarantineEvent) {
	for _, o := range m {
		o.ObserveQuarantine(e)
	}
}

func (m multiObserver) ObserveSession(e SessionEvent) {
	for _, o := range m {
		o.ObserveSession(e)
	}
}

// observerList returns the observers SetObserver set, one by one.
func (s *Switch) observerList() []any {
	b := s.observer.Load()
	if b == nil {
		return nil
	}
	if m, ok := b.o.(multiObserver); ok {
		out := make([]any, len(m))
		for i, o := range m {
			out[i] = o
		}
		return out
	}
	return []any{b.o}
}

// observerBox lets an interface value live in an atomic.Pointer.
type observerBox struct{ o Observer }

// SetObserver makes os (nil ones skipped) receive the Switch's events from
// now on, replacing the observers set before. It is safe for concurrent use.
func (s *Switch) SetObserver(os ...Observer) {
	o := observers(os...)
	if o == nil {
		s.observer.Store(nil)
		return
	}
	s.observer.Store(&observerBox{o})
}

// Pool returns the name of the pool the Switch leases from.
func (s *Switch) Pool() string { return s.cfg.pool }

// observerOf returns the Switch's observer, nil for none.
func (s *Switch) observerOf() Observer {
	if b := s.observer.Load(); b != nil {
		return b.o
	}
	return nil
}

func (s *Switch) observeAttempt(pool, site string, p *Proxy, v ban.Verdict, latency time.Duration) {
	if o := s.observerOf(); o != nil {
		o.ObserveAttempt(AttemptEvent{Pool: pool, Site: site, ProxyID: p.id, Kind: v.Kind, Reason: v.Reason, Latency: latency,
			Labels: s.labelsFor(pool, p.id)})
	}
}

func (s *Switch) observeQuarantine(pool, site string, p *Proxy, v ban.Verdict, pen penalty) {
	if o := s.observerOf(); o != nil {
		o.ObserveQuarantine(QuarantineEvent{Pool: pool, Site: site, ProxyID: p.id, Reason: v.Reason, Kind: v.Kind,
			Duration: pen.quarantine, InARow: pen.strikes, Dead: pen.dead, Rotated: pen.rotated})
	}
}

// observeSessionStart tells the observer of a session that started on site
// with the proxy of member ("<id>:<slot>").
func (s *Switch) observeSessionStart(pool, site, member string) {
	if o := s.observerOf(); o != nil {
		id, _, _ := strings.Cut(member, ":")
		o.ObserveSession(SessionEvent{Pool: pool, ProxyID: id, Site: site})
	}
}

// observeSessionEnd tells the observer of a session that ended.
func (s *Switch) observeSessionEnd(pool string, r SessionRetirement) {
	if o := s.observerOf(); o != nil {
		o.ObserveSession(SessionEvent{Pool: pool, ProxyID: r.ProxyID, Ended: true, Site: r.Site, Reason: r.Reason,
			Requests: r.Requests, Age: max(r.At.Sub(r.Started), 0)})
	}
}

// observeEvidence tells the observer of a step of the evidence (EvidenceEvent's What).
func (s *Switch) observeEvidence(pool, site string, p *Proxy, what, reason string) {
	if o := s.observerOf(); o != nil {
		o.ObserveEvidence(EvidenceEvent{Pool: pool, Site: site, ProxyID: p.id, What: what, Reason: reason})
	}
}
