package ban

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/andybalholm/cascadia"
)

// Rules configure the built-in checks of a Detector. Start from
// DefaultRules, whose values are the "Default" of each field below: the zero
// Rules has no ban status, no challenge pattern, no expected content and no
// size check, so that only transport errors, a proxy's 407 and a plain-HTTP
// proxy's 502 are judged (besides the classifiers). proxyswitch's ban
// options (WithBanStatus, WithChallengeURLs, WithExpect, WithSizeDrop,
// WithClassifier) set these fields.
type Rules struct {
	// BanStatus maps a site (as the site function names it) to the HTTP
	// status codes that mean the site bans the proxy; the entry "" is for
	// every site without an entry of its own. No codes means none is a ban
	// there. Default: "" -> DefaultBanStatus.
	BanStatus map[string][]int
	// ChallengeURLs are regular expressions (Go syntax) naming captcha,
	// login and block pages, matched against the whole URL a redirect sends
	// the client to and the whole final URL of a redirect chain. None turns
	// the check off. Default: DefaultChallengeURLs.
	ChallengeURLs []string
	// Expect are the CSS selectors 2xx pages must contain. Several rules may
	// apply to one page; each is checked. Default: none.
	Expect []Expect
	// SizeDrop makes a 2xx body a ban (ReasonSizeDrop) when it is below
	// SizeDrop times the median size of the latest 64 OK pages of the same
	// site and media type, once 16 of them are known (see Detector.Learn).
	// It must be in [0, 1); 0 turns the check off. Default: 0.25.
	SizeDrop float64
	// Classifiers run before the built-in checks, in order; the first one
	// that does not Pass decides. Default: none.
	Classifiers []Classifier
}

// Expect is a rule of expected content: every 2xx page of Site ("" = every
// site) whose request URI (path and query) matches URL (a Go regular
// expression; "" = every page) must contain each of Selectors (CSS, goquery
// syntax; at least one). A page without one is a soft ban (ReasonSelector):
// a captcha, a placeholder or an empty page served with 200.
type Expect struct {
	Site      string
	URL       string
	Selectors []string
}

// DefaultRules returns the default rules (new maps and slices, the caller's
// to change): DefaultBanStatus on every site, DefaultChallengeURLs, a size
// drop ratio of 0.25, no expected content and no classifier.
func DefaultRules() Rules {
	return Rules{
		BanStatus:     map[string][]int{"": DefaultBanStatus()},
		ChallengeURLs: DefaultChallengeURLs(),
		SizeDrop:      0.25,
	}
}

// DefaultChallengeURLs returns the default challenge patterns (a new slice):
// regular expressions matched, case-insensitively, against the whole URL a
// redirect sends the client to and the whole final URL of a redirect chain.
// Extend them with
// proxyswitch.WithChallengeURLs(append(ban.DefaultChallengeURLs(), `mine`)...).
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
	site  string         // "" = every site
	url   *regexp.Regexp // matched against the request URI; nil = every page
	sels  []cascadia.Selector
	quick bool // every selector is a quickSelector: a scan of the tags may find them (Exchange.contains)
}

// Detector runs the classifiers and the built-in checks of its Rules on
// exchanges, and learns the usual page sizes the size check judges by (in
// memory, its own: two Detectors learn apart). It is safe for concurrent
// use.
type Detector struct {
	status      map[string]map[int]bool // site ("" = every other site) -> ban codes
	challenge   []*regexp.Regexp
	expects     []expectRule
	sizeDrop    float64
	classifiers []Classifier
	sizes       baselines
}

// NewDetector compiles r. The error names the first bad rule: a status code
// outside 100..599, a pattern or selector that does not compile, an Expect
// without selectors, a size drop ratio outside [0, 1), a nil classifier.
// Later changes to r do not reach the Detector.
func NewDetector(r Rules) (*Detector, error) {
	d := &Detector{status: map[string]map[int]bool{}, sizeDrop: r.SizeDrop}
	for site, codes := range r.BanStatus {
		for _, code := range codes {
			if code < 100 || code > 599 {
				return nil, fmt.Errorf("ban: ban status %d for site %q is not an HTTP status code", code, site)
			}
		}
		d.status[site] = codeSet(codes)
	}
	for _, p := range r.ChallengeURLs {
		re, err := regexp.Compile(p)
		if err != nil {
			return nil, fmt.Errorf("ban: challenge URL pattern %q: %w", p, err)
		}
		d.challenge = append(d.challenge, re)
	}
	for _, e := range r.Expect {
		rule := expectRule{site: e.Site}
		if e.URL != "" {
			re, err := regexp.Compile(e.URL)
			if err != nil {
				return nil, fmt.Errorf("ban: expected-content URL pattern %q: %w", e.URL, err)
			}
			rule.url = re
		}
		if len(e.Selectors) == 0 {
			return nil, fmt.Errorf("ban: expected content for site %q, URL %q names no selector", e.Site, e.URL)
		}
		rule.quick = true
		for _, sel := range e.Selectors {
			rule.quick = rule.quick && quickSelector.MatchString(strings.TrimSpace(sel))
			cs, err := cascadia.Compile(sel)
			if err != nil {
				return nil, fmt.Errorf("ban: CSS selector %q: %w", sel, err)
			}
			rule.sels = append(rule.sels, cs)
		}
		d.expects = append(d.expects, rule)
	}
	if !(r.SizeDrop >= 0 && r.SizeDrop < 1) { // NaN too
		return nil, fmt.Errorf("ban: size drop ratio %v is outside [0, 1)", r.SizeDrop)
	}
	for _, cl := range r.Classifiers {
		if cl == nil {
			return nil, errors.New("ban: nil classifier")
		}
	}
	d.classifiers = slices.Clone(r.Classifiers)
	return d, nil
}

func codeSet(codes []int) map[int]bool {
	m := make(map[int]bool, len(codes))
	for _, c := range codes {
		m[c] = true
	}
	return m
}

// Classify returns the verdict on x: the first classifier's that does not
// Pass, else the built-in checks' (see the package documentation for their
// order). A final response no check decides is OK; a redirect hop no check
// decides is Pass. A classifier's verdict is made well-formed: an unknown
// Kind is Pass, a Ban or ProxyFailure without a valid reason gets
// ReasonCustom, a negative RetryAfter is 0. The error is that of a
// classifier that panicked (the request then fails with it). Classify may
// parse x's Body (Document) and caches what it computes in x.
func (d *Detector) Classify(x *Exchange) (Verdict, error) {
	for _, c := range d.classifiers {
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
		v = d.classifyResponse(x)
	}
	if v.Kind == Pass && x.Final() {
		v.Kind = OK
	}
	return v, nil
}

// Learn feeds the size of x, a final response classified OK, into the size
// baseline of its site and media type. It does nothing when the size check
// is off, or for a response other than a decoded 2xx with a body read whole
// (not Undecoded, not Truncated).
func (d *Detector) Learn(x *Exchange) {
	if d.sizeDrop > 0 && x.StatusCode >= 200 && x.StatusCode <= 299 && x.HasBody() && !x.Undecoded && !x.Truncated {
		d.sizes.learn(x.baselineKey(), len(x.Body))
	}
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
	if (v.Kind == Ban || v.Kind == ProxyFailure) && !ValidReason(v.Reason) {
		v.Reason = ReasonCustom
	}
	v.RetryAfter = max(v.RetryAfter, 0)
	return v, nil
}

// classifyResponse runs the built-in checks 3 to 8 on a response.
func (d *Detector) classifyResponse(x *Exchange) Verdict {
	code, final := x.StatusCode, x.Final()
	switch {
	case final && x.Redirected() && d.challenged(x.URL), !final && d.challengeRedirect(x):
		return Verdict{Kind: Ban, Reason: ReasonChallenge}
	case code == http.StatusProxyAuthRequired:
		return Verdict{Kind: ProxyFailure, Reason: ReasonProxyAuth}
	case code == http.StatusBadGateway && x.URL.Scheme == "http":
		// Through a plain-HTTP proxy a 502 is the proxy's word that it could
		// not get the page; inside an HTTPS tunnel it is the site's own.
		return Verdict{Kind: ProxyFailure, Reason: ReasonProxyGateway}
	case d.banStatus(x.Site, code):
		return Verdict{Kind: Ban, Reason: StatusReason(code), RetryAfter: parseRetryAfter(x.Header.Get("Retry-After"), time.Now())}
	case !final:
		return Verdict{Kind: Pass}
	case code < 200 || code > 299:
		return Verdict{Kind: Neutral}
	case !x.HasBody():
		return Verdict{Kind: OK}
	}
	// The content checks. A page they cannot read (not decoded, not parsed,
	// cut short by the read limit) tells nothing against the proxy:
	// unchecked, never a ban.
	unchecked := Verdict{Kind: Neutral, Reason: ReasonUnchecked}
	for _, e := range d.expects {
		if (e.site != "" && e.site != x.Site) || (e.url != nil && !e.url.MatchString(x.URL.RequestURI())) {
			continue
		}
		if x.Undecoded {
			return unchecked
		}
		switch found, ok := x.contains(e.sels, e.quick); {
		case !ok:
			return unchecked
		case !found && x.Truncated:
			// What is missing may be past what was read.
			return unchecked
		case !found:
			return Verdict{Kind: Ban, Reason: ReasonSelector}
		}
	}
	if d.sizeDrop > 0 {
		if med, ok := d.sizes.median(x.baselineKey()); ok && float64(len(x.Body)) < d.sizeDrop*float64(med) {
			if x.Undecoded || x.Truncated {
				// Not the page's size: its compressed size, or the read limit.
				return unchecked
			}
			return Verdict{Kind: Ban, Reason: ReasonSizeDrop}
		}
	}
	return Verdict{Kind: OK}
}

// challengeRedirect reports whether x redirects to a challenge page other
// than the URL its chain asked for (as the final-URL check spares a page
// asked for that happens to match a pattern).
func (d *Detector) challengeRedirect(x *Exchange) bool {
	to := x.redirectTarget()
	return to != nil && (x.OriginURL == nil || to.String() != x.OriginURL.String()) && d.challenged(to)
}

func (d *Detector) challenged(u *url.URL) bool {
	s := u.String()
	for _, re := range d.challenge {
		if re.MatchString(s) {
			return true
		}
	}
	return false
}

func (d *Detector) banStatus(site string, code int) bool {
	if set, ok := d.status[site]; ok {
		return set[code]
	}
	return d.status[""][code]
}

// classifyError classifies a transport error of an attempt whose request's
// own context is still alive (the transport treats the caller's deadline as
// neutral before it gets here).
func classifyError(x *Exchange) Verdict {
	var te *TunnelError
	var op *net.OpError
	var cve *tls.CertificateVerificationError
	var uae x509.UnknownAuthorityError
	var he x509.HostnameError
	switch {
	case x.TimedOut:
		return Verdict{Kind: ProxyFailure, Reason: ReasonProxyTimeout}
	case errors.As(x.Err, &te) && te.StatusCode == http.StatusProxyAuthRequired:
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
