package proxyswitch

import "github.com/proxyswitch/proxyswitch/shard"

// shareProxies is shard.Share for parsed proxies: the proxies of ps that
// member self owns under sh, in the order of ps. A server that lost Redis
// builds its local pool from it (see LocalPool). It fails like shard.Share,
// and with ErrConfig on a nil proxy.
func shareProxies(sh shard.Sharder, ps []*Proxy, members []string, self string) ([]*Proxy, error) {
	ids := make([]string, len(ps))
	for i, p := range ps {
		if p == nil {
			return nil, configErr("nil proxy #%d", i+1)
		}
		ids[i] = p.id
	}
	mine, err := shard.Share(sh, ids, members, self)
	if err != nil {
		return nil, err
	}
	// mine is a subsequence of ids, which Share checked for duplicates.
	out := make([]*Proxy, 0, len(mine))
	for _, p := range ps {
		if len(out) < len(mine) && p.id == mine[len(out)] {
			out = append(out, p)
		}
	}
	return out, nil
}
