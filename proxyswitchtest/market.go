package proxyswitchtest

// The fake marketplaces, modelled on Wildberries, Ozon and Avito, for the
// example programs and for tests of crawlers ([StartMarket]).
//
// Each platform is a [Site] (loopback only, with a recorder that
// counts IP collisions: arrivals that find another request from the same
// client IP in flight) serving a catalog (categories of pages, each page
// linking its products) and product pages, each platform with its own markup
// (see [Selectors]) and its own anti-bot habits, a [Guard]:
//
//   - wildberries: at most 2 requests per IP per second; beyond that 429
//     with Retry-After, and a second offence blocks the IP (403). A listed IP
//     gets 403.
//   - ozon: a request that arrives while another from the same IP is in
//     flight is redirected to a captcha; two such captchas, or a second
//     offence against its limit of 3 requests per second, block the IP.
//     A listed IP gets the captcha.
//   - avito: at most 2 requests per IP per second; beyond that 429 without
//     Retry-After, then a block. A listed IP gets a placeholder page (200
//     without the product: a quiet ban).
//
// Each platform also lets shoppers sign in and order (for sticky sessions):
// /login?user=U signs U in and sets a session cookie bound to the client
// IP, /cart/add?id=N puts a product in the cart, /checkout places the order.
// A cart or checkout request without a live session cookie is redirected to
// /login; one whose cookie was issued to another IP is taken for a stolen
// session: 403, and the session is revoked. See [ShopStats].
//
// The three share one blacklist ([Blacklist]): an IP any of them
// blocks is refused by all of them, each in its own way, and IPs burnt
// before the crawl ([MarketConfig.Burnt]) are on it from the start. No platform
// refuses an IP that waits [SafeInterval] between two requests to it and
// never sends two at once.

import (
	"fmt"
	"html"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// SafeInterval is a pause between two requests from one IP to one platform
// that keeps the IP under every platform's rate limit.
const SafeInterval = 500 * time.Millisecond

// Defaults of [MarketConfig].
const (
	DefaultCategories       = 4
	DefaultPagesPerCategory = 5
	DefaultProductsPerPage  = 20
	DefaultProductDelay     = 20 * time.Millisecond
	pageSize                = 6 << 10 // catalog and product pages are padded to about this size
)

// MarketConfig sizes the marketplaces. The zero value is usable.
type MarketConfig struct {
	Categories       int           // categories per platform; 0: DefaultCategories
	PagesPerCategory int           // catalog pages per category; 0: DefaultPagesPerCategory
	ProductsPerPage  int           // products linked from each catalog page; 0: DefaultProductsPerPage
	ProductDelay     time.Duration // how long a product page takes to render; 0: DefaultProductDelay, < 0: none
	Burnt            []string      // client IPs on the shared blacklist before the crawl
}

func (c MarketConfig) withDefaults() MarketConfig {
	if c.Categories <= 0 {
		c.Categories = DefaultCategories
	}
	if c.PagesPerCategory <= 0 {
		c.PagesPerCategory = DefaultPagesPerCategory
	}
	if c.ProductsPerPage <= 0 {
		c.ProductsPerPage = DefaultProductsPerPage
	}
	switch {
	case c.ProductDelay == 0:
		c.ProductDelay = DefaultProductDelay
	case c.ProductDelay < 0:
		c.ProductDelay = 0
	}
	return c
}

// Selectors are the CSS selectors of a platform's markup.
type Selectors struct {
	Card  string // a product link (<a href>) on a catalog page
	Next  string // the link (<a href>) to the next catalog page of a category
	Title string // the product's title on its page
	Price string // the product's price on its page
}

// Platform is one fake marketplace. Its fields are set by [StartMarket] and
// not changed after; its methods are safe for concurrent use.
type Platform struct {
	Name  string    // "wildberries", "ozon" or "avito"
	Sel   Selectors // its markup
	Site  *Site     // the site serving it: its recorder counts requests and IP collisions
	Guard *Guard    // its anti-bot layer: counts of what it refused

	cfg    MarketConfig
	markup markup

	shopMu   sync.Mutex
	sessions map[string]*shopSession // by session cookie
	shop     ShopStats
}

// shopSession is a signed-in shopper.
type shopSession struct {
	user, ip string
	cart     []int
}

// ShopStats counts what shoppers did on a platform.
type ShopStats struct {
	Logins    int // sessions opened
	CartAdds  int // products put in a cart
	Orders    int // orders placed
	Stolen    int // requests with a session cookie from another IP than its own (403)
	NoSession int // cart or checkout requests without a live session (redirected to /login)
}

// Host returns the platform's "127.0.0.1:PORT", the site proxyswitch leases
// for (the default site function).
func (p *Platform) Host() string { return p.Site.Host() }

// URL returns the platform's base URL.
func (p *Platform) URL() string { return p.Site.URL() }

// CatalogURLs returns the URL of every catalog page, category by category.
func (p *Platform) CatalogURLs() []string {
	var out []string
	for c := 1; c <= p.cfg.Categories; c++ {
		for pg := 1; pg <= p.cfg.PagesPerCategory; pg++ {
			out = append(out, p.catalogURL(c, pg))
		}
	}
	return out
}

// CategoryURLs returns the first catalog page of every category.
func (p *Platform) CategoryURLs() []string {
	out := make([]string, p.cfg.Categories)
	for c := range out {
		out[c] = p.catalogURL(c+1, 1)
	}
	return out
}

// ProductsPerPage returns how many products each catalog page links.
func (p *Platform) ProductsPerPage() int { return p.cfg.ProductsPerPage }

// Products returns how many product pages the catalog links.
func (p *Platform) Products() int {
	return p.cfg.Categories * p.cfg.PagesPerCategory * p.cfg.ProductsPerPage
}

func (p *Platform) catalogURL(category, page int) string {
	return fmt.Sprintf("%s/catalog/%d?page=%d", p.URL(), category, page)
}

// Market is the three platforms and the blacklist they share. Its fields
// are not changed after the start; its methods are safe for concurrent use.
type Market struct {
	Platforms []*Platform // wildberries, ozon, avito
	Blacklist *Blacklist  // shared by the three: an IP one blocks, all refuse
}

// StartMarket starts the three platforms on loopback, each on a free port,
// sized by cfg (zero fields take the defaults: [DefaultCategories] and the
// others). Close the market when done.
func StartMarket(cfg MarketConfig) *Market {
	cfg = cfg.withDefaults()
	m := &Market{Blacklist: NewBlacklist(cfg.Burnt...)}
	for _, name := range []string{"wildberries", "ozon", "avito"} {
		p := &Platform{Name: name, cfg: cfg, markup: markups[name], sessions: map[string]*shopSession{}}
		p.Sel = p.markup.sel
		p.Guard = NewGuard(http.HandlerFunc(p.serve))
		p.Guard.Shared = m.Blacklist
		p.Guard.RateWindow, p.Guard.BlockFor = time.Second, 10*time.Minute
		switch name {
		case "wildberries":
			p.Guard.RateLimit, p.Guard.RetryAfter, p.Guard.BlockAfter = 2, time.Minute, 1
			p.Guard.Listed = Forbid
		case "ozon":
			p.Guard.RateLimit, p.Guard.BlockAfter = 3, 1
			p.Guard.CaptchaOnConcurrent, p.Guard.BlockAfterCaptchas = true, 2
			p.Guard.Listed = Challenge
		case "avito":
			p.Guard.RateLimit, p.Guard.BlockAfter = 2, 1
			p.Guard.Listed = Placeholder
		}
		p.Site = StartSite(name, p.Guard)
		m.Platforms = append(m.Platforms, p)
	}
	return m
}

// Close shuts the platforms down.
func (m *Market) Close() {
	for _, p := range m.Platforms {
		p.Site.Close()
	}
}

// Platform returns the platform serving host ("127.0.0.1:PORT"), or nil.
func (m *Market) Platform(host string) *Platform {
	for _, p := range m.Platforms {
		if p.Host() == host {
			return p
		}
	}
	return nil
}

// Products returns how many product pages the three catalogs link.
func (m *Market) Products() int {
	n := 0
	for _, p := range m.Platforms {
		n += p.Products()
	}
	return n
}

// MarketStats is what the platforms saw, their ground truth.
type MarketStats struct {
	Requests   int            // requests received (captcha pages included)
	Refused    map[string]int // refusals by kind: "403", "429", "captcha", "placeholder"
	Bans       int            // refusals of every kind
	Collisions int            // arrivals that found another request from the same IP in flight
	MaxPerIP   int            // most requests one IP had in flight on one platform
	Listed     int            // IPs on the shared blacklist
	Direct     int            // requests that came without a proxy (from 127.0.0.1)
}

// Stats sums what the platforms saw so far.
func (m *Market) Stats() MarketStats {
	s := MarketStats{Refused: map[string]int{}, Listed: m.Blacklist.Len()}
	for _, p := range m.Platforms {
		rec := p.Site.Recorder()
		s.Requests += rec.Count()
		s.Collisions += rec.Collisions()
		s.MaxPerIP = max(s.MaxPerIP, rec.MaxConcurrentPerIP())
		s.Direct += rec.DirectHits()
		for _, d := range refusals {
			if n := p.Guard.Count(d); n > 0 {
				s.Refused[string(d)] += n
				s.Bans += n
			}
		}
	}
	return s
}

var refusals = []Decision{DecidedForbidden, DecidedRateLimited, DecidedCaptcha, DecidedPlaceholder, DecidedTruncated}

// serve is the platform's own handler, behind its anti-bot layer.
func (p *Platform) serve(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case r.URL.Path == "/":
		p.home(w)
	case len(parts) == 2 && parts[0] == "catalog":
		p.catalog(w, r, parts[1])
	case len(parts) == 2 && parts[0] == "product":
		p.product(w, r, parts[1])
	case r.URL.Path == "/login", r.URL.Path == "/cart/add", r.URL.Path == "/checkout":
		p.shopping(w, r)
	default:
		http.NotFound(w, r)
	}
}

func (p *Platform) home(w http.ResponseWriter) {
	var b strings.Builder
	fmt.Fprintf(&b, "<html><head><title>%s</title></head><body><nav>", p.Name)
	for c := 1; c <= p.cfg.Categories; c++ {
		fmt.Fprintf(&b, `<a class="category" href="/catalog/%d?page=1">Category %d</a>`, c, c)
	}
	b.WriteString("</nav></body></html>")
	writePage(w, b.String())
}

func (p *Platform) catalog(w http.ResponseWriter, r *http.Request, cat string) {
	c, err1 := strconv.Atoi(cat)
	pg, err2 := strconv.Atoi(r.URL.Query().Get("page"))
	if err1 != nil || err2 != nil || c < 1 || c > p.cfg.Categories || pg < 1 || pg > p.cfg.PagesPerCategory {
		http.NotFound(w, r)
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "<html><head><title>%s: category %d, page %d</title></head><body>", p.Name, c, pg)
	first := productID(c, pg, 1)
	for i := range p.cfg.ProductsPerPage {
		fmt.Fprintf(&b, p.markup.card, first+i, first+i)
	}
	if pg < p.cfg.PagesPerCategory {
		fmt.Fprintf(&b, p.markup.next, c, pg+1)
	}
	writePage(w, pad(b.String()))
}

func (p *Platform) product(w http.ResponseWriter, r *http.Request, id string) {
	n, err := strconv.Atoi(id)
	c, pg, i := n/1000000, n/1000%1000, n%1000
	if err != nil || c < 1 || c > p.cfg.Categories || pg < 1 || pg > p.cfg.PagesPerCategory || i < 1 || i > p.cfg.ProductsPerPage {
		http.NotFound(w, r)
		return
	}
	if d := p.cfg.ProductDelay; d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done():
			return
		}
	}
	price := 100 + n%9000
	writePage(w, pad(fmt.Sprintf(p.markup.product, p.Name, n, n, price)))
}

// Shop returns what shoppers did so far.
func (p *Platform) Shop() ShopStats {
	p.shopMu.Lock()
	defer p.shopMu.Unlock()
	return p.shop
}

// shopping serves /login, /cart/add and /checkout.
func (p *Platform) shopping(w http.ResponseWriter, r *http.Request) {
	ip, _, _ := net.SplitHostPort(r.RemoteAddr)
	p.shopMu.Lock()
	defer p.shopMu.Unlock()
	if r.URL.Path == "/login" {
		user := r.URL.Query().Get("user")
		if user == "" {
			user = "guest"
		}
		sid := fmt.Sprintf("%s-%d", p.Name, len(p.sessions)+1)
		p.sessions[sid] = &shopSession{user: user, ip: ip}
		p.shop.Logins++
		http.SetCookie(w, &http.Cookie{Name: "sid", Value: sid, Path: "/", HttpOnly: true})
		writePage(w, fmt.Sprintf(`<html><body><div class="account" data-user="%s">Signed in as %s</div></body></html>`, html.EscapeString(user), html.EscapeString(user)))
		return
	}
	var sess *shopSession
	sid := ""
	if c, err := r.Cookie("sid"); err == nil {
		sid, sess = c.Value, p.sessions[c.Value]
	}
	switch {
	case sess == nil:
		p.shop.NoSession++
		http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusFound)
		return
	case sess.ip != ip:
		p.shop.Stolen++
		delete(p.sessions, sid)
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(http.StatusForbidden)
		_, _ = io.WriteString(w, "<html><body>Your session was used from another address. Sign in again.</body></html>")
		return
	}
	if r.URL.Path == "/cart/add" {
		id, err := strconv.Atoi(r.URL.Query().Get("id"))
		if err != nil || id < 1 {
			http.Error(w, "bad product", http.StatusBadRequest)
			return
		}
		sess.cart = append(sess.cart, id)
		p.shop.CartAdds++
		writePage(w, fmt.Sprintf(`<html><body><div class="cart" data-items="%d">%d items in the cart</div></body></html>`, len(sess.cart), len(sess.cart)))
		return
	}
	if len(sess.cart) == 0 {
		writePage(w, `<html><body><div class="cart" data-items="0">The cart is empty</div></body></html>`)
		return
	}
	p.shop.Orders++
	writePage(w, fmt.Sprintf(`<html><body><div class="order" data-id="%d" data-items="%d">Order %d placed for %s: %d items</div></body></html>`,
		p.shop.Orders, len(sess.cart), p.shop.Orders, html.EscapeString(sess.user), len(sess.cart)))
	sess.cart = nil
}

// productID numbers products so that the catalog page linking one can be
// read back from it: category*10^6 + page*10^3 + position.
func productID(category, page, i int) int { return category*1000000 + page*1000 + i }

// markup is one platform's HTML, modelled loosely on the real one.
type markup struct {
	sel     Selectors
	card    string // catalog entry: id, id
	next    string // next page link: category, page
	product string // product page: platform, id, id, price
}

var markups = map[string]markup{
	"wildberries": {
		sel:  Selectors{Card: "article.product-card a.product-card__link", Next: "a.pagination-next", Title: "h1.product-page__title", Price: "ins.price-block__final-price"},
		card: `<article class="product-card"><a class="product-card__link" href="/product/%d">Item %d</a></article>`,
		next: `<a class="pagination-next" href="/catalog/%d?page=%d">Next</a>`,
		product: `<html><head><title>%s</title></head><body><div class="product-page">` +
			`<h1 class="product-page__title">Item %d</h1><p class="product-page__article">Art. %d</p>` +
			`<ins class="price-block__final-price">%d ₽</ins></div>`,
	},
	"ozon": {
		sel:  Selectors{Card: `div[data-widget="searchResultsV2"] a.tile-hover-target`, Next: `a[data-widget="paginator-next"]`, Title: `div[data-widget="webProductHeading"] h1`, Price: `div[data-widget="webPrice"] span`},
		card: `<div data-widget="searchResultsV2"><a class="tile-hover-target" href="/product/%d">Item %d</a></div>`,
		next: `<a data-widget="paginator-next" href="/catalog/%d?page=%d">Next</a>`,
		product: `<html><head><title>%s</title></head><body>` +
			`<div data-widget="webProductHeading"><h1>Item %d</h1></div><div data-widget="webDetailSKU">SKU %d</div>` +
			`<div data-widget="webPrice"><span>%d ₽</span></div>`,
	},
	"avito": {
		sel:  Selectors{Card: `div[data-marker="item"] a[data-marker="item-title"]`, Next: `a[data-marker="pagination-button/nextPage"]`, Title: `h1[data-marker="item-view/title-info"]`, Price: `span[data-marker="item-view/item-price"]`},
		card: `<div data-marker="item"><a data-marker="item-title" href="/product/%d">Item %d</a></div>`,
		next: `<a data-marker="pagination-button/nextPage" href="/catalog/%d?page=%d">Next</a>`,
		product: `<html><head><title>%s</title></head><body>` +
			`<h1 data-marker="item-view/title-info">Item %d</h1><span data-marker="item-view/item-id">№ %d</span>` +
			`<span data-marker="item-view/item-price">%d ₽</span>`,
	},
}

// pad closes an open page, padded with a description to about pageSize
// bytes, so that catalog and product pages weigh alike (a placeholder is far
// lighter: proxyswitch's size check sees it too).
func pad(page string) string {
	const open, text, end = `<p class="description">`, "A fine product, described at length. ", "</p></body></html>"
	if n := pageSize - len(page) - len(open) - len(end); n > 0 {
		page += open + strings.Repeat(text, n/len(text)+1)[:n]
	} else {
		page += open
	}
	return page + end
}

func writePage(w http.ResponseWriter, body string) { writeHTML(w, http.StatusOK, body) }
