// Package source loads a proxyswitch pool from where users keep their
// proxies, a file or a provider's HTTP API, and keeps it in step with it:
// a Syncer polls a Source on a schedule and applies what changed to a
// Switch's pool (atomically up to 500 proxies: see Syncer), refusing to
// wipe the pool when the source suddenly returns nothing or far fewer
// proxies than the pool holds.
//
// Every list is validated as proxyswitch.ReadProxies validates it (URL
// lines, host:port, host:port:user:pass, user:pass@host:port; blank lines
// and '#' comments skipped), all or nothing: one bad line rejects the whole
// list and the pool stays as it was. No error, log line or Result of this
// package holds a proxy's password, nor the query string or user info of a
// source's URL, nor its headers (a token lives there).
package source

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/proxyswitch/proxyswitch"
)

// Source is where a pool's proxies come from. Fetch returns the whole
// current list, validated; an error leaves the pool alone. A Source is
// called by one Syncer at a time but may be shared; File and HTTP are safe
// for concurrent use.
type Source interface {
	Fetch(ctx context.Context) ([]*proxyswitch.Proxy, error)
	// String names the source in logs and errors, without secrets.
	String() string
}

// File is a proxy list on disk, one proxy a line, re-read at each Fetch
// (so an operator may edit it, or a job rewrite it, between two syncs).
type File struct {
	Path string
}

// Fetch reads and validates the file.
func (f File) Fetch(ctx context.Context) ([]*proxyswitch.Proxy, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	fh, err := os.Open(f.Path)
	if err != nil {
		return nil, fmt.Errorf("source: %w", err)
	}
	defer fh.Close()
	ps, err := proxyswitch.ReadProxies(fh)
	if err != nil {
		return nil, fmt.Errorf("source %s: %w", f, err)
	}
	return ps, nil
}

// String returns "file PATH".
func (f File) String() string { return "file " + f.Path }

// DefaultHTTPTimeout bounds one Fetch of an HTTP source whose Client is nil.
const DefaultHTTPTimeout = 30 * time.Second

// DefaultMaxBytes bounds the body an HTTP source reads (16 MiB).
const DefaultMaxBytes = 16 << 20

// HTTP is a provider's API that returns the current proxy list. Fetch
// sends a GET to URL with Header (and "Authorization: Bearer Token" when
// Token is set) and reads the body: as lines (Extract nil), or through
// Extract, for instance JSON("proxies"). A status other than 200, a body
// larger than MaxBytes, a body Extract refuses or an invalid proxy fails the
// Fetch. The fields must not change once Fetch is in use.
type HTTP struct {
	URL    string
	Header http.Header
	Token  string
	// Client sends the request; nil is a client with DefaultHTTPTimeout
	// that uses no proxy (not even $HTTP_PROXY).
	Client *http.Client
	// Extract turns the body into proxy lines; nil reads it as lines.
	Extract func(body []byte) ([]string, error)
	// MaxBytes bounds the body; 0 is DefaultMaxBytes.
	MaxBytes int64
}

var defaultClient = &http.Client{Timeout: DefaultHTTPTimeout, Transport: &http.Transport{Proxy: nil}}

// String returns "http(s)://host/path": no user info, no query.
func (h *HTTP) String() string { return redactURL(h.URL) }

// redactURL keeps a URL's scheme, host and path: a token may sit in its
// user info or query.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "(invalid URL)"
	}
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
}

// Fetch gets, reads and validates the list.
func (h *HTTP) Fetch(ctx context.Context) ([]*proxyswitch.Proxy, error) {
	name := h.String()
	u, err := url.Parse(h.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("source %s: want an http or https URL", name)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.URL, nil)
	if err != nil {
		return nil, fmt.Errorf("source %s: bad request", name)
	}
	for k, vs := range h.Header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if h.Token != "" {
		req.Header.Set("Authorization", "Bearer "+h.Token)
	}
	c := h.Client
	if c == nil {
		c = defaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		// *url.Error repeats the whole URL: keep only its cause.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("source %s: %w", name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("source %s: %s", name, resp.Status)
	}
	limit := h.MaxBytes
	if limit <= 0 {
		limit = DefaultMaxBytes
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("source %s: reading the body: %w", name, err)
	}
	if int64(len(body)) > limit {
		return nil, fmt.Errorf("source %s: body larger than %d bytes", name, limit)
	}
	if h.Extract == nil {
		ps, err := proxyswitch.ReadProxies(bytes.NewReader(body))
		if err != nil {
			return nil, fmt.Errorf("source %s: %w", name, err)
		}
		return ps, nil
	}
	lines, err := h.Extract(body)
	if err != nil {
		return nil, fmt.Errorf("source %s: %w", name, err)
	}
	ps, err := proxyswitch.ParseProxies(lines)
	if err != nil {
		return nil, fmt.Errorf("source %s: %w", name, err)
	}
	return ps, nil
}

// JSON returns an Extract for a JSON body holding a list of proxy strings
// (in any form ParseProxy accepts): the body itself when path is empty,
// else the value under the object keys path names, one after the other
// (JSON("data", "proxies") reads {"data": {"proxies": [...]}}). Its errors
// name the path, never the body's content.
func JSON(path ...string) func([]byte) ([]string, error) {
	where := "the body"
	if len(path) > 0 {
		where = strings.Join(path, ".")
	}
	return func(body []byte) ([]string, error) {
		var v any
		if err := json.Unmarshal(body, &v); err != nil {
			return nil, errors.New("body is not JSON")
		}
		for _, k := range path {
			m, ok := v.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("JSON: %s: not an object on the way", where)
			}
			if v, ok = m[k]; !ok {
				return nil, fmt.Errorf("JSON: %s: missing", where)
			}
		}
		list, ok := v.([]any)
		if !ok {
			return nil, fmt.Errorf("JSON: %s: not a list", where)
		}
		out := make([]string, len(list))
		for i, e := range list {
			s, ok := e.(string)
			if !ok {
				return nil, fmt.Errorf("JSON: %s: item #%d is not a string", where, i+1)
			}
			out[i] = s
		}
		return out, nil
	}
}
