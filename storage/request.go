package storage

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"

	whatwg "github.com/nlnwa/whatwg-url/url"
)

// wireRequest is Colly's serialized request (colly.Request.Marshal: URL,
// Method, Depth, Body, ID, Ctx, Headers, Host), with each member of the
// type Colly's UnmarshalRequest decodes it into, so that a request that
// decodes here decodes there too. This package reads URL, Method and Body;
// Ctx and Headers are only checked (see wireCtx, wireHeaders), without
// keeping their contents. encoding/json matches the names
// case-insensitively, as Colly's UnmarshalRequest does.
type wireRequest struct {
	URL     string
	Method  string
	Body    []byte
	Depth   int
	ID      uint32
	Host    string
	Ctx     wireCtx
	Headers wireHeaders
}

// wireCtx checks a serialized request's Ctx as Colly decodes it, into a
// map[string]interface{}: null or an object, any values.
type wireCtx struct{}

func (wireCtx) UnmarshalJSON(b []byte) error {
	if i := skipSpace(b, 0); i < len(b) && (b[i] == '{' || b[i] == 'n') {
		return nil // valid JSON (the decoder checked): an object, or null
	}
	return errors.New("Ctx is not an object")
}

// wireHeaders checks a serialized request's Headers as Colly decodes them,
// into an http.Header: null, or an object of arrays of strings.
type wireHeaders struct{}

func (wireHeaders) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if string(b) == "null" || string(b) == "{}" {
		return nil
	}
	var h http.Header
	if err := json.Unmarshal(b, &h); err != nil {
		return errors.New("Headers are not an object of arrays of strings")
	}
	return nil
}

// checkRequest validates a serialized request before it is stored or used:
// at most max bytes, Colly's JSON that colly.Collector.UnmarshalRequest
// decodes (each member of the type it has there: Depth an int, ID a
// uint32, Ctx an object, Headers an object of arrays of strings, Body
// base64), an absolute http or https URL with a host, and a method made of
// letters (or none: GET).
func checkRequest(b []byte, max int) (wireRequest, error) {
	var w wireRequest
	if len(b) == 0 {
		return w, invalid("empty request")
	}
	if len(b) > max {
		return w, invalid("%d bytes exceed the limit of %d", len(b), max)
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return w, invalid("not a serialized Colly request: %v", err)
	}
	u, err := url.Parse(w.URL)
	if err != nil {
		// url.Parse's error quotes the URL, and its inner error may quote
		// part of a password ("http://u:pw/x@h" has the port ":pw"): no
		// part of it is passed on.
		return w, invalid("URL does not parse")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return w, invalid("URL scheme %q is not http or https", u.Scheme)
	}
	if u.Host == "" {
		return w, invalid("URL has no host")
	}
	if len(w.Method) > 20 || strings.ContainsFunc(w.Method, func(r rune) bool {
		return (r < 'A' || r > 'Z') && (r < 'a' || r > 'z')
	}) {
		return w, invalid("bad method %q", w.Method)
	}
	return w, nil
}

// Context keys this package writes into a delivered request's colly.Context.
const (
	// ctxDelivery holds the delivery token "<request ID>:<delivery number>".
	ctxDelivery = "proxyswitch.storage.delivery"
	// ctxOwner holds the colly.Request.ID of the fetch that answers for the
	// delivery (requests visited from its callbacks share its Context).
	ctxOwner = "proxyswitch.storage.owner"
)

// withDelivery returns the serialized request b with the delivery token in
// its Ctx, and without an owner left over from an earlier delivery or
// inherited from a parent request. b must be valid JSON (checkRequest).
//
// What Colly's Marshal writes (one "Ctx" member, an object or null, keys
// without escapes) is edited in place (spliceDelivery); anything else is
// decoded and encoded again (withDeliverySlow), which costs some 70
// allocations for a Colly request with a few headers and context values.
func withDelivery(b []byte, token string) ([]byte, error) {
	if out, ok := spliceDelivery(b, token); ok {
		return out, nil
	}
	return withDeliverySlow(b, token)
}

// spliceDelivery is withDelivery by editing the bytes: the Ctx member is
// written as "Ctx" (the slow way spells it so too), its members named
// ctxOwner or ctxDelivery are cut out, and ctxDelivery is added with token. It reports false for any form it does not handle: not an object,
// no Ctx member or more than one, a Ctx that is no object or null, a key
// with an escape.
func spliceDelivery(b []byte, token string) ([]byte, bool) {
	var keyStart, ctxStart, ctxEnd int // the Ctx member: its key, its value
	found := false
	ok := jsonMembers(b, func(key []byte, ks, vs, ve int) bool {
		if !bytes.EqualFold(key, []byte("Ctx")) {
			return true
		}
		if found {
			return false
		}
		found, keyStart, ctxStart, ctxEnd = true, ks, vs, ve
		return true
	})
	if !ok || !found {
		return nil, false
	}
	ctx := b[ctxStart:ctxEnd]
	tok, err := json.Marshal(token)
	if err != nil {
		return nil, false
	}
	out := make([]byte, 0, len(b)+len(ctxDelivery)+len(tok)+8)
	out = append(out, b[:keyStart]...)
	out = append(out, `"Ctx":{`...)
	first := true
	if !bytes.Equal(ctx, []byte("null")) {
		if !jsonMembers(ctx, func(key []byte, _, vs, ve int) bool {
			if string(key) == ctxOwner || string(key) == ctxDelivery {
				return true
			}
			if !first {
				out = append(out, ',')
			}
			first = false
			out = append(out, '"')
			out = append(out, key...)
			out = append(out, '"', ':')
			out = append(out, ctx[vs:ve]...)
			return true
		}) {
			return nil, false
		}
	}
	if !first {
		out = append(out, ',')
	}
	out = append(out, '"')
	out = append(out, ctxDelivery...)
	out = append(out, '"', ':')
	out = append(out, tok...)
	out = append(out, '}')
	return append(out, b[ctxEnd:]...), true
}

// jsonMembers calls f with the key (raw, without its quotes), the index of
// its opening quote and the span of the value of each member of the JSON object b, in order, until f
// returns false. It reports false if b is no object, a key holds an escape
// or f returned false. b must be valid JSON.
func jsonMembers(b []byte, f func(key []byte, ks, vs, ve int) bool) bool {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return true
	}
	for i < len(b) {
		if b[i] != '"' {
			return false
		}
		i0, ke := i, skipString(b, i)
		key := b[i+1 : ke-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			return false
		}
		i = skipSpace(b, ke)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		vs := skipSpace(b, i+1)
		ve := skipValue(b, vs)
		if !f(key, i0, vs, ve) {
			return false
		}
		i = skipSpace(b, ve)
		if i >= len(b) {
			return false
		}
		if b[i] == '}' {
			return true
		}
		if b[i] != ',' {
			return false
		}
		i = skipSpace(b, i+1)
	}
	return false
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string that starts at b[i] ('"').
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(b)
}

// skipValue returns the index after the value that starts at b[i].
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				i = skipString(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
		return len(b)
	}
	for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' &&
		b[i] != '\t' && b[i] != '\n' && b[i] != '\r' {
		i++
	}
	return i
}

// withDeliverySlow is withDelivery for any valid request: decoded and
// encoded again.
func withDeliverySlow(b []byte, token string) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil || m == nil {
		return nil, invalid("not a JSON object")
	}
	ctx := map[string]json.RawMessage{}
	for k, raw := range m {
		if strings.EqualFold(k, "Ctx") {
			if !bytes.Equal(raw, []byte("null")) {
				if err := json.Unmarshal(raw, &ctx); err != nil {
					return nil, invalid("Ctx is not an object: %v", err)
				}
			}
			delete(m, k)
		}
	}
	if ctx == nil {
		ctx = map[string]json.RawMessage{}
	}
	delete(ctx, ctxOwner)
	tok, _ := json.Marshal(token)
	ctx[ctxDelivery] = tok
	raw, err := json.Marshal(ctx)
	if err != nil {
		return nil, invalid("Ctx: %v", err)
	}
	m["Ctx"] = raw
	return json.Marshal(m)
}

// collyURLParser is the parser Colly v2 uses for every URL it scrapes
// (colly.go: urlParser).
var collyURLParser = whatwg.NewParser(whatwg.WithPercentEncodeSinglePercentSign())

// requestHash returns the request ID Colly passes to IsVisited and Visited
// when it runs a queued request: Colly's UnmarshalRequest parses the URL,
// Request.Do hands its String() to scrape, scrape normalizes it with the
// WHATWG parser and net/url, and requestHash hashes the normalized URL and
// the body with FNV-64a. TestRequestHashMatchesColly pins this against
// Colly itself.
//
// A URL that is already in the form all these steps give (canonicalURL:
// most URLs a crawl queues) is hashed as it is, without them: the parsers
// cost about 90 allocations a request.
func requestHash(w wireRequest) (uint64, bool) {
	norm := w.URL
	if !canonicalURL(norm) {
		var ok bool
		if norm, ok = collyNormalize(norm); !ok {
			return 0, false
		}
	}
	h := fnvString(fnvOffset, norm)
	for _, c := range w.Body {
		h = (h ^ uint64(c)) * fnvPrime
	}
	return h, true
}

// FNV-1a, 64 bits (hash/fnv's New64a), over a string without copying it:
// the request hash is taken for every queued request.
const (
	fnvOffset uint64 = 14695981039346656037
	fnvPrime  uint64 = 1099511628211
)

func fnvString(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * fnvPrime
	}
	return h
}

// collyNormalize is the URL that Colly hashes for a queued request with
// URL raw (see requestHash).
func collyNormalize(raw string) (string, bool) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", false
	}
	wu, err := collyURLParser.Parse(u.String())
	if err != nil {
		return "", false
	}
	parsed, err := url.Parse(wu.Href(false))
	if err != nil {
		return "", false
	}
	norm := parsed.String()
	if n, err := collyURLParser.Parse(norm); err == nil {
		norm = n.String()
	}
	return norm, true
}

// canonicalURL reports whether raw is a URL that collyNormalize returns
// unchanged, by a conservative test: "http://" or "https://", a host name
// of lower-case ASCII labels (none empty, none an IDNA "xn--" label, the
// last starting with a letter so that it is no IPv4 address) with no user
// info or port, a path that starts with "/" and has no "." or ".."
// segment and no "//", then at most a non-empty query; path and query made of ASCII
// letters, digits and "-._~" (the query also "=&+,;:@/"). No percent
// sign, no fragment. Anything else takes the parsers
// (TestCanonicalURLFastPath checks the two agree).
func canonicalURL(raw string) bool {
	rest, ok := strings.CutPrefix(raw, "https://")
	if !ok {
		if rest, ok = strings.CutPrefix(raw, "http://"); !ok {
			return false
		}
	}
	slash := strings.IndexByte(rest, '/')
	if slash <= 0 {
		return false
	}
	host, rest := rest[:slash], rest[slash:]
	label := 0 // start of the current label
	for i := 0; i <= len(host); i++ {
		if i < len(host) && host[i] != '.' {
			c := host[i]
			if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
				return false
			}
			continue
		}
		if i == label || strings.HasPrefix(host[label:i], "xn--") {
			return false
		}
		if i == len(host) && (host[label] < 'a' || host[label] > 'z') {
			return false
		}
		label = i + 1
	}
	path, query, hasQuery := strings.Cut(rest, "?")
	if hasQuery && query == "" {
		return false
	}
	for seg := range strings.SplitSeq(path[1:], "/") {
		if seg == "." || seg == ".." {
			return false
		}
	}
	if strings.Contains(path, "//") {
		return false
	}
	for i := 0; i < len(path); i++ {
		if !unreservedOrSlash(path[i]) {
			return false
		}
	}
	for i := 0; i < len(query); i++ {
		if c := query[i]; !unreservedOrSlash(c) && !strings.ContainsRune("=&+,;:@", rune(c)) {
			return false
		}
	}
	return true
}

func unreservedOrSlash(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~' || c == '/'
}
