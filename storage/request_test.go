package storage

import (
	"bytes"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/gocolly/colly/v2/queue"
	collystorage "github.com/gocolly/colly/v2/storage"
	"github.com/stretchr/testify/require"
)

// spyStorage is Colly's in-memory storage that records the IDs Colly asks
// about.
type spyStorage struct {
	collystorage.InMemoryStorage
	mu  sync.Mutex
	ids map[uint64]bool
}

func (s *spyStorage) IsVisited(id uint64) (bool, error) {
	s.mu.Lock()
	s.ids[id] = true
	s.mu.Unlock()
	return s.InMemoryStorage.IsVisited(id)
}

// requestHash must compute exactly the ID Colly passes to IsVisited when it
// runs a queued request, for awkward URLs and bodies too; otherwise the
// queue's redeliveries and duplicates are not recognised (see pending.go).
func TestRequestHashMatchesColly(t *testing.T) {
	site := newCountingSite(t, nil)
	base, _ := url.Parse(site.URL)
	paths := []string{
		"/plain", "/a b", "/ünï?q=ä", "/%7Euser", "/x?a=1&b=%zz", "/path/../dots",
		"/trailing?", "/UPPER/%41", "/frag#section", "/semi;colon", "/q?x=1&x=2",
		"/tab%09", "/emoji/😀", "", "/?", "/%25", "/a%2Fb",
	}
	spy := &spyStorage{ids: map[uint64]bool{}}
	c := colly.NewCollector(colly.AllowedDomains(base.Hostname()))
	require.NoError(t, c.SetStorage(spy))
	qs := newStorage(t, shared.Client(t), WithPollInterval(5*time.Millisecond))
	qs.Attach(c)
	q, err := queue.New(2, qs)
	require.NoError(t, err)

	var payloads [][]byte
	add := func(method, rawURL string, body []byte) {
		u, err := url.Parse(rawURL)
		require.NoError(t, err, rawURL)
		r := &colly.Request{URL: u, Method: method, Headers: &http.Header{}, Ctx: colly.NewContext()}
		if body != nil {
			r.Body = bytes.NewReader(body)
		}
		b, err := r.Marshal()
		require.NoError(t, err)
		payloads = append(payloads, b)
		require.NoError(t, qs.AddRequest(b))
	}
	for _, p := range paths {
		add("GET", site.URL+p, nil)
	}
	add("GET", "HTTP://"+base.Host+"/Scheme", nil)
	add("POST", site.URL+"/form", []byte("a=1&b=two"))
	add("POST", site.URL+"/form", []byte{0, 1, 2, 255})
	add("HEAD", site.URL+"/head", nil)
	require.NoError(t, q.Run(c))

	for _, b := range payloads {
		w, err := checkRequest(b, 1<<20)
		require.NoError(t, err)
		h, ok := requestHash(w)
		require.True(t, ok, w.URL)
		require.True(t, spy.ids[h], "Colly never asked IsVisited(%d) for %s %q", h, w.Method, w.URL)
	}
	require.Len(t, spy.ids, len(payloads))
	st, err := qs.Stats(bg)
	require.NoError(t, err)
	require.Equal(t, Stats{}, st)
}
