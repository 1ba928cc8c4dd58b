package proxyswitch_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/url"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/proxyswitchtest"
)

// A client of each proxy's own (here a plain *http.Transport; a uTLS or
// HTTP/2-fingerprint RoundTripper plugs in the same way), with keep-alives
// and a client identity per session: a sticky session of 20 requests opens
// one connection at its proxy, and every request carries the session's
// User-Agent. It runs against the fake proxies and an embedded Redis.
func ExampleWithClient() {
	stage, err := proxyswitchtest.StartStage(proxyswitchtest.StageConfig{Proxies: 2})
	if err != nil {
		log.Fatal(err)
	}
	defer stage.Close()
	site := proxyswitchtest.StartSite("shop", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, r.UserAgent())
	}))
	defer site.Close()

	sw, err := proxyswitch.NewSwitch(stage.Redis.Client(), proxyswitch.WithClient(proxyswitch.Client{
		New: func(proxy *url.URL) (http.RoundTripper, error) {
			return &http.Transport{Proxy: http.ProxyURL(proxy)}, nil // sends through its one proxy
		},
		KeepAlive: true,
		Identities: []http.Header{
			{"User-Agent": {"Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0"}, "Accept-Language": {"ru-RU,ru"}},
		},
	}))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	if _, err := sw.Add(ctx, stage.Farm.URLs()...); err != nil {
		log.Fatal(err)
	}
	c := colly.NewCollector(colly.AllowURLRevisit())
	sw.Attach(c)
	agents := map[string]int{}
	c.OnResponse(func(r *colly.Response) { agents[string(r.Body)]++ })
	task := proxyswitch.NewTaskContext("shopper-1")
	for i := range 20 {
		_ = c.Request("GET", fmt.Sprintf("%s/p/%d", site.URL(), i+1), nil, task, nil)
	}
	conns := 0
	for _, p := range stage.Farm.Proxies {
		accepted, _ := p.Conns()
		conns += accepted
	}
	fmt.Println(site.Recorder().Count(), "requests,", conns, "connection,", len(site.Recorder().IPs()), "IP")
	fmt.Println(agents)
	_ = sw.Close(ctx) // closes the idle connections
	// Output:
	// 20 requests, 1 connection, 1 IP
	// map[Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0:20]
}
