package proxyswitchtest

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Site is a fake target site: an httptest.Server on 127.0.0.1 whose handler
// is wrapped by a [Recorder], the ground truth of what reached it from which
// client IP. Its methods are safe for concurrent use.
type Site struct {
	name    string
	handler http.Handler
	rec     *Recorder
	srv     *httptest.Server
}

// NewSite starts a plain-HTTP site named name serving h (nil: every page
// is 404) on a free loopback port. tb.Cleanup closes it.
func NewSite(tb testing.TB, name string, h http.Handler) *Site {
	tb.Helper()
	s := startSite(name, h, false)
	tb.Cleanup(s.Close)
	return s
}

// NewTLSSite is like [NewSite] but serves HTTPS with httptest's self-signed
// certificate (clients need InsecureSkipVerify or [Site.TLSConfig]). Through a
// proxy it is reached with a CONNECT tunnel.
func NewTLSSite(tb testing.TB, name string, h http.Handler) *Site {
	tb.Helper()
	s := startSite(name, h, true)
	tb.Cleanup(s.Close)
	return s
}

// StartSite is [NewSite] for programs without a testing.TB (demos,
// examples): the caller must Close the site.
func StartSite(name string, h http.Handler) *Site {
	return startSite(name, h, false)
}

func startSite(name string, h http.Handler, useTLS bool) *Site {
	if h == nil {
		h = http.NotFoundHandler()
	}
	s := &Site{name: name, handler: h, rec: NewRecorder()}
	// httptest listens on 127.0.0.1:0.
	s.srv = httptest.NewUnstartedServer(s.rec.Wrap(h))
	if useTLS {
		s.srv.StartTLS()
	} else {
		s.srv.Start()
	}
	return s
}

// URL returns the base URL, e.g. "http://127.0.0.1:PORT".
func (s *Site) URL() string { return s.srv.URL }

// Host returns "127.0.0.1:PORT".
func (s *Site) Host() string {
	_, host, _ := strings.Cut(s.srv.URL, "://")
	return host
}

// Name returns the name given at creation.
func (s *Site) Name() string { return s.name }

// Recorder returns the site's ground-truth recorder.
func (s *Site) Recorder() *Recorder { return s.rec }

// Handler returns the wrapped (unrecorded) handler.
func (s *Site) Handler() http.Handler { return s.handler }

// TLS reports whether the site serves HTTPS.
func (s *Site) TLS() bool { return s.srv.TLS != nil }

// TLSConfig returns a client TLS config trusting the site's certificate
// (nil for plain-HTTP sites).
func (s *Site) TLSConfig() *tls.Config {
	if s.srv.TLS == nil {
		return nil
	}
	return s.srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
}

// Close shuts the site down; it blocks until outstanding requests finish.
// It is safe to call more than once.
func (s *Site) Close() { s.srv.Close() }
