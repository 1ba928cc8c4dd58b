package ban

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
	"unicode/utf16"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestClassify covers the built-in checks and the classifier chain on
// exchanges made up in memory.
func TestClassify(t *testing.T) {
	rules := DefaultRules()
	rules.BanStatus["lenient.example"] = []int{429}
	rules.Expect = []Expect{{Site: "shop.example", URL: `^/item/`, Selectors: []string{"div.item"}}}
	rules.Classifiers = []Classifier{func(x *Exchange) Verdict {
		switch {
		case bytes.Contains(x.Body, []byte("Доступ ограничен")):
			return Verdict{Kind: Ban, Reason: "access_limited"}
		case x.URL.Path == "/ok-anyway":
			return Verdict{Kind: OK}
		case x.URL.Path == "/bad-reason":
			return Verdict{Kind: Ban, Reason: "Has Spaces and a password=hunter2"}
		}
		return Verdict{Kind: Pass}
	}}
	r, err := NewDetector(rules)
	require.NoError(t, err)
	mk := func(rawURL string, code int, body string, hdr ...string) *Exchange {
		u, _ := url.Parse(rawURL)
		h := http.Header{"Content-Type": {"text/html; charset=utf-8"}}
		for i := 0; i+1 < len(hdr); i += 2 {
			h.Set(hdr[i], hdr[i+1])
		}
		return &Exchange{Site: u.Host, URL: u, OriginURL: u, StatusCode: code, Header: h, Body: []byte(body),
			Request: &http.Request{Method: http.MethodGet, URL: u}}
	}
	redirected := func(x *Exchange, from string) *Exchange { x.OriginURL, _ = url.Parse(from); return x }
	verdict := func(x *Exchange) Verdict {
		v, err := r.Classify(x)
		require.NoError(t, err)
		return v
	}
	for name, tc := range map[string]struct {
		x    *Exchange
		want Verdict
	}{
		"200":                   {mk("http://a.example/p/1", 200, "<p>hi</p>"), Verdict{Kind: OK}},
		"403":                   {mk("http://a.example/p/1", 403, ""), Verdict{Kind: Ban, Reason: "http_403"}},
		"503 retry-after":       {mk("http://a.example/p/1", 503, "", "Retry-After", "120"), Verdict{Kind: Ban, Reason: "http_503", RetryAfter: 2 * time.Minute}},
		"429":                   {mk("http://a.example/p/1", 429, ""), Verdict{Kind: Ban, Reason: "http_429"}},
		"site rule: 403 is not": {mk("http://lenient.example/p/1", 403, ""), Verdict{Kind: Neutral}},
		"site rule: 429 is":     {mk("http://lenient.example/p/1", 429, ""), Verdict{Kind: Ban, Reason: "http_429"}},
		"404":                   {mk("http://a.example/p/1", 404, "not found"), Verdict{Kind: Neutral}},
		"500":                   {mk("http://a.example/p/1", 500, ""), Verdict{Kind: Neutral}},
		"407":                   {mk("http://a.example/p/1", 407, ""), Verdict{Kind: ProxyFailure, Reason: ReasonProxyAuth}},
		"502 via http proxy":    {mk("http://a.example/p/1", 502, ""), Verdict{Kind: ProxyFailure, Reason: ReasonProxyGateway}},
		"502 in a tunnel":       {mk("https://a.example/p/1", 502, ""), Verdict{Kind: Neutral}},
		"redirect hop":          {mk("http://a.example/p/1", 302, "", "Location", "/p/2"), Verdict{Kind: Pass}},
		"redirect to captcha":   {mk("http://a.example/p/1", 302, "", "Location", "/captcha"), Verdict{Kind: Ban, Reason: ReasonChallenge}},
		"relative to the hop":   {mk("http://a.example/p/1", 303, "", "Location", "../showcaptcha?retpath=x"), Verdict{Kind: Ban, Reason: ReasonChallenge}},
		"captcha on another host": {mk("http://a.example/p/1", 307, "", "Location", "https://captcha.example/check?from=a"),
			Verdict{Kind: Ban, Reason: ReasonChallenge}},
		"redirect to login": {redirected(mk("http://a.example/p/2", 301, "", "Location", "http://a.example/login?next=/p/2"), "http://a.example/p/1"),
			Verdict{Kind: Ban, Reason: ReasonChallenge}},
		"redirect to a 'loginhistory' page": {mk("http://a.example/p/1", 302, "", "Location", "/loginhistory"), Verdict{Kind: Pass}},
		"redirect back to the login asked for": {redirected(mk("http://a.example/login/", 308, "", "Location", "/login"), "http://a.example/login"),
			Verdict{Kind: Pass}},
		"3xx without a Location": {mk("http://a.example/captcha-info", 302, ""), Verdict{Kind: Neutral}},
		"landed on captcha": {redirected(mk("http://a.example/showcaptcha?retpath=x", 200, "<form>"), "http://a.example/p/1"),
			Verdict{Kind: Ban, Reason: ReasonChallenge}},
		"captcha with a 403": {redirected(mk("http://a.example/captcha", 403, ""), "http://a.example/p/1"),
			Verdict{Kind: Ban, Reason: ReasonChallenge}},
		"landed on login": {redirected(mk("http://a.example/login?next=/p/1", 200, "<form>"), "http://a.example/p/1"),
			Verdict{Kind: Ban, Reason: ReasonChallenge}},
		"asked for the login page": {mk("http://a.example/login", 200, "<form>"), Verdict{Kind: OK}},
		"redirect to a real page": {redirected(mk("http://a.example/p/2", 200, "<p>"), "http://a.example/p/1"),
			Verdict{Kind: OK}},
		"a 'loginhistory' page is no login": {redirected(mk("http://a.example/loginhistory", 200, "<p>"), "http://a.example/p/1"),
			Verdict{Kind: OK}},
		"expected item present":    {mk("http://shop.example/item/1", 200, `<div class="item">x</div>`), Verdict{Kind: OK}},
		"expected item missing":    {mk("http://shop.example/item/1", 200, `<div class="stub">x</div>`), Verdict{Kind: Ban, Reason: ReasonSelector}},
		"empty 200":                {mk("http://shop.example/item/1", 200, ""), Verdict{Kind: Ban, Reason: ReasonSelector}},
		"binary garbage":           {mk("http://shop.example/item/1", 200, "\x00\xff\xfe<<<div class=item"), Verdict{Kind: Ban, Reason: ReasonSelector}},
		"other path of the site":   {mk("http://shop.example/about", 200, ""), Verdict{Kind: OK}},
		"404 of an expected page":  {mk("http://shop.example/item/1", 404, ""), Verdict{Kind: Neutral}},
		"classifier: ban":          {mk("http://a.example/p/1", 200, "<p>Доступ ограничен</p>"), Verdict{Kind: Ban, Reason: "access_limited"}},
		"classifier: overrule 403": {mk("http://a.example/ok-anyway", 403, ""), Verdict{Kind: OK}},
		"classifier: bad reason":   {mk("http://a.example/bad-reason", 200, ""), Verdict{Kind: Ban, Reason: ReasonCustom}},
		"HEAD":                     {func() *Exchange { x := mk("http://shop.example/item/1", 200, ""); x.Request.Method = "HEAD"; return x }(), Verdict{Kind: OK}},
	} {
		assert.Equal(t, tc.want, verdict(tc.x), name)
	}

	// Transport errors.
	for name, tc := range map[string]struct {
		err      error
		timedOut bool
		want     Verdict
	}{
		"dial":        {&net.OpError{Op: "proxyconnect", Net: "tcp", Err: errors.New("connection refused")}, false, Verdict{Kind: ProxyFailure, Reason: ReasonProxyConnect}},
		"CONNECT 407": {&TunnelError{StatusCode: 407}, false, Verdict{Kind: ProxyFailure, Reason: ReasonProxyAuth}},
		"CONNECT 503": {&TunnelError{StatusCode: 503}, false, Verdict{Kind: ProxyFailure, Reason: ReasonProxyTunnel}},
		"timeout":     {context.Canceled, true, Verdict{Kind: ProxyFailure, Reason: ReasonProxyTimeout}},
		"reset":       {errors.New("read: connection reset by peer"), false, Verdict{Kind: ProxyFailure, Reason: ReasonProxyError}},
		"bad cert":    {fmt.Errorf("tls: %w", x509.UnknownAuthorityError{}), false, Verdict{Kind: Neutral}},
	} {
		x := mk("https://a.example/p/1", 0, "")
		x.StatusCode, x.Header, x.Err, x.TimedOut = 0, nil, tc.err, tc.timedOut
		assert.Equal(t, tc.want, verdict(x), name)
	}

	// Size drop: judged once 16 sizes are known, per media type.
	for i := range baselineMinimum - 1 {
		x := mk("http://big.example/p/1", 200, strings.Repeat("x", 1000+i))
		require.Equal(t, OK, verdict(x).Kind)
		r.Learn(x)
	}
	assert.Equal(t, OK, verdict(mk("http://big.example/p/2", 200, "tiny")).Kind, "too few sizes known yet")
	x := mk("http://big.example/p/1", 200, strings.Repeat("x", 1000))
	r.Learn(x)
	assert.Equal(t, Verdict{Kind: Ban, Reason: ReasonSizeDrop}, verdict(mk("http://big.example/p/2", 200, "tiny")))
	assert.Equal(t, OK, verdict(mk("http://big.example/p/2", 200, strings.Repeat("x", 300))).Kind, "0.3 of the median is fine")
	assert.Equal(t, OK, verdict(mk("http://big.example/api", 200, "{}", "Content-Type", "application/json")).Kind,
		"JSON has a baseline of its own")
	assert.Equal(t, Neutral, verdict(mk("http://big.example/p/3", 404, "")).Kind, "only 2xx pages are sized")

	// A panicking classifier fails the request, it does not crash the crawler.
	sp, err := NewDetector(Rules{Classifiers: []Classifier{func(*Exchange) Verdict { panic("boom") }}})
	require.NoError(t, err)
	_, err = sp.Classify(mk("http://a.example/", 200, ""))
	assert.ErrorContains(t, err, "classifier panicked")
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for in, want := range map[string]time.Duration{
		"":                              0,
		"120":                           2 * time.Minute,
		" 7 ":                           7 * time.Second,
		"-5":                            0,
		"soon":                          0,
		"99999999999999999999999":       0, // not an int64: not a number of seconds we take
		"9223372036854775807":           100 * 365 * 24 * time.Hour,
		"Fri, 02 Jan 2026 03:05:05 GMT": time.Minute,
		"Fri, 02 Jan 2026 03:00:00 GMT": 0, // in the past
	} {
		assert.Equal(t, want, parseRetryAfter(in, now), in)
	}
}

// TestNewDetectorErrors: every bad rule is an error naming it, never a
// panic; the zero Rules and rules with every check off are fine.
func TestNewDetectorErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		r    Rules
		says string
	}{
		"regexp":         {Rules{ChallengeURLs: []string{`(unclosed`}}, `challenge URL pattern "(unclosed"`},
		"expect regexp":  {Rules{Expect: []Expect{{URL: `[z-a]`, Selectors: []string{"div"}}}}, `expected-content URL pattern "[z-a]"`},
		"selector":       {Rules{Expect: []Expect{{Selectors: []string{"div[[["}}}}, `CSS selector "div[[["`},
		"no selector":    {Rules{Expect: []Expect{{Site: "shop", URL: "/p/"}}}, "names no selector"},
		"status":         {Rules{BanStatus: map[string][]int{"": {403, 1000}}}, "ban status 1000"},
		"ratio":          {Rules{SizeDrop: 1.5}, "size drop ratio 1.5"},
		"negative ratio": {Rules{SizeDrop: -0.1}, "size drop ratio -0.1"},
		"classifier":     {Rules{Classifiers: []Classifier{nil}}, "nil classifier"},
	} {
		var err error
		require.NotPanics(t, func() { _, err = NewDetector(tc.r) }, name)
		assert.ErrorContains(t, err, tc.says, name)
	}
	for _, r := range []Rules{{}, DefaultRules(), {BanStatus: map[string][]int{"x.example": nil}}} {
		_, err := NewDetector(r)
		assert.NoError(t, err)
	}
}

// TestZeroRules: without rules only the proxy's own failures are judged.
func TestZeroRules(t *testing.T) {
	d, err := NewDetector(Rules{})
	require.NoError(t, err)
	u, _ := url.Parse("http://a.example/captcha")
	for code, want := range map[int]Verdict{
		200: {Kind: OK},
		403: {Kind: Neutral},
		407: {Kind: ProxyFailure, Reason: ReasonProxyAuth},
		502: {Kind: ProxyFailure, Reason: ReasonProxyGateway},
	} {
		v, err := d.Classify(&Exchange{Site: u.Host, URL: u, OriginURL: u, StatusCode: code, Header: http.Header{}})
		require.NoError(t, err)
		assert.Equal(t, want, v, code)
	}
}

func TestKindAndReasons(t *testing.T) {
	for k, want := range map[Kind]string{Pass: "pass", OK: "ok", Neutral: "neutral", Ban: "ban", ProxyFailure: "proxy_failure", 9: "Kind(9)"} {
		assert.Equal(t, want, k.String())
	}
	assert.Equal(t, "http_451", StatusReason(451))
	for _, r := range []string{ReasonChallenge, ReasonSelector, ReasonSizeDrop, ReasonProxyConnect, ReasonProxyAuth,
		ReasonProxyTunnel, ReasonProxyGateway, ReasonProxyTimeout, ReasonProxyError, ReasonCustom, StatusReason(403)} {
		assert.True(t, ValidReason(r), r)
	}
	for _, r := range []string{"", "Has Spaces", "UPPER", strings.Repeat("x", 65), "ü"} {
		assert.False(t, ValidReason(r), r)
	}
	assert.Equal(t, "proxyswitch: proxy refused the CONNECT tunnel: 407 Proxy Authentication Required",
		(&TunnelError{StatusCode: 407}).Error())
}

// utf16LE encodes s in UTF-16LE, with a byte order mark when bom.
func utf16LE(s string, bom bool) string {
	var b []byte
	if bom {
		b = []byte{0xff, 0xfe}
	}
	for _, u := range utf16.Encode([]rune(s)) {
		b = append(b, byte(u), byte(u>>8))
	}
	return string(b)
}

// TestUncheckablePages: a page the content checks apply to but cannot
// read (not decoded, not parsed, cut short by the read limit) is no
// evidence against the proxy: Neutral, ReasonUnchecked, never a ban; and
// a page in UTF-16 is read as such.
func TestUncheckablePages(t *testing.T) {
	rules := DefaultRules()
	rules.Expect = []Expect{{Site: "shop.example", URL: `^/item/`, Selectors: []string{"div.item"}}}
	d, err := NewDetector(rules)
	require.NoError(t, err)
	type mod func(*Exchange)
	undecoded := func(x *Exchange) { x.Undecoded = true }
	truncated := func(x *Exchange) { x.Truncated = true }
	contentType := func(ct string) mod { return func(x *Exchange) { x.Header.Set("Content-Type", ct) } }
	mk := func(rawURL, body string, mods ...mod) *Exchange {
		u, _ := url.Parse(rawURL)
		x := &Exchange{Site: u.Host, URL: u, OriginURL: u, StatusCode: 200, Body: []byte(body),
			Header: http.Header{"Content-Type": {"text/html"}}, Request: &http.Request{Method: http.MethodGet, URL: u}}
		for _, m := range mods {
			m(x)
		}
		return x
	}
	verdict := func(x *Exchange) Verdict {
		v, err := d.Classify(x)
		require.NoError(t, err)
		return v
	}
	const item = `<html><body><div class="item">x</div>`
	deep := item + strings.Repeat("<div>", 600) + "deep" + strings.Repeat("</div>", 600)
	_, perr := mk("http://shop.example/item/1", deep).Document()
	require.Error(t, perr, "the parser refuses it (a limit of golang.org/x/net/html)")

	unchecked := Verdict{Kind: Neutral, Reason: ReasonUnchecked}
	for name, tc := range map[string]struct {
		x    *Exchange
		want Verdict
	}{
		"nested deeper than the parser allows": {mk("http://shop.example/item/1", deep), unchecked},
		"nested, on a page without rules":      {mk("http://shop.example/about", deep), Verdict{Kind: OK}},
		"undecoded":                            {mk("http://shop.example/item/1", "\x1f\x8b garbage", undecoded), unchecked},
		"undecoded, on a page without rules":   {mk("http://shop.example/about", "\x1f\x8b garbage", undecoded), Verdict{Kind: OK}},
		"truncated before the selector":        {mk("http://shop.example/item/1", "<html><body>"+strings.Repeat("x", 100), truncated), unchecked},
		"truncated after the selector":         {mk("http://shop.example/item/1", item+strings.Repeat("x", 100), truncated), Verdict{Kind: OK}},
		"UTF-16 with a byte order mark":        {mk("http://shop.example/item/1", utf16LE(item, true)), Verdict{Kind: OK}},
		"UTF-16 by its Content-Type":           {mk("http://shop.example/item/1", utf16LE(item, false), contentType("text/html; charset=UTF-16LE")), Verdict{Kind: OK}},
		"UTF-16 declared, UTF-8 sent":          {mk("http://shop.example/item/1", item, contentType("text/html; charset=utf-16")), Verdict{Kind: OK}},
		"UTF-16 placeholder":                   {mk("http://shop.example/item/1", utf16LE(`<p>wait</p>`, true)), Verdict{Kind: Ban, Reason: ReasonSelector}},
		"UTF-16 declared, UTF-8 placeholder":   {mk("http://shop.example/item/1", `<p>wait</p>`, contentType("text/html; charset=utf-16")), Verdict{Kind: Ban, Reason: ReasonSelector}},
		"windows-1251 is read as it came":      {mk("http://shop.example/item/1", item+"\xcf\xf0\xe8\xe2\xe5\xf2", contentType("text/html; charset=windows-1251")), Verdict{Kind: OK}},
	} {
		assert.Equal(t, tc.want, verdict(tc.x), name)
	}

	// Size drop: a page cut short by the read limit, or still compressed,
	// is not the page's size; neither is learnt.
	for range baselineMinimum {
		x := mk("http://big.example/p/1", strings.Repeat("x", 1000))
		d.Learn(x)
	}
	assert.Equal(t, Verdict{Kind: Ban, Reason: ReasonSizeDrop}, verdict(mk("http://big.example/p/2", "tiny")))
	assert.Equal(t, unchecked, verdict(mk("http://big.example/p/2", "tiny", truncated)))
	assert.Equal(t, unchecked, verdict(mk("http://big.example/p/2", "tiny", undecoded)))
	for range baselineMinimum {
		d.Learn(mk("http://cut.example/p/1", "tiny", truncated))
		d.Learn(mk("http://cut.example/p/1", "tiny", undecoded))
	}
	_, known := d.sizes.median(mk("http://cut.example/p/1", "").baselineKey())
	assert.False(t, known, "sizes of truncated or undecoded pages are not learnt")
}
