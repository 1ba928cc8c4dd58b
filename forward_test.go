package proxyswitch

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Connections to a forward proxy (transport.go: forwardable). By default a
// plain-http page through an http proxy reuses an idle connection to that
// proxy, whatever site and lease it was opened for; everything whose
// connection is one to the site (a CONNECT tunnel, a SOCKS tunnel), a
// task's requests, requests net/http would not replay and a Switch with
// NoProxyReuse open one connection per request.
func TestProxyReuse(t *testing.T) {
	ctx := context.Background()
	const n = 8
	accepted := func(p *testbed.Proxy) int { a, _ := p.Conns(); return a }

	// With Colly's request timeout, and without one (no deadline: the hop
	// is leased before the send all the same, to pick its transport).
	for _, timeout := range []time.Duration{10 * time.Second, 0} {
		t.Run(fmt.Sprintf("plain pages share one connection to their proxy, timeout %v", timeout), func(t *testing.T) {
			bed, s := bedSwitch(t, 2, 1)
			c := colly.NewCollector(colly.AllowURLRevisit())
			s.Attach(c)
			c.SetRequestTimeout(timeout)
			for i := range n {
				require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", bed.Sites[i%2].URL(), i+1)))
			}
			p := bed.Proxies[0]
			assert.Equal(t, 1, accepted(p), "one connection for %d pages of two sites, each under its own lease", n)
			assert.Equal(t, n, bed.SiteHits())
			assertNoLeases(t, s, bed.Sites...)
			assertGroundTruth(t, bed)
			require.NoError(t, s.Close(ctx))
			require.Eventually(t, func() bool { _, open := p.Conns(); return open == 0 }, 5*time.Second, 10*time.Millisecond,
				"Close closed the idle connection")
		})
	}

	t.Run("a connection per request", func(t *testing.T) {
		tlsSite := testbed.NewTLSSite(t, "tls", nil)
		cases := []struct {
			name  string
			opts  []Option
			visit func(c *colly.Collector, site *testbed.Site, i int) error
		}{
			{"tls pages: a tunnel to the site each", nil, func(c *colly.Collector, _ *testbed.Site, i int) error {
				return c.Visit(fmt.Sprintf("%s/p/%d", tlsSite.URL(), i+1))
			}},
			{"a task's requests", nil, func(c *colly.Collector, site *testbed.Site, i int) error {
				return c.Request("GET", fmt.Sprintf("%s/p/%d", site.URL(), i+1), nil, NewTaskContext("shopper"), nil)
			}},
			{"posts", nil, func(c *colly.Collector, site *testbed.Site, i int) error {
				return c.Post(fmt.Sprintf("%s/p/%d", site.URL(), i+1), map[string]string{"q": "x"})
			}},
			{"NoProxyReuse", []Option{WithClient(Client{NoProxyReuse: true})}, func(c *colly.Collector, site *testbed.Site, i int) error {
				return c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), i+1))
			}},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				bed := testbed.NewBed(t, 1, 1)
				opts := append([]Option{WithBaseTransport(&http.Transport{TLSClientConfig: tlsSite.TLSConfig()})}, tc.opts...)
				s := newSwitch(t, shared.Client(t), opts...)
				_, err := s.Add(ctx, bed.ProxyURLs()...)
				require.NoError(t, err)
				c := colly.NewCollector(colly.AllowURLRevisit())
				s.Attach(c)
				for i := range n {
					require.NoError(t, tc.visit(c, bed.Sites[0], i))
				}
				assert.Equal(t, n, accepted(bed.Proxies[0]), "one connection per request")
				_, err = s.EndSession(ctx, "shopper")
				require.NoError(t, err)
				assertNoLeases(t, s, bed.Sites[0], tlsSite)
				require.NoError(t, s.Close(ctx))
			})
		}
	})

	t.Run("socks proxies: a tunnel to the site each", func(t *testing.T) {
		site := testbed.NewSite(t, "plain", nil)
		sp := newSocks5(t)
		s := newSwitch(t, shared.Client(t))
		_, err := s.Add(ctx, "socks5://"+sp.addr)
		require.NoError(t, err)
		c := colly.NewCollector(colly.AllowURLRevisit())
		s.Attach(c)
		for i := range n {
			require.NoError(t, c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), i+1)))
		}
		assert.Equal(t, int64(n), sp.accepted.Load(), "one SOCKS connection per request")
		assert.Equal(t, n, site.Recorder().Count())
		assertNoLeases(t, s, site)
		require.NoError(t, s.Close(ctx))
	})
}

// Reused connections keep every lease's promise: two workers crawling two
// sites through four proxies in parallel send no two requests from one IP
// to one site at once and none without a proxy, while the connections they
// open are far fewer than their pages.
func TestProxyReuseUnderLoad(t *testing.T) {
	ctx := context.Background()
	bed := testbed.NewBed(t, 2, 4)
	const pages = 200
	var wg sync.WaitGroup
	var failed atomic.Int64
	prefix := testPrefix()
	var switches []*Switch
	for w := range 2 {
		s := newSwitch(t, shared.Client(t), WithPrefix(prefix))
		if w == 0 {
			_, err := s.Add(ctx, bed.ProxyURLs()...)
			require.NoError(t, err)
		}
		c := colly.NewCollector(colly.Async(true), colly.AllowURLRevisit())
		require.NoError(t, c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: 4}))
		s.Attach(c)
		c.OnError(func(_ *colly.Response, err error) { failed.Add(1); t.Log(err) })
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range pages {
				_ = c.Visit(fmt.Sprintf("%s/p/%d", bed.Sites[i%2].URL(), w*pages+i+1))
			}
			c.Wait()
		}()
		switches = append(switches, s)
	}
	wg.Wait()
	for _, s := range switches {
		assertNoLeases(t, s, bed.Sites...)
		require.NoError(t, s.Close(ctx))
	}
	require.Zero(t, failed.Load())
	assert.Equal(t, 2*pages, bed.SiteHits())
	assertGroundTruth(t, bed)
	conns := 0
	for _, p := range bed.Proxies {
		a, _ := p.Conns()
		conns += a
	}
	assert.Less(t, conns, pages, "connections opened for %d pages", 2*pages)
}

// socks5 is a minimal SOCKS5 proxy (no authentication, CONNECT only) that
// counts the connections it accepts.
type socks5 struct {
	addr     string
	accepted atomic.Int64
}

func newSocks5(t *testing.T) *socks5 {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	sp := &socks5{addr: ln.Addr().String()}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			sp.accepted.Add(1)
			go sp.serve(conn)
		}
	}()
	return sp
}

func (sp *socks5) serve(conn net.Conn) {
	defer conn.Close()
	target, err := socks5Handshake(conn)
	if err != nil {
		return
	}
	up, err := net.Dial("tcp", target)
	if err != nil {
		_, _ = conn.Write([]byte{5, 5, 0, 1, 0, 0, 0, 0, 0, 0})
		return
	}
	defer up.Close()
	if _, err := conn.Write([]byte{5, 0, 0, 1, 0, 0, 0, 0, 0, 0}); err != nil {
		return
	}
	go func() { _, _ = io.Copy(up, conn); _ = up.Close() }()
	_, _ = io.Copy(conn, up)
}

// socks5Handshake reads a client's greeting and CONNECT request, and
// returns the target "host:port".
func socks5Handshake(conn net.Conn) (string, error) {
	hdr := make([]byte, 2)
	if _, err := io.ReadFull(conn, hdr); err != nil || hdr[0] != 5 {
		return "", fmt.Errorf("greeting: %v", err)
	}
	if _, err := io.ReadFull(conn, make([]byte, hdr[1])); err != nil {
		return "", err
	}
	if _, err := conn.Write([]byte{5, 0}); err != nil {
		return "", err
	}
	req := make([]byte, 4)
	if _, err := io.ReadFull(conn, req); err != nil || req[1] != 1 {
		return "", fmt.Errorf("request: %v", err)
	}
	var host string
	switch req[3] {
	case 1:
		ip := make([]byte, 4)
		if _, err := io.ReadFull(conn, ip); err != nil {
			return "", err
		}
		host = net.IP(ip).String()
	case 3:
		l := make([]byte, 1)
		if _, err := io.ReadFull(conn, l); err != nil {
			return "", err
		}
		name := make([]byte, l[0])
		if _, err := io.ReadFull(conn, name); err != nil {
			return "", err
		}
		host = string(name)
	default:
		return "", fmt.Errorf("address type %d", req[3])
	}
	port := make([]byte, 2)
	if _, err := io.ReadFull(conn, port); err != nil {
		return "", err
	}
	return net.JoinHostPort(host, strconv.Itoa(int(binary.BigEndian.Uint16(port)))), nil
}
