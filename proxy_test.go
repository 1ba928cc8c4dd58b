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
		{"https://user:pa55@gw.example:443", "https://xxxxx:xxxxx@gw.example:443"},
		{"socks5://10.0.0.1:1080", "socks5://10.0.0.1:1080"},
		{"socks5h://u:p@[::1]:1080", "socks5h://xxxxx:xxxxx@[::1]:1080"},
		{"  http://a.b:1  ", "http://a.b:1"},
		// Without a scheme: http.
		{"127.0.0.1:8080", "http://127.0.0.1:8080"},
		{"[::1]:8080", "http://[::1]:8080"},
		{"gw.example:8000:session-1:pw", "http://xxxxx:xxxxx@gw.example:8000"},
		{"gw.example:8000:session-1:p:w@x/y?z#", "http://xxxxx:xxxxx@gw.example:8000"},
		{"[2001:db8::1]:8000:u:pw", "http://xxxxx:xxxxx@[2001:db8::1]:8000"},
		{"u:pw@gw.example:8000", "http://xxxxx:xxxxx@gw.example:8000"},
		{"u:pw@[::1]:8000", "http://xxxxx:xxxxx@[::1]:8000"},
		{"u:p/w?#@x@gw.example:8000", "http://xxxxx:xxxxx@gw.example:8000"},
		{"gw.example:8000:u:p@" + canary, "http://xxxxx:xxxxx@gw.example:8000"},
		{"gw.example:8000:u://" + canary, "http://xxxxx:xxxxx@gw.example:8000"},
		{"socks5h://u:pw@[::1]:1080", "socks5h://xxxxx:xxxxx@[::1]:1080"},
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
		{"127.0.0.1", "missing port"},
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
		{"u:" + secret + "@h", "missing port"},
		{"h:80:u:" + secret + "@h:81", "ambiguous"},
		{"h:0:u:" + secret, "port must be"},
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

func TestReadProxies(t *testing.T) {
	in := `# datacenter pool
http://127.0.0.1:1

 socks5://u:pw@127.0.0.2:1080
http://127.0.0.1:1
`
	ps, err := ReadProxies(strings.NewReader(in))
	require.NoError(t, err)
	require.Len(t, ps, 2, "duplicate dropped")
	assert.Equal(t, "socks5://xxxxx:xxxxx@127.0.0.2:1080", ps[1].String())

	_, err = ReadProxies(strings.NewReader("http://127.0.0.1:1\n\nhttp://u:TopSecret@host\n"))
	require.ErrorIs(t, err, ErrInvalidProxy)
	assert.Contains(t, err.Error(), "line 3")
	assert.NotContains(t, err.Error(), "TopSecret")

	_, err = ParseProxies([]string{"http://a:1", "nope"})
	require.ErrorIs(t, err, ErrInvalidProxy)
	assert.Contains(t, err.Error(), "proxy #2")
}
