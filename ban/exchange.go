package ban

import (
	"bytes"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"unsafe"

	"github.com/PuerkitoBio/goquery"
	"github.com/andybalholm/cascadia"
	"golang.org/x/net/html"
	"golang.org/x/net/html/atom"
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
	Body       []byte        // response body, gunzipped, at most the collector's MaxBodySize; empty for a file type (image, PDF, archive...), which is not read
	Truncated  bool          // the body went on past what was read (or decoded), or was not read (a file type): the content checks ban on nothing they did not see
	Undecoded  bool          // the body came encoded and could not be decoded (or in an encoding Colly does not decode: br, deflate...): Body is as it came, and the content checks skip it
	Err        error         // the transport error; nil when a response came
	TimedOut   bool          // Err is the doing of the attempt's own timeout (proxyswitch.Timeouts.Attempt): ReasonProxyTimeout
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
//
// With quick (every selector matches an element by the element alone: see
// quickSelector) the page's tags are scanned first, without building the
// document (scanFinds): when the scan finds them all, that is the answer,
// and the page is parsed only when it lacks one (to be sure) or when a
// classifier asks for the Document.
func (x *Exchange) contains(sels []cascadia.Selector, quick bool) (found, ok bool) {
	if quick && !x.parsed && x.scanFinds(sels) {
		return true, true
	}
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

// quickSelector matches the selectors that a single element decides: a tag
// (or *), #ids, .classes and [attribute] tests, with no combinator and no
// pseudo-class, which would need the element's place in the document.
var quickSelector = regexp.MustCompile(`^(?:[A-Za-z][A-Za-z0-9-]*|\*)?(?:[.#][A-Za-z0-9_-]+|\[[A-Za-z_][A-Za-z0-9_-]*(?:[~|^$*]?=(?:"[^"\\]*"|'[^'\\]*'|[A-Za-z0-9_-]+))?\])*$`)

// scanMaxDepth is how deep the elements scanFinds keeps track of may nest
// before it leaves the answer to the parser (which refuses documents nested
// deeper than 512 elements: such a page is unchecked, not found).
const scanMaxDepth = 256

// scanFinds reports whether the page surely contains each of sels (quick
// selectors), from its tags alone (golang.org/x/net/html's tokenizer: no
// tree is built). It is conservative: false means "parse it to know". It
// says false for a page in UTF-16, one that nests deeper than scanMaxDepth
// (as far as a stack of open tags tells), and it does not count the tags
// that the parser merges, renames or may drop (uncounted, and whatever is
// inside select, template, svg or math), so that every element it matches
// is one the document has (FuzzScanFinds checks it against the parser).
func (x *Exchange) scanFinds(sels []cascadia.Selector) bool {
	if len(sels) == 0 || len(sels) > 64 || len(x.Body) == 0 {
		return false
	}
	if _, name, _ := charset.DetermineEncoding(x.Body, x.Header.Get("Content-Type")); strings.HasPrefix(name, "utf-16") {
		return false
	}
	z := html.NewTokenizer(bytes.NewReader(x.Body))
	var seen uint64
	all := uint64(1)<<len(sels) - 1
	var open []atom.Atom // the open elements, as far as the tags tell
	skip := 0            // > 0: inside an element whose content is not counted (open[skip-1] opened it)
	n := &html.Node{Type: html.ElementNode}
	for {
		tt := z.Next()
		switch tt {
		case html.ErrorToken:
			return z.Err() == io.EOF && seen == all
		case html.EndTagToken:
			name, _ := z.TagName()
			a := atom.Lookup(name)
			for i := len(open) - 1; i >= 0; i-- {
				if open[i] == a {
					open = open[:i]
					if skip > len(open) {
						skip = 0
					}
					break
				}
			}
		case html.StartTagToken, html.SelfClosingTagToken:
			name, more := z.TagName()
			a := atom.Lookup(name)
			// The element's name and attributes are views of the
			// tokenizer's buffer (no copy), valid until the next token:
			// the selectors read them at once and keep nothing.
			n.Data, n.DataAtom = view(name), a
			n.Attr = n.Attr[:0]
			for more {
				var k, v []byte
				k, v, more = z.TagAttr()
				n.Attr = append(n.Attr, html.Attribute{Key: view(k), Val: view(v)})
			}
			if tt == html.StartTagToken && !voidElement(a) {
				open = append(open, a)
				if len(open) > scanMaxDepth {
					return false
				}
				if skip == 0 && (a == atom.Select || a == atom.Template || a == atom.Svg || a == atom.Math) {
					skip = len(open)
				}
			}
			if skip > 0 || uncounted(a) {
				continue
			}
			for i, sel := range sels {
				if seen&(1<<i) == 0 && sel.Match(n) {
					seen |= 1 << i
				}
			}
		}
	}
}

// view is b as a string without a copy: only while b does not change.
func view(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// uncounted reports whether the parser may merge, rename or drop an
// element of that tag, by where it stands: the document's own elements
// (html, head, body), image (read as img), table parts outside a table,
// frames.
func uncounted(a atom.Atom) bool {
	switch a {
	case atom.Html, atom.Head, atom.Body, atom.Image, atom.Frameset, atom.Frame,
		atom.Caption, atom.Col, atom.Colgroup, atom.Tbody, atom.Thead, atom.Tfoot, atom.Tr, atom.Td, atom.Th:
		return true
	}
	return false
}

// voidElement reports whether an element of that tag never has content (no
// end tag), so it never stays open.
func voidElement(a atom.Atom) bool {
	switch a {
	case atom.Area, atom.Base, atom.Br, atom.Col, atom.Embed, atom.Hr, atom.Img, atom.Input, atom.Keygen,
		atom.Link, atom.Meta, atom.Param, atom.Source, atom.Track, atom.Wbr:
		return true
	}
	return false
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
