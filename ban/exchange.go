package ban

import (
	"bytes"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"

	"github.com/PuerkitoBio/goquery"
	"github.com/andybalholm/cascadia"
	"golang.org/x/net/html/charset"
)

// Proxy is the proxy an attempt went through, as a classifier sees it.
// proxyswitch's *Proxy is one.
type Proxy interface {
	ID() string     // the proxy's ID: a hash of its URL, no secret in it
	String() string // its URL, user info masked
}

// Exchange is one response (or transport error) as the classifiers see it.
// It is valid only during the call and not safe for concurrent use.
type Exchange struct {
	Site       string        // the site, as the site function names it
	Proxy      Proxy         // the proxy the attempt went through
	Request    *http.Request // this hop's request; its body is gone
	URL        *url.URL      // this hop's URL: at the end of a redirect chain, the final URL
	OriginURL  *url.URL      // the URL the request (redirect chain) started from
	StatusCode int           // 0 when Err is set
	Header     http.Header   // response header; nil when Err is set
	Body       []byte        // response body, gunzipped, at most the collector's MaxBodySize
	Truncated  bool          // the body went on past what was read (or decoded): the content checks ban on nothing they did not see
	Undecoded  bool          // the body came encoded and could not be decoded (or in an encoding Colly does not decode: br, deflate...): Body is as it came, and the content checks skip it
	Err        error         // the transport error; nil when a response came
	TimedOut   bool          // Err is the doing of the attempt's own timeout (proxyswitch.WithAttemptTimeout): ReasonProxyTimeout
	Attempt    int           // 1 for the first proxy tried for the request, 2 for the next...
	doc        *goquery.Document
	docErr     error
	parsed     bool
	transcoded bool   // doc was parsed from UTF-16
	sizeKey    string // baselineKey, once computed
}

// Redirected reports whether the request got here through redirects to
// another URL.
func (x *Exchange) Redirected() bool {
	// The same *url.URL (a chain's first hop) is no redirect: spare the two
	// String calls on the transport's per-attempt path.
	return x.OriginURL != nil && x.URL != nil && x.URL != x.OriginURL && x.URL.String() != x.OriginURL.String()
}

// Document parses Body as HTML, once, for goquery. A body in UTF-16 (by
// its byte order mark or its Content-Type's charset) is transcoded first;
// any other is parsed as it came (the markup of ASCII-compatible charsets
// reads the same). The error is the parser's: a document nested deeper
// than golang.org/x/net/html allows (512 elements), say.
func (x *Exchange) Document() (*goquery.Document, error) {
	if !x.parsed {
		x.parsed = true
		var r io.Reader = bytes.NewReader(x.Body)
		if enc, name, _ := charset.DetermineEncoding(x.Body, x.Header.Get("Content-Type")); strings.HasPrefix(name, "utf-16") {
			r, x.transcoded = enc.NewDecoder().Reader(r), true
		}
		x.doc, x.docErr = goquery.NewDocumentFromReader(r)
	}
	return x.doc, x.docErr
}

// contains reports whether the page contains each of sels; ok is false
// when it could not be parsed. A page transcoded from UTF-16 (Document)
// that lacks one is read once more as it came, in case its charset was
// declared wrong.
func (x *Exchange) contains(sels []cascadia.Selector) (found, ok bool) {
	doc, err := x.Document()
	if err != nil {
		return false, false
	}
	if containsAll(doc, sels) {
		return true, true
	}
	if !x.transcoded {
		return false, true
	}
	if doc, err = goquery.NewDocumentFromReader(bytes.NewReader(x.Body)); err != nil {
		return false, true // read one way it lacks a selector, the other way it does not parse
	}
	return containsAll(doc, sels), true
}

func containsAll(doc *goquery.Document, sels []cascadia.Selector) bool {
	for _, sel := range sels {
		if doc.FindMatcher(goquery.SingleMatcher(sel)).Length() == 0 {
			return false
		}
	}
	return true
}

// Final reports whether the response ends its redirect chain: it is no 3xx
// with a Location the client follows.
func (x *Exchange) Final() bool {
	switch x.StatusCode {
	case 301, 302, 303, 307, 308:
		return x.Header.Get("Location") == ""
	}
	return true
}

// HasBody reports whether the response carries a body worth checking: not
// the answer to a HEAD, not a 1xx, 204 or 304.
func (x *Exchange) HasBody() bool {
	if x.Request != nil && x.Request.Method == http.MethodHead {
		return false
	}
	return x.StatusCode >= 200 && x.StatusCode != http.StatusNoContent && x.StatusCode != http.StatusNotModified
}

// redirectTarget returns the URL a redirect sends the client to: its
// Location resolved against this hop's URL, as net/http resolves it. It is
// nil for a final response and for a Location that does not parse.
func (x *Exchange) redirectTarget() *url.URL {
	if x.Final() || x.URL == nil {
		return nil
	}
	u, err := x.URL.Parse(x.Header.Get("Location"))
	if err != nil {
		return nil
	}
	return u
}

// mediaType is the response's media type, lower-cased, without parameters.
func (x *Exchange) mediaType() string {
	mt, _, err := mime.ParseMediaType(x.Header.Get("Content-Type"))
	if err != nil {
		return ""
	}
	return mt
}

// baselineKey names x's size baseline, its site and media type, computed
// once: classifyResponse judges by it and Learn feeds it.
func (x *Exchange) baselineKey() string {
	if x.sizeKey == "" {
		x.sizeKey = x.Site + "\x00" + x.mediaType()
	}
	return x.sizeKey
}

// TunnelError is the error of a CONNECT the proxy answered with another
// status than 200 (proxyswitch's transport returns it from its
// OnProxyConnectResponse hook). It is a proxy failure: ReasonProxyAuth for a
// 407, ReasonProxyTunnel for any other status.
type TunnelError struct {
	StatusCode int // the proxy's answer to the CONNECT
}

// Error says the proxy refused the tunnel, with its status.
func (e *TunnelError) Error() string {
	return fmt.Sprintf("proxyswitch: proxy refused the CONNECT tunnel: %d %s", e.StatusCode, http.StatusText(e.StatusCode))
}
