// Command quickstart crawls a small local shop through five local proxies,
// with proxyswitch leasing one proxy per request from Redis, and shows that
// the shop never saw one IP send two requests at once.
//
//	go run ./_examples/quickstart                                   # an embedded in-process Redis
//	go run ./_examples/quickstart -redis server                     # a private redis-server from PATH
//	go run ./_examples/quickstart -redis redis://127.0.0.1:6379/0   # your Redis
//
// Everything runs on loopback: the shop is an httptest server and each proxy
// dials the shop from its own address 127.0.0.x, so the shop sees five
// distinct client IPs, as a real site would see five proxies.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/proxyswitchtest"
)

func main() {
	redisArg := proxyswitchtest.RedisFlag()
	pages := flag.Int("pages", 60, "product pages in the shop")
	flag.Parse()

	rs, err := proxyswitchtest.StartRedis(*redisArg)
	if err != nil {
		log.Fatal(err)
	}
	defer rs.Close()
	rdb := rs.Client()
	defer rdb.Close()
	fmt.Println("using", rs)

	shop := newShop(*pages)
	defer shop.Close()
	var proxyURLs []string
	for i := range 5 {
		p := newProxy(net.IPv4(127, 0, 0, byte(10+i)))
		defer p.Close()
		proxyURLs = append(proxyURLs, p.URL)
	}

	// One Switch per process; any number of collectors may share it.
	sw, err := proxyswitch.NewSwitch(rdb, proxyswitch.WithPrefix("quickstart"))
	if err != nil {
		log.Fatal(err)
	}
	defer sw.Close(context.Background()) // at exit: stops the lease renewer, releases whatever is still leased
	ctx := context.Background()
	if _, err := sw.Replace(ctx, proxyURLs); err != nil { // load the pool
		log.Fatal(err)
	}

	c := colly.NewCollector(colly.Async(true))
	sw.Attach(c) // the proxy function plus the hooks that release leases
	if err := c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: 10}); err != nil {
		log.Fatal(err)
	}
	var mu sync.Mutex
	var scraped int
	c.OnHTML("a[href]", func(e *colly.HTMLElement) { _ = e.Request.Visit(e.Attr("href")) })
	c.OnHTML(".product", func(e *colly.HTMLElement) {
		mu.Lock()
		scraped++
		mu.Unlock()
	})
	c.OnError(func(r *colly.Response, err error) { log.Printf("%s: %v", r.Request.URL, err) })

	start := time.Now()
	if err := c.Visit(shop.URL); err != nil {
		log.Fatal(err)
	}
	c.Wait()

	fmt.Printf("scraped %d products in %v with 10 workers sharing 5 proxies\n", scraped, time.Since(start).Round(time.Millisecond))
	fmt.Println("requests the shop received, by client IP:")
	for _, ip := range shop.ips() {
		fmt.Printf("  %-12s %d\n", ip, shop.hits[ip])
	}
	fmt.Printf("most requests from one IP at the same moment: %d (proxyswitch keeps it at 1)\n", shop.maxConcurrent)
	fmt.Printf("requests that reached the shop without a proxy: %d\n", shop.hits["127.0.0.1"])
	st, err := sw.Stats(ctx, shop.Listener.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("leases still held in Redis: %d\n", st.LeaseRecords)
}

// shop is a fake web shop that counts requests per client IP and the most
// requests one IP had in flight at once.
type shop struct {
	*httptest.Server
	mu            sync.Mutex
	hits          map[string]int
	inFlight      map[string]int
	maxConcurrent int
}

func newShop(pages int) *shop {
	s := &shop{hits: map[string]int{}, inFlight: map[string]int{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ip, _, _ := net.SplitHostPort(r.RemoteAddr)
		s.mu.Lock()
		s.hits[ip]++
		s.inFlight[ip]++
		s.maxConcurrent = max(s.maxConcurrent, s.inFlight[ip])
		s.mu.Unlock()
		time.Sleep(5 * time.Millisecond) // the page takes a moment to render
		s.mu.Lock()
		s.inFlight[ip]--
		s.mu.Unlock()

		w.Header().Set("Content-Type", "text/html")
		if r.URL.Path == "/" {
			for i := 1; i <= pages; i++ {
				fmt.Fprintf(w, `<a href="/p/%d">product %d</a>`, i, i)
			}
			return
		}
		fmt.Fprintf(w, `<div class="product">%s</div>`, r.URL.Path)
	}))
	return s
}

func (s *shop) ips() []string {
	var out []string
	for ip := range s.hits {
		out = append(out, ip)
	}
	sort.Strings(out)
	return out
}

// proxy is a minimal HTTP forward proxy on 127.0.0.1 that dials targets from
// its own source address.
type proxy struct {
	*httptest.Server
}

func newProxy(source net.IP) *proxy {
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: source}, Timeout: 5 * time.Second}
	transport := &http.Transport{DialContext: dialer.DialContext, DisableKeepAlives: true}
	return &proxy{httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out := r.Clone(r.Context())
		out.RequestURI = ""
		resp, err := transport.RoundTrip(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	}))}
}
