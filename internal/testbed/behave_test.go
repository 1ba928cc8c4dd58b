package testbed

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func serveFrom(h http.Handler, ip string) int {
	r := httptest.NewRequest(http.MethodGet, "/p/1", nil)
	r.RemoteAddr = ip + ":1234"
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code
}

// PerIPLimit answers 429 to a second request from one IP within Every, not
// to another IP, and again 200 once Every has passed; each is recorded.
func TestPerIPLimit(t *testing.T) {
	p := &PerIPLimit{Every: 100 * time.Millisecond}
	for _, c := range []struct {
		ip   string
		want int
	}{{"127.0.1.1", 200}, {"127.0.1.1", 429}, {"127.0.1.2", 200}} {
		wantInt(t, c.ip, serveFrom(p, c.ip), c.want)
	}
	time.Sleep(120 * time.Millisecond)
	wantInt(t, "after Every", serveFrom(p, "127.0.1.1"), 200)
	wantInt(t, "attempts", len(p.Attempts()), 4)
	wantInt(t, "status recorded", p.Attempts()[1].Status, 429)
}

// Flaky answers 503 only to its IPs, at about its rate, and marks them.
func TestFlaky(t *testing.T) {
	f := &Flaky{IPs: map[string]bool{"127.0.1.1": true}, Rate: 0.5}
	refused := 0
	for range 400 {
		if serveFrom(f, "127.0.1.1") == http.StatusServiceUnavailable {
			refused++
		}
		wantInt(t, "a healthy IP", serveFrom(f, "127.0.1.2"), 200)
	}
	if refused < 120 || refused > 280 {
		t.Errorf("%d of 400 refused, want about 200", refused)
	}
	as := f.Attempts()
	if !as[0].Marked || as[1].Marked {
		t.Errorf("marks: %+v %+v", as[0], as[1])
	}
}
