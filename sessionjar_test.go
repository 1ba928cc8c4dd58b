package proxyswitch

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// jarOf stores Set-Cookie lines from responses to from, in order, the way
// storeCookies does, and returns the jar's values.
func jarOf(t *testing.T, now time.Time, from string, lines ...string) []string {
	t.Helper()
	jar := map[string]string{}
	for i, line := range lines {
		c, err := http.ParseSetCookie(line)
		require.NoError(t, err, line)
		e, del, ok := newJarCookie(c, mustURL(t, from), now.Add(time.Duration(i)*time.Microsecond))
		if !ok {
			continue
		}
		if del {
			delete(jar, e.field())
			continue
		}
		b, err := json.Marshal(e)
		require.NoError(t, err)
		jar[e.field()] = strconv.FormatInt(e.Created, 10) + "|" + string(b)
	}
	var out []string
	for _, v := range jar {
		out = append(out, v)
	}
	slices.Sort(out) // in the order stored: tests pick entries by index
	return out
}

func cookieNames(cs []*http.Cookie) string {
	var names []string
	for _, c := range cs {
		names = append(names, c.String())
	}
	return strings.Join(names, "; ")
}

func TestSessionJarRules(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	jar := jarOf(t, now, "https://www.shop.example/catalog/phones?page=2",
		"a=1",                                                // host-only, default path /catalog
		"b=2; Path=/",                                        // host-only, every path
		"c=3; Domain=shop.example; Path=/",                   // the parent domain
		"d=4; Domain=.www.shop.example; Path=/",              // the host itself, leading dot
		"e=5; Domain=example; Path=/",                        // no dot: refused
		"f=6; Domain=other.example; Path=/",                  // not a parent: refused
		"g=7; Path=/; Secure",                                // https only
		"h=8; Path=/; Max-Age=0",                             // deleted at once
		"i=9; Path=/; Expires=Thu, 01 Jan 2026 00:00:00 GMT", // already expired
		"j=10; Path=/; Max-Age=60",
		"k=11; Path=/catalog/phones/x",
		"b=22; Path=/", // replaces b
	)
	for _, tc := range []struct {
		url, want string
		at        time.Time
	}{
		// Longest path first, then oldest first (b, replaced, counts as new).
		{"https://www.shop.example/catalog/phones", "a=1; c=3; d=4; g=7; j=10; b=22", now},
		{"https://www.shop.example/catalog", "a=1; c=3; d=4; g=7; j=10; b=22", now},
		{"https://www.shop.example/catalogue", "c=3; d=4; g=7; j=10; b=22", now}, // /catalog is no prefix of a path segment
		{"https://www.shop.example/catalog/phones/x/y", "k=11; a=1; c=3; d=4; g=7; j=10; b=22", now},
		{"http://www.shop.example/", "c=3; d=4; j=10; b=22", now},                      // no Secure over http
		{"https://api.shop.example/", "c=3", now},                                      // a sibling gets the parent-domain cookie only
		{"https://shop.example/", "c=3", now},                                          // the parent itself
		{"https://m.www.shop.example/", "c=3; d=4", now},                               // a subdomain of a domain cookie
		{"https://www.shop.example/", "c=3; d=4; g=7; b=22", now.Add(2 * time.Minute)}, // j expired
		{"https://evil.example/", "", now},
	} {
		got := cookieNames(cookiesFor(jar, mustURL(t, tc.url), tc.at))
		assert.Equal(t, tc.want, got, tc.url)
	}

	// Public suffixes: no site sets cookies for its neighbours under one,
	// and one served as a host gets its own cookies host-only.
	jar = append(jarOf(t, now, "https://www.shop.co.uk/",
		"a=1; Domain=co.uk", "b=2; Domain=shop.co.uk", "c=3; Domain=uk"),
		jarOf(t, now, "https://alice.github.io/", "d=4; Domain=github.io", "e=5; Domain=alice.github.io")...)
	jar = append(jar, jarOf(t, now, "https://github.io/", "f=6; Domain=github.io")...)
	for url, want := range map[string]string{
		"https://m.shop.co.uk/":     "b=2",
		"https://other.co.uk/":      "",
		"https://alice.github.io/":  "e=5",
		"https://bob.github.io/":    "",
		"https://github.io/":        "f=6",
		"https://x.alice.github.io": "e=5",
	} {
		assert.Equal(t, want, cookieNames(cookiesFor(jar, mustURL(t, url), now)), url)
	}

	// A percent-encoded path: the default path and the match agree.
	jar = jarOf(t, now, "https://shop.example/caf%C3%A9/menu", "a=1")
	assert.Equal(t, "a=1", cookieNames(cookiesFor(jar, mustURL(t, "https://shop.example/caf%C3%A9/dessert"), now)))

	// An IDN host is its punycode form (as net/http/cookiejar has it):
	// a Domain attribute may name the domain in punycode, and the cookies
	// go to either spelling of a host; a trailing dot does not matter.
	jar = jarOf(t, now, "https://www.bücher.de/", "a=1; Domain=xn--bcher-kva.de", "b=2")
	assert.Equal(t, "a=1; b=2", cookieNames(cookiesFor(jar, mustURL(t, "https://www.xn--bcher-kva.de./"), now)))
	assert.Equal(t, "a=1", cookieNames(cookiesFor(jar, mustURL(t, "https://shop.bücher.de/"), now)))

	// IP hosts: a Domain attribute must be the IP itself.
	jar = jarOf(t, now, "http://127.0.0.1:8080/", "a=1", "b=2; Domain=0.0.1", "c=3; Domain=127.0.0.1")
	assert.Equal(t, "a=1; c=3", cookieNames(cookiesFor(jar, mustURL(t, "http://127.0.0.1:9090/x"), now)), "ports do not matter")

	// Garbage in the jar is skipped, not fatal.
	assert.Equal(t, "a=1", cookieNames(cookiesFor(append(jar[:0:0], "oops", "1|{not json", jar[0]), mustURL(t, "http://127.0.0.1/"), now)))

	// Oversized cookies are dropped.
	_, _, ok := newJarCookie(&http.Cookie{Name: "big", Value: strings.Repeat("x", maxSessionCookieBytes)}, mustURL(t, "http://h.example/"), now)
	assert.False(t, ok)
}

func TestCookieHeader(t *testing.T) {
	session := []*http.Cookie{{Name: "sid", Value: "s1"}, {Name: "cart", Value: "c1"}}
	assert.Equal(t, "sid=s1; cart=c1; region=77", cookieHeader("region=77; sid=mine", session), "the session wins a name both have")
	assert.Equal(t, "sid=s1; cart=c1", cookieHeader("", session))
	assert.Equal(t, "a=1; b=2", cookieHeader(" a=1 ;; b=2 ", nil))
	assert.Equal(t, "", cookieHeader("", nil))
}
