package ban

import (
	"regexp"
	"strconv"
	"time"
)

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

// String names the kind: "pass", "ok", "neutral", "ban", "proxy_failure".
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
	// Kind is what the response says about the proxy.
	Kind Kind
	// Reason is a short code for counters and errors, such as "http_429" or
	// "missing_selector" (the Reason... constants). A Ban or ProxyFailure
	// verdict from a classifier whose reason is empty or not a short token
	// of [a-z0-9_.:-] (see ValidReason) is counted as "custom".
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
	ReasonSelector     = "missing_selector"   // a page without a selector it must contain (Rules.Expect)
	ReasonSizeDrop     = "size_drop"          // a page far smaller than the site's usual size (Rules.SizeDrop)
	ReasonProxyConnect = "proxy_connect"      // could not connect to the proxy
	ReasonProxyAuth    = "proxy_auth"         // the proxy answered 407: credentials refused
	ReasonProxyTunnel  = "proxy_tunnel"       // the proxy refused the CONNECT tunnel to the site
	ReasonProxyGateway = "proxy_gateway"      // a plain-HTTP proxy answered 502
	ReasonProxyTimeout = "proxy_timeout"      // the attempt outlived its own timeout (Exchange.TimedOut)
	ReasonProxyError   = "proxy_error"        // the connection broke (reset, EOF, malformed answer)
	ReasonCustom       = "custom"             // a classifier's verdict without a usable reason
	// ReasonUnchecked is the reason of a Neutral verdict on a 2xx page the
	// content checks (Rules.Expect, Rules.SizeDrop) applied to but could not
	// read: a body that did not decode (Exchange.Undecoded), that did not
	// parse as HTML (nested deeper than the parser allows, say), or that was
	// cut short by the read limit (Exchange.Truncated) where what is missing
	// may lie further on. Such a page is no evidence against the proxy: it is
	// handed to Colly like any Neutral answer, and counted with this reason.
	ReasonUnchecked = "unchecked"
)

// StatusReason is the reason of a ban by status code: "http_<code>".
func StatusReason(code int) string { return "http_" + strconv.Itoa(code) }

var reasonRE = regexp.MustCompile(`^[a-z0-9_.:-]{1,64}$`)

// ValidReason reports whether reason is usable as a Verdict's Reason (and a
// metrics label): 1 to 64 characters of [a-z0-9_.:-]. A Ban or ProxyFailure
// verdict with another reason is counted as ReasonCustom.
func ValidReason(reason string) bool { return reasonRE.MatchString(reason) }

// Classifier decides what a response means. It returns Pass to leave the
// decision to the next check. It runs for every hop of every request, on the
// request's goroutine: it must be fast, must not block, must not keep the
// Exchange (or its Body) after it returns and must not panic (a panic is
// recovered and fails the request with an error). It may be called from many
// goroutines at once.
type Classifier func(*Exchange) Verdict
