package proxyswitch

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/proxyswitch/proxyswitch/internal/testlog"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sessionTally sums an observer's session events: starts, ends by reason,
// and the requests of the sessions that ended, by reason.
type sessionTally struct {
	started  int
	ended    map[string]int
	requests map[string][]int
	ages     map[string][]time.Duration
	pools    map[string]bool
	proxies  map[string]bool // proxy IDs of the events
}

func (o *recordingObserver) tally(t *testing.T) sessionTally {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	st := sessionTally{ended: map[string]int{}, requests: map[string][]int{}, ages: map[string][]time.Duration{}, pools: map[string]bool{}, proxies: map[string]bool{}}
	for _, e := range o.sessions {
		st.pools[e.Pool] = true
		st.proxies[e.ProxyID] = true
		if !e.Ended {
			st.started++
			assert.Empty(t, e.Reason, "a start has no reason")
			assert.NotEmpty(t, e.Site, "a start names its site")
			continue
		}
		st.ended[e.Reason]++
		st.requests[e.Reason] = append(st.requests[e.Reason], e.Requests)
		// By Redis' clock in ms: a session that starts and ends within a
		// millisecond is 0 old (the test's "ended" session is made older).
		assert.GreaterOrEqual(t, e.Age, time.Duration(0))
		assert.Less(t, e.Age, time.Minute)
		st.ages[e.Reason] = append(st.ages[e.Reason], e.Age)
	}
	return st
}

// The observer sees every session this process starts and ends, with the
// reason and the requests it served, whichever collector (and Redis client)
// made the event; LiveSessions counts what is left, cluster-wide. The
// shop's view of IP changes is the ground truth for the starts.
func TestSessionEventsAndLiveSessions(t *testing.T) {
	ctx := context.Background()
	flow, site, _, s := sessionShop(t, 10, WithSessions(Sessions{MaxRequests: 3}))
	other := sibling(t, s, shared.Client(t))
	obs := &recordingObserver{}
	s.SetObserver(obs)
	other.SetObserver(obs)
	cs := []*colly.Collector{attached(s), attached(other)}
	step := func(task string, n int) {
		t.Helper()
		require.NoError(t, cs[n%2].Request("GET", stepURL(site, task, n), nil, NewTaskContext(task), nil))
	}
	live := func() int {
		t.Helper()
		n, err := other.LiveSessions(ctx)
		require.NoError(t, err)
		return n
	}
	assert.Zero(t, live())

	for n := 1; n <= 7; n++ { // three sessions: 3 + 3 + 1 requests
		step("limited", n)
	}
	assert.Equal(t, 1, live())
	step("banned", 1)
	step("banned", 2)
	flow.Ban(flow.visitor("banned").ips[0])
	step("banned", 3) // retired on its 403, sent again in a new session
	step("ended", 1)
	assert.Equal(t, 3, live())
	time.Sleep(5 * time.Millisecond) // the "ended" session's age is then at least 5ms
	ended, err := s.EndSession(ctx, "ended")
	require.NoError(t, err)
	require.True(t, ended)
	assert.Equal(t, 2, live(), "limited and banned live on")

	got := obs.tally(t)
	shopSessions := 0
	for _, task := range []string{"limited", "banned", "ended"} {
		shopSessions += len(flow.visitor(task).ips) // a new session is a new IP (the old one is held out)
	}
	assert.Equal(t, 6, shopSessions)
	assert.Equal(t, shopSessions, got.started)
	assert.Equal(t, map[string]int{SessionMaxRequests: 2, "http_403": 1, SessionEnded: 1}, got.ended)
	assert.Equal(t, []int{3, 3}, got.requests[SessionMaxRequests])
	assert.Equal(t, []int{3}, got.requests["http_403"], "two steps and the banned one")
	assert.Equal(t, []int{1}, got.requests[SessionEnded])
	if assert.Len(t, got.ages[SessionEnded], 1) {
		assert.GreaterOrEqual(t, got.ages[SessionEnded][0], 5*time.Millisecond, "an ended session's age, from its start to its end")
	}
	assert.Equal(t, map[string]bool{s.Pool(): true}, got.pools)
	assert.NotContains(t, got.proxies, "")
	endedN := 0
	for _, n := range got.ended {
		endedN += n
	}
	assert.Equal(t, got.started-endedN, live(), "started minus ended: none lapsed")
	assert.Empty(t, flow.errors())

	// Clear forgets the live sessions with the leases they held.
	require.NoError(t, s.Clear(ctx))
	assert.Zero(t, live())
}

// A session that lapses is seen by no one: no event, and it leaves the
// live count when its TTL runs out; starting sessions trims it away.
func TestLiveSessionsLapse(t *testing.T) {
	ctx := context.Background()
	_, site, _, s := sessionShop(t, 4, WithSessions(Sessions{TTL: 1500 * time.Millisecond}))
	obs := &recordingObserver{}
	s.SetObserver(obs)
	c := attached(s)
	for _, task := range []string{"a", "b", "c"} {
		require.NoError(t, c.Request("GET", stepURL(site, task, 1), nil, NewTaskContext(task), nil))
	}
	n, err := s.LiveSessions(ctx)
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	time.Sleep(1600 * time.Millisecond)
	n, err = s.LiveSessions(ctx)
	require.NoError(t, err)
	assert.Zero(t, n, "all three lapsed")
	require.NoError(t, c.Request("GET", stepURL(site, "d", 1), nil, NewTaskContext("d"), nil))
	n, err = s.LiveSessions(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	card, err := shared.Client(t).ZCard(ctx, s.keys.liveSessions()).Result()
	require.NoError(t, err)
	assert.EqualValues(t, 1, card, "the lapsed ones were trimmed when d started")
	ttl, err := shared.Client(t).PTTL(ctx, s.keys.liveSessions()).Result()
	require.NoError(t, err)
	assert.Greater(t, ttl, time.Duration(0), "the set expires with the pool's idle TTL")
	got := obs.tally(t)
	assert.Equal(t, 4, got.started)
	assert.Empty(t, got.ended)
}

// Trimming lapsed sessions is a bounded step per session started: with
// 5,000 lapsed entries in the live-sessions zset, a session start removes
// the 100 that lapsed first, not all of them (before, one ZREMRANGEBYSCORE
// of every lapsed entry: 500,000 blocked Redis for 0.24 s), and the ones
// left are not counted as live.
func TestLiveSessionsTrimBounded(t *testing.T) {
	ctx := context.Background()
	rdb := shared.Client(t)
	s := newSwitch(t, rdb)
	_, err := s.Add(ctx, scaleURLs(0, 10)...)
	require.NoError(t, err)
	const lapsed = 5000
	past := time.Now().Add(-time.Minute).UnixMilli()
	zs := make([]redis.Z, lapsed)
	for i := range zs {
		zs[i] = redis.Z{Score: float64(past + int64(i)), Member: fmt.Sprintf("%016x", i+1)}
	}
	require.NoError(t, rdb.ZAdd(ctx, s.keys.liveSessions(), zs...).Err())
	n, err := s.LiveSessions(ctx)
	require.NoError(t, err)
	assert.Zero(t, n, "lapsed entries are not live")

	require.NoError(t, s.own.redis().startSession(ctx, "task-1", "shop.example", "shop.example", nil))
	card, err := rdb.ZCard(ctx, s.keys.liveSessions()).Result()
	require.NoError(t, err)
	assert.EqualValues(t, lapsed-100+1, card, "one start trims 100 lapsed entries and adds its own")
	first, err := rdb.ZRangeWithScores(ctx, s.keys.liveSessions(), 0, 0).Result()
	require.NoError(t, err)
	require.Len(t, first, 1)
	assert.EqualValues(t, past+100, first[0].Score, "the longest lapsed go first")
	n, err = s.LiveSessions(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n, "only the session started is live")
}

// Sessions of Sessions.Pool lease from another pool: their events reach
// the Switch's observer with that pool's name, and LiveSessions counts
// them there.
func TestSessionEventsOfSessionPool(t *testing.T) {
	ctx := context.Background()
	flow, site, _, s := sessionShop(t, 2, WithSessions(Sessions{Pool: "residential"}))
	obs := &recordingObserver{}
	s.SetObserver(obs)
	resi := testbed.NewProxies(t, 2)
	_, err := s.sessionSwitch(t).Add(ctx, resi[0].URL(), resi[1].URL())
	require.NoError(t, err)
	c := attached(s)
	task := NewTaskContext("shopper")
	for n := 1; n <= 3; n++ {
		require.NoError(t, c.Request("GET", stepURL(site, "shopper", n), nil, task, nil))
	}
	info := SessionOf(task)
	require.NotNil(t, info)
	p0, err := ParseProxy(resi[0].URL())
	require.NoError(t, err)
	p1, err := ParseProxy(resi[1].URL())
	require.NoError(t, err)
	assert.Contains(t, []string{p0.ID(), p1.ID()}, info.ProxyID)
	obs.mu.Lock()
	assert.Equal(t, info.ProxyID, obs.sessions[0].ProxyID, "the start names the session's proxy")
	obs.mu.Unlock()
	n, err := s.LiveSessions(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	flow.Ban(flow.visitor("shopper").ips[0])
	require.NoError(t, c.Request("GET", stepURL(site, "shopper", 4), nil, NewTaskContext("shopper"), nil))
	got := obs.tally(t)
	assert.Equal(t, 2, got.started)
	assert.Equal(t, map[string]int{"http_403": 1}, got.ended)
	assert.Equal(t, map[string]bool{"residential": true}, got.pools)
	obs.mu.Lock()
	q := len(obs.quarantines)
	obs.mu.Unlock()
	assert.Equal(t, 1, q, "the session pool's ban reached the observer too")
	s.SetObserver(nil)
	_, err = s.EndSession(ctx, "shopper")
	require.NoError(t, err)
	assert.Len(t, obs.tally(t).ended, 1, "no observer, no event")
}

// SetObserver with several fans every event out: both observers see the same sessions,
// attempts and quarantines.
func TestObserversFanOut(t *testing.T) {
	assert.Nil(t, observers())
	assert.Nil(t, observers(nil, nil))
	one := &recordingObserver{}
	assert.Same(t, one, observers(nil, one))

	flow, site, _, s := sessionShop(t, 3)
	a, b := &recordingObserver{}, &recordingObserver{}
	s.SetObserver(a, nil, b)
	c := attached(s)
	task := NewTaskContext("fan")
	require.NoError(t, c.Request("GET", stepURL(site, "fan", 1), nil, task, nil))
	flow.Ban(flow.visitor("fan").ips[0])
	require.NoError(t, c.Request("GET", stepURL(site, "fan", 2), nil, task, nil))
	for _, o := range []*recordingObserver{a, b} {
		got := o.tally(t)
		assert.Equal(t, 2, got.started)
		assert.Equal(t, map[string]int{"http_403": 1}, got.ended)
		assert.Equal(t, map[ban.Kind]int{ban.OK: 2, ban.Ban: 1}, o.attemptKinds())
		o.mu.Lock()
		assert.Len(t, o.quarantines, 1)
		o.mu.Unlock()
	}
}

// Sessions lease from the session pool whatever a site's route says; a
// task's request to a routed site says so once, unless Sessions.Pool
// names the sessions' pool.
func TestSessionWarnsRouteIgnored(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts func(site string) []Option
		warn int
	}{
		{"routed, no session pool", func(site string) []Option { return []Option{WithRoute(site, "residential")} }, 1},
		{"routed, session pool", func(site string) []Option {
			return []Option{WithRoute(site, "residential"), WithSessions(Sessions{Pool: "residential"})}
		}, 0},
		{"no route", func(string) []Option { return nil }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &testlog.Buffer{}
			flow := newShopFlow()
			site := testbed.NewSite(t, "shop", flow)
			proxies := testbed.NewProxies(t, 2)
			s := newSwitch(t, shared.Client(t), append(tc.opts(site.Host()), WithLogger(logs.Logger()))...)
			for _, sw := range []*Switch{s, s.sessionSwitch(t)} {
				_, err := sw.Add(context.Background(), proxies[0].URL(), proxies[1].URL())
				require.NoError(t, err)
			}
			c := attached(s)
			for n := 1; n <= 3; n++ {
				require.NoError(t, c.Request("GET", stepURL(site, "routed", n), nil, NewTaskContext("routed"), nil))
			}
			assert.Equal(t, tc.warn, strings.Count(logs.String(), "not from their route's pools"), logs.String())
			assert.Empty(t, flow.errors())
		})
	}
}
