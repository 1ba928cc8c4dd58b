package redact

import (
	"net/url"
	"testing"
)

func TestCredentials(t *testing.T) {
	for _, tc := range []struct{ raw, msg, want string }{
		{"http://user:pa%2Fss@h:1", "dial http://user:pa%2Fss@h:1: refused", "dial SHOWN: refused"},
		{"http://user:pa%2Fss@h:1", "password pa/ss, escaped pa%2Fss, user user", "password xxxxx, escaped xxxxx, xxxxx xxxxx"}, // the word too: mangled, never leaking
		{"socks5://tok3n@h:1", "socks: cannot dial tok3n@h:1 as tok3n", "socks: cannot dial xxxxx@h:1 as xxxxx"},
		{"http://acct:@h:1", "user acct refused", "user xxxxx refused"},
		{"http://h:1", "nothing to hide in http://h:1", "nothing to hide in http://h:1"},
	} {
		u, err := url.Parse(tc.raw)
		if err != nil {
			t.Fatal(err)
		}
		if got := Credentials(tc.msg, u, "SHOWN"); got != tc.want {
			t.Errorf("Credentials(%q, %s) = %q, want %q", tc.msg, tc.raw, got, tc.want)
		}
	}
	if got := Credentials("x", nil, "SHOWN"); got != "x" {
		t.Errorf("nil URL: %q", got)
	}
}
