package proxyswitch

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseProxyAccepts(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"http://127.0.0.1:8080", "http://127.0.0.1:8080"},
		{"HTTP://Proxy.Example.COM:3128/", "http://proxy.example.com:3128"},
		{"https://user:pa55@gw.example:443", "https://user:xxxxx@gw.example:443"},
		{"socks5://10.0.0.1:1080", "socks5://10.0.0.1:1080"},
		{"socks5h://u:p@[::1]:1080", "socks5h://u:xxxxx@[::1]:1080"},
		{"  http://a.b:1  ", "http://a.b:1"},
	} {
		p, err := ParseProxy(tc.in)
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.want, p.String(), tc.in)
		assert.Len(t, p.ID(), 16)
		assert.True(t, isProxyID(p.ID()))
	}
}

func TestProxyIdentityIncludesCredentials(t *testing.T) {
	a, err := ParseProxy("http://session-1:pw@gw.example:8000")
	require.NoError(t, err)
	b, err := ParseProxy("http://session-2:pw@gw.example:8000")
	require.NoError(t, err)
	c, err := ParseProxy("HTTP://session-1:pw@GW.example:8000/")
	require.NoError(t, err)
	d, err := ParseProxy("http://session-1:other@gw.example:8000")
	require.NoError(t, err)
	assert.NotEqual(t, a.ID(), b.ID(), "different usernames are different exit IPs")
	assert.NotEqual(t, a.ID(), d.ID(), "different passwords are different identities")
	assert.Equal(t, a.ID(), c.ID(), "case and a trailing slash do not change identity")
	assert.Equal(t, "pw", a.URL().User.String()[len("session-1:"):], "URL keeps credentials for dialing")
	assert.NotContains(t, a.ID(), "pw")
}

func TestParseProxyRejectsWithoutLeakingPassword(t *testing.T) {
	const secret = "Canary-s3cr3t"
	for _, tc := range []struct{ in, reason string }{
		{"", "empty"},
		{"127.0.0.1:8080", "missing scheme"},
		{"ftp://u:" + secret + "@h:21", "unsupported scheme"},
		{"http://u:" + secret + "@h", "missing port"},
		{"http://u:" + secret + "@:8080", "missing host"},
		{"http://u:" + secret + "@h:0", "port must be"},
		{"http://u:" + secret + "@h:70000", "port must be"},
		{"http://u:" + secret + "@h:http", "malformed"},
		{"http://u:" + secret + "@h:80/path", "path"},
		{"http://u:" + secret + "@h:80?x=1", "query"},
		{"http://u:" + secret + "@h:80#frag", "fragment"},
		{"http://u:" + secret + "@h :80", "white space"},
		{"http://:" + secret + "@h:80", "empty user"},
		{"http://u:" + secret + "%zz@h:80", "malformed"},
		{"socks4://u:" + secret + "@h:80", "unsupported scheme"},
		{"u:" + secret + "@h:80", "missing scheme"},
	} {
		_, err := ParseProxy(tc.in)
		require.Error(t, err, tc.in)
		assert.ErrorIs(t, err, ErrInvalidProxy, tc.in)
		var pe *ProxyError
		require.True(t, errors.As(err, &pe), tc.in)
		assert.Contains(t, err.Error(), tc.reason, tc.in)
		assert.NotContains(t, err.Error(), secret, tc.in)
		assert.NotContains(t, pe.Proxy, secret, tc.in)
	}
}

func TestRedactRaw(t *testing.T) {
	for in, want := range map[string]string{
		"http://u:pw@h:1":         "http://u:xxxxx@h:1",
		"http://u:p@w@h:1/x":      "http://u:xxxxx@h:1/x",
		"http://h:1":              "http://h:1",
		"http://u@h:1":            "http://u@h:1",
		"u:pw@h:1":                "u:xxxxx@h:1",
		"weird://u:pw@h:1?q=@x":   "weird://u:xxxxx@h:1?q=@x",
		"http://h:1/path@notauth": "http://h:1/path@notauth",
	} {
		assert.Equal(t, want, redactRaw(in), in)
	}
}

func TestReadProxies(t *testing.T) {
	in := `# datacenter pool
http://127.0.0.1:1

 socks5://u:pw@127.0.0.2:1080
http://127.0.0.1:1
`
	ps, err := ReadProxies(strings.NewReader(in))
	require.NoError(t, err)
	require.Len(t, ps, 2, "duplicate dropped")
	assert.Equal(t, "socks5://u:xxxxx@127.0.0.2:1080", ps[1].String())

	_, err = ReadProxies(strings.NewReader("http://127.0.0.1:1\n\nhttp://u:TopSecret@host\n"))
	require.ErrorIs(t, err, ErrInvalidProxy)
	assert.Contains(t, err.Error(), "line 3")
	assert.NotContains(t, err.Error(), "TopSecret")

	_, err = ParseProxies([]string{"http://a:1", "nope"})
	require.ErrorIs(t, err, ErrInvalidProxy)
	assert.Contains(t, err.Error(), "proxy #2")
}
