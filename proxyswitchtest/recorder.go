package proxyswitchtest

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// DirectIP is the client IP a site sees when a crawler connects to it
// directly instead of through one of the fake proxies. Fake proxies never use
// it as their source IP.
const DirectIP = "127.0.0.1"

// Hit is one request recorded by a [Recorder].
type Hit struct {
	Method   string // r.Method
	Path     string // r.URL.Path
	Query    string // r.URL.RawQuery
	ClientIP string // IP part of r.RemoteAddr
	Via      string // Via request header, "" if absent
	Status   int    // status code the handler answered with (200 if it never wrote)
	// Start is the arrival time; End is the end of the in-flight interval
	// (first write of the response, or handler return if it never wrote).
	Start, End time.Time
	// Collided reports whether another request from the same ClientIP was in
	// flight when this one arrived.
	Collided bool
}

// Duration is the length of the in-flight interval.
func (h Hit) Duration() time.Duration { return h.End.Sub(h.Start) }

// Recorder is the ground truth of a site: it wraps a handler and records
// every request together with per-client-IP in-flight accounting.
//
// A hit is appended when its in-flight interval ends, which is before the
// first byte of the response is written, so once a client has received a
// response its hit is visible in Hits/Count/IPs.
//
// All methods are safe for concurrent use. The zero value is not usable; use
// [NewRecorder].
type Recorder struct {
	mu     sync.Mutex
	hits   []Hit
	ips    map[string]int
	direct int
	fl     inflight
}

// NewRecorder returns an empty recorder.
func NewRecorder() *Recorder {
	return &Recorder{ips: make(map[string]int), fl: newInflight()}
}

// Wrap returns a handler that records every request and then calls h.
func (r *Recorder) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		hit := Hit{
			Method:   req.Method,
			Path:     req.URL.Path,
			Query:    req.URL.RawQuery,
			ClientIP: clientIP(req.RemoteAddr),
			Via:      req.Header.Get("Via"),
		}
		r.mu.Lock()
		hit.Start = time.Now()
		hit.Collided = r.fl.begin(hit.ClientIP)
		r.mu.Unlock()

		rw := &recWriter{ResponseWriter: w, done: func(status int) {
			hit.Status = status
			r.finish(hit)
		}}
		defer rw.finish(http.StatusOK) // never wrote (or panicked)
		h.ServeHTTP(rw, req)
	})
}

func (r *Recorder) finish(hit Hit) {
	r.mu.Lock()
	defer r.mu.Unlock()
	hit.End = time.Now()
	r.fl.end(hit.ClientIP)
	r.hits = append(r.hits, hit)
	r.ips[hit.ClientIP]++
	if isDirectIP(hit.ClientIP) {
		r.direct++
	}
}

// Hits returns a copy of all recorded hits, in the order their in-flight
// intervals ended.
func (r *Recorder) Hits() []Hit {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Hit(nil), r.hits...)
}

// Count returns the number of recorded hits.
func (r *Recorder) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.hits)
}

// MaxConcurrentPerIP returns the maximum number of simultaneously in-flight
// requests seen from a single client IP.
func (r *Recorder) MaxConcurrentPerIP() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fl.max
}

// MaxConcurrentByIP returns, per client IP, the maximum number of
// simultaneously in-flight requests.
func (r *Recorder) MaxConcurrentByIP() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return copyMap(r.fl.maxByKey)
}

// Collisions returns the number of request arrivals that found another
// request from the same client IP in flight.
func (r *Recorder) Collisions() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fl.collisions
}

// InFlight returns the number of requests currently in flight.
func (r *Recorder) InFlight() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fl.inFlight()
}

// DirectHits returns the number of hits whose client IP is [DirectIP] (or
// ::1), i.e. requests that did not go through a fake proxy and exposed the
// crawler's real address.
func (r *Recorder) DirectHits() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.direct
}

// IPs returns the number of hits per client IP.
func (r *Recorder) IPs() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return copyMap(r.ips)
}

// Reset clears all hits and statistics. The in-flight counters are kept, so
// a request in flight during Reset still ends correctly: it is recorded as a
// hit when it ends and still counts as a collision partner for new arrivals.
// For clean numbers call Reset while the site is idle.
func (r *Recorder) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hits = nil
	clear(r.ips)
	r.direct = 0
	r.fl.resetStats()
}

// recWriter ends the in-flight interval on the first response write.
type recWriter struct {
	http.ResponseWriter
	done  func(status int)
	ended bool
}

func (w *recWriter) finish(status int) {
	if !w.ended {
		w.ended = true
		w.done(status)
	}
}

func (w *recWriter) WriteHeader(code int) {
	// 1xx informational responses (except 101) are not final.
	if code >= 200 || code == http.StatusSwitchingProtocols {
		w.finish(code)
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *recWriter) Write(b []byte) (int, error) {
	w.finish(http.StatusOK)
	return w.ResponseWriter.Write(b)
}

// Flush implements http.Flusher.
func (w *recWriter) Flush() {
	w.finish(http.StatusOK)
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *recWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func clientIP(remoteAddr string) string {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		return remoteAddr
	}
	return host
}

func isDirectIP(ip string) bool { return ip == DirectIP || ip == "::1" }
