package proxyswitch

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/proxyswitch/proxyswitch/internal/engine"
)

// Sessions with an error score.
//
// A hard ban met through a task's sticky session retires it at once (a
// challenge or captcha, a 403, an empty or truncated page, a proxy failure:
// the IP is burnt, or the proxy is). A soft refusal (429 Too Many Requests,
// 503 Service Unavailable: the site is busy or pacing the client) adds 1 to
// the session's error score instead, kept with the session's record in
// Redis so that any server continuing the task sees it; each healthy
// request of the session takes the decay off it (never below 0). Only when
// the score reaches the max does the refusal retire the session, and
// quarantine its proxy, as a hard ban does. A soft refusal that leaves
// the session alive quarantines nothing (the task keeps its IP and its
// cookies), and its request is not retried: it fails with a *BlockedError
// naming the site's answer (a retry would go through the same IP at once,
// or leave the session), and the task's next request goes on in the same
// session. The decay costs no round trip: it is applied at the next soft
// refusal, from the count of requests the session sent since the last one.

// Defaults of Sessions.MaxErrorScore and ErrorDecay, as Crawlee's (maxErrorScore,
// errorScoreDecrement).
const (
	DefaultSessionMaxErrorScore = 3.0
	DefaultSessionErrorDecay    = 0.5
)

// errorScore returns the session error score's max and decay.
func (sc *sessionConfig) errorScore() (max, decay float64) { return sc.maxErrors, sc.errorDecay }

func (sc *sessionConfig) validateErrorScore() error {
	if m, d := sc.errorScore(); !(m >= 1 && m <= 1e6) || !(d >= 0 && d <= 1e6) {
		return configErr("Sessions.MaxErrorScore %v (from 1), ErrorDecay %v (from 0)", m, d)
	}
	return nil
}

// softRefusal reports whether v is a refusal a session may survive.
func softRefusal(v ban.Verdict) bool {
	return v.Kind == ban.Ban && (v.Reason == ban.StatusReason(429) || v.Reason == ban.StatusReason(503))
}

// keepSession scores a soft refusal met through the session lease l of
// task: true when the session lives on (no quarantine, no retirement, no
// retry). A hard ban, a spent score, a session gone or a Redis error is
// false: the caller retires the session as before.
func (s *Switch) keepSession(ctx context.Context, l *Lease, task string, v ban.Verdict) bool {
	m, decay := s.cfg.session.errorScore()
	if !softRefusal(v) || m <= 1 {
		return false
	}
	p := l.be.redis()
	id := strings.TrimPrefix(l.token, sessionTokenPrefix)
	res, err := roundTrip(ctx, s.cfg.redisTimeout, func(ctx context.Context) ([]any, error) {
		return sessionScoreScript.Run(ctx, p.rdb, []string{p.keys.session(task)}, id,
			strconv.FormatFloat(m, 'g', -1, 64), strconv.FormatFloat(decay, 'g', -1, 64)).Slice()
	}, nil)
	if err != nil {
		s.cfg.logger.Warn("proxyswitch: scoring a session's soft refusal failed; the session retires", "err", redisErr("session score", err))
		return false
	}
	st, _ := intAt(res, 0)
	if st == 2 {
		s.observeEvidence(l.be.pool(), l.site, l.proxy, "session_spent", v.Reason)
	}
	if st != 1 || len(res) != 2 {
		return false
	}
	s.observeEvidence(l.be.pool(), l.site, l.proxy, "session_kept", v.Reason)
	s.cfg.logger.Debug("proxyswitch: soft refusal: the session keeps its proxy", "task", clip(task),
		"site", l.site, "reason", v.Reason, "error_score", fmt.Sprint(res[1]))
	return true
}

var sessionScoreScript = engine.Root.Script("session_score")
