package proxyswitch

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every spelling of one proxy is one identity (issue 13, item 8): loading
// two spellings must give one pool entry, or two requests leave from one IP
// at once. Distinct proxies (host, port, scheme, credentials) stay distinct.
func TestProxyIdentityCanonical(t *testing.T) {
	groups := []struct {
		canon     string // the canonical URL, stored and dialled
		spellings []string
	}{
		{"http://10.0.0.1:8080", []string{
			"http://10.0.0.1:8080", "10.0.0.1:8080", "http://10.0.0.1:08080", "http://10.0.0.1:0008080",
			"HTTP://10.0.0.1:8080", "http://10.0.0.1.:8080", "http://[::ffff:10.0.0.1]:8080",
			"http://[::FFFF:a00:1]:8080", "http://[0:0:0:0:0:ffff:10.0.0.1]:8080", "http://１０.０.０.１:8080",
		}},
		{"http://[2001:db8::1]:3128", []string{
			"http://[2001:db8::1]:3128", "http://[2001:DB8::1]:3128", "http://[2001:db8:0:0:0:0:0:1]:3128",
			"http://[2001:0db8:0000::0001]:3128", "[2001:db8::1]:03128", "http://[2001:db8::0:1]:3128",
		}},
		{"socks5://u:p@proxy.example.com:1080", []string{
			"socks5://u:p@proxy.example.com:1080", "SOCKS5://u:p@PROXY.Example.COM:1080",
			"socks5://u:p@proxy.example.com.:1080", "socks5://u:p@proxy.example.com:01080",
			"socks5://%75:%70@proxy.example.com:1080",
		}},
		{"http://user:pw@xn--bcher-kva.example:8000", []string{
			"http://user:pw@xn--bcher-kva.example:8000", "http://user:pw@bücher.example:8000",
			"http://user:pw@BÜCHER.example:8000", "http://user:pw@XN--BCHER-KVA.EXAMPLE.:8000",
			"http://user:pw@b%C3%BCcher.example:8000", "user:pw@bücher.example:8000",
			"bücher.example:8000:user:pw", "xn--bcher-kva.example.:08000:user:pw",
		}},
		{"http://[fe80::1%25eth0]:80", []string{"http://[fe80::1%25eth0]:80", "http://[FE80:0::1%25eth0]:080"}},
	}

	ids := map[string]string{} // id -> canonical URL
	for _, g := range groups {
		var id string
		for _, s := range g.spellings {
			p, err := ParseProxy(s)
			if err != nil {
				t.Fatalf("ParseProxy(%q): %v", s, err)
			}
			if got := p.raw(); got != g.canon {
				t.Errorf("ParseProxy(%q) is stored as %q, want %q", s, got, g.canon)
			}
			if id == "" {
				id = p.ID()
			} else if p.ID() != id {
				t.Errorf("ParseProxy(%q).ID() = %s, want %s (the ID of %q)", s, p.ID(), id, g.spellings[0])
			}
		}
		if other, dup := ids[id]; dup {
			t.Errorf("%s and %s share ID %s", other, g.canon, id)
		}
		ids[id] = g.canon

		ps, err := ParseProxies(g.spellings)
		if err != nil || len(ps) != 1 {
			t.Errorf("ParseProxies of %d spellings of %s: %d proxies, %v; want 1", len(g.spellings), g.canon, len(ps), err)
		}
	}

	// What differs stays different: host, port, scheme, user, password.
	distinct := []string{
		"http://10.0.0.1:8080", "http://10.0.0.2:8080", "http://10.0.0.1:8081", "https://10.0.0.1:8080",
		"socks5://10.0.0.1:8080", "socks5h://10.0.0.1:8080", "http://a@10.0.0.1:8080", "http://a:b@10.0.0.1:8080",
		"http://a:c@10.0.0.1:8080", "http://A:b@10.0.0.1:8080", "http://[::1]:8080", "http://[::ffff:10.0.0.3]:8080",
		"http://[64:ff9b::a00:1]:8080", "http://proxy.example:8080", "http://proxy.example.net:8080",
		"http://bucher.example:8080", "http://bücher.example:8080", "http://[fe80::1%25eth1]:80", "http://[fe80::1]:80",
	}
	seen := map[string]string{}
	for _, s := range distinct {
		p, err := ParseProxy(s)
		if err != nil {
			t.Fatalf("ParseProxy(%q): %v", s, err)
		}
		if other, dup := seen[p.ID()]; dup {
			t.Errorf("%q and %q have one ID %s", other, s, p.ID())
		}
		seen[p.ID()] = s
	}
}

// Spellings that no two resolvers read alike are refused, not loaded as a
// name to resolve.
func TestProxyIdentityRejects(t *testing.T) {
	for _, s := range []string{
		"http://010.0.0.1:8080", "http://1.2.3.256:8080", "http://h..:8080", "http://10.0.0.1:0",
		"http://10.0.0.1:65536", "http://10.0.0.1:000000065536", "http://[1.2.3.4]:80", "http://\x9c:401",
		"http://xn--zn7c:401", "http://²:403", "http://a：b:80",
	} {
		if p, err := ParseProxy(s); err == nil {
			t.Errorf("ParseProxy(%q) = %s, want an error", s, p)
		} else if !strings.Contains(err.Error(), "invalid") && !strings.Contains(err.Error(), "port") {
			t.Logf("%q: %v", s, err)
		}
	}
}

// FuzzProxyIdentity: a spelling and its canonical form are one proxy, and
// re-spelling the host (case, trailing dot, port zeros) changes nothing.
func FuzzProxyIdentity(f *testing.F) {
	f.Add("10.0.0.1", uint16(8080), "u", "p")
	f.Add("[::ffff:1.2.3.4]", uint16(1), "", "")
	f.Add("bücher.example", uint16(443), "x", "")
	f.Add("[2001:DB8::0:1]", uint16(65535), "a", "b")
	f.Add("\x9c", uint16(401), "0", "0") // not UTF-8: once stored as xn--zn7c (U+FFFD), which did not parse again
	f.Add("@A", uint16(1), "0", "")      // the user name is "0@"
	f.Add("²", uint16(403), "0", "")     // maps to "2", which is no name to resolve
	f.Fuzz(func(t *testing.T, host string, port uint16, user, pass string) {
		if port == 0 {
			return
		}
		mk := func(h, p string) string {
			s := "http://"
			if user != "" {
				s += user
				if pass != "" {
					s += ":" + pass
				}
				s += "@"
			}
			return s + h + ":" + p
		}
		p, err := ParseProxy(mk(host, strconv.Itoa(int(port))))
		if err != nil {
			return
		}
		again, err := ParseProxy(p.raw())
		if err != nil || again.ID() != p.ID() || again.raw() != p.raw() {
			t.Fatalf("canonical %q does not round-trip: %v", p.String(), err)
		}
		// The canonical URL with the host in upper case, a trailing dot on a
		// name, zeros in front of the port: the same proxy.
		u := p.URL()
		h := u.Hostname()
		if strings.Contains(h, ":") {
			h = "[" + strings.ToUpper(h) + "]"
		} else if !strings.Contains(h, "%") {
			h = strings.ToUpper(h) + "."
		}
		u.Host = h + ":000" + u.Port()
		other, err := ParseProxy(u.String())
		if err != nil || other.ID() != p.ID() {
			t.Fatalf("re-spelt %q: %v, id %v, want %s", h, err, other, p.ID())
		}
	})
}

// Loaded through Add in several spellings, one proxy is one pool entry: one
// slot to lease, so no two requests leave from its IP at once.
func TestProxyIdentityOneEntry(t *testing.T) {
	ctx := context.Background()
	s := newSwitch(t, shared.Client(t), WithTimeouts(Timeouts{MaxWait: Off}))
	_, err := s.Add(ctx, "http://u:p@10.0.0.9:3128", "u:p@[::ffff:10.0.0.9]:03128")
	require.NoError(t, err)
	_, err = s.Add(ctx, "10.0.0.9.:3128:u:p", "http://u:p@bücher.example:80", "http://u:p@XN--BCHER-KVA.example.:080")
	require.NoError(t, err)
	ps, err := s.List(ctx)
	require.NoError(t, err)
	require.Len(t, ps, 2)
	l, err := s.Lease(ctx, "site.example")
	require.NoError(t, err)
	l2, err := s.Lease(ctx, "site.example")
	require.NoError(t, err)
	require.NotEqual(t, l.Proxy().URL().Host, l2.Proxy().URL().Host)
	_, err = s.Lease(ctx, "site.example")
	require.ErrorIs(t, err, ErrNoProxy, "two proxies, two leases")
}
