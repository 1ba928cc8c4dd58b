// Command shopper runs sticky-session shopper flows on a fake marketplace
// (modelled on Ozon): each shopper signs in, puts products in the cart and
// checks out. The marketplace binds each sign-in to the client IP and takes
// a session cookie that comes back from another IP for a stolen one (403),
// so a flow must leave from one IP with its own cookies from start to end:
// a proxyswitch session, one per task.
//
//	go run ./_examples/shopper                 # sticky sessions: every order goes through
//	go run ./_examples/shopper -sessions=false # a proxy per request: watch the flows break
//	go run ./_examples/shopper -redis server   # a private redis-server from PATH (default: an embedded Redis)
//	go run ./_examples/shopper -redis redis://127.0.0.1:6379/0
//
// Each shopper is a task (proxyswitch.NewTaskContext): while its session
// lives, its proxy serves no one else on the marketplace, its cookies live in
// Redis (any server could carry on with the flow) and never in the
// collector's jar, and EndSession hands the proxy back when the flow is done.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/proxyswitchtest"
)

func main() {
	redisArg := proxyswitchtest.RedisFlag()
	shoppers := flag.Int("shoppers", 20, "shoppers, each with a flow of its own")
	items := flag.Int("items", 3, "products each shopper puts in the cart")
	nProxies := flag.Int("proxies", 30, "proxies in the pool")
	sessions := flag.Bool("sessions", true, "give each shopper a sticky session (false: a proxy per request)")
	flag.Parse()
	log.SetFlags(0)
	if *shoppers < 1 || *items < 1 {
		log.Fatal("shopper: need shoppers, items >= 1")
	}
	ctx := context.Background()

	st, err := proxyswitchtest.StartStage(proxyswitchtest.StageConfig{Redis: *redisArg, Proxies: *nProxies, Market: &proxyswitchtest.MarketConfig{}})
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	rdb := st.Redis.Client()
	defer rdb.Close()
	ozon := st.Market.Platforms[1]
	exitIP := map[string]string{} // proxy URL -> the address it dials out from
	for _, p := range st.Farm.Proxies {
		exitIP[p.URL()] = p.SourceIP().String()
	}

	sw, err := proxyswitch.NewSwitch(rdb,
		proxyswitch.WithPrefix("shopper"),
		proxyswitch.WithRotation(proxyswitch.Rotation{Cooldown: proxyswitchtest.SafeInterval}),
		proxyswitch.WithTimeouts(proxyswitch.Timeouts{MaxWait: 5 * time.Second}), // give up soon when every proxy is burnt (-sessions=false)
		proxyswitch.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))),
		proxyswitch.WithSessions(proxyswitch.Sessions{Retired: func(r proxyswitch.SessionRetirement) {
			log.Printf("%s: session retired after %d requests (%s on %s)", r.Task, r.Requests, r.Reason, r.Site)
		}}))
	if err != nil {
		log.Fatal(err)
	}
	if err := sw.Clear(ctx); err != nil {
		log.Fatal(err)
	}
	defer sw.Clear(ctx)
	defer sw.Close(ctx) // before the Clear: stops the lease renewer, releases whatever is still leased
	if _, err := sw.Replace(ctx, st.Farm.URLs()); err != nil {
		log.Fatal(err)
	}
	mode := "one sticky session per shopper"
	if !*sessions {
		mode = "a proxy per request, no sessions"
	}
	fmt.Printf("%d shoppers on %s through %d proxies (%s); Redis: %s\n\n", *shoppers, ozon.Name, *nProxies, mode, st.Redis)

	c := colly.NewCollector(colly.AllowURLRevisit()) // a cart page is asked for again and again
	sw.Attach(c)
	c.SetRequestTimeout(time.Minute)
	c.OnHTML(".account, .cart, .order", func(e *colly.HTMLElement) {
		e.Request.Ctx.Put("page", strings.TrimSpace(e.Text))
	})
	c.OnError(func(r *colly.Response, err error) {
		r.Ctx.Put("page", fmt.Sprintf("%s: %v", r.Request.URL.Path, err))
	})

	var mu sync.Mutex
	lines := map[string]string{}
	var wg sync.WaitGroup
	start := time.Now()
	for i := range *shoppers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			task := fmt.Sprintf("shopper-%02d", i+1)
			line := shop(ctx, c, sw, ozon, task, *items, *sessions, exitIP)
			mu.Lock()
			lines[task] = line
			mu.Unlock()
		}()
	}
	wg.Wait()

	var tasks []string
	for t := range lines {
		tasks = append(tasks, t)
	}
	sort.Strings(tasks)
	for _, t := range tasks {
		fmt.Println(lines[t])
	}
	seen := ozon.Shop()
	ms := st.Market.Stats()
	fmt.Printf("\nin %v the marketplace saw %d sign-ins, %d products put in carts, %d orders;\n", time.Since(start).Round(100*time.Millisecond), seen.Logins, seen.CartAdds, seen.Orders)
	fmt.Printf("%d requests with a session cookie from another IP (refused as stolen), %d without a session (sent to /login),\n", seen.Stolen, seen.NoSession)
	fmt.Printf("%d IP collisions, %d other refusals (%v).\n", ms.Collisions, ms.Bans, ms.Refused)
	if *sessions && seen.Orders != *shoppers {
		os.Exit(1)
	}
}

// shop runs one shopper's flow: sign in, put items in the cart, check out,
// each step after a human pause. It returns a line telling how it went.
func shop(ctx context.Context, c *colly.Collector, sw *proxyswitch.Switch, site *proxyswitchtest.Platform, task string, items int, sessions bool, exitIP map[string]string) string {
	cctx := colly.NewContext()
	if sessions {
		cctx = proxyswitch.NewTaskContext(task) // every request of the flow belongs to the task
	}
	ips := map[string]bool{}
	step := func(path string) (string, bool) {
		time.Sleep(time.Duration(400+rand.IntN(400)) * time.Millisecond) // a human reads the page
		cctx.Put("page", "")
		err := c.Request("GET", site.URL()+path, nil, cctx, nil)
		if info := proxyswitch.SessionOf(cctx); info != nil {
			ips[exitIP[info.Proxy]] = true
		}
		page := cctx.Get("page")
		return page, err == nil && page != ""
	}
	var done []string
	page, ok := step("/login?user=" + url.QueryEscape(task))
	for i := 0; ok && i < items; i++ {
		page, ok = step(fmt.Sprintf("/cart/add?id=%d", 1001001+rand.IntN(20)))
		if ok {
			done = append(done, "added")
		}
	}
	if ok {
		page, ok = step("/checkout")
	}
	result := page
	if sessions {
		info, _ := sw.Session(ctx, task)
		var cookies []string
		if jar, err := sw.SessionCookies(ctx, task, mustParse(site.URL()+"/")); err == nil {
			for _, ck := range jar {
				cookies = append(cookies, ck.Name+"="+ck.Value)
			}
		}
		_, _ = sw.EndSession(ctx, task) // the flow is done: the proxy serves others again
		if info != nil {
			return fmt.Sprintf("%s  %d requests from %s, cookies %v: %s", task, info.Requests, strings.Join(keys(ips), ", "), cookies, result)
		}
	}
	return fmt.Sprintf("%s  %d cart steps done: %s", task, len(done), result)
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func mustParse(raw string) *url.URL {
	u, err := url.Parse(raw)
	if err != nil {
		panic(err)
	}
	return u
}
