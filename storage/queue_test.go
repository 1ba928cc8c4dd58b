package storage

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/gocolly/colly/v2/queue"
	"github.com/stretchr/testify/require"
)

// marshal returns a serialized Colly GET request for u.
func marshal(t testing.TB, u string) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"URL": u, "Method": "GET"})
	require.NoError(t, err)
	return b
}

// pop delivers the next request and returns its delivery token.
func pop(t testing.TB, s *Storage) (token string, url string) {
	t.Helper()
	b, err := s.GetRequest()
	require.NoError(t, err)
	var m struct {
		URL string
		Ctx map[string]any
	}
	require.NoError(t, json.Unmarshal(b, &m))
	return m.Ctx[ctxDelivery].(string), m.URL
}

// delivered is a delivery token without its pop ID: "<request ID>:<delivery
// number>".
func delivered(tok string) string {
	id, n, err := splitToken(tok)
	if err != nil {
		return tok
	}
	return id + ":" + strconv.Itoa(n)
}

func TestAddRequestValidation(t *testing.T) {
	s := newStorage(t, shared.Client(t), WithMaxRequestSize(200))
	for name, b := range map[string][]byte{
		"empty":       nil,
		"not json":    []byte("{oops"),
		"json array":  []byte(`[1,2]`),
		"no url":      []byte(`{"Method":"GET"}`),
		"ftp":         marshal(t, "ftp://example.com/x"),
		"javascript":  marshal(t, "javascript:alert(1)"),
		"relative":    marshal(t, "/just/a/path"),
		"bad method":  []byte(`{"URL":"http://a.example/","Method":"GET /x"}`),
		"oversized":   marshal(t, "http://a.example/"+strings.Repeat("x", 300)),
		"control url": []byte(`{"URL":"http://a.example/\u0001"}`),
	} {
		require.ErrorIs(t, s.AddRequest(b), ErrInvalidRequest, name)
	}
	require.NoError(t, s.AddRequest(marshal(t, "HTTPS://a.example/ok")))
	n, err := s.QueueSize()
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

// A delivery that is not acknowledged comes back after the visibility
// timeout; the old token is then stale and changes nothing.
func TestRedeliveryAfterVisibilityTimeout(t *testing.T) {
	s := newStorage(t, shared.Client(t), WithVisibilityTimeout(200*time.Millisecond), WithPollInterval(10*time.Millisecond))
	require.NoError(t, s.AddRequest(marshal(t, "http://a.example/1")))
	tok1, u := pop(t, s)
	require.Equal(t, "http://a.example/1", u)
	_, err := s.GetRequest()
	require.ErrorIs(t, err, ErrQueueEmpty)
	st, err := s.Stats(bg)
	require.NoError(t, err)
	require.Equal(t, Stats{InFlight: 1}, st)

	time.Sleep(250 * time.Millisecond)
	other := twin(t, s, shared.Client(t)) // another worker picks it up
	tok2, u := pop(t, other)
	require.Equal(t, "http://a.example/1", u)
	require.NotEqual(t, tok1, tok2)
	require.True(t, strings.HasSuffix(delivered(tok2), ":2"), tok2)

	require.NoError(t, s.settle(tok1, nil)) // stale: ignored
	st, _ = s.Stats(bg)
	require.Equal(t, 1, st.InFlight)
	require.NoError(t, other.settle(tok2, nil))
	st, _ = s.Stats(bg)
	require.Equal(t, Stats{}, st)
}

// Failing a request on each delivery dead-letters it; Requeue brings it
// back with a fresh count.
func TestDeadLetterAndRequeue(t *testing.T) {
	s := newStorage(t, shared.Client(t), WithMaxDeliveries(3), WithRetryDelay(0), WithPollInterval(time.Millisecond))
	require.NoError(t, s.AddRequest(marshal(t, "http://a.example/poison")))
	for i := 1; i <= 3; i++ {
		tok, _ := pop(t, s)
		require.Equal(t, fmt.Sprintf("1:%d", i), delivered(tok))
		require.NoError(t, s.settle(tok, fmt.Errorf("boom %d", i)))
	}
	_, err := s.GetRequest()
	require.ErrorIs(t, err, ErrQueueEmpty)
	st, err := s.Stats(bg)
	require.NoError(t, err)
	require.Equal(t, Stats{Dead: 1}, st)
	n, err := s.QueueSize()
	require.NoError(t, err)
	require.Zero(t, n)

	dl, err := s.DeadLetters(bg, 0, 10)
	require.NoError(t, err)
	require.Len(t, dl, 1)
	require.Equal(t, "1", dl[0].ID)
	require.Equal(t, "http://a.example/poison", dl[0].URL)
	require.Equal(t, 3, dl[0].Deliveries)
	require.Equal(t, "boom 3", dl[0].Reason)
	require.WithinDuration(t, time.Now(), dl[0].Since, 5*time.Second)

	require.ErrorIs(t, s.Requeue(bg, "nope"), ErrNotFound)
	require.NoError(t, s.Requeue(bg, "1"))
	require.ErrorIs(t, s.Requeue(bg, "1"), ErrNotFound)
	tok, _ := pop(t, s)
	require.Equal(t, "1:1", delivered(tok))
	require.NoError(t, s.settle(tok, nil))
	st, _ = s.Stats(bg)
	require.Equal(t, Stats{}, st)
	_, err = s.DeadLetters(bg, -1, 1)
	require.ErrorIs(t, err, ErrConfig)
}

// Values that this package did not write are dead-lettered on delivery,
// never handed to Colly and never a panic.
func TestCorruptStoredRequests(t *testing.T) {
	rdb := shared.Client(t)
	s := newStorage(t, rdb, WithMaxRequestSize(1000))
	plant := func(id, payload string) {
		require.NoError(t, rdb.HSet(bg, s.q.data, id, payload).Err())
		require.NoError(t, rdb.RPush(bg, s.q.ready, id).Err())
	}
	plant("a", "{not json")
	plant("b", string(marshal(t, "file:///etc/passwd")))
	plant("c", string(marshal(t, "http://a.example/"+strings.Repeat("y", 2000))))
	plant("d", `{"URL":"http://a.example/","Ctx":"not an object"}`)
	require.NoError(t, rdb.HSet(bg, s.q.tries, "e", "many").Err())
	plant("e", string(marshal(t, "http://a.example/e")))
	plant("f", string(marshal(t, "http://a.example/fine")))

	var got []string
	for range 10 {
		b, err := s.GetRequest()
		if errors.Is(err, ErrQueueEmpty) {
			break
		}
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidRequest)
			continue
		}
		got = append(got, string(b))
	}
	require.Len(t, got, 1)
	require.Contains(t, got[0], "/fine")
	dl, err := s.DeadLetters(bg, 0, 10)
	require.NoError(t, err)
	reasons := map[string]string{}
	for _, d := range dl {
		reasons[d.ID] = d.Reason
	}
	require.Len(t, reasons, 5)
	require.Contains(t, reasons["a"], "not a serialized Colly request")
	require.Contains(t, reasons["b"], `scheme "file"`)
	require.Contains(t, reasons["c"], "exceeds the limit")
	require.Contains(t, reasons["d"], "Ctx is not an object")
	require.Contains(t, reasons["e"], "corrupt delivery count")
}

// runQueue crawls the namespace of s with a fresh collector and
// queue.New(threads, s) until the queue is drained.
func runQueue(t testing.TB, s *Storage, threads int, setup func(*colly.Collector)) {
	t.Helper()
	c, q := queueCollector(t, s, threads, setup)
	require.NoError(t, q.Run(c))
}

// queueCollector returns a fresh collector on s with Attach's hooks, then
// setup's (if not nil), and a queue.New(threads, s) to run it.
func queueCollector(t testing.TB, s *Storage, threads int, setup func(*colly.Collector)) (*colly.Collector, *queue.Queue) {
	t.Helper()
	c := colly.NewCollector()
	require.NoError(t, c.SetStorage(s))
	s.Attach(c)
	if setup != nil {
		setup(c)
	}
	q, err := queue.New(threads, s)
	require.NoError(t, err)
	return c, q
}

// Through Colly's own queue: every URL fetched once, a 404 is done, a 500 is
// retried and dead-lettered, a duplicate entry is acknowledged as visited
// (not left to time out), and the queue ends empty.
func TestQueueWithColly(t *testing.T) {
	site := newCountingSite(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/poison":
			http.Error(w, "boom", http.StatusInternalServerError)
		case "/missing":
			http.NotFound(w, r)
		default:
			fmt.Fprint(w, "ok")
		}
	})
	s := newStorage(t, shared.Client(t), WithMaxDeliveries(3), WithRetryDelay(10*time.Millisecond),
		WithPollInterval(5*time.Millisecond), WithVisibilityTimeout(time.Minute))
	q, err := queue.New(1, s)
	require.NoError(t, err)
	for i := range 200 {
		require.NoError(t, q.AddURL(fmt.Sprintf("%s/p/%d", site.URL, i)))
	}
	require.NoError(t, q.AddURL(site.URL+"/p/7")) // duplicate entry
	require.NoError(t, q.AddURL(site.URL+"/poison"))
	require.NoError(t, q.AddURL(site.URL+"/missing"))

	start := time.Now()
	runQueue(t, s, 4, nil)
	require.Less(t, time.Since(start), 30*time.Second, "something waited for the visibility timeout")
	for i := range 200 {
		require.Equal(t, 1, site.count(fmt.Sprintf("/p/%d", i)), i)
	}
	require.Equal(t, 3, site.count("/poison"))
	require.Equal(t, 1, site.count("/missing"))
	st, err := s.Stats(bg)
	require.NoError(t, err)
	require.Equal(t, Stats{Dead: 1}, st)
	dl, err := s.DeadLetters(bg, 0, 10)
	require.NoError(t, err)
	require.Equal(t, site.URL+"/poison", dl[0].URL)
	require.Contains(t, dl[0].Reason, "Internal Server Error")
	require.Zero(t, s.pending.n.Load(), "pending deliveries left behind")
}

// A request delivered again after its worker died (claimed, maybe fetched,
// never acknowledged) is fetched again although its URL is marked visited;
// a separate duplicate entry of a visited URL is not.
func TestRedeliveryBypassesOwnVisitedMark(t *testing.T) {
	site := newCountingSite(t, nil)
	dead := newStorage(t, shared.Client(t), WithVisibilityTimeout(150*time.Millisecond), WithPollInterval(5*time.Millisecond))
	q, err := queue.New(1, dead)
	require.NoError(t, err)
	require.NoError(t, q.AddURL(site.URL+"/a"))

	// The worker that dies: Colly's requestCheck runs, then nothing.
	b, err := dead.GetRequest()
	require.NoError(t, err)
	c := colly.NewCollector()
	require.NoError(t, c.SetStorage(dead))
	r, err := c.UnmarshalRequest(b)
	require.NoError(t, err)
	v, err := c.HasVisited(r.URL.String())
	require.NoError(t, err)
	require.False(t, v)
	h, ok := requestHash(wireRequest{URL: r.URL.String()})
	require.True(t, ok)
	require.NoError(t, dead.Visited(h))

	require.NoError(t, q.AddURL(site.URL+"/a")) // a duplicate entry, added later
	time.Sleep(200 * time.Millisecond)

	survivor := twin(t, dead, shared.Client(t))
	runQueue(t, survivor, 2, nil)
	require.Equal(t, 1, site.count("/a"), "redelivery not fetched, or duplicate fetched")
	st, err := survivor.Stats(bg)
	require.NoError(t, err)
	require.Equal(t, Stats{}, st)
}

// Requests visited from a queued request's callbacks share its context;
// their outcome must not answer for the queued request: a child's success
// must not acknowledge the parent before the parent is done (a crash then
// would lose it), nor a child's failure fail it. A Retry from OnError takes
// the delivery over.
func TestAckOwnership(t *testing.T) {
	var flaky atomic.Int32
	site := newCountingSite(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/parent":
			fmt.Fprint(w, `<html><body><a href="/child-ok">c</a><a href="/child-fails">c</a></body></html>`)
		case "/child-fails":
			http.Error(w, "no", http.StatusServiceUnavailable)
		case "/flaky":
			if flaky.Add(1) == 1 {
				http.Error(w, "once", http.StatusBadGateway)
				return
			}
			fmt.Fprint(w, "ok")
		default:
			fmt.Fprint(w, "ok")
		}
	})
	s := newStorage(t, shared.Client(t), WithMaxDeliveries(1), WithRetryDelay(0), WithPollInterval(5*time.Millisecond))
	q, err := queue.New(1, s)
	require.NoError(t, err)
	require.NoError(t, q.AddURL(site.URL+"/parent"))
	require.NoError(t, q.AddURL(site.URL+"/flaky"))
	rdb := shared.Client(t)
	parentInFlight := func() string { // the parent is queue ID 1
		_, errF := rdb.ZScore(bg, s.q.inflight, "1").Result()
		_, errD := rdb.ZScore(bg, s.q.dead, "1").Result()
		return fmt.Sprintf("in flight: %v, dead: %v", errF == nil, errD == nil)
	}
	var seen []string
	runQueue(t, s, 1, func(c *colly.Collector) {
		c.OnHTML("a[href]", func(e *colly.HTMLElement) { _ = e.Request.Visit(e.Attr("href")) })
		c.OnScraped(func(r *colly.Response) {
			if strings.HasPrefix(r.Request.URL.Path, "/child") {
				seen = append(seen, parentInFlight())
			}
		})
		c.OnError(func(r *colly.Response, _ error) {
			switch r.Request.URL.Path {
			case "/flaky":
				_ = r.Request.Retry()
			case "/child-fails":
				seen = append(seen, parentInFlight())
			}
		})
	})
	require.Equal(t, 1, site.count("/parent"))
	require.Equal(t, 1, site.count("/child-ok"))
	require.Equal(t, 1, site.count("/child-fails"))
	require.Equal(t, 2, site.count("/flaky"))
	want := "in flight: true, dead: false"
	require.Equal(t, []string{want, want}, seen, "a child's outcome acknowledged or failed its parent")
	st, err := s.Stats(bg)
	require.NoError(t, err)
	require.Equal(t, Stats{}, st, "a child's failure or a retried request was dead-lettered")
}

func TestAckNotQueued(t *testing.T) {
	s := newStorage(t, shared.Client(t))
	r := &colly.Request{Ctx: colly.NewContext()}
	require.ErrorIs(t, s.Ack(r), ErrNotQueued)
	require.ErrorIs(t, s.Nack(r, nil), ErrNotQueued)
	r.Ctx.Put(ctxDelivery, "garbage")
	require.ErrorIs(t, s.Ack(r), ErrNotQueued)
	r.Ctx.Put(ctxDelivery, 12) // not even a string
	require.ErrorIs(t, s.Ack(r), ErrNotQueued)
}

// While a process runs one delivery of a URL, a second queue entry of the
// same URL is handed back, not run beside it, and the hand-back does not
// count as a delivery.
func TestSameURLHeldBackInProcess(t *testing.T) {
	s := newStorage(t, shared.Client(t), WithPollInterval(time.Millisecond))
	for _, u := range []string{"http://a.example/same", "http://a.example/same", "http://a.example/other"} {
		require.NoError(t, s.AddRequest(marshal(t, u)))
	}
	tok1, u1 := pop(t, s)
	require.Equal(t, "1:1", delivered(tok1))
	tok3, u3 := pop(t, s) // entry 2 is held back
	require.Equal(t, "3:1", delivered(tok3))
	require.NotEqual(t, u1, u3)
	_, err := s.GetRequest()
	require.ErrorIs(t, err, ErrQueueEmpty)
	require.NoError(t, s.settle(tok1, nil))
	tok2, u2 := pop(t, s)
	require.Equal(t, "2:1", delivered(tok2), "the hand-backs counted as deliveries")
	require.Equal(t, u1, u2)
	other := twin(t, s, shared.Client(t)) // another process is not held back by this one
	require.NoError(t, other.AddRequest(marshal(t, "http://a.example/same")))
	tok4, _ := pop(t, other)
	require.Equal(t, "4:1", delivered(tok4))
}

// AddRequest refuses what Colly's UnmarshalRequest cannot decode (a member
// of another type than Colly's), and accepts what it can: before, Headers
// of a string, a Depth of a string or a Ctx that was no object were queued
// and then delivered to a queue that could not run them.
func TestAddRequestRefusesWhatCollyCannotDecode(t *testing.T) {
	s := newStorage(t, shared.Client(t))
	c := colly.NewCollector()
	r, err := c.UnmarshalRequest(marshal(t, "http://a.example/colly"))
	require.NoError(t, err)
	*r.Headers = http.Header{"X-A": {"b"}}
	r.Ctx.Put("k", map[string]any{"n": 1})
	r.Depth, r.ID = 3, 77
	own, err := r.Marshal()
	require.NoError(t, err)
	accepted := 0
	for _, b := range []string{
		string(own),
		`{"URL":"http://a.example/1","Headers":"notamap"}`,
		`{"URL":"http://a.example/2","Headers":{"A":"b"}}`,
		`{"URL":"http://a.example/3","Headers":{"A":[1]}}`,
		`{"URL":"http://a.example/4","Headers":{"A":["b",null]},"Ctx":null}`,
		`{"URL":"http://a.example/5","Headers":null}`,
		`{"URL":"http://a.example/6","Depth":"x"}`,
		`{"URL":"http://a.example/7","Depth":1.5}`,
		`{"URL":"http://a.example/8","ID":-1}`,
		`{"URL":"http://a.example/9","ID":4294967296}`,
		`{"URL":"http://a.example/10","Ctx":"x"}`,
		`{"URL":"http://a.example/11","Ctx":[1]}`,
		`{"URL":"http://a.example/12","Ctx":{"a":[1,{"b":null}]}}`,
		`{"URL":"http://a.example/13","Host":5}`,
		`{"URL":"http://a.example/14","host":"h.example","depth":2,"ctx":{}}`,
	} {
		_, cerr := c.UnmarshalRequest([]byte(b))
		err := s.AddRequest([]byte(b))
		if cerr != nil {
			require.ErrorIs(t, err, ErrInvalidRequest, "%s: Colly: %v", b, cerr)
		} else {
			require.NoError(t, err, b)
			accepted++
		}
	}
	require.Equal(t, 5, accepted)
	st, err := s.Stats(bg)
	require.NoError(t, err)
	require.Equal(t, Stats{Ready: accepted}, st)
	for range accepted { // what is queued, Colly runs
		b, err := s.GetRequest()
		require.NoError(t, err)
		_, err = c.UnmarshalRequest(b)
		require.NoError(t, err)
	}
}
