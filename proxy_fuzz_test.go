package proxyswitch

import (
	"strconv"
	"strings"
	"testing"
)

// FuzzParseProxy: no input panics, an accepted URL round-trips to the same
// identity, and a rejected one never echoes its password. Run longer with
// go test -run '^$' -fuzz FuzzParseProxy -fuzztime 60s .
func FuzzParseProxy(f *testing.F) {
	for _, s := range []string{
		"http://u:pw@h:1", "socks5h://[::1]:1080", "https://h:443/", "ftp://x", "http://u:p@w@h:1/x?y#z",
		"http://%zz@h:1", "http://u:@h:1", "://", "http://[::1", "HTTP://H:65535",
	} {
		f.Add(s, "CanaryPw")
	}
	f.Fuzz(func(t *testing.T, raw, pw string) {
		p, err := ParseProxy(raw)
		if err == nil {
			again, err := ParseProxy(p.raw())
			if err != nil || again.ID() != p.ID() {
				t.Fatalf("canonical form %q does not round-trip: %v", p.String(), err)
			}
			if u := p.URL(); u.User != nil {
				if secret, ok := u.User.Password(); ok && secret != "" && strings.Contains(p.String(), ":"+secret+"@") {
					t.Fatalf("String() shows the password: %q", p.String())
				}
			}
			return
		}
		if len(pw) < 4 || strings.ContainsAny(pw, ":@/?#") || strings.Contains(strconv.Quote(raw), pw) {
			return
		}
		withPw := "http://user:" + pw + "@" + raw
		if _, err := ParseProxy(withPw); err != nil && strings.Contains(err.Error(), pw) {
			t.Fatalf("error echoes the password: %v", err)
		}
	})
}
