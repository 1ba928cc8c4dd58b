package proxyswitchtest

import (
	"io"
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"
)

func TestStartWithoutTB(t *testing.T) {
	site := StartSite("shop", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer site.Close()
	farm, err := StartFarm(3)
	if err != nil {
		t.Fatal(err)
	}
	defer farm.Close()
	urls := farm.URLs()
	if len(urls) != 3 || urls[1] != farm.Proxies[1].URL() {
		t.Fatalf("URLs() = %v", urls)
	}
	pu, _ := url.Parse(urls[1])
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu), DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := c.Get(site.URL() + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if got := site.Recorder().IPs()[SourceIP(1).String()]; got != 1 {
		t.Errorf("hits from %v = %d, want 1", SourceIP(1), got)
	}
	if got, want := farm.SpreadIPs(2), []string{SourceIP(0).String(), SourceIP(1).String()}; got[0] != want[0] || got[1] != want[1] {
		t.Errorf("SpreadIPs(2) = %v, want %v", got, want)
	}
	if _, err := StartProxy(net.ParseIP("10.0.0.1")); err == nil {
		t.Error("StartProxy accepted a source IP off loopback")
	}
	if _, err := StartFarm(-1); err == nil {
		t.Error("StartFarm(-1) did not fail")
	}
}

func TestAllowedHost(t *testing.T) {
	for host, want := range map[string]bool{
		"127.0.0.1": true, "127.9.8.7": true, "::1": true, "localhost": true, "LocalHost": true,
		"0.0.0.0": false, "10.0.0.1": false, "example.com": false, "::": false, "localhost.evil.com": false,
	} {
		if got := allowedHost(host); got != want {
			t.Errorf("allowedHost(%q) = %v, want %v", host, got, want)
		}
	}
}
