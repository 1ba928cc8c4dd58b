package storage

import (
	"bytes"
	"encoding/json"
	"hash/fnv"
	"math/rand/v2"
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

// roundTripFunc answers Colly's requests in memory: no network.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestCanonicalURLFastPath: requestHash hashes a URL that canonicalURL
// accepts as it is, skipping the parsers. That must give Colly's own ID
// (checked against Colly, which fetches through an in-memory transport),
// and canonicalURL must accept only URLs the parsers leave unchanged
// (checked on random URLs of awkward characters).
func TestCanonicalURLFastPath(t *testing.T) {
	canonical := []string{
		"https://shop.example/catalog/item?id=1&ref=list",
		"http://a.example/",
		"http://www.a-b.example/x/y_z~/Caps.html",
		"https://a.example/q?x=1;y=2&z=a+b,c:d@e/f",
		"https://a.example/dir/",
	}
	spy := &spyStorage{ids: map[uint64]bool{}}
	c := colly.NewCollector()
	c.WithTransport(roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Body: http.NoBody, Header: http.Header{}, Request: r}, nil
	}))
	require.NoError(t, c.SetStorage(spy))
	for _, u := range canonical {
		require.True(t, canonicalURL(u), u)
		require.NoError(t, c.Visit(u))
		h, ok := requestHash(wireRequest{URL: u})
		require.True(t, ok)
		require.True(t, spy.ids[h], "requestHash(%q) is not the ID Colly checked", u)
	}
	for _, u := range []string{
		"HTTP://a.example/", "http://A.example/", "http://a.example", "http://a.example:80/",
		"http://u@a.example/", "http://1.2.3.4/", "http://a.0x1/", "http://xn--nxasmq6b.example/",
		"http://a..example/", "http://a.example/./b", "http://a.example/b/..", "http://a.example//b",
		"http://a.example/b?", "http://a.example/%7E", "http://a.example/a b", "http://a.example/#f",
		"http://a.example/b?q='", "ftp://a.example/", "http://a.example\\b",
	} {
		require.False(t, canonicalURL(u), u)
	}

	const alphabet = "aZ09-._~/?#%=&+,;:@!$'()*[] \\\"<>{}|^`.xn"
	rng := rand.New(rand.NewPCG(1, 2))
	accepted := 0
	for range 200000 {
		b := []byte("http://a.example/")
		if rng.IntN(2) == 0 {
			b = []byte("https://x" + string(alphabet[rng.IntN(len(alphabet))]) + "y.example")
		}
		for range rng.IntN(12) {
			b = append(b, alphabet[rng.IntN(len(alphabet))])
		}
		u := string(b)
		if !canonicalURL(u) {
			continue
		}
		accepted++
		norm, ok := collyNormalize(u)
		require.True(t, ok, u)
		require.Equal(t, u, norm, "canonicalURL accepted a URL Colly rewrites")
	}
	require.Greater(t, accepted, 1000)
}

// TestRequestHashAllocs: the hash of a URL in canonical form skips the
// URL parsers (about 90 allocations before).
func TestRequestHashAllocs(t *testing.T) {
	w := wireRequest{URL: "https://shop.example/catalog/item?id=1&ref=list"}
	n := testing.AllocsPerRun(100, func() { requestHash(w) })
	if raceOn {
		t.Skipf("%.0f allocations under the race detector, which allocates on its own", n)
	}
	require.LessOrEqual(t, n, 6.0) // 1 with Go 1.26, 4 with Go 1.24; 136 through the parsers
}

// TestWithDeliverySplice: the in-place edit of a delivered request gives
// what decoding and encoding it again gives (compared decoded), for what
// Colly writes and for awkward forms; those it does not handle go the slow
// way. And it is cheap.
func TestWithDeliverySplice(t *testing.T) {
	u, _ := url.Parse("https://a.example/x?y=1")
	ctx := colly.NewContext()
	ctx.Put("k", "v")
	ctx.Put(ctxOwner, "7")
	ctx.Put(ctxDelivery, "9:1")
	colly1, err := (&colly.Request{URL: u, Method: "GET", Ctx: ctx, Headers: &http.Header{"A": {"b"}}}).Marshal()
	require.NoError(t, err)
	colly2, err := (&colly.Request{URL: u, Method: "GET", Ctx: colly.NewContext()}).Marshal()
	require.NoError(t, err)
	cases := []struct {
		in     string
		splice bool // handled in place
	}{
		{string(colly1), true},
		{string(colly2), true},
		{`{"URL":"https://a.example/","Ctx":null}`, true},
		{` { "ctx" : { "a" : [1, {"}":"{"}], "b":"x\"y" } , "URL" : "https://a.example/" } `, true},
		{`{"URL":"https://a.example/","Ctx":{"a":1,"a":2,"proxyswitch.storage.owner":"3"}}`, true},
		{`{"URL":"https://a.example/","Ctx":{}}`, true},
		{`{"URL":"https://a.example/","Ctx":{"\u0061":1}}`, false},
		{`{"URL":"https://a.example/","C\u0074x":{"a":1}}`, false},
		{`{"URL":"https://a.example/","Ctx":{"a":1},"CTX":{"b":2}}`, false},
		{`{"URL":"https://a.example/"}`, false},
		{`{"URL":"https://a.example/","Ctx":{"proxyswitch.storage.own\u0065r":"5"}}`, false},
	}
	decode := func(b []byte) any {
		var v any
		require.NoError(t, json.Unmarshal(b, &v), string(b))
		return v
	}
	for _, c := range cases {
		fast, ok := spliceDelivery([]byte(c.in), "12:3")
		require.Equal(t, c.splice, ok, c.in)
		want, err := withDeliverySlow([]byte(c.in), "12:3")
		require.NoError(t, err, c.in)
		got, err := withDelivery([]byte(c.in), "12:3")
		require.NoError(t, err, c.in)
		require.Equal(t, decode(want), decode(got), c.in)
		if ok {
			require.Equal(t, decode(want), decode(fast), c.in)
		}
	}
	for _, bad := range []string{`{"URL":"https://a.example/","Ctx":"x"}`, `{"URL":"https://a.example/","Ctx":[1]}`} {
		_, err := withDelivery([]byte(bad), "1:1")
		require.ErrorIs(t, err, ErrInvalidRequest, bad)
	}

	n := testing.AllocsPerRun(100, func() { _, _ = withDelivery(colly1, "12:3") })
	if raceOn {
		t.Skipf("%.0f allocations under the race detector, which allocates on its own", n)
	}
	require.LessOrEqual(t, n, 3.0) // 72 decoding and encoding again
}

// FuzzWithDelivery: on any valid JSON, withDelivery never panics and,
// where decoding and encoding again succeeds, the in-place edit gives the
// same request (compared decoded).
func FuzzWithDelivery(f *testing.F) {
	for _, s := range []string{
		`{"URL":"https://a.example/","Ctx":{"a":1}}`, `{"ctx":null}`, `{"Ctx":{"x":[{"}":"]"}]},"b":"\\"}`,
		`[]`, `"x"`, `{"Ctx":{"proxyswitch.storage.owner":1,"proxyswitch.storage.delivery":2}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if !json.Valid(b) {
			return
		}
		fast, ok := spliceDelivery(b, "1:2")
		slow, err := withDeliverySlow(b, "1:2")
		if !ok || err != nil {
			return
		}
		var x, y any
		if json.Unmarshal(fast, &x) != nil || json.Unmarshal(slow, &y) != nil {
			t.Fatalf("invalid output for %q: %q / %q", b, fast, slow)
		}
		require.Equal(t, y, x, string(b))
	})
}

// TestFNVString: the request hash's inline FNV-1a is hash/fnv's New64a.
func TestFNVString(t *testing.T) {
	for _, in := range []string{"", "a", "https://shop.example/catalog/item?id=1&ref=list", "\x00\xff"} {
		h := fnv.New64a()
		h.Write([]byte(in))
		require.Equal(t, h.Sum64(), fnvString(fnvOffset, in), in)
	}
}
