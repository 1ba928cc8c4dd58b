// Command gateway crawls a shop through a rotating gateway of a proxy
// provider: one host:port, whose user name picks a sticky exit IP by a
// session id. One pool entry, a template with {session:N}, becomes N
// virtual proxies, one provider session each; the shop refuses the exit IP
// of the first session (an IP burnt before we came), and the ban rotates
// that session (a new id, a new exit IP) instead of losing it. Two
// shoppers (sticky tasks) keep one exit IP each for their whole visit.
// The gateway's sessions are labelled country=de, and a plain proxy beside
// them country=ru: pages asked for with UseLabels(ctx, "country=ru") leave
// through that one only. Every request goes through a custom RoundTripper
// (WithClient), as a uTLS or HTTP/2-fingerprint client would plug in.
//
//	go run ./_examples/gateway                 # an embedded in-process Redis
//	go run ./_examples/gateway -redis server   # a private redis-server from PATH
//
// Everything runs on loopback: the fake gateway dials the shop from one of
// its exit addresses 127.0.x.y, chosen by the session id in the user name,
// so the shop sees the exit IP as a real site would. It exits 1 if two
// requests reached the shop from one IP at once, if a request went without
// a proxy or without the custom RoundTripper, if a page failed, if a
// shopper changed IPs, or if a country=ru page left from another IP.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/proxyswitchtest"
)

func main() {
	redisArg := proxyswitchtest.RedisFlag()
	pages := flag.Int("pages", 60, "catalog pages to crawl")
	sessions := flag.Int("sessions", 6, "provider sessions of the gateway entry")
	flag.Parse()

	rs, err := proxyswitchtest.StartRedis(*redisArg)
	if err != nil {
		log.Fatal(err)
	}
	defer rs.Close()
	rdb := rs.Client()
	defer rdb.Close()

	gw, err := proxyswitchtest.StartGateway(proxyswitchtest.GatewayConfig{Exits: 32, Password: "s3cret"})
	if err != nil {
		log.Fatal(err)
	}
	defer gw.Close()
	burnt := gw.Exits()[0] // the exit the gateway gives its first session
	ru, err := proxyswitchtest.StartProxy(proxyswitchtest.SourceIP(0))
	if err != nil {
		log.Fatal(err)
	}
	defer ru.Close()
	var bypassed atomic.Int64 // requests that did not come through the custom RoundTripper
	shop := proxyswitchtest.StartSite("shop", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Client") != "fingerprint-demo" {
			bypassed.Add(1)
		}
		if ip, _, _ := net.SplitHostPort(r.RemoteAddr); ip == burnt {
			http.Error(w, "access denied", http.StatusForbidden)
			return
		}
		fmt.Fprintf(w, "<html><body><h1>%s</h1><p class=price>%d</p></body></html>", r.URL.Path, len(r.URL.Path)*100)
	}))
	defer shop.Close()

	var sent atomic.Int64
	sw, err := proxyswitch.NewSwitch(rdb, proxyswitch.WithPrefix("gateway-example"),
		proxyswitch.WithClient(proxyswitch.Client{New: func(proxy *url.URL) (http.RoundTripper, error) {
			return &fingerprintClient{inner: &http.Transport{Proxy: http.ProxyURL(proxy)}, sent: &sent}, nil
		}}))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	defer sw.Close(ctx)
	// One entry: the provider's gateway with a session placeholder in the
	// user name (Bright Data's "-session-", Oxylabs' "-sessid-"; IPRoyal's
	// "_session-" sits in the password), here
	// http://customer-demo-session-{session:6}:s3cret@127.0.0.1:PORT,
	// its sessions labelled country=de; and a plain proxy labelled ru.
	entry := gw.Template("customer-demo", *sessions) + " country=de"
	if _, err := sw.Replace(ctx, []string{entry, ru.URL() + " country=ru"}); err != nil {
		log.Fatal(err)
	}
	before := ids(ctx, sw)

	c := colly.NewCollector(colly.AllowURLRevisit(), colly.Async(true))
	// The crawl and the shoppers leave from the gateway's German sessions:
	// without labels a shopper's sticky session could take the one
	// country=ru proxy, and hold it from the Russian pages for its TTL.
	c.Context = proxyswitch.UseLabels(ctx, "country=de")
	sw.Attach(c)
	if err := c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: 4}); err != nil {
		log.Fatal(err)
	}
	var mu sync.Mutex
	failed := 0
	c.OnError(func(r *colly.Response, err error) {
		mu.Lock()
		failed++
		mu.Unlock()
		log.Printf("%s: %v", r.Request.URL, err)
	})
	for i := range *pages {
		if err := c.Visit(fmt.Sprintf("%s/catalog/%d", shop.URL(), i)); err != nil {
			log.Fatal(err)
		}
	}
	for _, task := range []string{"shopper-1", "shopper-2"} {
		tc := proxyswitch.NewTaskContext(task)
		for step := range 5 {
			if err := c.Request("GET", fmt.Sprintf("%s/cart/%s/%d", shop.URL(), task, step), nil, tc, nil); err != nil {
				log.Fatal(err)
			}
		}
	}
	// Pages that must leave from Russia, beside the crawl.
	rc := colly.NewCollector(colly.AllowURLRevisit())
	rc.Context = proxyswitch.UseLabels(ctx, "country=ru")
	sw.Attach(rc)
	for i := range 3 {
		if err := rc.Visit(fmt.Sprintf("%s/ru/%d", shop.URL(), i)); err != nil {
			mu.Lock()
			failed++
			mu.Unlock()
			log.Printf("/ru/%d: %v", i, err)
		}
	}
	c.Wait()

	rec := shop.Recorder()
	byIP := rec.IPs()
	exits := make([]string, 0, len(byIP))
	for ip := range byIP {
		exits = append(exits, ip)
	}
	sort.Strings(exits)
	fmt.Printf("%d requests reached the shop from %d exit IPs:\n", rec.Count(), len(exits))
	for _, ip := range exits {
		note := ""
		switch ip {
		case burnt:
			note = "  (burnt: refused, its session rotated)"
		case ru.SourceIP().String():
			note = "  (the country=ru proxy)"
		}
		fmt.Printf("  %-15s %3d%s\n", ip, byIP[ip], note)
	}
	after := ids(ctx, sw)
	rotated := 0
	for id := range after {
		if !before[id] {
			rotated++
		}
	}
	fmt.Printf("pool: %d gateway sessions, %d of them new (rotated after a ban); the gateway saw %d session ids\n",
		len(after), rotated, gw.Sessions())
	taskIPs := map[string]map[string]bool{} // what the shop saw of each shopper
	for _, h := range rec.Hits() {
		if task, ok := strings.CutPrefix(h.Path, "/cart/"); ok && h.Status == http.StatusOK {
			task, _, _ = strings.Cut(task, "/")
			if taskIPs[task] == nil {
				taskIPs[task] = map[string]bool{}
			}
			taskIPs[task][h.ClientIP] = true
		}
	}
	sticky := true
	for _, task := range []string{"shopper-1", "shopper-2"} {
		fmt.Printf("%s: every step from one exit IP: %v\n", task, len(taskIPs[task]) == 1)
		sticky = sticky && len(taskIPs[task]) == 1
	}
	fromRU, elsewhere := 0, 0 // the country=ru pages by where they left from
	for _, h := range rec.Hits() {
		if strings.HasPrefix(h.Path, "/ru/") {
			if h.ClientIP == ru.SourceIP().String() {
				fromRU++
			} else {
				elsewhere++
			}
		}
	}
	fmt.Printf("country=ru pages: %d of 3 from the ru proxy, %d from another IP\n", fromRU, elsewhere)
	fmt.Printf("custom RoundTripper (WithClient): %d requests sent, %d reached the shop without it\n",
		sent.Load(), bypassed.Load())
	fmt.Printf("IP collisions at the shop: %d, requests without a proxy: %d, failed pages: %d\n",
		rec.Collisions(), rec.DirectHits(), failed)
	if rec.Collisions() > 0 || rec.DirectHits() > 0 || failed > 0 || !sticky || fromRU != 3 || elsewhere > 0 ||
		bypassed.Load() > 0 || sent.Load() == 0 {
		os.Exit(1)
	}
}

// ids returns the IDs of the pool's gateway sessions.
func ids(ctx context.Context, sw *proxyswitch.Switch) map[string]bool {
	ps, err := sw.List(ctx)
	if err != nil {
		log.Fatal(err)
	}
	out := map[string]bool{}
	for _, p := range ps {
		if p.Labels()["country"] == "de" {
			out[p.ID()] = true
		}
	}
	return out
}

// fingerprintClient stands for a uTLS or HTTP/2-fingerprint RoundTripper
// (Client.New): it sends through its one proxy, marks each request so that
// the shop can tell it came through it, and counts them.
type fingerprintClient struct {
	inner *http.Transport
	sent  *atomic.Int64
}

func (f *fingerprintClient) RoundTrip(req *http.Request) (*http.Response, error) {
	f.sent.Add(1)
	req = req.Clone(req.Context()) // a RoundTripper leaves its request as it was
	req.Header.Set("X-Client", "fingerprint-demo")
	return f.inner.RoundTrip(req)
}

// CloseIdleConnections lets the Switch close its connections when the proxy
// is banned (needed with Client.KeepAlive).
func (f *fingerprintClient) CloseIdleConnections() { f.inner.CloseIdleConnections() }
