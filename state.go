package proxyswitch

import (
	"context"
	"fmt"
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

	// Learned is the cooldown the fleet learned for the site
	// (Rotation.LearnedPacing), 0 for none; releases use it when it is longer
	// than Rotation.Cooldown.
	Learned time.Duration
}

// SiteState reads the state of the pool for site in one round trip. It is
// safe for concurrent use.
func (s *Switch) SiteState(ctx context.Context, site string) (SiteState, error) {
	scope := s.scopeOf(site)
	res, err := roundTrip(ctx, s.cfg.redisTimeout, func(ctx context.Context) ([]int64, error) {
		return engine.State{StateKeys: s.keys.states(scope), Slots: s.cfg.slots}.Run(ctx, s.rdb).Int64Slice()
	}, nil)
	if err != nil {
		return SiteState{}, redisErr("state", err)
	}
	if len(res) != 6 {
		return SiteState{}, fmt.Errorf("%w: state reply of %d items", ErrCorrupt, len(res))
	}
	return SiteState{Site: site, Free: int(res[0]), Leased: int(res[1]), Cooling: int(res[2]),
		Quarantined: int(res[3]), Dead: int(res[4]), Learned: time.Duration(res[5]) * time.Millisecond}, nil
}
