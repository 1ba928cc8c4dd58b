package proxyswitch

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fileSite serves /file.pdf: size bytes of a PDF in 64 KiB writes,
// counting what it could write before the client went away.
func fileSite(t *testing.T, size int, written *atomic.Int64) *testbed.Site {
	chunk := bytes.Repeat([]byte("%PDF-1.7 x\n"), 64<<10/11)
	return testbed.NewSite(t, "files", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/pdf")
		for n := 0; n < size; n += len(chunk) {
			k, err := w.Write(chunk[:min(len(chunk), size-n)])
			written.Add(int64(k))
			if err != nil {
				return
			}
		}
	}))
}

// TestFileAbortedAtHeadersIsNotDownloaded: Colly's way to skip a file,
// OnResponseHeaders and Abort, saves its download through Attach too: the
// transport reads no body of a file type for its checks (it read up to 10
// MiB of each before Colly saw the headers).
func TestFileAbortedAtHeadersIsNotDownloaded(t *testing.T) {
	var written, read atomic.Int64
	const size = 12 << 20 // past the 10 MiB the checks would read
	site := fileSite(t, size, &written)
	// The test proxies store and forward: count what the client reads.
	dialer := &net.Dialer{}
	base := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: conn, read: &read}, nil
	}}
	s := newSwitch(t, shared.Client(t), WithBaseTransport(base))
	_, err := s.Add(context.Background(), testbed.NewProxies(t, 1)[0].URL())
	require.NoError(t, err)
	c := colly.NewCollector()
	s.Attach(c)
	c.OnResponseHeaders(func(r *colly.Response) {
		if r.Headers.Get("Content-Type") == "application/pdf" {
			r.Request.Abort()
		}
	})
	responses := 0
	c.OnResponse(func(*colly.Response) { responses++ })
	_ = c.Visit(site.URL() + "/file.pdf")
	assert.Zero(t, responses, "aborted")
	assert.Less(t, read.Load(), int64(1<<20), "the client read %d of %d bytes", read.Load(), size)
	assertNoLeases(t, s, site)
}

// TestFileReachesCollyWhole: a file Colly does not abort reaches it whole
// and unchanged, and the request counts as an answer like any page.
func TestFileReachesCollyWhole(t *testing.T) {
	var written atomic.Int64
	const size = 3<<20 + 17
	site := fileSite(t, size, &written)
	s := newSwitch(t, shared.Client(t))
	_, err := s.Add(context.Background(), testbed.NewProxies(t, 1)[0].URL())
	require.NoError(t, err)
	c := colly.NewCollector()
	s.Attach(c)
	var body []byte
	c.OnResponse(func(r *colly.Response) { body = r.Body })
	require.NoError(t, c.Visit(site.URL()+"/file.pdf"))
	require.Len(t, body, size)
	assert.True(t, bytes.HasPrefix(body, []byte("%PDF-1.7 x\n")))
	assertNoLeases(t, s, site)
}

// countingConn counts the bytes read from a connection.
type countingConn struct {
	net.Conn
	read *atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

func TestFileMedia(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/pdf": true, "Application/PDF; name=x.pdf": true, " image/png ": true, "video/mp4": true,
		"application/vnd.openxmlformats-officedocument.spreadsheetml.sheet": true, "application/octet-stream": true,
		"text/html; charset=utf-8": false, "application/json": false, "application/gzip": false, "": false,
		"image/": false, "application/pdfx": false, "text/plain": false, "application/xhtml+xml": false,
	} {
		assert.Equal(t, want, fileMedia(ct), "%q", ct)
	}
	assert.Zero(t, testing.AllocsPerRun(100, func() { fileMedia("Application/PDF; charset=binary") }))
}
