package proxyswitchtest

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"sync"
	"time"
)

// Treatment is what a [Guard] serves one client IP.
type Treatment int

const (
	// Serve passes the request to the wrapped handler: the real page.
	Serve Treatment = iota
	// Placeholder answers 200 with a stub page without the product (a
	// quiet ban: the status says all is well).
	Placeholder
	// Forbid answers 403.
	Forbid
	// Truncate serves the real page cut to a tenth of its length (the
	// product tag is still there, most of the page is not).
	Truncate
	// Challenge redirects (302) to the captcha page.
	Challenge
)

// String returns the treatment's name: "serve", "placeholder", "forbid",
// "truncate" or "challenge".
func (t Treatment) String() string {
	switch t {
	case Serve:
		return "serve"
	case Placeholder:
		return "placeholder"
	case Forbid:
		return "forbid"
	case Truncate:
		return "truncate"
	case Challenge:
		return "challenge"
	}
	return "Treatment(" + strconv.Itoa(int(t)) + ")"
}

// Decision is what a [Guard] did with one request.
type Decision string

// Decisions of a [Guard].
const (
	DecidedPage        Decision = "page"        // served by the wrapped handler
	DecidedPlaceholder Decision = "placeholder" // 200 stub without the product
	DecidedTruncated   Decision = "truncated"   // the page cut short
	DecidedForbidden   Decision = "403"         // burnt or blocked IP
	DecidedRateLimited Decision = "429"         // too many requests
	DecidedCaptcha     Decision = "captcha"     // 302 to the captcha page
	DecidedCaptchaPage Decision = "captcha_page"
)

// GuardHit is one request as a [Guard] judged it.
type GuardHit struct {
	IP       string    // the client IP
	Path     string    // r.URL.Path
	Decision Decision  // what the guard did
	At       time.Time // when the request arrived
}

// Pages of a [Guard].
const (
	CaptchaPath     = "/captcha"
	PlaceholderHTML = `<html><body><div class="stub">This product is temporarily unavailable</div></body></html>`
	CaptchaHTML     = `<html><body><form class="captcha" action="/captcha"><p>Prove you are human</p><input name="answer"></form></body></html>`
)

// Guard is an anti-bot layer in front of a site's handler, modelled on
// how marketplaces treat scrapers. It is a middleware: compose it inside the
// site's recorder, as StartSite(name, NewGuard(h)) does, so that the
// recorder sees every request, refused ones included.
//
// Per client IP (the proxy's source IP), in this order:
//
//   - [CaptchaPath] serves the captcha page (200, form.captcha).
//   - An IP given a [Treatment] by [Guard.Burn] gets it every time.
//   - An IP blocked for too many 429s (or captchas) gets 403 until the
//     block ends.
//   - An IP on the Shared blacklist gets the Listed treatment.
//   - With CaptchaOnConcurrent, a request arriving while another from the
//     same IP is in flight is redirected (302) to the captcha page; after
//     BlockAfterCaptchas such redirects the IP is blocked for BlockFor.
//   - With RateLimit set, a request beyond RateLimit requests from one IP
//     within RateWindow gets 429 (with Retry-After when RetryAfter is set);
//     after BlockAfter such answers the IP is blocked for BlockFor.
//   - Otherwise the wrapped handler serves the page.
//
// An IP blocked here is also added to Shared, when set: marketplaces that
// share one blacklist refuse, each in its own way, an IP any of them blocked.
//
// Set the fields before the site serves; its methods are safe for concurrent
// use.
type Guard struct {
	RateLimit           int           // requests per IP per RateWindow; 0: no limit
	RateWindow          time.Duration // default 1s
	RetryAfter          time.Duration // Retry-After of a 429, whole seconds; 0: none
	BlockAfter          int           // 429s before the IP is blocked; 0: never
	BlockFor            time.Duration // default 1m
	CaptchaOnConcurrent bool          // redirect a request that overlaps another from its IP
	BlockAfterCaptchas  int           // captcha redirects before the IP is blocked; 0: never
	Shared              *Blacklist    // a blacklist shared with other marketplaces; nil: none
	Listed              Treatment     // what an IP on Shared gets; Serve (the zero value) means Forbid

	next http.Handler

	mu       sync.Mutex
	visitors map[string]*visitor
	treat    map[string]Treatment
	hits     []GuardHit
	blocks   int
}

type visitor struct {
	recent   []time.Time // request times within the rate window
	limited  int         // 429s answered
	captchas int         // captcha redirects for concurrent requests
	blocked  time.Time   // 403 until then
	inFlight int
}

// NewGuard wraps next, the site's own handler (nil: every page is 404),
// with no limit set: set the fields before the site serves.
func NewGuard(next http.Handler) *Guard {
	if next == nil {
		next = http.NotFoundHandler()
	}
	return &Guard{next: next, visitors: map[string]*visitor{}, treat: map[string]Treatment{}}
}

// Burn gives ip a treatment for every request from now on (Serve lifts it).
func (m *Guard) Burn(ip string, t Treatment) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if t == Serve {
		delete(m.treat, ip)
		return
	}
	m.treat[ip] = t
}

// Hits returns every request judged so far, in arrival order.
func (m *Guard) Hits() []GuardHit {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]GuardHit(nil), m.hits...)
}

// Count returns how many requests got decision d.
func (m *Guard) Count(d Decision) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, h := range m.hits {
		if h.Decision == d {
			n++
		}
	}
	return n
}

// ServeHTTP judges the request and answers it: a refusal, or the wrapped
// handler's page.
func (m *Guard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ip := clientIP(r.RemoteAddr)
	d, retryAfter := m.decide(ip, r)
	switch d {
	case DecidedCaptchaPage:
		writeHTML(w, http.StatusOK, CaptchaHTML)
	case DecidedPlaceholder:
		writeHTML(w, http.StatusOK, PlaceholderHTML)
	case DecidedForbidden:
		writeHTML(w, http.StatusForbidden, "<html><body>Access denied</body></html>")
	case DecidedRateLimited:
		if retryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(int(retryAfter/time.Second)))
		}
		writeHTML(w, http.StatusTooManyRequests, "<html><body>Too many requests</body></html>")
	case DecidedCaptcha:
		w.Header().Set("Location", CaptchaPath+"?return="+url.QueryEscape(r.URL.RequestURI()))
		w.WriteHeader(http.StatusFound)
	case DecidedTruncated:
		m.serve(ip, func() { truncate(w, r, m.next) })
	default:
		m.serve(ip, func() { m.next.ServeHTTP(w, r) })
	}
}

// decide judges one request and records the decision.
func (m *Guard) decide(ip string, r *http.Request) (Decision, time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	d, retryAfter := m.decideLocked(ip, r, now)
	m.hits = append(m.hits, GuardHit{IP: ip, Path: r.URL.Path, Decision: d, At: now})
	if d == DecidedPage || d == DecidedTruncated {
		m.visitor(ip).inFlight++ // ended by serve
	}
	return d, retryAfter
}

func (m *Guard) decideLocked(ip string, r *http.Request, now time.Time) (Decision, time.Duration) {
	if r.URL.Path == CaptchaPath {
		return DecidedCaptchaPage, 0
	}
	if d, ok := treated(m.treat[ip]); ok {
		return d, 0
	}
	v := m.visitor(ip)
	if now.Before(v.blocked) {
		return DecidedForbidden, 0
	}
	if m.Shared.Has(ip) {
		if d, ok := treated(m.Listed); ok {
			return d, 0
		}
		return DecidedForbidden, 0
	}
	if m.CaptchaOnConcurrent && v.inFlight > 0 {
		v.captchas++
		if m.BlockAfterCaptchas > 0 && v.captchas >= m.BlockAfterCaptchas {
			m.block(ip, v, now)
		}
		return DecidedCaptcha, 0
	}
	if m.RateLimit > 0 {
		window := m.RateWindow
		if window <= 0 {
			window = time.Second
		}
		keep := v.recent[:0]
		for _, t := range v.recent {
			if now.Sub(t) < window {
				keep = append(keep, t)
			}
		}
		v.recent = append(keep, now)
		if len(v.recent) > m.RateLimit {
			v.limited++
			if m.BlockAfter > 0 && v.limited > m.BlockAfter {
				m.block(ip, v, now)
				return DecidedForbidden, 0
			}
			return DecidedRateLimited, m.RetryAfter
		}
	}
	return DecidedPage, 0
}

// treated is the decision a treatment given to an IP makes; false for Serve.
func treated(t Treatment) (Decision, bool) {
	switch t {
	case Placeholder:
		return DecidedPlaceholder, true
	case Forbid:
		return DecidedForbidden, true
	case Truncate:
		return DecidedTruncated, true
	case Challenge:
		return DecidedCaptcha, true
	}
	return "", false
}

// block blocks ip for BlockFor and lists it on the shared blacklist.
func (m *Guard) block(ip string, v *visitor, now time.Time) {
	blockFor := m.BlockFor
	if blockFor <= 0 {
		blockFor = time.Minute
	}
	v.blocked = now.Add(blockFor)
	m.blocks++
	m.Shared.Add(ip)
}

// Blocks returns how many times this marketplace blocked an IP (for too
// many 429s or captchas).
func (m *Guard) Blocks() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.blocks
}

func (m *Guard) visitor(ip string) *visitor {
	v := m.visitors[ip]
	if v == nil {
		v = &visitor{}
		m.visitors[ip] = v
	}
	return v
}

// serve runs f as an in-flight request of ip.
func (m *Guard) serve(ip string, f func()) {
	defer func() {
		m.mu.Lock()
		m.visitor(ip).inFlight--
		m.mu.Unlock()
	}()
	f()
}

// truncate serves next's answer cut to a tenth of its body, as a complete,
// well-formed response (Content-Length matches what is sent).
func truncate(w http.ResponseWriter, r *http.Request, next http.Handler) {
	rec := httptest.NewRecorder()
	next.ServeHTTP(rec, r)
	body := rec.Body.Bytes()
	body = bytes.Clone(body[:len(body)/10])
	for k, vs := range rec.Header() {
		w.Header()[k] = vs
	}
	w.Header().Set("Content-Length", fmt.Sprint(len(body)))
	w.WriteHeader(rec.Code)
	w.Write(body)
}

// writeHTML answers code with an HTML body of a known length.
func writeHTML(w http.ResponseWriter, code int, body string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(code)
	_, _ = io.WriteString(w, body)
}

// Blacklist is a list of client IPs that several [Guard]s share, as
// platforms that buy one anti-bot service or swap block lists do: an IP one
// of them blocks is refused by all of them. A nil *Blacklist lists nothing.
// It is safe for concurrent use.
type Blacklist struct {
	mu  sync.Mutex
	ips map[string]bool
}

// NewBlacklist returns a blacklist listing ips (IPs burnt before the crawl).
func NewBlacklist(ips ...string) *Blacklist {
	b := &Blacklist{ips: make(map[string]bool, len(ips))}
	for _, ip := range ips {
		b.ips[ip] = true
	}
	return b
}

// Add lists ip; it reports whether ip was not listed yet.
func (b *Blacklist) Add(ip string) bool {
	if b == nil {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ips[ip] {
		return false
	}
	b.ips[ip] = true
	return true
}

// Has reports whether ip is listed.
func (b *Blacklist) Has(ip string) bool {
	if b == nil {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ips[ip]
}

// Len returns how many IPs are listed.
func (b *Blacklist) Len() int {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.ips)
}
