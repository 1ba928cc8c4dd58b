package testbed

import (
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"time"
)

// Attempt is one request a [Flaky] or [PerIPLimit] site answered, in the
// order they arrived.
type Attempt struct {
	ClientIP string
	At       time.Time
	Status   int  // the status the site answered
	Marked   bool // Flaky: the IP is one of the flaky ones
}

// attempts records Attempts under a mutex.
type attempts struct {
	mu   sync.Mutex
	list []Attempt
}

func (a *attempts) add(x Attempt) {
	a.mu.Lock()
	a.list = append(a.list, x)
	a.mu.Unlock()
}

// serve records x and answers it: with next (nil: [DefaultHandler]) when
// its status is 200, else with that status and body.
func (a *attempts) serve(w http.ResponseWriter, r *http.Request, x Attempt, next http.Handler, body string) {
	a.add(x)
	if x.Status != http.StatusOK {
		writeHTML(w, x.Status, "<html><body>"+body+"</body></html>")
		return
	}
	orDefault(next).ServeHTTP(w, r)
}

// Attempts returns a copy of the attempts so far, in arrival order.
func (a *attempts) Attempts() []Attempt {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]Attempt(nil), a.list...)
}

func remoteIP(r *http.Request) string {
	h, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return h
}

// Flaky is a site behind which some IPs are flaky: a request from one of
// them is answered 503 with probability Rate, any other request by Next
// ([DefaultHandler] when nil). Every request is recorded (Attempts). Safe
// for concurrent use.
type Flaky struct {
	attempts
	IPs  map[string]bool // the flaky client IPs
	Rate float64         // the share of their requests answered 503
	Next http.Handler
}

func (f *Flaky) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ip := remoteIP(r)
	x := Attempt{ClientIP: ip, At: time.Now(), Status: http.StatusOK, Marked: f.IPs[ip]}
	if x.Marked && rand.Float64() < f.Rate {
		x.Status = http.StatusServiceUnavailable
	}
	f.serve(w, r, x, f.Next, "try later")
}

// PerIPLimit is a site that allows each client IP one request per Every:
// a request that comes sooner after the last one it accepted from that IP
// is answered 429 (without Retry-After), any other by Next
// ([DefaultHandler] when nil). Every request is recorded (Attempts). Safe
// for concurrent use.
type PerIPLimit struct {
	attempts
	Every time.Duration
	Next  http.Handler

	mu   sync.Mutex
	last map[string]time.Time // last accepted request per IP
}

func (p *PerIPLimit) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ip, now := remoteIP(r), time.Now()
	p.mu.Lock()
	if p.last == nil {
		p.last = make(map[string]time.Time)
	}
	t, seen := p.last[ip]
	ok := !seen || now.Sub(t) >= p.Every
	if ok {
		p.last[ip] = now
	}
	p.mu.Unlock()
	x := Attempt{ClientIP: ip, At: now, Status: http.StatusOK}
	if !ok {
		x.Status = http.StatusTooManyRequests
	}
	p.serve(w, r, x, p.Next, "slow down")
}
