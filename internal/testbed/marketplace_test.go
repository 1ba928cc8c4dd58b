package testbed

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestMarketplaceRateLimitThenBlock(t *testing.T) {
	m := NewMarketplace(nil)
	m.RateLimit, m.RateWindow, m.RetryAfter, m.BlockAfter, m.BlockFor = 2, time.Minute, 3*time.Second, 1, time.Minute
	site := NewSite(t, "market", m)
	p := NewProxy(t, SourceIP(0))
	c := client(t, p.URL())

	for i := range 2 {
		resp, body := get(t, c, site.URL()+"/p/1")
		wantStatus(t, resp, http.StatusOK)
		if !strings.Contains(body, `class="product"`) || !strings.Contains(body, `class="description"`) || len(body) < 4000 {
			t.Fatalf("request %d: not a padded product page (%d bytes)", i, len(body))
		}
	}
	resp, _ := get(t, c, site.URL()+"/p/1")
	wantStatus(t, resp, http.StatusTooManyRequests)
	if got := resp.Header.Get("Retry-After"); got != "3" {
		t.Errorf("Retry-After = %q, want 3", got)
	}
	resp, _ = get(t, c, site.URL()+"/p/1")
	wantStatus(t, resp, http.StatusForbidden)
	resp, _ = get(t, c, site.URL()+"/p/2")
	wantStatus(t, resp, http.StatusForbidden) // blocked now, whatever the rate

	// Another IP is not affected.
	resp, _ = get(t, client(t, NewProxy(t, SourceIP(1)).URL()), site.URL()+"/p/1")
	wantStatus(t, resp, http.StatusOK)
	wantInt(t, "recorded hits", site.Recorder().Count(), 6)
	wantInt(t, "429s", m.Count(DecidedRateLimited), 1)
	wantInt(t, "403s", m.Count(DecidedForbidden), 2)
}

func TestMarketplaceCaptchaOnConcurrentRequests(t *testing.T) {
	m := NewMarketplace(&ShopHandler{Delay: 300 * time.Millisecond})
	m.CaptchaOnConcurrent = true
	site := NewSite(t, "market", m)
	p := NewProxy(t, SourceIP(0))

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		resp, _ := get(t, client(t, p.URL()), site.URL()+"/p/1")
		wantStatus(t, resp, http.StatusOK)
	}()
	time.Sleep(100 * time.Millisecond)
	resp, _ := get(t, client(t, p.URL()), site.URL()+"/p/2?x=1")
	wantStatus(t, resp, http.StatusFound)
	if got, want := resp.Header.Get("Location"), CaptchaPath+"?return=%2Fp%2F2%3Fx%3D1"; got != want {
		t.Errorf("Location = %q, want %q", got, want)
	}
	wg.Wait()
	resp, body := get(t, client(t, p.URL()), site.URL()+CaptchaPath)
	wantStatus(t, resp, http.StatusOK)
	if !strings.Contains(body, `class="captcha"`) {
		t.Errorf("captcha page %q", body)
	}
	// One at a time is fine.
	resp, _ = get(t, client(t, p.URL()), site.URL()+"/p/3")
	wantStatus(t, resp, http.StatusOK)
	wantInt(t, "captcha redirects", m.Count(DecidedCaptcha), 1)
}

func TestMarketplaceBurntIPs(t *testing.T) {
	m := NewMarketplace(nil)
	site := NewSite(t, "market", m)
	ps := NewProxies(t, 5)
	m.Burn(ps[0].SourceIP().String(), Placeholder)
	m.Burn(ps[1].SourceIP().String(), Forbid)
	m.Burn(ps[2].SourceIP().String(), Truncate)
	m.Burn(ps[3].SourceIP().String(), Challenge)

	resp, full := get(t, client(t, ps[4].URL()), site.URL()+"/p/7")
	wantStatus(t, resp, http.StatusOK)

	resp, body := get(t, client(t, ps[0].URL()), site.URL()+"/p/7")
	wantStatus(t, resp, http.StatusOK)
	if body != PlaceholderHTML {
		t.Errorf("placeholder body %q", body)
	}
	resp, _ = get(t, client(t, ps[1].URL()), site.URL()+"/p/7")
	wantStatus(t, resp, http.StatusForbidden)
	resp, body = get(t, client(t, ps[2].URL()), site.URL()+"/p/7")
	wantStatus(t, resp, http.StatusOK)
	if len(body) != len(full)/10 || !strings.HasPrefix(full, body) || !strings.Contains(body, `<div class="product" data-id="7">`) {
		t.Errorf("truncated page: %d of %d bytes: %q", len(body), len(full), body)
	}
	resp, _ = get(t, client(t, ps[3].URL()), site.URL()+"/p/7")
	wantStatus(t, resp, http.StatusFound)

	m.Burn(ps[0].SourceIP().String(), Serve)
	resp, body = get(t, client(t, ps[0].URL()), site.URL()+"/p/7")
	wantStatus(t, resp, http.StatusOK)
	if body != full {
		t.Errorf("lifted burn still serves %q", body)
	}
	wantInt(t, "recorded hits", site.Recorder().Count(), 6)
	hits := m.Hits()
	if len(hits) != 6 || hits[1].Decision != DecidedPlaceholder || hits[1].IP != ps[0].SourceIP().String() {
		t.Errorf("hits %+v", hits)
	}
}

func TestMarketplaceSharedBlacklist(t *testing.T) {
	ps := NewProxies(t, 3)
	burnt, abuser, clean := ps[0], ps[1], ps[2]
	shared := NewBlacklist(burnt.SourceIP().String())
	strict := NewMarketplace(nil)
	strict.RateLimit, strict.RateWindow, strict.BlockAfter, strict.Shared = 1, time.Minute, 1, shared
	quiet := NewMarketplace(nil)
	quiet.Shared, quiet.Listed = shared, Placeholder
	a, b := NewSite(t, "strict", strict), NewSite(t, "quiet", quiet)

	resp, _ := get(t, client(t, burnt.URL()), a.URL()+"/p/1")
	wantStatus(t, resp, http.StatusForbidden) // listed before the crawl: Forbid by default
	resp, body := get(t, client(t, burnt.URL()), b.URL()+"/p/1")
	wantStatus(t, resp, http.StatusOK)
	if body != PlaceholderHTML {
		t.Errorf("listed IP on the quiet site got %q", body)
	}

	for _, want := range []int{http.StatusOK, http.StatusTooManyRequests, http.StatusForbidden} {
		resp, _ = get(t, client(t, abuser.URL()), a.URL()+"/p/2")
		wantStatus(t, resp, want)
	}
	wantInt(t, "blocks", strict.Blocks(), 1)
	wantInt(t, "listed", shared.Len(), 2)
	resp, body = get(t, client(t, abuser.URL()), b.URL()+"/p/2")
	if resp.StatusCode != http.StatusOK || body != PlaceholderHTML {
		t.Errorf("IP blocked on one site served %d %q on the other", resp.StatusCode, body)
	}
	resp, _ = get(t, client(t, clean.URL()), b.URL()+"/p/2")
	wantStatus(t, resp, http.StatusOK)
	wantInt(t, "placeholders", quiet.Count(DecidedPlaceholder), 2)

	var none *Blacklist // a nil blacklist lists nothing
	if none.Add("127.0.0.9") || none.Has("127.0.0.9") || none.Len() != 0 {
		t.Error("nil blacklist lists something")
	}
}

func TestMarketplaceBlockAfterCaptchas(t *testing.T) {
	m := NewMarketplace(&ShopHandler{Delay: 300 * time.Millisecond})
	m.CaptchaOnConcurrent, m.BlockAfterCaptchas, m.Shared = true, 1, NewBlacklist()
	site := NewSite(t, "market", m)
	p := NewProxy(t, SourceIP(0))

	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, _ := get(t, client(t, p.URL()), site.URL()+"/p/1")
		wantStatus(t, resp, http.StatusOK)
	}()
	time.Sleep(100 * time.Millisecond)
	resp, _ := get(t, client(t, p.URL()), site.URL()+"/p/2")
	wantStatus(t, resp, http.StatusFound)
	<-done
	resp, _ = get(t, client(t, p.URL()), site.URL()+"/p/3")
	wantStatus(t, resp, http.StatusForbidden) // blocked after one captcha
	wantInt(t, "blocks", m.Blocks(), 1)
	if !m.Shared.Has(p.SourceIP().String()) {
		t.Error("blocked IP not on the shared blacklist")
	}
}
