package testbed

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of [DefaultHandler].
const (
	DefaultProductDelay = 2 * time.Millisecond
	DefaultProductCount = 20
	maxBigKiB           = 64 << 10 // 64 MiB cap for /big
)

// ShopHandler is a small fake product site. Configure its fields before the
// site serves requests; they are not meant to be changed concurrently.
//
// Routes:
//
//	/                     HTML index linking /p/1 .. /p/ProductCount
//	/p/{n}                product page (any n >= 1) after Delay:
//	                      <div class="product" data-id="n">Product n</div>
//	                      followed, with PageSize set, by a description
//	                      <p class="description"> padding it to PageSize bytes
//	/redirect?to=URL      302 to URL
//	/redirect?n=K[&to=U]  chain of K same-site 302s (/redirect?n=K-1 ...),
//	                      the last one to U, or /p/1 if to is absent
//	/status/{code}        answers code (200..599) with a small body
//	/slow?d=500ms         sleeps d (default 500ms, aborted with the request
//	                      context), then 200
//	/big?kb=N             200 with an N KiB body (default 1, max 64 MiB)
//	/setcookie[?name=&value=]  sets a cookie (default testbed=<counter>)
//	/echo                 JSON description of the request as received
//
// Unknown paths answer 404.
type ShopHandler struct {
	// Delay is applied to product pages (/p/{n}) before answering.
	Delay time.Duration
	// ProductCount is the number of products linked from the index
	// (<= 0 means DefaultProductCount). Product pages beyond it are still
	// served, so crawls may address arbitrarily many distinct pages.
	ProductCount int
	// PageSize pads product pages with a description to about this many
	// bytes (0: no padding, the page is about 80 bytes).
	PageSize int

	once    sync.Once
	mux     *http.ServeMux
	cookies atomic.Int64
}

// DefaultHandler returns a [ShopHandler] with the default options
// (Delay = 2ms, ProductCount = 20).
func DefaultHandler() *ShopHandler {
	return &ShopHandler{Delay: DefaultProductDelay, ProductCount: DefaultProductCount}
}

func (h *ShopHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.once.Do(h.init)
	h.mux.ServeHTTP(w, r)
}

func (h *ShopHandler) init() {
	m := http.NewServeMux()
	m.HandleFunc("/{$}", h.index)
	m.HandleFunc("/p/{n}", h.product)
	m.HandleFunc("/redirect", h.redirect)
	m.HandleFunc("/status/{code}", h.status)
	m.HandleFunc("/slow", h.slow)
	m.HandleFunc("/big", h.big)
	m.HandleFunc("/setcookie", h.setCookie)
	m.HandleFunc("/echo", h.echo)
	h.mux = m
}

func (h *ShopHandler) productCount() int {
	if h.ProductCount <= 0 {
		return DefaultProductCount
	}
	return h.ProductCount
}

func (h *ShopHandler) index(w http.ResponseWriter, r *http.Request) {
	var b strings.Builder
	b.WriteString("<html><head><title>Testbed shop</title></head><body><ul>\n")
	for i := 1; i <= h.productCount(); i++ {
		fmt.Fprintf(&b, "<li><a href=\"/p/%d\">Product %d</a></li>\n", i, i)
	}
	b.WriteString("</ul></body></html>\n")
	writeHTML(w, http.StatusOK, b.String())
}

func (h *ShopHandler) product(w http.ResponseWriter, r *http.Request) {
	n, err := strconv.Atoi(r.PathValue("n"))
	if err != nil || n < 1 {
		http.NotFound(w, r)
		return
	}
	if !sleepCtx(r, h.Delay) {
		return
	}
	page := fmt.Sprintf("<html><body><div class=\"product\" data-id=\"%d\">Product %d</div>", n, n)
	const tail = "</body></html>"
	if pad := h.PageSize - len(page) - len(tail) - len(descOpen) - len(descClose); pad > 0 {
		page += descOpen + strings.Repeat(descText, pad/len(descText)+1)[:pad] + descClose
	}
	writeHTML(w, http.StatusOK, page+tail)
}

const (
	descOpen  = `<p class="description">`
	descClose = `</p>`
	descText  = "A fine product, described at length. "
)

func (h *ShopHandler) redirect(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	to := q.Get("to")
	n, _ := strconv.Atoi(q.Get("n"))
	var loc string
	switch {
	case n > 1:
		v := url.Values{"n": {strconv.Itoa(n - 1)}}
		if to != "" {
			v.Set("to", to)
		}
		loc = "/redirect?" + v.Encode()
	case to != "":
		loc = to
	default:
		loc = "/p/1"
	}
	w.Header().Set("Location", loc)
	w.WriteHeader(http.StatusFound)
}

func (h *ShopHandler) status(w http.ResponseWriter, r *http.Request) {
	code, err := strconv.Atoi(r.PathValue("code"))
	if err != nil || code < 200 || code > 599 {
		http.Error(w, "bad status code", http.StatusBadRequest)
		return
	}
	if code == http.StatusNoContent || code == http.StatusNotModified {
		w.WriteHeader(code)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	fmt.Fprintf(w, "status %d\n", code)
}

func (h *ShopHandler) slow(w http.ResponseWriter, r *http.Request) {
	d := 500 * time.Millisecond
	if s := r.URL.Query().Get("d"); s != "" {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			http.Error(w, "bad duration", http.StatusBadRequest)
			return
		}
	}
	if !sleepCtx(r, d) {
		return
	}
	writeHTML(w, http.StatusOK, "<html><body>slow</body></html>")
}

func (h *ShopHandler) big(w http.ResponseWriter, r *http.Request) {
	kb := 1
	if s := r.URL.Query().Get("kb"); s != "" {
		var err error
		if kb, err = strconv.Atoi(s); err != nil || kb < 0 || kb > maxBigKiB {
			http.Error(w, "bad kb", http.StatusBadRequest)
			return
		}
	}
	chunk := []byte(strings.Repeat("0123456789abcdef", 64)) // 1 KiB
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("Content-Length", strconv.Itoa(kb*len(chunk)))
	w.WriteHeader(http.StatusOK)
	for range kb {
		if _, err := w.Write(chunk); err != nil {
			return
		}
	}
}

func (h *ShopHandler) setCookie(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	name, value := q.Get("name"), q.Get("value")
	if name == "" {
		name = "testbed"
	}
	if value == "" {
		value = strconv.FormatInt(h.cookies.Add(1), 10)
	}
	http.SetCookie(w, &http.Cookie{Name: name, Value: value, Path: "/"})
	writeHTML(w, http.StatusOK, "<html><body>cookie set</body></html>")
}

// EchoResponse is the JSON body served by /echo.
type EchoResponse struct {
	Method     string              `json:"method"`
	URL        string              `json:"url"`
	Host       string              `json:"host"`
	RemoteAddr string              `json:"remote_addr"`
	ClientIP   string              `json:"client_ip"`
	Header     map[string][]string `json:"header"`
}

func (h *ShopHandler) echo(w http.ResponseWriter, r *http.Request) {
	ip, _, _ := net.SplitHostPort(r.RemoteAddr)
	body, _ := json.Marshal(EchoResponse{
		Method:     r.Method,
		URL:        r.URL.String(),
		Host:       r.Host,
		RemoteAddr: r.RemoteAddr,
		ClientIP:   ip,
		Header:     r.Header,
	})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	w.Write(body)
}

func writeHTML(w http.ResponseWriter, code int, body string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(code)
	w.Write([]byte(body))
}

// sleepCtx sleeps d unless the request is cancelled first; it reports
// whether the full delay elapsed.
func sleepCtx(r *http.Request, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
		return false
	}
}

// RefusedPages wraps a site's handler: every Every-th product page
// (/p/{n} with n a multiple of Every) answers Status to every client,
// whatever its IP, as a deleted or region-locked page does; every other
// request goes to Next. Every <= 0 refuses no page.
type RefusedPages struct {
	Next   http.Handler
	Every  int
	Status int // the answer of a refused page; 0 means 403
}

// Refused reports whether path is one of the refused pages.
func (h *RefusedPages) Refused(path string) bool {
	n, ok := strings.CutPrefix(path, "/p/")
	if !ok || h.Every <= 0 {
		return false
	}
	i, err := strconv.Atoi(n)
	return err == nil && i > 0 && i%h.Every == 0
}

func (h *RefusedPages) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !h.Refused(r.URL.Path) {
		h.Next.ServeHTTP(w, r)
		return
	}
	code := h.Status
	if code == 0 {
		code = http.StatusForbidden
	}
	writeHTML(w, code, "<html><body>"+http.StatusText(code)+"</body></html>")
}
