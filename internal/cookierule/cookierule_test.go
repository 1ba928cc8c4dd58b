package cookierule

import (
	"net/http"
	"testing"
	"time"
)

func TestJarKey(t *testing.T) {
	for host, want := range map[string]string{
		"www.shop.com":      "shop.com",
		"shop.com":          "shop.com",
		"a.b.shop.co.uk":    "shop.co.uk",
		"co.uk":             "co.uk",
		"com":               "com",
		"localhost":         "localhost",
		"127.0.0.1":         "127.0.0.1",
		"::1":               "::1",
		"alice.github.io":   "alice.github.io",
		"x.alice.github.io": "alice.github.io",
		"github.io":         "github.io",
		"www.shop.test":     "shop.test",
	} {
		if got := JarKey(host); got != want {
			t.Errorf("JarKey(%q) = %q, want %q", host, got, want)
		}
	}
}

func TestDomain(t *testing.T) {
	for _, tc := range []struct {
		host, attr, domain string
		hostOnly, ok       bool
	}{
		{"www.shop.com", "", "www.shop.com", true, true},
		{"www.shop.com", "shop.com", "shop.com", false, true},
		{"www.shop.com", ".Shop.COM", "shop.com", false, true},
		{"www.shop.com", "www.shop.com", "www.shop.com", false, true},
		{"www.shop.com", "com", "", false, false},
		{"www.shop.com", "other.com", "", false, false},
		{"www.shop.com", "api.shop.com", "", false, false},
		{"www.shop.co.uk", "co.uk", "", false, false},
		{"co.uk", "co.uk", "co.uk", true, true},
		{"127.0.0.1", "127.0.0.1", "127.0.0.1", true, true}, // host-only, as net/http/cookiejar has it
		{"127.0.0.1", "0.0.1", "", false, false},
	} {
		d, h, ok := Domain(tc.host, tc.attr)
		if d != tc.domain || h != tc.hostOnly || ok != tc.ok {
			t.Errorf("Domain(%q, %q) = %q, %v, %v; want %q, %v, %v", tc.host, tc.attr, d, h, ok, tc.domain, tc.hostOnly, tc.ok)
		}
	}
}

func TestMatch(t *testing.T) {
	for _, tc := range []struct {
		req, cookie string
		want        bool
	}{
		{"/a", "/a", true}, {"/a/b", "/a", true}, {"/ab", "/a", false}, {"/a", "/a/", false},
		{"/a/", "/a/", true}, {"/a/b", "/a/", true}, {"", "/", true}, {"/", "/a", false},
	} {
		if got := PathMatch(tc.req, tc.cookie); got != tc.want {
			t.Errorf("PathMatch(%q, %q) = %v", tc.req, tc.cookie, got)
		}
	}
	for _, tc := range []struct {
		host, domain string
		hostOnly     bool
		want         bool
	}{
		{"api.shop.com", "shop.com", false, true}, {"api.shop.com", "shop.com", true, false},
		{"shop.com", "shop.com", true, true}, {"notshop.com", "shop.com", false, false},
		{"1.2.3.4", "2.3.4", false, false},
	} {
		if got := DomainMatch(tc.host, tc.domain, tc.hostOnly); got != tc.want {
			t.Errorf("DomainMatch(%q, %q, %v) = %v", tc.host, tc.domain, tc.hostOnly, got)
		}
	}
	if DefaultPath("/a/b/c") != "/a/b" || DefaultPath("/a") != "/" || DefaultPath("a/b") != "/" || Path("x", "/a/b") != "/a" || Path("/p", "/a/b") != "/p" {
		t.Error("DefaultPath or Path")
	}
	if SecureOK(true, "http") || !SecureOK(true, "https") || !SecureOK(false, "http") {
		t.Error("SecureOK")
	}
}

func TestExpiry(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if at, del := Expiry(&http.Cookie{MaxAge: 60, Expires: now.Add(-time.Hour)}, now); del || !at.Equal(now.Add(time.Minute)) {
		t.Error("Max-Age wins over Expires")
	}
	if _, del := Expiry(&http.Cookie{MaxAge: -1}, now); !del {
		t.Error("Max-Age <= 0 deletes")
	}
	if _, del := Expiry(&http.Cookie{Expires: now}, now); !del {
		t.Error("an Expires not after now deletes")
	}
	if at, del := Expiry(&http.Cookie{}, now); del || !at.IsZero() {
		t.Error("a session cookie")
	}
}

func TestCanonicalHost(t *testing.T) {
	for in, want := range map[string]string{
		"www.Shop.Example.":    "www.shop.example",
		"www.bücher.de":        "www.xn--bcher-kva.de",
		"WWW.BÜCHER.DE":        "www.xn--bcher-kva.de",
		"www.xn--bcher-kva.de": "www.xn--bcher-kva.de",
		"127.0.0.1":            "127.0.0.1",
		"::1":                  "::1",
	} {
		got, ok := CanonicalHost(in)
		if !ok || got != want {
			t.Errorf("CanonicalHost(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}
