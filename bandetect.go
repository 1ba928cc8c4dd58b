package proxyswitch

import (
	"bytes"
	"compress/gzip"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/andybalholm/cascadia"
)

// Ban detection: what one response means for the proxy that carried it.
//
// Where it runs. Attach installs a RoundTripper (transport.go) in front of an
// *http.Transport whose Proxy is the Switch's ProxyFunc. It sees every hop of
// every request below Colly, reads the body (never more than the collector's
// MaxBodySize), classifies it here and, on a ban or a proxy failure,
// quarantines the proxy (ban.go) and sends the request again through another
// one before Colly sees anything. Colly cannot stop its later OnResponse,
// OnHTML or OnXML callbacks from a hook, so deciding below Colly is the only
// place where a banned page can be kept from the user's parsing: a request
// whose retries run out fails with ErrBanned or ErrProxyFailed, reported by
// OnError and by Visit, never by OnResponse.
//
// Order of the checks, the first decisive one wins:
//
//  1. the user's classifiers (WithClassifier), in order;
//  2. a transport error: a proxy failure, by kind (reasons proxy_*);
//  3. a redirect (a 3xx with a Location) to a URL matching a challenge
//     pattern (captcha, login, block page), other than the URL the chain
//     asked for: a ban of the hop that redirected, "challenge_redirect",
//     judged before the client follows it (so the challenge page is never
//     requested, nor marked visited by Colly's revisit check); and the
//     final URL of a redirect chain matching a challenge pattern (one
//     reached through a redirect this check did not see, such as one a
//     classifier passed): the same ban;
//  4. 407 from the proxy, 502 from a plain-HTTP proxy: a proxy failure;
//  5. a ban status of the site (403, 429, 503 by default): "http_<code>",
//     with Retry-After as the minimum quarantine;
//  6. any other non-2xx answer: neutral (a real 404 is not a ban);
//  7. a 2xx page without a selector the site's pages must contain:
//     "missing_selector";
//  8. a 2xx body far smaller than the site's usual size: "size_drop";
//  9. otherwise the response is OK.

// Kind is what a response says about the proxy that carried it.
type Kind uint8

const (
	// Pass is a classifier's "no opinion": the next check decides. A
	// response every check passes is OK.
	Pass Kind = iota
	// OK is real content: handed to Colly; the proxy's backoff starts over.
	OK
	// Neutral is an answer that is neither content nor a ban, such as a real
	// 404 or a 500: handed to Colly as it is (OnError reports non-2xx
	// statuses), nothing happens to the proxy but its release.
	Neutral
	// Ban means the site refuses this proxy: the proxy is quarantined on the
	// site and the request is sent again through another proxy.
	Ban
	// ProxyFailure means the proxy itself failed: it is quarantined for the
	// (shorter) failure quarantine, counted towards being marked dead, and
	// the request is sent again through another proxy.
	ProxyFailure
)

func (k Kind) String() string {
	switch k {
	case Pass:
		return "pass"
	case OK:
		return "ok"
	case Neutral:
		return "neutral"
	case Ban:
		return "ban"
	case ProxyFailure:
		return "proxy_failure"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Verdict is the classification of one response.
type Verdict struct {
	Kind Kind
	// Reason is a short code for counters and errors, such as "http_429" or
	// "missing_selector" (the Reason... constants). A Ban or ProxyFailure
	// verdict from a classifier whose reason is empty or not a short token
	// of [a-z0-9_.:-] is counted as "custom".
	Reason string
	// RetryAfter is the least quarantine the site asked for (its Retry-After
	// header); the quarantine is never shorter, and never longer than the
	// maximum quarantine.
	RetryAfter time.Duration
}

// Reasons of the built-in checks. A ban status gives "http_<code>", such as
// "http_403".
const (
	ReasonChallenge    = "challenge_redirect" // a redirect to, or a chain ending on, a captcha, login or block page
	ReasonSelector     = "missing_selector"   // a page without a selector it must contain (WithExpect)
	ReasonSizeDrop     = "size_drop"          // a page far smaller than the site's usual size (WithSizeDrop)
	ReasonProxyConnect = "proxy_connect"      // could not connect to the proxy
	ReasonProxyAuth    = "proxy_auth"         // the proxy answered 407: credentials refused
	ReasonProxyTunnel  = "proxy_tunnel"       // the proxy refused the CONNECT tunnel to the site
	ReasonProxyGateway = "proxy_gateway"      // a plain-HTTP proxy answered 502
	ReasonProxyTimeout = "proxy_timeout"      // the attempt outlived WithAttemptTimeout
	ReasonProxyError   = "proxy_error"        // the connection broke (reset, EOF, malformed answer)
	ReasonCustom       = "custom"             // a classifier's verdict without a usable reason
)

// StatusReason is the reason of a ban by status code: "http_<code>".
func StatusReason(code int) string { return "http_" + strconv.Itoa(code) }

// Classifier decides what a response means. It returns Pass to leave the
// decision to the next check. It runs for every hop of every request, on the
// request's goroutine: it must be fast, must not block, must not keep the
// Exchange (or its Body) after it returns and must not panic (a panic is
// recovered and fails the request with an error). It may be called from many
// goroutines at once.
type Classifier func(*Exchange) Verdict

// Exchange is one response (or transport error) as the classifiers see it.
// It is valid only during the call and not safe for concurrent use.
type Exchange struct {
	Site       string        // the site, as the site function names it
	Proxy      *Proxy        // the proxy the attempt went through
	Request    *http.Request // this hop's request; its body is gone
	URL        *url.URL      // this hop's URL: at the end of a redirect chain, the final URL
	OriginURL  *url.URL      // the URL the request (redirect chain) started from
	StatusCode int           // 0 when Err is set
	Header     http.Header   // response header; nil when Err is set
	Body       []byte        // response body, gunzipped, at most the collector's MaxBodySize
	Truncated  bool          // the body went on past what was read
	Err        error         // the transport error; nil when a response came
	Attempt    int           // 1 for the first proxy tried for the request, 2 for the next...
	timedOut   bool          // Err is the attempt timeout's doing
	undecoded  bool          // the body is compressed and could not be decoded
	doc        *goquery.Document
	docErr     error
	parsed     bool
	sizeKey    string // baselineKey, once computed
}

// Redirected reports whether the request got here through redirects to
// another URL.
func (x *Exchange) Redirected() bool {
	// The same *url.URL (a chain's first hop) is no redirect: spare the two
	// String calls on the transport's per-attempt path.
	return x.OriginURL != nil && x.URL != nil && x.URL != x.OriginURL && x.URL.String() != x.OriginURL.String()
}

// Document parses Body as HTML, once, for goquery.
func (x *Exchange) Document() (*goquery.Document, error) {
	if !x.parsed {
		x.parsed = true
		x.doc, x.docErr = goquery.NewDocumentFromReader(bytes.NewReader(x.Body))
	}
	return x.doc, x.docErr
}

// isFinal reports whether the response ends its redirect chain (the client
// follows a 3xx with a Location).
func (x *Exchange) isFinal() bool {
	switch x.StatusCode {
	case 301, 302, 303, 307, 308:
		return x.Header.Get("Location") == ""
	}
	return true
}

// redirectTarget returns the URL a redirect sends the client to: its
// Location resolved against this hop's URL, as net/http resolves it. It is
// nil for a final response and for a Location that does not parse.
func (x *Exchange) redirectTarget() *url.URL {
	if x.isFinal() || x.URL == nil {
		return nil
	}
	u, err := x.URL.Parse(x.Header.Get("Location"))
	if err != nil {
		return nil
	}
	return u
}

// hasBody reports whether the response carries a body worth checking.
func (x *Exchange) hasBody() bool {
	if x.Request != nil && x.Request.Method == http.MethodHead {
		return false
	}
	return x.StatusCode >= 200 && x.StatusCode != http.StatusNoContent && x.StatusCode != http.StatusNotModified
}

// mediaType is the response's media type, lower-cased, without parameters.
func (x *Exchange) mediaType() string {
	mt, _, err := mime.ParseMediaType(x.Header.Get("Content-Type"))
	if err != nil {
		return ""
	}
	return mt
}

// DefaultChallengeURLs returns the default challenge patterns (a new slice):
// regular expressions matched, case-insensitively, against the whole URL a
// redirect sends the client to and the whole final URL of a redirect chain.
// Extend them with WithChallengeURLs(append(DefaultChallengeURLs(), `mine`)...).
func DefaultChallengeURLs() []string {
	return []string{
		`(?i)captcha`,
		`(?i)challenge`,
		`(?i)/cdn-cgi/`,
		`(?i)/(log-?in|sign-?in|logon|auth)([/?#.;]|$)`,
		`(?i)/(blocked|banned|forbidden|access-?denied|anti-?bot|bot-?check|security-?check)([/?#.;]|$)`,
	}
}

// DefaultBanStatus returns the status codes that mean a ban on every site
// without a rule of its own: 403, 429 and 503.
func DefaultBanStatus() []int { return []int{403, 429, 503} }

type expectRule struct {
	site string         // "" = every site
	url  *regexp.Regexp // matched against the request URI; nil = every page
	sels []cascadia.Selector
	raw  []string
}

// rules are the compiled ban rules of a Switch.
type rules struct {
	status      map[string]map[int]bool // site ("" = every other site) -> ban codes
	challenge   []*regexp.Regexp
	expects     []expectRule
	sizeDrop    float64
	classifiers []Classifier
	sizes       baselines
}

func compileRules(c *config) (*rules, error) {
	r := &rules{status: map[string]map[int]bool{}, sizeDrop: c.sizeDrop}
	r.status[""] = codeSet(DefaultBanStatus())
	for site, codes := range c.banStatus {
		for _, code := range codes {
			if code < 100 || code > 599 {
				return nil, configErr("ban status %d for site %q is not an HTTP status code", code, site)
			}
		}
		r.status[site] = codeSet(codes)
	}
	patterns := DefaultChallengeURLs()
	if c.challengeSet {
		patterns = c.challengeURLs
	}
	for _, p := range patterns {
		re, err := regexp.Compile(p)
		if err != nil {
			return nil, configErr("challenge URL pattern %q: %v", p, err)
		}
		r.challenge = append(r.challenge, re)
	}
	for _, e := range c.expects {
		rule := expectRule{site: e.site, raw: e.selectors}
		if e.url != "" {
			re, err := regexp.Compile(e.url)
			if err != nil {
				return nil, configErr("expected-content URL pattern %q: %v", e.url, err)
			}
			rule.url = re
		}
		if len(e.selectors) == 0 {
			return nil, configErr("expected content for site %q, URL %q names no selector", e.site, e.url)
		}
		for _, sel := range e.selectors {
			cs, err := cascadia.Compile(sel)
			if err != nil {
				return nil, configErr("CSS selector %q: %v", sel, err)
			}
			rule.sels = append(rule.sels, cs)
		}
		r.expects = append(r.expects, rule)
	}
	if c.sizeDrop < 0 || c.sizeDrop >= 1 {
		return nil, configErr("size drop ratio %v is outside [0, 1)", c.sizeDrop)
	}
	for _, cl := range c.classifiers {
		if cl == nil {
			return nil, configErr("nil classifier")
		}
	}
	r.classifiers = c.classifiers
	return r, nil
}

func codeSet(codes []int) map[int]bool {
	m := make(map[int]bool, len(codes))
	for _, c := range codes {
		m[c] = true
	}
	return m
}

// classify returns the verdict on x. The error is that of a classifier that
// panicked: the request then fails with it.
func (r *rules) classify(x *Exchange) (Verdict, error) {
	for _, c := range r.classifiers {
		v, err := runClassifier(c, x)
		if err != nil {
			return Verdict{}, err
		}
		if v.Kind != Pass {
			return v, nil
		}
	}
	var v Verdict
	if x.Err != nil {
		v = classifyError(x)
	} else {
		v = r.classifyResponse(x)
	}
	if v.Kind == Pass && x.isFinal() {
		v.Kind = OK
	}
	return v, nil
}

// runClassifier calls c, turning a panic into an error and an unusable
// verdict into a well-formed one.
func runClassifier(c Classifier, x *Exchange) (v Verdict, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("proxyswitch: classifier panicked on %s: %v", x.Site, p)
		}
	}()
	v = c(x)
	if v.Kind > ProxyFailure {
		return Verdict{Kind: Pass}, nil
	}
	if (v.Kind == Ban || v.Kind == ProxyFailure) && !validReason(v.Reason) {
		v.Reason = ReasonCustom
	}
	v.RetryAfter = max(v.RetryAfter, 0)
	return v, nil
}

var reasonRE = regexp.MustCompile(`^[a-z0-9_.:-]{1,64}$`)

func validReason(s string) bool { return reasonRE.MatchString(s) }

// classifyResponse runs the built-in checks 3 to 8 on a response.
func (r *rules) classifyResponse(x *Exchange) Verdict {
	code, final := x.StatusCode, x.isFinal()
	switch {
	case final && x.Redirected() && r.challenged(x.URL), !final && r.challengeRedirect(x):
		return Verdict{Kind: Ban, Reason: ReasonChallenge}
	case code == http.StatusProxyAuthRequired:
		return Verdict{Kind: ProxyFailure, Reason: ReasonProxyAuth}
	case code == http.StatusBadGateway && x.URL.Scheme == "http":
		// Through a plain-HTTP proxy a 502 is the proxy's word that it could
		// not get the page; inside an HTTPS tunnel it is the site's own.
		return Verdict{Kind: ProxyFailure, Reason: ReasonProxyGateway}
	case r.banStatus(x.Site, code):
		return Verdict{Kind: Ban, Reason: StatusReason(code), RetryAfter: parseRetryAfter(x.Header.Get("Retry-After"), time.Now())}
	case !final:
		return Verdict{Kind: Pass}
	case code < 200 || code > 299:
		return Verdict{Kind: Neutral}
	case !x.hasBody() || x.undecoded:
		return Verdict{Kind: OK}
	}
	for _, e := range r.expects {
		if (e.site != "" && e.site != x.Site) || (e.url != nil && !e.url.MatchString(x.URL.RequestURI())) {
			continue
		}
		doc, err := x.Document()
		if err != nil {
			return Verdict{Kind: Ban, Reason: ReasonSelector}
		}
		for _, sel := range e.sels {
			if doc.FindMatcher(goquery.SingleMatcher(sel)).Length() == 0 {
				return Verdict{Kind: Ban, Reason: ReasonSelector}
			}
		}
	}
	if r.sizeDrop > 0 {
		if med, ok := r.sizes.median(x.baselineKey()); ok && float64(len(x.Body)) < r.sizeDrop*float64(med) {
			return Verdict{Kind: Ban, Reason: ReasonSizeDrop}
		}
	}
	return Verdict{Kind: OK}
}

// learn feeds an OK page's size into its site's baseline.
func (r *rules) learn(x *Exchange) {
	if r.sizeDrop > 0 && x.StatusCode >= 200 && x.StatusCode <= 299 && x.hasBody() && !x.undecoded {
		r.sizes.learn(x.baselineKey(), len(x.Body))
	}
}

// baselineKey names x's size baseline, its site and media type, computed
// once: classifyResponse judges by it and learn feeds it.
func (x *Exchange) baselineKey() string {
	if x.sizeKey == "" {
		x.sizeKey = x.Site + "\x00" + x.mediaType()
	}
	return x.sizeKey
}

// challengeRedirect reports whether x redirects to a challenge page other
// than the URL its chain asked for (as the final-URL check spares a page
// asked for that happens to match a pattern).
func (r *rules) challengeRedirect(x *Exchange) bool {
	to := x.redirectTarget()
	return to != nil && (x.OriginURL == nil || to.String() != x.OriginURL.String()) && r.challenged(to)
}

func (r *rules) challenged(u *url.URL) bool {
	s := u.String()
	for _, re := range r.challenge {
		if re.MatchString(s) {
			return true
		}
	}
	return false
}

func (r *rules) banStatus(site string, code int) bool {
	if set, ok := r.status[site]; ok {
		return set[code]
	}
	return r.status[""][code]
}

// tunnelError is a CONNECT answered with another status than 200.
type tunnelError struct{ status int }

func (e *tunnelError) Error() string {
	return fmt.Sprintf("proxyswitch: proxy refused the CONNECT tunnel: %d %s", e.status, http.StatusText(e.status))
}

// classifyError classifies a transport error of an attempt whose request's
// own context is still alive (the transport treats the caller's deadline as
// neutral before it gets here).
func classifyError(x *Exchange) Verdict {
	var te *tunnelError
	var op *net.OpError
	var cve *tls.CertificateVerificationError
	var uae x509.UnknownAuthorityError
	var he x509.HostnameError
	switch {
	case x.timedOut:
		return Verdict{Kind: ProxyFailure, Reason: ReasonProxyTimeout}
	case errors.As(x.Err, &te) && te.status == http.StatusProxyAuthRequired:
		return Verdict{Kind: ProxyFailure, Reason: ReasonProxyAuth}
	case errors.As(x.Err, &te):
		return Verdict{Kind: ProxyFailure, Reason: ReasonProxyTunnel}
	case errors.As(x.Err, &op) && op.Op == "proxyconnect":
		return Verdict{Kind: ProxyFailure, Reason: ReasonProxyConnect}
	case errors.As(x.Err, &cve), errors.As(x.Err, &uae), errors.As(x.Err, &he):
		// The site's certificate: no other proxy would make it valid.
		return Verdict{Kind: Neutral}
	}
	return Verdict{Kind: ProxyFailure, Reason: ReasonProxyError}
}

// parseRetryAfter reads a Retry-After header: seconds or an HTTP date.
// Anything else, or a time in the past, is 0.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		const maxSeconds = int64(100 * 365 * 24 * 3600) // later capped by the max quarantine
		return time.Duration(min(max(n, 0), maxSeconds)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return min(t.Sub(now), 100*365*24*time.Hour)
	}
	return 0
}

// decodeBody returns the body as the classifiers see it: gunzipped (at most
// limit bytes of output, whatever the compression ratio) when it came
// gzip-encoded and net/http left it so. ok is false when it could not be
// decoded.
func decodeBody(resp *http.Response, raw []byte, limit int64) (body []byte, ok bool) {
	if resp.Uncompressed || !strings.Contains(strings.ToLower(resp.Header.Get("Content-Encoding")), "gzip") {
		return raw, true
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		return raw, false
	}
	defer zr.Close()
	out, err := io.ReadAll(io.LimitReader(zr, limit))
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return raw, false
	}
	return out, true
}
