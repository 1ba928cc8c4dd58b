package testbed

import (
	"net/http"
	"sync/atomic"
	"time"
)

// Storm is a site-wide storm in front of a site's handler: from From to
// To (set before the site serves) every request is answered 429 Too Many
// Requests, whoever sends it, as a site does that rate-limits or challenges
// every client for a while; before and after, Next serves. Times are
// absolute, so that collectors in other processes meet the same storm. It
// counts what it refused and what it let through, by phase. Safe for
// concurrent use.
//
// Status, when set, is the storm's answer instead of 429 (a 502 of a site
// that is down: through a plain-HTTP proxy, the proxy's 502). Delay, when
// set, makes the storm a slowdown instead: every request waits Delay (or
// until it is cancelled), then Next serves it.
type Storm struct {
	Next     http.Handler // must be set (NewStorm sets it)
	From, To time.Time
	Status   int           // the storm's answer; 0: 429
	Delay    time.Duration // a slowdown instead of a refusal; 0: none

	before, during, after atomic.Int64
}

// NewStorm returns a Storm in front of next (nil: [DefaultHandler]) from
// from, for d.
func NewStorm(next http.Handler, from time.Time, d time.Duration) *Storm {
	return &Storm{Next: orDefault(next), From: from, To: from.Add(d)}
}

func (s *Storm) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	switch {
	case now.Before(s.From):
		s.before.Add(1)
	case now.Before(s.To):
		s.during.Add(1)
		if s.Delay > 0 {
			select {
			case <-time.After(s.Delay):
			case <-r.Context().Done():
				return
			}
			s.Next.ServeHTTP(w, r)
			return
		}
		code := s.Status
		if code == 0 {
			code = http.StatusTooManyRequests
		}
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(code)
		_, _ = w.Write([]byte("<html><body>" + http.StatusText(code) + "</body></html>"))
		return
	default:
		s.after.Add(1)
	}
	s.Next.ServeHTTP(w, r)
}

// Counts returns the requests the site got before, during and after the
// storm.
func (s *Storm) Counts() (before, during, after int64) {
	return s.before.Load(), s.during.Load(), s.after.Load()
}
