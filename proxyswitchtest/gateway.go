package proxyswitchtest

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// GatewayConfig configures a fake [Gateway].
type GatewayConfig struct {
	// Exits is the number of exit IPs, SourceIP(FirstExit) onwards. The
	// default is 16.
	Exits int
	// FirstExit is the SourceIP index of the first exit. The default is
	// 1000 (127.0.4.239), clear of a Farm of up to 1000 proxies.
	FirstExit int
	// Password, when set, is the password every request must carry (407
	// otherwise); the user name is free. The default accepts any.
	Password string
	// Shared, when true, lets sessions share exits as a residential pool
	// does: when every exit is held, a new session id joins the one used
	// least recently, and the sessions already there keep it. The default
	// (false) gives it to the new session alone: the old one loses it.
	Shared bool
}

// Gateway is a fake rotating gateway of a proxy provider: one listening
// port, and behind it Exits exit IPs. The session id in a request's proxy
// user name or password ("...-session-<id>", "...-sessid-<id>" or
// "..._session-<id>": the syntaxes of Bright Data, Oxylabs and IPRoyal)
// picks its exit, sticky: the same id leaves from the same IP; a
// new id gets an exit no session holds, or, when every exit is held, the
// one used least recently (whose session then loses it, unless
// GatewayConfig.Shared: then both leave from it). A request without
// a session id leaves from the next exit in turn. The site sees the exit IP
// as RemoteAddr. Targets must be loopback, as for [Proxy].
//
// All methods are safe for concurrent use.
type Gateway struct {
	cfg   GatewayConfig
	addr  string
	srv   *http.Server
	exits []*Proxy

	mu        sync.Mutex
	bySession map[string]int // session id -> exit
	holder    []string       // exit -> session id holding it
	lastUse   []time.Time    // exit -> last request through it
	seen      map[string]bool
	next      int // round-robin exit of requests without a session
	requests  atomic.Int64
	closeOnce sync.Once
}

// sessionInUser finds a provider session id in a user name or password.
var sessionInUser = regexp.MustCompile(`(?:^|[-_])(?:session|sessid)-([A-Za-z0-9]+)`)

// NewGateway starts a fake gateway; tb.Cleanup closes it.
func NewGateway(tb testing.TB, cfg GatewayConfig) *Gateway {
	tb.Helper()
	g, err := startGateway(tb, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(g.Close)
	return g
}

// StartGateway is [NewGateway] for programs without a testing.TB: the
// caller must Close the gateway.
func StartGateway(cfg GatewayConfig) (*Gateway, error) { return startGateway(stdReporter{}, cfg) }

func startGateway(rep reporter, cfg GatewayConfig) (*Gateway, error) {
	if cfg.Exits == 0 {
		cfg.Exits = 16
	}
	if cfg.FirstExit == 0 {
		cfg.FirstExit = 1000
	}
	if cfg.Exits < 1 || cfg.FirstExit < 0 || cfg.FirstExit+cfg.Exits > MaxSourceIPs {
		return nil, fmt.Errorf("proxyswitchtest: gateway exits %d from index %d out of range [0,%d)", cfg.Exits, cfg.FirstExit, MaxSourceIPs)
	}
	g := &Gateway{cfg: cfg, bySession: map[string]int{}, holder: make([]string, cfg.Exits),
		lastUse: make([]time.Time, cfg.Exits), seen: map[string]bool{}}
	for i := range cfg.Exits {
		p, err := startProxy(rep, SourceIP(cfg.FirstExit+i))
		if err != nil {
			g.Close()
			return nil, err
		}
		g.exits = append(g.exits, p)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		g.Close()
		return nil, fmt.Errorf("proxyswitchtest: gateway listen: %w", err)
	}
	g.addr = ln.Addr().String()
	g.srv = &http.Server{Handler: http.HandlerFunc(g.serveHTTP), ReadHeaderTimeout: 30 * time.Second,
		ErrorLog: log.New(io.Discard, "", 0)}
	go func() {
		if err := g.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			rep.Errorf("proxyswitchtest: gateway: %v", err)
		}
	}()
	return g, nil
}

// Addr returns the gateway's "127.0.0.1:PORT".
func (g *Gateway) Addr() string { return g.addr }

// Template returns a gateway entry for proxyswitch of n sessions:
// "http://<user>-session-{session:<n>}:<password>@127.0.0.1:PORT" (the
// password is "x" when the gateway accepts any).
func (g *Gateway) Template(user string, n int) string {
	pass := g.cfg.Password
	if pass == "" {
		pass = "x"
	}
	return fmt.Sprintf("http://%s-session-{session:%d}:%s@%s", user, n, url.QueryEscape(pass), g.addr)
}

// Exits returns the exit IPs, in order.
func (g *Gateway) Exits() []string {
	out := make([]string, len(g.exits))
	for i, p := range g.exits {
		out[i] = p.SourceIP().String()
	}
	return out
}

// SessionIP returns the exit IP session id holds now, or "".
func (g *Gateway) SessionIP(id string) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if i, ok := g.bySession[id]; ok {
		return g.exits[i].SourceIP().String()
	}
	return ""
}

// Sessions returns the number of distinct session ids the gateway has seen.
func (g *Gateway) Sessions() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.seen)
}

// Requests returns the number of requests the gateway received.
func (g *Gateway) Requests() int { return int(g.requests.Load()) }

// Close stops the gateway and its exits.
func (g *Gateway) Close() {
	g.closeOnce.Do(func() {
		if g.srv != nil {
			g.srv.Close()
		}
		for _, p := range g.exits {
			p.Close()
		}
	})
}

// exit returns the exit of a request with proxy credentials user:pass.
func (g *Gateway) exit(user, pass string) int {
	id := ""
	for _, s := range []string{user, pass} {
		if m := sessionInUser.FindStringSubmatch(s); m != nil {
			id = m[1]
			break
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	if id == "" {
		i := g.next % len(g.exits)
		g.next++
		g.lastUse[i] = now
		return i
	}
	g.seen[id] = true
	i, ok := g.bySession[id]
	if !ok {
		i = -1
		for j, h := range g.holder { // a free exit first, else the least recently used
			if h == "" {
				i = j
				break
			}
			if i < 0 || g.lastUse[j].Before(g.lastUse[i]) {
				i = j
			}
		}
		if old := g.holder[i]; old != "" && !g.cfg.Shared {
			delete(g.bySession, old)
		}
		g.holder[i], g.bySession[id] = id, i
	}
	g.lastUse[i] = now
	return i
}

func (g *Gateway) serveHTTP(w http.ResponseWriter, r *http.Request) {
	g.requests.Add(1)
	user, pass, ok := proxyAuth(r)
	if !ok || (g.cfg.Password != "" && pass != g.cfg.Password) {
		w.Header().Set("Proxy-Authenticate", `Basic realm="proxyswitchtest-gateway"`)
		http.Error(w, "407 proxy authentication required", http.StatusProxyAuthRequired)
		return
	}
	g.exits[g.exit(user, pass)].serveHTTP(w, r)
}

// proxyAuth reads the Basic credentials of Proxy-Authorization.
func proxyAuth(r *http.Request) (user, pass string, ok bool) {
	scheme, enc, ok := strings.Cut(r.Header.Get("Proxy-Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return "", "", false
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
	if err != nil {
		return "", "", false
	}
	return strings.Cut(string(raw), ":")
}
