package metrics

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// clock is a settable time source for a Collector.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)} }

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// testCollector is a Collector with a settable clock, fed by hand.
func testCollector(opts ...Option) (*Collector, *clock) {
	c := newCollector("main", newConfig(append([]Option{WithServer("w1")}, opts...)))
	clk := newClock()
	c.now = clk.now
	return c, clk
}

func attempt(site, proxy string, k ban.Kind, reason string, latency time.Duration) proxyswitch.AttemptEvent {
	return proxyswitch.AttemptEvent{Pool: "main", Site: site, ProxyID: proxy, Kind: k, Reason: reason, Latency: latency}
}

func TestCollectorCountsEvents(t *testing.T) {
	c, clk := testCollector()
	for range 7 {
		c.ObserveAttempt(attempt("a.example", "p1", ban.OK, "", 100*time.Millisecond))
	}
	c.ObserveAttempt(attempt("a.example", "p1", ban.Neutral, "", 300*time.Millisecond))
	c.ObserveAttempt(attempt("a.example", "p2", ban.Ban, "http_429", time.Second))
	c.ObserveAttempt(attempt("b.example", "p3", ban.ProxyFailure, "proxy_connect", 2*time.Second))
	c.ObserveAttempt(attempt("b.example", "p3", ban.Ban, "Not A Reason!", 0))
	c.ObserveAttempt(attempt("c.example", "p4", ban.Neutral, ban.ReasonUnchecked, 0))
	c.ObserveQuarantine(proxyswitch.QuarantineEvent{Pool: "main", Site: "a.example", ProxyID: "p2", Reason: "http_429",
		Kind: ban.Ban, Duration: 30 * time.Minute, InARow: 1})
	c.ObserveQuarantine(proxyswitch.QuarantineEvent{Pool: "main", Site: "b.example", ProxyID: "p3", Reason: "proxy_connect",
		Kind: ban.ProxyFailure, Duration: time.Minute, InARow: 5, Dead: true})

	// p2 answers well on a.example 90s after its quarantine: one recovery.
	clk.add(90 * time.Second)
	c.ObserveAttempt(attempt("a.example", "p2", ban.OK, "", 0))
	c.ObserveAttempt(attempt("a.example", "p2", ban.OK, "", 0)) // not a second one

	f, page := scrape(t, c)
	f.expect(t, []want{
		{"proxyswitch_attempts_total", []string{"pool=main", "server=w1", "site=a.example", "outcome=ok"}, 9},
		{"proxyswitch_attempts_total", []string{"site=a.example", "outcome=neutral"}, 1},
		{"proxyswitch_attempts_total", []string{"site=a.example", "outcome=ban"}, 1},
		{"proxyswitch_attempts_total", []string{"site=b.example", "outcome=proxy_failure"}, 1},
		{"proxyswitch_attempts_total", []string{"site=b.example", "outcome=ban"}, 1},
		{"proxyswitch_attempts_total", []string{"site=c.example", "outcome=unchecked"}, 1},
		{"proxyswitch_bans_total", []string{"site=a.example", "kind=ban", "reason=http_429"}, 1},
		{"proxyswitch_bans_total", []string{"site=b.example", "kind=proxy_failure", "reason=proxy_connect"}, 1},
		{"proxyswitch_bans_total", []string{"site=b.example", "kind=ban", "reason=custom"}, 1},
		{"proxyswitch_proxies_marked_dead_total", []string{"reason=proxy_connect"}, 1},
	}...)
	n, sum, ok := f.histogram("proxyswitch_attempt_duration_seconds", "site=a.example")
	require.True(t, ok)
	assert.EqualValues(t, 11, n)
	assert.InDelta(t, 7*0.1+0.3+1, sum, 1e-9)
	n, sum, ok = f.histogram("proxyswitch_quarantine_duration_seconds", "site=a.example", "kind=ban")
	require.True(t, ok)
	assert.EqualValues(t, 1, n)
	assert.InDelta(t, 1800, sum, 1e-9)
	_, _, ok = f.histogram("proxyswitch_quarantine_duration_seconds", "site=b.example", "kind=proxy_failure")
	assert.False(t, ok, "a dead-marking is counted as such, not as a quarantine")
	n, sum, ok = f.histogram("proxyswitch_recovery_duration_seconds", "site=a.example")
	require.True(t, ok)
	assert.EqualValues(t, 1, n)
	assert.InDelta(t, 90, sum, 1e-9)
	assert.NotContains(t, page, "proxyswitch_proxy_success_ratio", "per-proxy series are opt-in")
	assert.NotContains(t, page, "proxyswitch_members", "no member list observed")

	// Quarantines that never end in a good answer are forgotten after two days.
	c.ObserveQuarantine(proxyswitch.QuarantineEvent{Site: "a.example", ProxyID: "p9", Kind: ban.Ban, Duration: time.Hour})
	assert.EqualValues(t, 2, c.pendingN.Load())
	clk.add(49 * time.Hour)
	scrape(t, c)
	assert.Zero(t, c.pendingN.Load())
}

func TestCollectorCountsSessions(t *testing.T) {
	c, _ := testCollector()
	f, _ := scrape(t, c)
	f.expect(t, want{"proxyswitch_sessions_started_total", []string{"pool=main", "server=w1"}, 0})
	for range 4 {
		c.ObserveSession(proxyswitch.SessionEvent{Pool: "main", Site: "a.example", ProxyID: "p1"})
	}
	end := func(reason string, requests int, age time.Duration) {
		c.ObserveSession(proxyswitch.SessionEvent{Pool: "main", ProxyID: "p1", Ended: true, Reason: reason, Requests: requests, Age: age})
	}
	end("http_403", 12, 40*time.Second)
	end(proxyswitch.SessionMaxRequests, 50, 2*time.Minute)
	end(proxyswitch.SessionEnded, 3, time.Second)
	end("Weird Reason {}", -1, -time.Second) // never a bad label, never a negative observation

	f, _ = scrape(t, c)
	f.expect(t, []want{
		{"proxyswitch_sessions_started_total", nil, 4},
		{"proxyswitch_sessions_ended_total", []string{"reason=http_403"}, 1},
		{"proxyswitch_sessions_ended_total", []string{"reason=max_requests"}, 1},
		{"proxyswitch_sessions_ended_total", []string{"reason=ended"}, 1},
		{"proxyswitch_sessions_ended_total", []string{"reason=custom"}, 1},
	}...)
	n, sum, ok := f.histogram("proxyswitch_session_requests")
	require.True(t, ok)
	assert.EqualValues(t, 4, n)
	assert.InDelta(t, 12+50+3, sum, 1e-9)
	n, sum, ok = f.histogram("proxyswitch_session_duration_seconds")
	require.True(t, ok)
	assert.EqualValues(t, 4, n)
	assert.InDelta(t, 40+120+1, sum, 1e-9)
}

func TestSiteLabelsAreBounded(t *testing.T) {
	c, _ := testCollector(WithMaxSites(3))
	for i := range 10 {
		c.ObserveAttempt(attempt(fmt.Sprintf("s%d.example", i), "p", ban.OK, "", 0))
	}
	c.ObserveAttempt(attempt("s0.example", "p", ban.OK, "", 0))
	c.ObserveAttempt(attempt("", "p", ban.OK, "", 0))
	f, _ := scrape(t, c)
	assert.Equal(t, []string{"_other", "s0.example", "s1.example", "s2.example"}, f.labelValues("proxyswitch_attempts_total", "site"))
	v, _ := f.value("proxyswitch_attempts_total", "site=_other")
	assert.Equal(t, 8.0, v)
	v, _ = f.value("proxyswitch_attempts_total", "site=s0.example")
	assert.Equal(t, 2.0, v)

	// Invalid UTF-8 in a site (a custom site function) neither panics nor
	// breaks the page.
	c2, _ := testCollector()
	c2.ObserveAttempt(attempt("bad\xff\xfesite", "p", ban.OK, "", 0))
	f, _ = scrape(t, c2)
	assert.Equal(t, []string{"bad\uFFFDsite"}, f.labelValues("proxyswitch_attempts_total", "site"))
}

func TestTopProxies(t *testing.T) {
	c, clk := testCollector(WithTopProxies(2), WithProxyWindow(4))
	ms := time.Millisecond
	// p1: 6 attempts, the last 4 are ok, ok, ban, failure (50% over the window).
	for _, k := range []ban.Kind{ban.Ban, ban.Ban, ban.OK, ban.OK, ban.Ban, ban.ProxyFailure} {
		c.ObserveAttempt(attempt("a", "p1", k, "x", 100*ms))
	}
	// p2: all good but slow; p3: all good and fast; p4: 1 of 4 bad.
	for range 5 {
		c.ObserveAttempt(attempt("a", "p2", ban.OK, "", 900*ms))
		c.ObserveAttempt(attempt("b", "p3", ban.Neutral, "", 10*ms))
	}
	for i := range 4 {
		k := ban.OK
		if i == 0 {
			k = ban.Ban
		}
		c.ObserveAttempt(attempt("a", "p4", k, "x", time.Duration(i+1)*100*ms))
	}
	f, _ := scrape(t, c)
	assert.Equal(t, []string{"p1", "p4"}, f.labelValues("proxyswitch_proxy_success_ratio", "proxy"))
	for _, tc := range []struct {
		proxy            string
		success, latency float64
		attempts         float64
	}{{"p1", 0.5, 0.1, 4}, {"p4", 0.75, 0.25, 4}} {
		v, _ := f.value("proxyswitch_proxy_success_ratio", "proxy="+tc.proxy)
		assert.Equal(t, tc.success, v, tc.proxy)
		v, _ = f.value("proxyswitch_proxy_latency_seconds", "proxy="+tc.proxy)
		assert.InDelta(t, tc.latency, v, 1e-9, tc.proxy)
		v, _ = f.value("proxyswitch_proxy_window_attempts", "proxy="+tc.proxy)
		assert.Equal(t, tc.attempts, v, tc.proxy)
	}
	v, _ := f.value("proxyswitch_tracked_proxies")
	assert.Equal(t, 4.0, v)

	// p1 and p4 recover: the slow p2 is now among the worst two.
	for range 4 {
		c.ObserveAttempt(attempt("a", "p1", ban.OK, "", 5*ms))
		c.ObserveAttempt(attempt("a", "p4", ban.OK, "", 5*ms))
	}
	f, _ = scrape(t, c)
	assert.Equal(t, []string{"p2", "p3"}, f.labelValues("proxyswitch_proxy_success_ratio", "proxy"))

	// An hour without attempts: forgotten.
	clk.add(61 * time.Minute)
	c.ObserveAttempt(attempt("a", "p3", ban.OK, "", 10*ms))
	f, _ = scrape(t, c)
	assert.Equal(t, []string{"p3"}, f.labelValues("proxyswitch_proxy_success_ratio", "proxy"))
	v, _ = f.value("proxyswitch_tracked_proxies")
	assert.Equal(t, 1.0, v)
}

func TestJoinBanSpike(t *testing.T) {
	c, clk := testCollector(WithJoinWindow(time.Minute))
	feed := func(n, bans int) {
		for i := range n {
			k := ban.OK
			if i < bans {
				k = ban.Ban
			}
			c.ObserveAttempt(attempt("a", "p", k, "http_403", 0))
			clk.add(time.Second)
		}
	}
	spike := func() float64 {
		f, _ := scrape(t, c)
		v, ok := f.value("proxyswitch_join_ban_spike")
		require.True(t, ok)
		return v
	}

	c.ObserveMembers([]string{"w1"})
	feed(100, 2) // 2 bans, long before the join
	clk.add(time.Minute)
	feed(40, 1) // the window before the join: 1 ban in 40 attempts
	c.ObserveMembers([]string{"w1"})
	assert.Zero(t, spike(), "the same list is no join")
	c.ObserveMembers([]string{"w2", "w1"})
	feed(19, 19)
	assert.Zero(t, spike(), "fewer than 20 attempts after the join decide nothing")
	feed(11, 0) // 30 attempts, 19 bans

	f, _ := scrape(t, c)
	f.expect(t, []want{
		{"proxyswitch_members", nil, 2},
		{"proxyswitch_member_joins_total", nil, 1},
		{"proxyswitch_join_ban_ratio", []string{"window=before"}, 1.0 / 40},
		{"proxyswitch_join_ban_ratio", []string{"window=after"}, 19.0 / 30},
		{"proxyswitch_join_ban_spike", nil, 1},
	}...)
	v, _ := f.value("proxyswitch_last_member_join_timestamp_seconds")
	assert.InDelta(t, float64(clk.now().Add(-30*time.Second).Unix()), v, 1e-3)

	// The after window closes a minute after the join: later bans do not
	// count, and the signal ends two join windows after the join.
	feed(30, 0)
	feed(30, 30)
	f, _ = scrape(t, c)
	after, _ := f.value("proxyswitch_join_ban_ratio", "window=after")
	assert.InDelta(t, 19.0/60, after, 1e-9)
	assert.Equal(t, 1.0, spike())
	clk.add(30 * time.Second)
	assert.Zero(t, spike())

	// A member leaving is no join; two joining at once count twice; a join
	// with the same ban share as before is no spike.
	alternate := func(n int) {
		for i := range n {
			k := ban.OK
			if i%2 == 0 {
				k = ban.Ban
			}
			c.ObserveAttempt(attempt("a", "p", k, "http_403", 0))
			clk.add(time.Second)
		}
	}
	alternate(60)
	c.ObserveMembers([]string{"w1"})
	c.ObserveMembers([]string{"w1", "w3", "w4"})
	alternate(60)
	f, _ = scrape(t, c)
	v, _ = f.value("proxyswitch_member_joins_total")
	assert.Equal(t, 3.0, v)
	v, _ = f.value("proxyswitch_members")
	assert.Equal(t, 3.0, v)
	before, _ := f.value("proxyswitch_join_ban_ratio", "window=before")
	after, _ = f.value("proxyswitch_join_ban_ratio", "window=after")
	assert.InDelta(t, 0.5, before, 0.05)
	assert.InDelta(t, 0.5, after, 1e-9)
	assert.Zero(t, spike())
}

func TestObserverIsTheSwitchs(t *testing.T) {
	sw := newSwitch(t)
	c := New(sw, WithServer("w1"))
	var got []string
	ch := make(chan *prometheus.Desc, 64)
	c.Describe(ch)
	close(ch)
	for d := range ch {
		got = append(got, d.String())
	}
	assert.Len(t, got, 24)
	assert.Panics(t, func() { New(nil) })
	assert.Panics(t, func() { NewState(nil) })
}

func BenchmarkObserveAttempt(b *testing.B) {
	for _, k := range []int{0, 20} {
		b.Run(fmt.Sprintf("top=%d", k), func(b *testing.B) {
			c, _ := testCollector(WithTopProxies(k))
			c.now = time.Now
			ids := make([]string, 500)
			for i := range ids {
				ids[i] = fmt.Sprintf("%016x", i)
			}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					i++
					c.ObserveAttempt(attempt("ozon.example", ids[i%len(ids)], ban.OK, "", 120*time.Millisecond))
				}
			})
		})
	}
}

// TestConcurrentUse feeds a Collector from many goroutines while it is
// scraped and told of member lists (run with -race); nothing is lost.
func TestConcurrentUse(t *testing.T) {
	c, _ := testCollector(WithTopProxies(5), WithProxyWindow(10))
	c.now = time.Now
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				k := ban.OK
				if i%10 == 0 {
					k = ban.Ban
					c.ObserveQuarantine(proxyswitch.QuarantineEvent{Site: "a", ProxyID: fmt.Sprint(g), Kind: k, Duration: time.Second})
				}
				c.ObserveAttempt(attempt("a", fmt.Sprint(g, i%7), k, "http_429", time.Millisecond))
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 20 {
			c.ObserveMembers([]string{"w1", fmt.Sprint("w", 2+i%3)})
			scrape(t, c)
		}
	}()
	wg.Wait()
	f, _ := scrape(t, c)
	assert.Equal(t, 4000.0, f.sum("proxyswitch_attempts_total"))
	v, _ := f.value("proxyswitch_bans_total", "reason=http_429")
	assert.Equal(t, 400.0, v)
	v, _ = f.value("proxyswitch_tracked_proxies")
	assert.Equal(t, 56.0, v)
}

func TestCollectorCountsAttemptsByLabel(t *testing.T) {
	c, _ := testCollector(WithMaxSites(3))
	ru := attempt("a.example", "p1", ban.OK, "", 0)
	ru.Labels = "country=ru,type=residential"
	for range 3 {
		c.ObserveAttempt(ru)
	}
	ru.Kind = ban.Ban
	c.ObserveAttempt(ru)
	de := attempt("a.example", "p2", ban.OK, "", 0)
	de.Labels = "country=de,type=datacenter"
	c.ObserveAttempt(de)
	c.ObserveAttempt(attempt("a.example", "p3", ban.OK, "", 0)) // no labels: in no series
	f, page := scrape(t, c)
	f.expect(t, []want{
		{"proxyswitch_label_attempts_total", []string{"pool=main", "server=w1", "label=country=ru", "outcome=ok"}, 3},
		{"proxyswitch_label_attempts_total", []string{"label=country=ru", "outcome=ban"}, 1},
		{"proxyswitch_label_attempts_total", []string{"label=type=residential", "outcome=ok"}, 3},
		{"proxyswitch_label_attempts_total", []string{"label=country=de", "outcome=ok"}, 1},
		{"proxyswitch_label_attempts_total", []string{"label=" + OtherSite, "outcome=ok"}, 1}, // the 4th label, past the bound
		{"proxyswitch_attempts_total", []string{"site=a.example", "outcome=ok"}, 5},
	}...)
	assert.NotContains(t, page, `label=""`)
}
