package proxyswitch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// canary marks a secret in a user-info position: no error may show it.
const canary = "Canary7Q"

// FuzzRedaction puts the canary in the user name and in the password, next
// to whatever bytes the fuzzer chooses ('/', '?', '#', '@', ':', '%', spaces,
// unicode, new lines), in every form a proxy is given in, and checks that no
// error of ParseProxy, ParseProxies or ReadProxies shows it. Run longer with
// go test -run '^$' -fuzz FuzzRedaction -fuzztime 60s .
func FuzzRedaction(f *testing.F) {
	for _, seed := range []struct {
		a, b string
		form uint8
	}{
		{"", "", 0}, {"u", "p/x", 0}, {"u", "p?x", 0}, {"u", "p#x", 0}, {"u", "p@x", 0}, {"u", "p:x", 0},
		{"u", "p%zz", 0}, {"u ", " p", 0}, {"ü", "пароль", 0}, {"/", "", 1}, {"?", "#", 2}, {"", "/", 3},
		{"", "@x", 3}, {"", "", 4}, {"x", "", 5}, {"", "://x", 6}, {"@", "@", 7}, {"", "//", 8}, {"\n", "\n", 9},
		{"%", "%25", 10}, {":", ":", 11}, {"", "x@h.example", 3}, {"a", "b", 12},
		{":@", "", 7}, {"", "0#", 5}, {"#", "@", 5},
	} {
		f.Add(seed.a, seed.b, seed.form)
	}
	f.Fuzz(func(t *testing.T, a, b string, form uint8) {
		user, pass := a+canary, b+canary+a
		schemes := []string{"http", "socks5h", "ftp", "bogus", "HTTP"}
		hosts := []string{"gw.example:8000", "[::1]:1080", "gw.example", "gw.example:0", "", "[::1]", "1.2.3.4:99999"}
		scheme := schemes[int(form)%len(schemes)]
		host := hosts[int(form/8)%len(hosts)]
		var raw string
		switch form % 8 {
		case 0:
			raw = scheme + "://" + user + ":" + pass + "@" + host
		case 1:
			raw = scheme + "://" + user + "@" + host
		case 2:
			raw = user + ":" + pass + "@" + host
		case 3:
			raw = host + ":" + user + ":" + pass
		case 4:
			raw = scheme + "://:" + pass + "@" + host
		case 5:
			raw = user + ":" + pass + ":" + host
		case 6:
			raw = scheme + "://" + user + ":" + pass + "@" + host + "/path?q#f"
		case 7:
			raw = user + "@" + host
		}
		checkNoCanary(t, raw)
	})
}

// checkNoCanary parses raw every way a caller can and fails if an error
// shows the canary.
func checkNoCanary(t *testing.T, raw string) {
	t.Helper()
	_, err := ParseProxy(raw)
	if err != nil {
		var pe *ProxyError
		if !errors.As(err, &pe) || !errors.Is(err, ErrInvalidProxy) {
			t.Fatalf("ParseProxy(%q): %v is not a *ProxyError wrapping ErrInvalidProxy", raw, err)
		}
		if strings.Contains(err.Error(), canary) || strings.Contains(pe.Proxy, canary) {
			t.Fatalf("ParseProxy(%q) echoes a secret: %v", raw, err)
		}
	}
	if _, err := ParseProxies([]string{"http://ok.example:1", raw}); err != nil && strings.Contains(err.Error(), canary) {
		t.Fatalf("ParseProxies(%q) echoes a secret: %v", raw, err)
	}
	if _, err := ReadProxies(strings.NewReader("http://ok.example:1\n" + raw + "\n")); err != nil && strings.Contains(err.Error(), canary) {
		// A new line splits raw into lines of its own; a line that is only
		// "Canary7Q..." is a host, not user info, to whoever reads it.
		if !strings.ContainsAny(raw, "\r\n") {
			t.Fatalf("ReadProxies(%q) echoes a secret: %v", raw, err)
		}
	}
}

func TestRedactionSecretCases(t *testing.T) {
	for _, raw := range []string{
		"http://u:" + canary + "/x@h.example:8080",
		"http://u:" + canary + "?x@h.example:8080",
		"http://u:" + canary + "#x@h.example:8080",
		"http://u:p/" + canary + "@h.example:8080",
		"http://" + canary + ":p/x@h.example:8080",
		"http://" + canary + "@h.example",
		"http://" + canary + ":pw@h.example",
		"ftp://" + canary + ":pw@h.example:21",
		"socks5://" + canary + "@h.example:0",
		canary + ":pw@h.example",
		"h.example:0:" + canary + ":pw",
		"h.example:8080::" + canary,
		"u:" + canary + "://x@h.example",
		canary + "://x@h.example:80/",
		"user:" + canary + ":1.2.3.4:8080",
		"h.example:8080:" + canary + ":p@h2.example:81",
	} {
		_, err := ParseProxy(raw)
		require.Error(t, err, raw)
		assert.NotContains(t, err.Error(), canary, raw)
		checkNoCanary(t, raw)
	}
}

func TestParseProxyLineFormat(t *testing.T) {
	line, err := ParseProxy("gw.example:8000:session-1:p/w")
	require.NoError(t, err)
	url, err := ParseProxy("http://session-1:p%2Fw@gw.example:8000")
	require.NoError(t, err)
	assert.Equal(t, url.ID(), line.ID(), "the line format is that URL")
	pw, _ := line.URL().User.Password()
	assert.Equal(t, "p/w", pw)

	ps, err := ReadProxies(strings.NewReader("# provider export\ngw.example:8000:u1:pw1\ngw.example:8000:u2:pw2\n127.0.0.1:3128\n"))
	require.NoError(t, err)
	require.Len(t, ps, 3)
	assert.Equal(t, "http://xxxxx:xxxxx@gw.example:8000", ps[1].String())

	for _, in := range []string{
		"gw.example:8000:u:p@h2.example:81", // user:password@host:port or host:port:user:password?
		"user:9999:1.2.3.4:8080",            // host:port:user:password or user:password:host:port?
	} {
		_, err := ParseProxy(in)
		require.ErrorIs(t, err, ErrInvalidProxy, in)
		assert.Contains(t, err.Error(), "ambiguous", in)
		assert.NotContains(t, err.Error(), "9999", in)
		assert.NotContains(t, err.Error(), ":p@", in)
	}
}

func TestRedactRawNamesOnlyWhatIsNotSecret(t *testing.T) {
	for in, want := range map[string]string{
		"http://u:pw@h:1":         "http://xxxxx@h:1",
		"http://u:p@w@h:1/x":      "http://xxxxx@h:1",
		"http://h:1":              "http://h:1",
		"http://u@h:1":            "http://xxxxx@h:1",
		"u:pw@h:1":                "xxxxx@h:1",
		"weird://u:pw@h:1?q=@x":   "<unparsable URL>",
		"weird://u:pw@h:1":        "xxxxx@h:1",
		"http://h:1/path@notauth": "http://xxxxx@notauth",
		"http://u:pa/ss@h:1":      "http://xxxxx@h:1",
		"h:1:u:pw":                "<unparsable URL>",
		"h:1:u:p@w":               "<unparsable URL>",
		"http://[::1]:80":         "http://[::1]:80",
		"ftp://h":                 "ftp://h",
	} {
		assert.Equal(t, want, redactRaw(in), in)
	}
}

// TestTransportErrorsHideCredentials: an error or panic of Client.New, or a
// custom RoundTripper's error, that quotes the proxy's URL or user name
// reaches the request's error and the logs without the credentials: the
// user name is hidden too, with or without a password (a provider's account
// or token often is the user name).
func TestTransportErrorsHideCredentials(t *testing.T) {
	const user, pass = "Canary7U-acct-session-1", "Canary7P"
	bed := testbed.NewBed(t, 1, 1)
	hp := bed.Proxies[0].URL()
	hp = hp[strings.LastIndex(hp, "/")+1:]
	for name, tc := range map[string]struct {
		proxy string
		newf  func(*url.URL) (http.RoundTripper, error)
	}{
		"New panics": {"http://" + user + ":" + pass + "@" + hp, func(u *url.URL) (http.RoundTripper, error) {
			panic(fmt.Sprintf("no dialer for %s", u))
		}},
		"New fails": {"http://" + user + ":" + pass + "@" + hp, func(u *url.URL) (http.RoundTripper, error) {
			return nil, fmt.Errorf("unsupported proxy %v (user %s)", u, u.User.Username())
		}},
		"RoundTrip fails": {"http://" + user + ":" + pass + "@" + hp, func(u *url.URL) (http.RoundTripper, error) {
			return roundTripFunc(func(*http.Request) (*http.Response, error) {
				return nil, fmt.Errorf("proxy %v refused the credentials of %s", u, u.User.Username())
			}), nil
		}},
		"token as the user name, no password": {"socks5://" + user + "@" + hp, func(u *url.URL) (http.RoundTripper, error) {
			return nil, errors.New("socks: cannot dial " + u.String())
		}},
		"empty password": {"http://" + user + ":@" + hp, func(u *url.URL) (http.RoundTripper, error) {
			return nil, errors.New("cannot dial " + u.String())
		}},
	} {
		t.Run(name, func(t *testing.T) {
			var logs bytes.Buffer
			s := newSwitch(t, shared.Client(t), WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))),
				WithClient(Client{New: tc.newf}), WithTimeouts(Timeouts{MaxWait: Off}))
			_, err := s.Add(context.Background(), tc.proxy)
			require.NoError(t, err)
			c := colly.NewCollector()
			s.Attach(c)
			err = c.Visit(bed.Sites[0].URL() + "/p/1")
			require.Error(t, err)
			all := err.Error() + "\n" + logs.String()
			assert.NotContains(t, all, "Canary7U")
			assert.NotContains(t, all, pass)
			assert.Contains(t, err.Error(), hp, "the proxy is still named by its address")
		})
	}
}

// roundTripFunc is a RoundTripper of one function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
