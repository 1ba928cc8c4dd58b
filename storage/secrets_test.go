package storage

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/gocolly/colly/v2"
	"github.com/stretchr/testify/require"
)

// The user info of a queued URL (a password, or a token written as one)
// never reaches an error, a log line or a dead-letter reason in Redis,
// whether the URL fails to parse when added, when delivered, or a failure
// quotes it.
func TestQueuedURLPasswordNeverShown(t *testing.T) {
	const secret = "hunter2secret"
	rdb := shared.Client(t)
	var log bytes.Buffer
	s := newStorage(t, rdb, WithMaxDeliveries(1), WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
	bad := []string{
		"http://bob:" + secret + "@example.com/%zz",   // bad escape
		"http://bob:" + secret + "@example.com:port/", // bad port
		"http://bob:" + secret + "/x@example.com/",    // the password taken for a port
		"http://bob:" + secret + "@exa mple.com/",     // bad host
	}
	for i, u := range bad {
		b := fmt.Appendf(nil, `{"URL":%q,"Method":"GET"}`, u)
		err := s.AddRequest(b)
		require.ErrorIs(t, err, ErrInvalidRequest, u)
		require.NotContains(t, err.Error(), secret)

		// Planted in the queue: GetRequest dead-letters it.
		id := fmt.Sprint("planted", i)
		require.NoError(t, rdb.HSet(bg, s.q.data, id, b).Err())
		require.NoError(t, rdb.RPush(bg, s.q.ready, id).Err())
		_, err = s.GetRequest()
		require.ErrorIs(t, err, ErrInvalidRequest, u)
		require.NotContains(t, err.Error(), secret)
	}

	// A failure that quotes the URL (Colly's AlreadyVisitedError does).
	_, err := s.AddURLs(bg, "http://bob:"+secret+"@example.com/ok")
	require.NoError(t, err)
	b, err := s.GetRequest()
	require.NoError(t, err)
	r, err := colly.NewCollector().UnmarshalRequest(b)
	require.NoError(t, err)
	require.NoError(t, s.Nack(r, &colly.AlreadyVisitedError{Destination: r.URL}))

	dead, err := s.DeadLetters(bg, 0, 100)
	require.NoError(t, err)
	require.Len(t, dead, len(bad)+1)
	visited := 0
	for _, d := range dead {
		require.NotContains(t, d.Reason, secret, d.ID)
		if strings.Contains(d.Reason, "already visited") {
			visited++
			require.Contains(t, d.Reason, "bob:xxxxx@example.com", "the URL, password masked")
		}
	}
	require.Equal(t, 1, visited)
	reasons, err := rdb.HVals(bg, s.q.why).Result()
	require.NoError(t, err)
	for _, why := range reasons {
		require.NotContains(t, why, secret)
	}
	require.NotContains(t, log.String(), secret)
}

func TestRedactUserinfo(t *testing.T) {
	for in, want := range map[string]string{
		"":                          "",
		"no url here: a@b":          "no url here: a@b",
		`Get "http://u:p@h/x": eof`: `Get "http://u:xxxxx@h/x": eof`,
		"http://u:p@w@h?q":          "http://u:xxxxx@h?q",
		"http://u@h/ and https://a:b@c.d#f, mail x@y": "http://u@h/ and https://a:xxxxx@c.d#f, mail x@y",
		"http://h/p@q": "http://h/p@q",
		"ws://a:b@h":   "ws://a:xxxxx@h",
	} {
		require.Equal(t, want, redactUserinfo(in), in)
	}
	require.True(t, errors.Is(invalid("x"), ErrInvalidRequest))
}
