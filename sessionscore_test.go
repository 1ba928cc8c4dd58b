package proxyswitch

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// refusingFlow is the shop flow behind a gate that answers 429 to every
// request with refuse=1 in its query, whoever sends it.
type refusingFlow struct {
	*shopFlow
	refused atomic.Int64
}

func (f *refusingFlow) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("refuse") == "1" {
		f.refused.Add(1)
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	f.shopFlow.ServeHTTP(w, r)
}

// TestSessionSoftRefusal is issue 16's session acceptance: a task refused
// once with a soft reason (429) keeps its IP and cookies, the refused
// request failing at once with the 429 named; healthy requests take the
// score down; soft refusals in a row spend it and retire the session; a
// hard ban still retires it at once.
func TestSessionSoftRefusal(t *testing.T) {
	flow := &refusingFlow{shopFlow: newShopFlow()}
	site := testbed.NewSite(t, "shop", flow)
	proxies := testbed.NewProxies(t, 4)
	var mu sync.Mutex
	var retired []SessionRetirement
	s := newSwitch(t, shared.Client(t), WithSessions(Sessions{Retired: func(r SessionRetirement) {
		mu.Lock()
		retired = append(retired, r)
		mu.Unlock()
	}}))
	for _, p := range proxies {
		_, err := s.Add(context.Background(), p.URL())
		require.NoError(t, err)
	}
	other := sibling(t, s, shared.Client(t)) // the task goes on on another server too
	cs := []*colly.Collector{attached(s), attached(other)}
	const task = "cart-7"
	ctx := NewTaskContext(task)
	n := 0
	step := func() error {
		n++
		return cs[n%2].Request("GET", stepURL(site, task, n), nil, ctx, nil)
	}
	refuse := func() {
		t.Helper()
		n++
		err := cs[n%2].Request("GET", stepURL(site, task, n)+"&refuse=1", nil, ctx, nil)
		require.ErrorIs(t, err, ErrBanned)
		assert.Equal(t, "http_429", blockedReason(t, err))
	}
	for range 3 {
		require.NoError(t, step())
	}
	first := SessionOf(ctx)
	require.NotNil(t, first)
	ip := flow.visitor(task).ips[0]

	// One soft refusal: not retried, the session lives on with its IP and cookies.
	refuse()
	assert.EqualValues(t, 1, flow.refused.Load(), "the refused request was not sent again")
	for range 2 {
		require.NoError(t, step())
	}
	assert.Equal(t, []string{ip}, flow.visitor(task).ips, "the same IP after the refusal")
	assert.Equal(t, first.ID, SessionOf(ctx).ID, "the same session")
	assert.Empty(t, flow.errors(), "the cookies went on")
	assert.Empty(t, s.BanCounts(), "no quarantine")

	// Refusals with healthy requests between them never spend the score
	// (1, then 1 - 2*0.5 + 1 = 1 ...).
	for range 3 {
		refuse()
		require.NoError(t, step())
		require.NoError(t, step())
	}
	assert.Equal(t, []string{ip}, flow.visitor(task).ips)
	assert.Equal(t, first.ID, SessionOf(ctx).ID)

	// Three in a row spend it (1, 2, 3): the third retires the session and
	// quarantines its proxy, as a ban does.
	refuse()
	refuse()
	mu.Lock()
	assert.Empty(t, retired, "a score of 2 of 3")
	mu.Unlock()
	n++
	require.ErrorIs(t, cs[n%2].Request("GET", stepURL(site, task, n)+"&refuse=1", nil, ctx, nil), ErrBanned)
	mu.Lock()
	require.NotEmpty(t, retired, "the score is spent")
	assert.Equal(t, first.ID, retired[0].ID)
	assert.Equal(t, "http_429", retired[0].Reason)
	mu.Unlock()
	require.NoError(t, step())
	v := flow.visitor(task)
	require.Len(t, v.ips, 2, "a new IP")
	assert.Equal(t, 1, v.fresh, "without the old cookies")
	second := SessionOf(ctx)
	require.NotEqual(t, first.ID, second.ID)

	// A hard ban retires the new session at once.
	flow.Ban(v.ips[1])
	require.NoError(t, step(), "the banned step goes again through another proxy, in a new session")
	assert.Len(t, flow.visitor(task).ips, 3)
	assert.NotEqual(t, second.ID, SessionOf(ctx).ID)
	assert.Equal(t, "http_403", SessionOf(ctx).Previous.Reason)
	assert.Empty(t, flow.errors())

	_, err := NewSwitch(shared.Client(t), WithSessions(Sessions{MaxErrorScore: 0.5, ErrorDecay: 0.5}))
	assert.ErrorIs(t, err, ErrConfig)
	_, err = NewSwitch(shared.Client(t), WithSessions(Sessions{MaxErrorScore: 3, ErrorDecay: -0.5}))
	assert.ErrorIs(t, err, ErrConfig)
}
