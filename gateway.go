package proxyswitch

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"

	"github.com/proxyswitch/proxyswitch/ban"
)

// Gateway entries: one provider endpoint, many exit IPs.
//
// A rotating gateway is one host:port whose user name (or password) picks
// a sticky exit IP by a session id: "user-session-abc123" keeps abc123's
// IP, another id gets another IP. A pool entry that holds the placeholder
// {session:N} (or {session}, N = 1) in its user info is such a gateway: Add,
// Replace, ParseProxies and ReadProxies expand it to N virtual proxies, each
// the template with a random session id of 8 characters [a-z0-9] in place
// of the placeholder:
//
//	http://customer-acme-session-{session:50}:secret@gw.example:7000
//	gw.example:7000:user-acme-session-{session:50}:secret
//
// Each virtual proxy is a proxy of the pool like any other (its own ID,
// leases, cooldowns, sessions): two requests never share a provider
// session, hence an exit IP, on one site. What differs is a ban: a ban of a
// virtual proxy on a site replaces it, atomically and once across the fleet
// (pool_update.lua's "rotate"), by a new session of its gateway (a new exit
// IP) instead of quarantining it; the request's retry leases another proxy.
// A sticky task (TaskKey) holds one virtual proxy, hence one provider
// session, for its session's life; a ban retires it and the task's next
// session gets another. Not rotated, but handled as for any proxy: a proxy
// failure (the gateway itself failing: every session of it would), an
// operator's Switch.Ban, and a rate-limit refusal under learned pacing (the
// site's pace, which a new IP does not change). The pool keeps N members of
// each template: Replace with the same list keeps the sessions it has (their
// state too), Remove of the template removes them all, and List shows each
// virtual proxy. The templates live in Redis (the pool's gateways hash), so
// any worker rotates a session whatever Switch loaded the pool.

// maxGatewaySessions bounds N in {session:N}.
const maxGatewaySessions = 10000

// sessionIDLen is the length of a generated provider session id: providers
// accept 8 alphanumeric characters (IPRoyal asks for exactly 8).
const sessionIDLen = 8

// placeholder is how a canonical template marks the session id.
const placeholder = "{session}"

// sessionMark stands for the session id while a template is parsed as a
// proxy URL: letters only, so it survives canonicalisation unescaped.
const sessionMark = "pssessionmarkzq"

var sessionToken = regexp.MustCompile(`\{session(?::([0-9]+))?\}`)

// isTemplate reports whether raw is a gateway template.
func isTemplate(raw string) bool { return strings.Contains(raw, "{session") }

// parseGateway validates a gateway template: one {session} or {session:N}
// placeholder in the user name or password of a proxy ParseProxy accepts.
// It returns the canonical template (the proxy's canonical URL with
// "{session}" for the session id) and N. The error never echoes user info.
func parseGateway(raw string) (string, int, error) {
	bad := func(reason string) error {
		return &ProxyError{Proxy: redactRaw(sessionToken.ReplaceAllString(raw, "s")), Reason: reason, Err: ErrInvalidProxy}
	}
	m := sessionToken.FindAllStringSubmatchIndex(raw, -1)
	switch {
	case len(m) == 0:
		return "", 0, bad("malformed session placeholder (want {session} or {session:N})")
	case len(m) > 1:
		return "", 0, bad("more than one session placeholder")
	case strings.Contains(raw, sessionMark):
		return "", 0, bad("gateway template holds a reserved word")
	}
	n := 1
	if m[0][2] >= 0 {
		v, err := strconv.Atoi(raw[m[0][2]:m[0][3]])
		if err != nil || v < 1 || v > maxGatewaySessions {
			return "", 0, bad(fmt.Sprintf("session count must be 1 to %d", maxGatewaySessions))
		}
		n = v
	}
	p, err := ParseProxy(raw[:m[0][0]] + sessionMark + raw[m[0][1]:])
	if err != nil {
		return "", 0, err
	}
	u := p.url.User
	pass, _ := u.Password()
	if u == nil || (!strings.Contains(u.Username(), sessionMark) && !strings.Contains(pass, sessionMark)) {
		return "", 0, bad("the session placeholder must be in the user name or the password")
	}
	t := p.raw()
	if strings.Count(t, sessionMark) != 1 {
		return "", 0, bad("the session placeholder must be in the user name or the password")
	}
	return strings.Replace(t, sessionMark, placeholder, 1), n, nil
}

// gatewayProxy is the virtual proxy of template for provider session id.
func gatewayProxy(template, id string) (*Proxy, error) {
	if strings.Count(template, placeholder) != 1 {
		return nil, fmt.Errorf("%w: a gateway template without one %s", ErrCorrupt, placeholder)
	}
	p, err := ParseProxy(strings.Replace(template, placeholder, id, 1))
	if err != nil {
		return nil, err
	}
	p.gw = template
	return p, nil
}

// newSessionID returns a random provider session id.
func newSessionID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, sessionIDLen)
	for i := range b {
		b[i] = alphabet[rand.N(len(alphabet))]
	}
	return string(b)
}

// expandGateway returns n virtual proxies of template, each with a new
// session id: the candidates pool_update.lua takes the missing members from.
func expandGateway(template string, n int) ([]*Proxy, error) {
	out := make([]*Proxy, 0, n)
	seen := make(map[string]bool, n)
	for len(out) < n {
		p, err := gatewayProxy(template, newSessionID())
		if err != nil {
			return nil, err
		}
		if !seen[p.id] {
			seen[p.id] = true
			out = append(out, p)
		}
	}
	return out, nil
}

// rotates reports whether a verdict on a virtual proxy rotates its session
// rather than quarantining it: a ban, but an operator's, a site probe's
// (ReasonSiteProbe) or a rate-limit refusal under learned pacing.
func rotates(c *config, v ban.Verdict) bool {
	return v.Kind == ban.Ban && v.Reason != ReasonOperator && !siteOnly(v) && paceRefusal(c, v) == ""
}

// rotation is what rotate did.
type rotation int

const (
	rotateFailed rotation = iota // Redis failed, or the template is invalid: quarantine px as any proxy
	rotatePlain                  // px is in the pool but no gateway's: quarantine it
	rotateDone                   // px was rotated, or is gone (another worker rotated it)
)

// rotate replaces px, a virtual proxy of gateway template tmpl (as the
// pool's copy or penalize.lua said), by a new session of its gateway,
// ending l if it is px's lease on site: one round trip. pool_update.lua
// checks against the pool that px is still tmpl's member: a virtual proxy
// another worker rotated already is gone (rotateDone, nothing changes), and
// one that the copy took for a gateway's but is a plain proxy now is
// reported rotatePlain. pen is set for rotateDone only.
func (p *redisPool) rotate(ctx context.Context, site string, px *Proxy, l *Lease, tmpl string) (penalty, rotation) {
	np, err := gatewayProxy(tmpl, newSessionID())
	if err != nil {
		p.cfg.logger.Warn("proxyswitch: a gateway template in the pool is invalid; quarantining its proxy",
			"proxy", px.String(), "key", p.keys.gateways(), "err", err)
		return penalty{}, rotateFailed
	}
	member, token := "", ""
	if l != nil && l.scope == p.sw.scopeOf(site) && l.local == nil && l.released.CompareAndSwap(false, true) {
		member, token = l.member, l.token
	}
	call := p.keys.poolUpdate("rotate", p.cfg.idleTTL, false, []any{px.id, np.id, np.raw(), member, token, p.sw.scopeOf(site)})
	res, err := roundTrip(ctx, p.timeout, func(ctx context.Context) ([]int64, error) {
		return call.Run(ctx, p.rdb).Int64Slice()
	}, nil)
	if err == nil && len(res) != 6 {
		err = fmt.Errorf("%w: rotate reply of %d items", ErrCorrupt, len(res))
	}
	if err != nil || res[5] == 1 {
		if member != "" {
			l.released.Store(false)
		}
		if err != nil {
			p.cfg.logger.Warn("proxyswitch: rotating a gateway session failed; quarantining it",
				"proxy", px.String(), "site", site, "err", redisErr("rotate", err))
			return penalty{}, rotateFailed
		}
		return penalty{}, rotatePlain
	}
	if res[1] == 1 {
		p.cfg.logger.Debug("proxyswitch: gateway session rotated", "proxy", px.String(), "site", site,
			"old", px.id, "new", np.id)
	}
	// The banned session is gone: no strike stays. It was fresh (a new
	// session has no strike on any site), which the evidence of a page that
	// refuses everyone counts (Switch.pageRefused).
	return penalty{ended: member != "", strikes: 1, healthy: true, rotated: true}, rotateDone
}
