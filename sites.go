package proxyswitch

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/proxyswitch/proxyswitch/internal/engine"
)

// SiteUse is one site leased from a pool, with the time of its last lease.
type SiteUse struct {
	Site      string
	LastLease time.Time
}

// Sites returns the sites leased from the pool within the idle TTL, most
// recently used first (with ScopeGlobal, the single scope "*").
func (s *Switch) Sites(ctx context.Context) ([]SiteUse, error) {
	res, err := roundTrip(ctx, s.cfg.redisTimeout, func(ctx context.Context) ([]string, error) {
		return engine.Sites{Sites: s.keys.sites(), IdleTTL: s.cfg.idleTTL}.Run(ctx, s.rdb).StringSlice()
	}, nil)
	if err != nil {
		return nil, redisErr("sites", err)
	}
	out := make([]SiteUse, 0, len(res)/2)
	for i := 0; i+1 < len(res); i += 2 {
		ms, err := strconv.ParseFloat(res[i+1], 64)
		if err != nil {
			return nil, fmt.Errorf("%w: site %q has score %q", ErrCorrupt, res[i], res[i+1])
		}
		out = append(out, SiteUse{Site: res[i], LastLease: time.UnixMilli(int64(ms))})
	}
	return out, nil
}
