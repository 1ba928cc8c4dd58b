package metrics

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// evidenceLog records the evidence events the Switch reports, beside the
// Collector.
type evidenceLog struct {
	mu sync.Mutex
	n  map[string]int
}

func (e *evidenceLog) ObserveAttempt(proxyswitch.AttemptEvent)       {}
func (e *evidenceLog) ObserveQuarantine(proxyswitch.QuarantineEvent) {}
func (e *evidenceLog) ObserveSession(proxyswitch.SessionEvent)       {}
func (e *evidenceLog) ObserveEvidence(ev proxyswitch.EvidenceEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n == nil {
		e.n = map[string]int{}
	}
	e.n[ev.What]++
}

func (e *evidenceLog) count(what string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n[what]
}

// TestEvidenceCrawl crawls a marketplace that refuses every 5th page to
// everyone, through 4 proxies of which one is burnt there (403 on every
// page), and runs a task's sticky session into a site that answers 429:
// proxyswitch_evidence_total counts the pages refused (as many as the
// requests that failed with ErrPageRefused), the strikes they cost lifted,
// the burnt proxy's strike confirmed (once per normal page it was refused
// on), and the soft refusals the session survived, then the one that spent
// its error score and retired it.
func TestEvidenceCrawl(t *testing.T) {
	ctx := context.Background()
	h := &testbed.RefusedPages{Next: testbed.DefaultHandler(), Every: 5}
	market := testbed.NewMarketplace(h)
	site := testbed.NewSite(t, "refusing", market)
	proxies := testbed.NewProxies(t, 4)
	urls := make([]string, len(proxies))
	for i, p := range proxies {
		urls[i] = p.URL()
	}
	burnt := proxies[0].SourceIP().String()
	market.Burn(burnt, testbed.Forbid)
	// The breaker is off: the first strikes before their lift must not pause the site.
	sw := newSwitch(t, proxyswitch.WithBreaker(proxyswitch.Breaker{Disabled: true}), proxyswitch.WithTimeouts(proxyswitch.Timeouts{MaxWait: 5 * time.Second}))
	_, err := sw.Add(ctx, urls...)
	require.NoError(t, err)
	col := newCollector(sw.Pool(), newConfig(nil))
	log := &evidenceLog{}
	sw.SetObserver(col, log)

	c := newCrawler(sw)
	refused := 0
	c.OnError(func(_ *colly.Response, err error) {
		if errors.Is(err, proxyswitch.ErrPageRefused) {
			refused++
		}
	})
	const pages = 20
	for i := range pages {
		_ = c.Visit(fmt.Sprintf("%s/p/%d", site.URL(), i+1)) // the refused pages fail: counted above
	}
	require.Positive(t, refused)
	burntOnNormal := 0
	for _, hit := range market.Hits() {
		if hit.IP == burnt && hit.Decision == testbed.DecidedForbidden && !h.Refused(hit.Path) {
			burntOnNormal++
		}
	}

	// The session: every answer of the site is a 429. No retry: each
	// request is one refusal.
	soft := testbed.NewSite(t, "soft", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "slow down", http.StatusTooManyRequests)
	}))
	ss := newSwitch(t, proxyswitch.WithBans(proxyswitch.Bans{Retries: proxyswitch.Off}), proxyswitch.WithSessions(proxyswitch.Sessions{MaxErrorScore: 3, ErrorDecay: 0.5}))
	_, err = ss.Add(ctx, testbed.NewProxies(t, 2)[0].URL())
	require.NoError(t, err)
	scol := newCollector(ss.Pool(), newConfig([]Option{WithServer("s")}))
	slog := &evidenceLog{}
	ss.SetObserver(scol, slog)
	sc := newCrawler(ss)
	task := proxyswitch.NewTaskContext("shopper")
	for i := range 3 {
		err := sc.Request("GET", fmt.Sprintf("%s/p/%d", soft.URL(), i+1), nil, task, nil)
		var be *proxyswitch.BlockedError
		require.ErrorAs(t, err, &be)
		assert.Equal(t, http.StatusTooManyRequests, be.Status)
	}

	f, _ := scrape(t, col)
	host := site.Host()
	t.Logf("pages refused %d, lifted %d, confirmed %d (burnt proxy refused on %d normal pages)",
		refused, log.count("lifted"), log.count("confirmed"), burntOnNormal)
	f.expect(t,
		want{"proxyswitch_evidence_total", []string{"site=" + host, "what=page_refused"}, float64(refused)},
		want{"proxyswitch_evidence_total", []string{"site=" + host, "what=lifted"}, float64(log.count("lifted"))},
	)
	assert.GreaterOrEqual(t, log.count("lifted"), refused, "each refused page lifts the first strike of its first proxy at least")
	assert.Equal(t, burntOnNormal, log.count("confirmed"), "the burnt proxy's strike on a normal page is confirmed by the next proxy")
	if burntOnNormal > 0 {
		f.expect(t, want{"proxyswitch_evidence_total", []string{"site=" + host, "what=confirmed"}, float64(burntOnNormal)})
	}

	sf, _ := scrape(t, scol)
	sf.expect(t,
		want{"proxyswitch_evidence_total", []string{"site=" + soft.Host(), "what=session_kept"}, 2},
		want{"proxyswitch_evidence_total", []string{"site=" + soft.Host(), "what=session_spent"}, 1},
		want{"proxyswitch_sessions_ended_total", []string{"reason=http_429"}, 1},
	)
}
