package storage

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"github.com/gocolly/colly/v2"
)

// addBatch bounds the requests one AddURLs script call carries.
const addBatch = 500

// AddURLs queues a GET request for each URL, as Colly's queue.AddURL does
// for one, in far fewer round trips: one script call per 500 URLs, each
// batch added atomically and in order. Every URL is checked first (an
// absolute http or https URL with a host, within WithMaxRequestSize once
// serialized); if one fails, nothing is queued and the error names it. If
// Redis fails midway, or a batch would exceed WithMaxQueued (ErrQueueFull),
// the batches before stay queued: n says how many URLs were. n is a lower
// bound when err is ErrRedis: a batch whose reply did not come within
// WithRedisTimeout (a slow network, a Redis busy for a moment) may still
// have been queued, whole, after AddURLs gave up on it; it is then in the
// queue but not in n (Stats tells), and adding it again queues it twice
// (the visited check then fetches each URL once). It is safe for
// concurrent use.
func (s *Storage) AddURLs(ctx context.Context, urls ...string) (n int, err error) {
	reqs := make([]any, 0, len(urls))
	for i, raw := range urls {
		b, err := marshalGet(raw)
		if err == nil {
			_, err = checkRequest(b, s.cfg.maxRequestSize)
		}
		if err != nil {
			return 0, fmt.Errorf("URL %d of %d%s: %w", i+1, len(urls), redacted(raw), err)
		}
		reqs = append(reqs, b)
	}
	for len(reqs) > 0 {
		batch := reqs[:min(addBatch, len(reqs))]
		if err := s.add(ctx, "add requests", batch); err != nil {
			return n, err
		}
		n += len(batch)
		reqs = reqs[len(batch):]
	}
	return n, nil
}

// marshalGet serializes a GET request for raw the way Colly's queue.AddURL
// does: the URL normalized by the WHATWG parser Colly uses.
func marshalGet(raw string) ([]byte, error) {
	// The parsers' errors quote the URL, password and all: not passed on.
	u, err := collyURLParser.Parse(raw)
	if err != nil {
		return nil, invalid("not a valid URL")
	}
	u2, err := url.Parse(u.Href(false))
	if err != nil {
		return nil, invalid("not a valid URL")
	}
	return (&colly.Request{URL: u2, Method: "GET"}).Marshal()
}

// redacted names raw in an error, password masked and clipped to 64 bytes
// (clip): " (URL)", or "" when it does not parse.
func redacted(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return " (" + clip(u.Redacted()) + ")"
}

// redactUserinfo masks the password of every URL in s that has one, as
// url.URL.Redacted does ("scheme://user:xxxxx@host"), for text that may
// quote URLs: a failure's message stored as a dead-letter reason (Colly's
// AlreadyVisitedError, for one, quotes the URL whole). A URL's authority
// is taken to end at the first '/', '?', '#', whitespace or angle bracket
// after "://", and its user info at the last '@' before that.
func redactUserinfo(s string) string {
	if !strings.Contains(s, "@") {
		return s
	}
	var b strings.Builder
	rest := s
	for {
		i := strings.Index(rest, "://")
		if i < 0 {
			break
		}
		b.WriteString(rest[:i+3])
		rest = rest[i+3:]
		end := strings.IndexAny(rest, "/?#<>` \t\r\n")
		if end < 0 {
			end = len(rest)
		}
		at := strings.LastIndexByte(rest[:end], '@')
		if at < 0 {
			continue
		}
		if user, _, ok := strings.Cut(rest[:at], ":"); ok {
			b.WriteString(user)
			b.WriteString(":xxxxx")
		} else {
			b.WriteString(rest[:at])
		}
		rest = rest[at:]
	}
	b.WriteString(rest)
	return b.String()
}
