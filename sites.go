package proxyswitch

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/proxyswitch/proxyswitch/internal/engine"
)

// SiteUse is one site leased from a pool, with the time of its last lease.
type SiteUse struct {
	Site      string
	LastLease time.Time
}

// Sites returns the sites leased from the pool within the idle TTL, most
// recently used first (with ScopeGlobal, the single scope "*"). It reads in
// pages, so a site forgotten meanwhile may be listed or not.
func (s *Switch) Sites(ctx context.Context) ([]SiteUse, error) {
	last := map[string]float64{}
	call := engine.Sites{Sites: s.keys.sites(), IdleTTL: s.cfg.idleTTL, Count: pageSize()}
	for first := true; first || call.Site != ""; first = false {
		res, err := roundTrip(ctx, s.cfg.redisTimeout, func(ctx context.Context) ([]string, error) {
			return call.Run(ctx, s.rdb).StringSlice()
		}, nil)
		if err != nil {
			return nil, redisErr("sites", err)
		}
		if len(res) < 2 || len(res)%2 != 0 {
			return nil, fmt.Errorf("%w: sites: page reply of %d items", ErrCorrupt, len(res))
		}
		for i := 2; i < len(res); i += 2 {
			ms, err := strconv.ParseFloat(res[i+1], 64)
			if err != nil {
				return nil, fmt.Errorf("%w: site %q has score %q", ErrCorrupt, res[i], res[i+1])
			}
			if old, ok := last[res[i]]; !ok || ms > old {
				last[res[i]] = ms
			}
		}
		call.Score, call.Site = res[0], res[1]
	}
	out := make([]SiteUse, 0, len(last))
	for site := range last {
		out = append(out, SiteUse{Site: site})
	}
	// Most recent first; sites leased in the same ms in reverse order of
	// name (what one ZRANGE ... REV of the zset gave).
	slices.SortFunc(out, func(a, b SiteUse) int {
		if c := cmp.Compare(last[b.Site], last[a.Site]); c != 0 {
			return c
		}
		return strings.Compare(b.Site, a.Site)
	})
	for i := range out {
		out[i].LastLease = time.UnixMilli(int64(last[out[i].Site]))
	}
	return out, nil
}
