package proxyswitch

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/proxyswitch/proxyswitch/internal/engine"
)

// SiteState counts the proxy slots of a pool in each state for one site
// (slots are proxies when the concurrency is 1).
type SiteState struct {
	Site        string
	Free        int // leasable now
	Leased      int // held by a live lease
	Cooling     int // released, waiting out the cooldown (or an expired lease's slot)
	Quarantined int // banned on this site (or on every site) until the quarantine ends
	Dead        int // out of every site's rotation until revived (drained ones too)

	// Learned is the site's learned cooldown (Rotation.LearnedPacing), 0
	// for none.
	Learned time.Duration
}

// SiteState reads the state of the pool for site. A large pool is read in
// several calls, so the counts may then not be one instant nor add up. It is
// safe for concurrent use.
func (s *Switch) SiteState(ctx context.Context, site string) (SiteState, error) {
	scope := s.scopeOf(site)
	call := engine.State{StateKeys: s.keys.states(scope), Slots: s.cfg.slots, Phase: "busy", Cursor: "0", Budget: pageSize(), Site: failSite(scope)}
	var st SiteState
	seen := map[string]bool{}
	for first := true; call.Phase != "done"; first = false {
		res, err := roundTrip(ctx, s.cfg.redisTimeout, func(ctx context.Context) ([]any, error) {
			return call.Run(ctx, s.rdb).Slice()
		}, nil)
		if err != nil {
			return SiteState{}, redisErr("state", err)
		}
		if len(res) < 5 || (len(res)-5)%2 != 0 {
			return SiteState{}, fmt.Errorf("%w: state reply of %d items", ErrCorrupt, len(res))
		}
		size, ok1 := engine.IntAt(res, 0)
		k, ok2 := engine.IntAt(res, 1)
		learned, ok3 := engine.IntAt(res, 2)
		phase, ok4 := res[3].(string)
		cursor, ok5 := res[4].(string)
		if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || phase == call.Phase && cursor == "0" {
			return SiteState{}, fmt.Errorf("%w: state reply %.100v", ErrCorrupt, res[:5])
		}
		if first {
			st = SiteState{Site: site, Free: int(size * k), Learned: time.Duration(learned) * time.Millisecond}
		}
		for i := 5; i < len(res); i += 2 {
			item, ok := res[i].(string)
			n, nok := engine.IntAt(res, i+1)
			if !ok || !nok || item == "" || n < 0 || n > k {
				return SiteState{}, fmt.Errorf("%w: state reply item %.100v", ErrCorrupt, res[i])
			}
			// A name counts once in its phase: the busy members ("L", "C",
			// "Q"), the dead ids ("D"), the ids banned everywhere ("X").
			key := item
			if strings.ContainsRune("LCQ", rune(item[0])) {
				key = "b" + item[1:]
			}
			if seen[key] {
				continue
			}
			seen[key] = true
			switch item[0] {
			case 'L':
				st.Leased += int(n)
			case 'C':
				st.Cooling += int(n)
			case 'Q', 'X':
				st.Quarantined += int(n)
			case 'D':
				st.Dead += int(n)
			default:
				return SiteState{}, fmt.Errorf("%w: state reply item %.100q", ErrCorrupt, item)
			}
		}
		call.Phase, call.Cursor = phase, cursor
	}
	st.Free = max(st.Free-st.Leased-st.Cooling-st.Quarantined-st.Dead, 0)
	return st, nil
}
