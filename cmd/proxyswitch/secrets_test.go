package main

import (
	"strings"
	"testing"

	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/stretchr/testify/assert"
)

// TestCLICanaryNeverPrinted gives the CLI proxies and Redis URLs that do not
// parse, with a canary in their user name or password: the canary appears in
// no output, in any case.
func TestCLICanaryNeverPrinted(t *testing.T) {
	const canary = "Canary7Q"
	srv := redistest.Start(t)
	good := map[string]string{EnvRedisURL: "redis://" + srv.Addr() + "/0"}
	for name, tc := range map[string]struct {
		env   map[string]string
		stdin string
		args  []string
		want  string
	}{
		"password with slash":  {good, "", []string{"add", "http://u:" + canary + "/x@127.0.0.1"}, "must be %-escaped"},
		"password with query":  {good, "", []string{"ban", "http://u:" + canary + "?x@127.0.0.1:0", "ozon.example"}, "must be %-escaped"},
		"password with hash":   {good, "", []string{"drain", "http://u:" + canary + "#x@127.0.0.1"}, "must be %-escaped"},
		"user name":            {good, "", []string{"revive", "http://" + canary + ":pw@127.0.0.1"}, "missing port"},
		"user name only":       {good, "", []string{"unban", "socks5://" + canary + "@127.0.0.1:0", "ozon.example"}, "port must be"},
		"line format bad port": {good, "127.0.0.1:0:" + canary + ":pw\n", []string{"load", "-"}, "line 1"},
		"line format bad pass": {good, "127.0.0.1:8080:u:" + canary + "@x/y\n127.0.0.1:0:u:p\n", []string{"load", "-"}, "line 2"},
		"remove bad":           {good, "", []string{"remove", "http://u:p/" + canary + "@127.0.0.1"}, "must be %-escaped"},
		"site URL user name":   {good, "", []string{"list", "https://" + canary + ":12/x@www.ozon.example"}, "is a URL"},
		"redis user name":      {map[string]string{EnvRedisURL: "redis://" + canary + "@127.0.0.1:6379/x"}, "", []string{"list"}, "invalid Redis URL"},
		"redis slash password": {map[string]string{EnvRedisURL: "redis://" + canary + ":12/x@127.0.0.1/0"}, "", []string{"list"}, "invalid Redis URL"},
		"redis other scheme":   {map[string]string{EnvRedisURL: "mysql://" + canary + ":pw@h/"}, "", []string{"list"}, "invalid Redis URL"},
		"redis flag":           {good, "", []string{"-redis", "redis://u:" + canary + "#@127.0.0.1/0", "list"}, "invalid Redis URL"},
		"redis line format":    {map[string]string{EnvRedisURL: "127.0.0.1:6379:u:" + canary}, "", []string{"list"}, "invalid Redis URL"},
	} {
		t.Run(name, func(t *testing.T) {
			r := cli(t, tc.env, tc.stdin, append([]string{"-v"}, tc.args...)...)
			assert.NotEqual(t, 0, r.code, r.all())
			assert.Contains(t, r.all(), tc.want)
			assert.NotContains(t, strings.ToLower(r.all()), strings.ToLower(canary))
		})
	}
}

// FuzzRedactURL puts a canary in the user name and password of Redis URLs
// (and of URLs given as SITE) next to any bytes: redactURL never shows it.
// Run longer with go test -run '^$' -fuzz FuzzRedactURL -fuzztime 60s ./cmd/proxyswitch
func FuzzRedactURL(f *testing.F) {
	for i, s := range [][2]string{{"", ""}, {"/", "?"}, {"#", "@"}, {":", "%zz"}, {"ü ", "\n"}, {"@x:1/", ""}, {"0", " "}} {
		f.Add(s[0], s[1], uint8(i*3+1))
	}
	f.Add("0", " ", uint8(10)) // "0Canary7Q: Canary7Q0@[::1]:6379" as SITE was echoed
	f.Fuzz(func(t *testing.T, a, b string, form uint8) {
		const canary = "Canary7Q"
		user, pass := a+canary, b+canary+a
		host := []string{"127.0.0.1:6379", "h", "[::1]:6379", ""}[int(form/4)%4]
		raw := []string{
			"redis://" + user + ":" + pass + "@" + host + "/0",
			"rediss://" + user + "@" + host,
			user + ":" + pass + "@" + host,
			host + ":" + user + ":" + pass,
		}[form%4]
		if got := redactURL(raw); strings.Contains(strings.ToLower(got), strings.ToLower(canary)) {
			t.Fatalf("redactURL(%q) = %q", raw, got)
		}
		if err := checkSite(raw); err != nil && strings.Contains(strings.ToLower(err.Error()), strings.ToLower(canary)) {
			t.Fatalf("checkSite(%q): %v", raw, err)
		}
	})
}

// TestCLIAcceptedProxyUserNeverPrinted: a proxy that parses, with a canary
// in its user name (gateway users carry the account and the session) and
// in its password, goes through every command that names proxies; no output
// shows either, only the proxy's ID and its masked URL.
func TestCLIAcceptedProxyUserNeverPrinted(t *testing.T) {
	const user, pass = "Canary9U-customer-X-session-1", "Canary9P"
	srv := redistest.Start(t)
	env := map[string]string{EnvRedisURL: "redis://" + srv.Addr() + "/0"}
	proxy := "http://" + user + ":" + pass + "@127.0.0.1:3128"
	line := "127.0.0.2:3128:" + user + ":" + pass + "\n"
	for _, tc := range []struct {
		stdin string
		args  []string
	}{
		{line, []string{"load", "-"}}, // replaces the pool
		{"", []string{"add", proxy}},
		{"", []string{"list"}},
		{"", []string{"ban", proxy, "ozon.example"}},
		{"", []string{"list", "ozon.example"}},
		{"", []string{"stats", "ozon.example"}},
		{"", []string{"unban", proxy, "ozon.example"}},
		{"", []string{"drain", proxy}},
		{"", []string{"revive", proxy}},
		{"", []string{"remove", proxy}},
	} {
		r := cli(t, env, tc.stdin, append([]string{"-v"}, tc.args...)...)
		assert.Equal(t, 0, r.code, "%v: %s", tc.args[0], r.all())
		for _, secret := range []string{user, pass, "customer-X"} {
			assert.NotContains(t, r.all(), secret, tc.args[0])
		}
	}
}
