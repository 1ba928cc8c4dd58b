// Command gateway crawls a shop through a rotating gateway of a proxy
// provider: one host:port, whose user name picks a sticky exit IP by a
// session id. One pool entry, a template with {session:N}, becomes N
// virtual proxies, one provider session each; the shop refuses the exit IP
// of the first session (an IP burnt before we came), and the ban rotates
// that session (a new id, a new exit IP) instead of losing it. Two
// shoppers (sticky tasks) keep one exit IP each for their whole visit.
//
//	go run ./_examples/gateway                 # an embedded in-process Redis
//	go run ./_examples/gateway -redis server   # a private redis-server from PATH
//
// Everything runs on loopback: the fake gateway dials the shop from one of
// its exit addresses 127.0.x.y, chosen by the session id in the user name,
// so the shop sees the exit IP as a real site would. It exits 1 if two
// requests reached the shop from one IP at once, if a request went without
// a proxy, if a page failed, or if a shopper changed IPs.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"

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
	shop := proxyswitchtest.StartSite("shop", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ip, _, _ := net.SplitHostPort(r.RemoteAddr); ip == burnt {
			http.Error(w, "access denied", http.StatusForbidden)
			return
		}
		fmt.Fprintf(w, "<html><body><h1>%s</h1><p class=price>%d</p></body></html>", r.URL.Path, len(r.URL.Path)*100)
	}))
	defer shop.Close()

	sw, err := proxyswitch.NewSwitch(rdb, proxyswitch.WithPrefix("gateway-example"))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	defer sw.Close(ctx)
	// One entry: the provider's gateway with a session placeholder in the
	// user name (Bright Data's "-session-", Oxylabs' "-sessid-"; IPRoyal's
	// "_session-" sits in the password), here
	// http://customer-demo-session-{session:6}:s3cret@127.0.0.1:PORT.
	entry := gw.Template("customer-demo", *sessions)
	if _, err := sw.Replace(ctx, []string{entry}); err != nil {
		log.Fatal(err)
	}
	before := ids(ctx, sw)

	c := colly.NewCollector(colly.AllowURLRevisit(), colly.Async(true))
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
		if ip == burnt {
			note = "  (burnt: refused, its session rotated)"
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
	fmt.Printf("pool: %d sessions, %d of them new (rotated after a ban); the gateway saw %d session ids\n",
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
	fmt.Printf("IP collisions at the shop: %d, requests without a proxy: %d, failed pages: %d\n",
		rec.Collisions(), rec.DirectHits(), failed)
	if rec.Collisions() > 0 || rec.DirectHits() > 0 || failed > 0 || !sticky {
		os.Exit(1)
	}
}

// ids returns the IDs of the pool's proxies (its sessions).
func ids(ctx context.Context, sw *proxyswitch.Switch) map[string]bool {
	ps, err := sw.List(ctx)
	if err != nil {
		log.Fatal(err)
	}
	out := map[string]bool{}
	for _, p := range ps {
		out[p.ID()] = true
	}
	return out
}
