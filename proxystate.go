package proxyswitch

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/proxyswitch/proxyswitch/internal/engine"
)

// The states of a proxy on a site, as ProxyState.State names them.
const (
	StateFree        = "free"        // a slot can be leased now
	StateLeased      = "leased"      // a request holds a slot
	StateCooling     = "cooling"     // released, waiting out the cooldown (or an expired lease's slot)
	StateQuarantined = "quarantined" // banned on the site (or on every site) until Until
	StateDead        = "dead"        // out of every site's rotation until Revive
	StateDrained     = "drained"     // taken out by Drain until Revive
)

// ProxyState is one proxy of a pool as one site sees it, read by
// ProxyStates. Times are by Redis' clock. It is a snapshot value.
//
// A proxy has one slot per site (k with Rotation.Concurrency k). State sums
// its slots up, the first that applies: dead or drained, quarantined,
// leased, free, cooling.
type ProxyState struct {
	Proxy *Proxy // its ID and URL (String redacts the password)
	State string // StateFree, StateLeased, StateCooling, StateQuarantined, StateDead or StateDrained

	// Until is when the state ends (lease expiry, end of cooldown or of
	// quarantine); zero for free, dead and drained.
	Until time.Time
	// Strikes is the proxy's bans in a row on the site, until a healthy
	// answer or Unban.
	Strikes int
	// BanAllSites: a ban on every site holds the proxy out.
	BanAllSites bool
	// Since and Reason say when and why a dead or drained proxy was marked.
	Since  time.Time
	Reason string

	FreeSlots        int // slots leasable now
	LeasedSlots      int // slots held by a live lease
	CoolingSlots     int // slots cooling down
	QuarantinedSlots int // slots held out by a ban
	DeadSlots        int // slots out of every rotation
}

// proxyStateFields is the number of items per proxy in the reply of
// proxy_states.lua.
const proxyStateFields = 13

// ProxyStates reads the state of every proxy of the Switch's own pool on
// site, ordered by redacted URL, in pages (not one instant). It walks the
// whole pool: an operator's call. It is safe for concurrent use.
func (s *Switch) ProxyStates(ctx context.Context, site string) ([]ProxyState, error) {
	if site == "" && s.cfg.scope != ScopeGlobal {
		return nil, fmt.Errorf("%w: empty site", ErrConfig)
	}
	scope := s.scopeOf(site)
	var out []ProxyState
	seen := map[string]bool{}
	cursor := "0"
	for first := true; first || cursor != "0"; first = false {
		call := engine.ProxyStates{StateKeys: s.keys.states(scope), Slots: s.cfg.slots, Cursor: cursor,
			Count: max(1, pageSize()/(2*s.cfg.slots)), Site: failSite(scope)} // a few lookups per slot: ~250 slots a page
		res, err := roundTrip(ctx, s.cfg.redisTimeout, func(ctx context.Context) ([]any, error) {
			return call.Run(ctx, s.rdb).Slice()
		}, nil)
		if err != nil {
			return nil, redisErr("proxy states", err)
		}
		next, ok := "", len(res) > 0
		if ok {
			next, ok = res[0].(string)
		}
		if !ok {
			return nil, fmt.Errorf("%w: proxy states reply without a cursor", ErrCorrupt)
		}
		page, err := s.parseProxyStates(res[1:])
		if err != nil {
			return nil, err
		}
		for _, st := range page {
			if !seen[st.Proxy.id] { // HSCAN may return an entry twice
				seen[st.Proxy.id] = true
				out = append(out, st)
			}
		}
		cursor = next
	}
	sortProxies(out, func(st ProxyState) *Proxy { return st.Proxy })
	return out, nil
}

// parseProxyStates reads the reply of proxy_states.lua after its cursor.
func (s *Switch) parseProxyStates(res []any) ([]ProxyState, error) {
	r := reply{res: res}
	now, slots, n := r.int(0), r.int(1), r.int(2)
	if r.err != nil || slots < 1 || n < 0 || int64(len(res)-3) != n*proxyStateFields {
		return nil, fmt.Errorf("%w: proxy states reply of %d items", ErrCorrupt, len(res))
	}
	out := make([]ProxyState, 0, n)
	for i := 3; i < len(res); i += proxyStateFields {
		id, raw, dead := r.str(i), r.str(i+1), r.str(i+2)
		st := ProxyState{
			Strikes:          int(r.int(i + 3)),
			FreeSlots:        int(r.int(i + 5)),
			LeasedSlots:      int(r.int(i + 6)),
			CoolingSlots:     int(r.int(i + 7)),
			QuarantinedSlots: int(r.int(i + 8)),
			DeadSlots:        int(r.int(i + 9)),
		}
		allEnd, leaseUntil, coolUntil, quarUntil := r.int(i+4), r.int(i+10), r.int(i+11), r.int(i+12)
		if r.err != nil {
			return nil, fmt.Errorf("%w: proxy states reply: %w", ErrCorrupt, r.err)
		}
		counted := st.FreeSlots + st.LeasedSlots + st.CoolingSlots + st.QuarantinedSlots + st.DeadSlots
		if min(st.Strikes, st.FreeSlots, st.LeasedSlots, st.CoolingSlots, st.QuarantinedSlots, st.DeadSlots) < 0 ||
			int64(counted) > slots {
			return nil, fmt.Errorf("%w: proxy states reply: %d slots of proxy %s in states, of %d", ErrCorrupt, counted, id, slots)
		}
		p, err := s.poolEntry(s.keys.proxies(), id, raw)
		if err != nil {
			return nil, err
		}
		st.Proxy = p
		switch {
		case dead != "":
			ms, reason, _ := strings.Cut(dead, "|")
			if at, err := strconv.ParseInt(ms, 10, 64); err == nil {
				st.Since = time.UnixMilli(at)
			}
			st.State, st.Reason = StateDead, reason
			if reason == "drained" {
				st.State = StateDrained
			}
		case st.DeadSlots > 0:
			st.State = StateDead
		case quarUntil > 0:
			st.State, st.Until, st.BanAllSites = StateQuarantined, time.UnixMilli(quarUntil), allEnd > now
		case st.LeasedSlots > 0:
			st.State, st.Until = StateLeased, time.UnixMilli(leaseUntil)
		case st.FreeSlots > 0:
			st.State = StateFree
		case st.CoolingSlots > 0:
			st.State, st.Until = StateCooling, time.UnixMilli(coolUntil)
		default: // no slot tracked on the site
			st.State = StateFree
		}
		out = append(out, st)
	}
	sortProxies(out, func(st ProxyState) *Proxy { return st.Proxy })
	return out, nil
}

// reply reads typed items of a script's reply; the first item of the wrong
// type (or missing) sets err, after which every read returns a zero value.
type reply struct {
	res []any
	err error
}

func (r *reply) int(i int) int64 {
	v, ok := intAt(r.res, i)
	if !ok && r.err == nil {
		r.err = fmt.Errorf("item %d is not an integer", i+1)
	}
	return v
}

func (r *reply) str(i int) string {
	var v string
	ok := i < len(r.res)
	if ok {
		v, ok = r.res[i].(string)
	}
	if !ok && r.err == nil {
		r.err = fmt.Errorf("item %d is not a string", i+1)
	}
	return v
}
