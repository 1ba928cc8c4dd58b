package proxyswitchtest

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
)

// newProxies starts n proxies, closed with the test.
func newProxies(t *testing.T, n int) []*Proxy { return NewFarm(t, n).Proxies }

// get fetches u through proxy without following redirects.
func get(t *testing.T, proxy *Proxy, u string) (*http.Response, *goquery.Document) {
	t.Helper()
	pu, _ := url.Parse(proxy.URL())
	c := &http.Client{
		Transport:     &http.Transport{Proxy: http.ProxyURL(pu), DisableKeepAlives: true},
		Timeout:       10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := goquery.NewDocumentFromReader(strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	return resp, doc
}

func TestCatalogAndProducts(t *testing.T) {
	proxies := newProxies(t, 3)
	m := StartMarket(MarketConfig{Categories: 2, PagesPerCategory: 2, ProductsPerPage: 3, ProductDelay: -1})
	t.Cleanup(m.Close)
	if got, want := m.Products(), 3*2*2*3; got != want {
		t.Errorf("Products() = %d, want %d", got, want)
	}
	for i, p := range m.Platforms {
		if m.Platform(p.Host()) != p {
			t.Errorf("%s: Platform(%q) is not it", p.Name, p.Host())
		}
		if got := len(p.CatalogURLs()); got != 4 {
			t.Errorf("%s: %d catalog pages, want 4", p.Name, got)
		}
		// One proxy per platform, slow enough for the rate limits.
		proxy := proxies[i]
		resp, doc := get(t, proxy, p.CategoryURLs()[1])
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: catalog: %d", p.Name, resp.StatusCode)
		}
		cards := doc.Find(p.Sel.Card)
		if cards.Length() != 3 || doc.Find(p.Sel.Next).Length() != 1 {
			t.Fatalf("%s: catalog page with %d cards and %d next links", p.Name, cards.Length(), doc.Find(p.Sel.Next).Length())
		}
		next, _ := doc.Find(p.Sel.Next).Attr("href")
		if want := "/catalog/2?page=2"; next != want {
			t.Errorf("%s: next page %q, want %q", p.Name, next, want)
		}
		href, _ := cards.Last().Attr("href")
		time.Sleep(SafeInterval)
		resp, doc = get(t, proxy, p.URL()+href)
		if resp.StatusCode != http.StatusOK || doc.Find(p.Sel.Title).Text() != "Item 2001003" || !strings.HasSuffix(doc.Find(p.Sel.Price).Text(), "₽") {
			t.Errorf("%s: product %s: %d, title %q, price %q", p.Name, href, resp.StatusCode, doc.Find(p.Sel.Title).Text(), doc.Find(p.Sel.Price).Text())
		}
		time.Sleep(SafeInterval)
		if resp, _ := get(t, proxy, p.URL()+"/product/2003001"); resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s: product beyond the catalog: %d, want 404", p.Name, resp.StatusCode)
		}
	}
	st := m.Stats()
	if st.Bans != 0 || st.Collisions != 0 || st.Direct != 0 || st.Requests != 9 {
		t.Errorf("stats %+v, want 9 requests and nothing else", st)
	}
}

func TestAntiBot(t *testing.T) {
	proxies := newProxies(t, 3)
	burnt, abuser := proxies[0], proxies[1]
	m := StartMarket(MarketConfig{Categories: 1, PagesPerCategory: 1, ProductsPerPage: 1, ProductDelay: -1, Burnt: []string{burnt.SourceIP().String()}})
	t.Cleanup(m.Close)
	wb, ozon, avito := m.Platforms[0], m.Platforms[1], m.Platforms[2]
	product := "/product/1001001"

	// A burnt IP is refused by each platform in its own way.
	if resp, _ := get(t, burnt, wb.URL()+product); resp.StatusCode != http.StatusForbidden {
		t.Errorf("wildberries to a burnt IP: %d, want 403", resp.StatusCode)
	}
	if resp, _ := get(t, burnt, ozon.URL()+product); resp.StatusCode != http.StatusFound || !strings.HasPrefix(resp.Header.Get("Location"), CaptchaPath) {
		t.Errorf("ozon to a burnt IP: %d to %q, want a captcha redirect", resp.StatusCode, resp.Header.Get("Location"))
	}
	if resp, doc := get(t, burnt, avito.URL()+product); resp.StatusCode != http.StatusOK || doc.Find(avito.Sel.Title).Length() != 0 {
		t.Errorf("avito to a burnt IP: %d with a title, want a placeholder", resp.StatusCode)
	}

	// Three requests in a second break wildberries' limit (429 with
	// Retry-After), a fourth gets the IP blocked, and the shared blacklist
	// carries the block to avito.
	for i, want := range []int{200, 200, 429, 403} {
		resp, _ := get(t, abuser, wb.URL()+product)
		if resp.StatusCode != want {
			t.Fatalf("wildberries request %d: %d, want %d", i+1, resp.StatusCode, want)
		}
		if want == 429 && resp.Header.Get("Retry-After") == "" {
			t.Error("429 without Retry-After")
		}
	}
	if resp, doc := get(t, abuser, avito.URL()+product); resp.StatusCode != http.StatusOK || doc.Find(avito.Sel.Title).Length() != 0 {
		t.Errorf("avito to an IP wildberries blocked: %d with a title, want a placeholder", resp.StatusCode)
	}
	if resp, doc := get(t, proxies[2], avito.URL()+product); resp.StatusCode != http.StatusOK || doc.Find(avito.Sel.Title).Length() != 1 {
		t.Errorf("avito to a clean IP: %d without a title", resp.StatusCode)
	}

	st := m.Stats()
	want := map[string]int{"403": 2, "429": 1, "captcha": 1, "placeholder": 2}
	for k, n := range want {
		if st.Refused[k] != n {
			t.Errorf("refused %s: %d, want %d (%v)", k, st.Refused[k], n, st.Refused)
		}
	}
	if st.Bans != 6 || st.Listed != 2 {
		t.Errorf("stats %+v: want 6 bans and 2 listed IPs", st)
	}
}

func TestShopping(t *testing.T) {
	proxies := newProxies(t, 2)
	m := StartMarket(MarketConfig{ProductDelay: -1})
	t.Cleanup(m.Close)
	avito := m.Platforms[2] // the most patient anti-bot (no concurrency check)
	resp, doc := get(t, proxies[0], avito.URL()+"/login?user=ann")
	if resp.StatusCode != http.StatusOK || doc.Find(".account").AttrOr("data-user", "") != "ann" {
		t.Fatalf("login: %d %q", resp.StatusCode, doc.Text())
	}
	sid := resp.Cookies()[0]
	withCookie := func(proxy *Proxy, path string) *http.Response {
		t.Helper()
		time.Sleep(SafeInterval)
		pu, _ := url.Parse(proxy.URL())
		c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu)}, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		req, _ := http.NewRequest("GET", avito.URL()+path, nil)
		req.AddCookie(sid)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	for _, path := range []string{"/cart/add?id=1001001", "/cart/add?id=1001002", "/checkout"} {
		if resp := withCookie(proxies[0], path); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d", path, resp.StatusCode)
		}
	}
	if resp := withCookie(proxies[1], "/cart/add?id=1001003"); resp.StatusCode != http.StatusForbidden {
		t.Errorf("a session cookie from another IP: %d, want 403", resp.StatusCode)
	}
	if resp := withCookie(proxies[0], "/checkout"); resp.StatusCode != http.StatusFound || !strings.HasPrefix(resp.Header.Get("Location"), "/login?next=") {
		t.Errorf("a revoked session: %d to %q, want a redirect to /login", resp.StatusCode, resp.Header.Get("Location"))
	}
	if got, want := avito.Shop(), (ShopStats{Logins: 1, CartAdds: 2, Orders: 1, Stolen: 1, NoSession: 1}); got != want {
		t.Errorf("shop stats %+v, want %+v", got, want)
	}
}
