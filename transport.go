package proxyswitch

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/ban"
)

// The transport Attach installs: classification and retries below Colly.
//
// Each hop of a request goes through the inner *http.Transport, whose Proxy
// is the Switch's ProxyFunc, so the hop leases (or keeps) its proxy exactly
// as without the transport (or through the forward one, which keeps
// connections to http proxies for http:// pages: forwardable); with
// WithClient's per-proxy clients, the hop
// calls the ProxyFunc itself and goes through the client of the proxy it
// got (client.go: send, sendPerProxy). Then the response is read (at most the
// collector's MaxBodySize, gunzipped once if Colly would gunzip it; the
// buffered bytes replace the body Colly reads, see buffer)
// and classified (package ban: the Switch's ban.Detector). On a ban or a proxy failure the proxy is
// quarantined and its lease ended (ban.go), so the next ProxyFunc call for
// the same request leases another proxy, and the hop is sent again (its body
// rewound with GetBody) until a retry is left no more, when that is safe
// (below). A hop redirected
// (3xx) to a challenge page is such a ban of that hop, judged before
// net/http follows the redirect: the hop goes again through another proxy
// (or, when only temporary redirects led to it, the chain starts again
// from its first URL: see retry), so the challenge page is never requested and Colly never sees its URL (its
// revisit check would refuse the same captcha URL met through a second
// proxy as "already visited", spending no retry). A chain that ended on a
// challenge page reached otherwise starts again from its first URL instead:
// the transport answers with a 307 to that URL, which net/http and Colly
// follow like any redirect back to the page asked for. When no retry is left
// the hop fails with a *BlockedError: Colly reports it through OnError and
// Visit, never through OnResponse, so a banned page never reaches the user's
// parsing.
//
// What is sent again. A hop goes out again through another proxy only when
// that cannot make the site act twice on it:
//   - a hop net/http itself would replay (Request.isReplayable): GET, HEAD,
//     OPTIONS or TRACE, or one carrying an Idempotency-Key or
//     X-Idempotency-Key header, whose body, if any, rewinds (GetBody);
//   - a hop the site refused (a ban verdict on an answer of the site: a ban
//     status such as 403 or 429, a challenge redirect, a page missing its
//     selectors or far too small, a classifier's ban): the site answered,
//     and a verdict of ban says it refused the request, so another IP's
//     send is as safe as the first one. A POST banned is therefore sent
//     again like a GET (a classifier that knows a site's refusal of a POST
//     may still have acted on it returns ban.Neutral for it);
//   - a hop that failed before it could reach the site: no connection was
//     got for it (net/http's httptrace GotConn, which comes before the first
//     byte of the request is written: the dial to the proxy, its TLS, a SOCKS
//     handshake or the CONNECT tunnel failed, or Timeouts.Attempt ran out
//     during them), the error is one of the proxy's set-up (a
//     *ban.TunnelError: the CONNECT refused, 407 included; a *net.OpError
//     "proxyconnect"), or a plain-HTTP proxy answered 407 itself. The trace
//     is believed of an *http.Transport only (the inner transport, or a
//     per-proxy client that is one): through another RoundTripper
//     (Client.New) only the error tells.
//
// Any other failure of a request net/http would not replay (a POST that
// timed out, or whose connection broke, after it was written; a plain-HTTP
// proxy's 502, which may come after the site got the request) is not sent
// again: the proxy is
// judged as for any failure (quarantine, dead marks, the breaker's count)
// and its lease ends, and the request fails with its *BlockedError
// (ErrProxyFailed, wrapping the error it met; NotResent set), never
// ErrNoProxy, since the request went out. WroteRequest is no such marker:
// it comes after the write, and a write cut short may have reached the site.
//
// Requests that did not come through the hooks (a collector cloned without
// Attach, or the ProxyFunc given to another client) pass through untouched,
// as do failures to lease a proxy (ErrNoProxy: no proxy was used).

// errAttemptTimeout is the cause of an attempt ended by Timeouts.Attempt.
var errAttemptTimeout = errors.New("proxyswitch: attempt timeout")

const (
	// defaultReadLimit bounds what classification reads of a body when the
	// collector sets no MaxBodySize (Colly then reads bodies whole): the rest
	// is streamed to Colly unread. 10 MiB, Colly's own default.
	defaultReadLimit = 10 << 20
	// maxChainHops: a chain restarts from its first URL only while it is
	// shorter than this (net/http and Colly give up at 10 hops).
	maxChainHops = 8
)

type transport struct {
	s     *Switch
	inner *http.Transport // nil with per-proxy clients (WithClient, client.go)
	// forward, beside inner, keeps idle connections to http and https
	// proxies for http:// pages (Client.NoProxyReuse; forwardable); nil with
	// per-proxy clients or NoProxyReuse.
	forward *http.Transport
}

// transport returns the Switch's transport, the one Attach installs on
// every collector (built on first use): without per-proxy clients
// (WithClient), one inner *http.Transport whose Proxy is the ProxyFunc,
// keep-alives off, and the forward one, keep-alives on, for the hops whose
// connection to the proxy is not one to the site (forwardable). What
// differs per collector (MaxBodySize) is read from the request's binding,
// which knows its collector.
func (s *Switch) transport() *transport {
	s.trOnce.Do(func() {
		cl := &s.cfg.client
		if cl.perProxy() {
			s.tr = &transport{s: s} // each hop through its proxy's client (client.go)
			return
		}
		inner := s.baseTransport()
		inner.Proxy = s.ProxyFunc
		inner.DisableKeepAlives = true
		tunnelFailures(inner)
		s.tr = &transport{s: s, inner: inner}
		if !cl.NoProxyReuse {
			fw := s.baseTransport()
			fw.Proxy = s.forwardProxy
			fw.DisableKeepAlives = false
			fw.MaxIdleConns = cl.MaxTotal
			fw.MaxIdleConnsPerHost = cl.MaxPerProxy
			fw.IdleConnTimeout = cl.IdleTimeout
			tunnelFailures(fw)
			s.tr.forward = fw
			s.forward.Store(fw)
		}
	})
	return s.tr
}

// forwardable reports whether a hop may go through the forward transport:
// a request for an http:// page that net/http would replay, of a hooked
// request without a task, whose lease (taken by leaseEarly) is of an http
// or https proxy. Its connection to the proxy carries a request for the
// page, not a tunnel to the site: net/http pools it per proxy (its
// connectMethodKey drops the target for http through an http proxy), and
// the next hop leased on that proxy, for any site, may take it up.
func (t *transport) forwardable(req *http.Request) bool {
	if t.forward == nil || req.URL.Scheme != "http" || !replayable(req) {
		return false
	}
	b := t.s.reg.lookup(req.Header)
	if b == nil || !b.hooked || b.taskState() != nil {
		return false
	}
	l := b.currentLease()
	return l != nil && forwardScheme(l.proxy.url.Scheme)
}

// forwardScheme reports whether a proxy of this scheme forwards http://
// requests itself (no tunnel per site).
func forwardScheme(scheme string) bool { return scheme == "http" || scheme == "https" }

// forwardProxy is the forward transport's Proxy: the ProxyFunc, which
// returns the lease leaseEarly took. Should that lease have changed since
// to a SOCKS proxy, whose connection is a tunnel to the site, the hop
// fails with ErrNoProxy before anything is sent rather than keep it.
func (s *Switch) forwardProxy(req *http.Request) (*url.URL, error) {
	u, err := s.ProxyFunc(req)
	switch {
	case err != nil:
		return nil, err
	case u == nil:
		return nil, fmt.Errorf("%w: no proxy for the hop", ErrNoProxy)
	case !forwardScheme(u.Scheme):
		return nil, fmt.Errorf("%w: the hop's proxy changed to a %s proxy after it was leased", ErrNoProxy, u.Scheme)
	}
	return u, nil
}

// Collectors sharing one client. Colly's Clone shares the original's HTTP
// client, so the transport the last Attach installed serves the original
// and every clone, whichever Switch attached them. Each Switch that
// attached a collector is listed here (weakly: a Switch nobody uses any
// more may go), and a transport hands a request that another Switch's
// hooks registered to that Switch's transport: the request keeps its
// Switch's pool, bans and sessions.
var attachedSwitches struct {
	mu   sync.Mutex
	list []weak.Pointer[Switch]
}

// noteAttached lists s among the Switches that attached a collector.
func noteAttached(s *Switch) {
	attachedSwitches.mu.Lock()
	defer attachedSwitches.mu.Unlock()
	live := attachedSwitches.list[:0]
	found := false
	for _, w := range attachedSwitches.list {
		if o := w.Value(); o != nil {
			live = append(live, w)
			found = found || o == s
		}
	}
	clear(attachedSwitches.list[len(live):])
	attachedSwitches.list = live
	if !found {
		attachedSwitches.list = append(attachedSwitches.list, weak.Make(s))
	}
}

// owner returns the Switch whose hooks registered req (or the hop it was
// redirected from), if that is not t's: nil when t's own or nobody's.
func (t *transport) owner(req *http.Request) *Switch {
	var prev http.Header
	if req.Response != nil && req.Response.Request != nil {
		prev = req.Response.Request.Header
	}
	mine := func(s *Switch) bool {
		return s.reg.lookup(req.Header) != nil || (prev != nil && s.reg.lookup(prev) != nil)
	}
	if mine(t.s) {
		return nil
	}
	attachedSwitches.mu.Lock()
	others := make([]*Switch, 0, len(attachedSwitches.list))
	for _, w := range attachedSwitches.list {
		if o := w.Value(); o != nil && o != t.s {
			others = append(others, o)
		}
	}
	attachedSwitches.mu.Unlock()
	for _, o := range others {
		if mine(o) {
			return o
		}
	}
	return nil
}

// send sends one attempt: through the inner transport, or through the
// client of the attempt's proxy (client.go).
func (t *transport) send(a *attempt) (*http.Response, error) {
	if t.inner == nil {
		return t.sendPerProxy(a)
	}
	a.traced = true
	if t.forwardable(a.req) {
		return t.forward.RoundTrip(a.req)
	}
	return t.inner.RoundTrip(a.req)
}

// RoundTrip sends one hop, through as many proxies as bans, failures and
// the retry bound call for.
func (t *transport) RoundTrip(req *http.Request) (resp *http.Response, err error) {
	if o := t.owner(req); o != nil {
		return o.transport().RoundTrip(req) // a collector sharing this client, attached by another Switch
	}
	var su *sessionUse // the task's session the last attempt went through (session.go)
	defer func() { resp, err = su.finish(resp, err) }()
	if t.s.pageRuns.n.Load() != 0 {
		// This Switch's guess of a storm (ban.go, stormSuspect): the site
		// paused here alone; its requests wait it out as a breaker's pause.
		if err := t.s.pageRuns.wait(req.Context(), t.s.cfg.siteFunc(req.URL), t.s.cfg.maxWait); err != nil {
			return nil, t.s.reg.lookup(req.Header).noProxy(err)
		}
	}
	for n := 1; ; n++ {
		a, err := t.newAttempt(req, n)
		if err != nil {
			return nil, err
		}
		if su, err = t.s.sessionAttempt(req, a); err != nil {
			a.done()
			return nil, t.s.reg.lookup(req.Header).noProxy(err)
		}
		if err := t.leaseEarly(a.req); err != nil {
			a.done()
			return nil, t.s.reg.lookup(req.Header).noProxy(err)
		}
		// After leaseEarly: net/http's own ProxyFunc call is what tells
		// that the hop went through a proxy.
		before := t.s.reg.lookup(req.Header)
		calls := before.proxyCalls()
		resp, err := t.send(a)
		b := t.s.reg.lookup(req.Header)
		if errors.Is(err, ErrNoProxy) {
			return a.hand(resp, b.noProxy(err))
		}
		if b == nil || !b.hooked || (before == b && b.proxyCalls() == calls) {
			// Not ours to judge: no hooks, or no proxy was used.
			return a.hand(resp, err)
		}
		l := b.currentLease()
		if l == nil {
			return a.hand(resp, err)
		}
		again, resp, err := t.judge(req, a, b, l, resp, err)
		if !again {
			return resp, err
		}
	}
}

// leaseEarly leases the proxy of a hooked request's hop (without a task)
// before net/http asks the ProxyFunc for it, when the request has a
// deadline or may go through the forward transport (whose choice needs the
// proxy: forwardable). With a deadline the wait for a free proxy then ends
// a little before it (leaseMargin), so that its ErrNoProxy reaches Colly
// as it is.
// Waiting until the deadline itself, the error would race net/http's
// Client.Timeout, which replaces the error of a request it timed out with
// one keeping only its text (net/http's setRequestCancel and
// Client.do): errors.Is(err, ErrNoProxy) would not hold in OnError and
// Visit. The ProxyFunc then finds the lease in the binding and returns it.
// The wait's end goes to the ProxyFunc in the binding (waitBy, read by
// acquireBy), which makes the context of leaseContext only if the wait
// comes near it: most leases are granted long before, and a context and a
// copy of the request per page cost the crawl more than the lease's own
// client work.
func (t *transport) leaseEarly(req *http.Request) error {
	dl, ok := req.Context().Deadline()
	if !ok && (t.forward == nil || req.URL.Scheme != "http") {
		return nil
	}
	b := t.s.reg.lookup(req.Header)
	if b == nil && req.Response != nil && req.Response.Request != nil {
		b = t.s.reg.lookup(req.Response.Request.Header) // a redirect hop: the ProxyFunc joins it to its chain
	}
	if b == nil || !b.hooked || b.taskState() != nil {
		return nil
	}
	if ok {
		b.setWaitBy(dl.Add(-leaseMargin(time.Until(dl))))
		defer b.setWaitBy(time.Time{})
	}
	_, err := t.s.ProxyFunc(req)
	return err
}

// leaseContext is ctx for a wait for a proxy: with ctx's deadline brought
// forward by leaseMargin, so that the wait's ErrNoProxy ends the request
// before net/http's Client.Timeout replaces it (leaseEarly; a task's
// session waits under it too, sessionAttempt).
func leaseContext(ctx context.Context) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, dl.Add(-leaseMargin(time.Until(dl))))
}

// leaseMargin is how long before a request's deadline, left away, its wait
// for a proxy ends: a tenth of what is left, at most 250ms.
func leaseMargin(left time.Duration) time.Duration {
	return max(min(left/10, 250*time.Millisecond), 0)
}

// judge classifies one attempt and acts on it. again means: send the hop
// once more (the lease is gone, the next ProxyFunc call leases anew).
func (t *transport) judge(req *http.Request, a *attempt, b *binding, l *Lease, resp *http.Response, err error) (again bool, _ *http.Response, _ error) {
	s := t.s
	x := &ban.Exchange{Site: s.cfg.siteFunc(req.URL), Proxy: l.proxy, Request: req, URL: req.URL,
		OriginURL: chainOrigin(req).URL, Err: err, Attempt: b.attempt()}
	if err == nil {
		x.StatusCode, x.Header = resp.StatusCode, resp.Header
		if x.Final() && x.HasBody() {
			if rerr := t.buffer(resp, x, a, b.collector()); rerr != nil {
				x.Err, resp = rerr, nil
			}
		}
	}
	if l.taken.Load() {
		// The renewer found the lease taken over (or Close ended it) while
		// the attempt ran: the site may have seen another request from
		// this IP meanwhile, so the answer is not handed on as if the
		// proxy had been exclusive throughout (renew.go).
		closeBody(resp)
		a.done()
		s.clients.closeProxy(l.proxy.id, x.Site) // its connections there may be another holder's business now
		return false, nil, l.lost("taken over while its request ran")
	}
	if x.Err != nil && callerDone(req) {
		// The request's own deadline or cancellation: the site may be the
		// slow one, so no proxy is blamed, and no retry could run anyway.
		a.done()
		return false, nil, x.Err
	}
	x.TimedOut = x.Err != nil && a.timedOut()
	v, cerr := s.cfg.detector.Classify(x)
	if v.Reason == ReasonOperator || v.Reason == ReasonSiteProbe {
		v.Reason = ban.ReasonCustom // reserved: an operator's or a site probe's, not a classifier's
	}
	if cerr == nil {
		s.observeAttempt(l.be.pool(), x.Site, l.proxy, v, time.Since(a.start))
		s.brk.attempt(l, x.Site, v, b.sentAfter(a.start)) // the site's circuit breaker counts it (breaker.go)
	}
	switch {
	case cerr != nil:
		closeBody(resp)
		a.done()
		return false, nil, cerr
	case v.Kind != ban.Ban && v.Kind != ban.ProxyFailure:
		if x.Err != nil {
			a.done()
			return false, nil, x.Err
		}
		if x.Final() {
			l.healthy.Store(true)
			s.pageRuns.served(x.Site)
			if v.Kind == ban.OK {
				s.cfg.detector.Learn(x)
			}
			// Served through this proxy: the refusals of the same URL
			// through others were theirs (Bans.EvidenceFirst), and so
			// were those of the hops that led here since the chain last
			// (re)started (a challenge met on a URL that then redirected
			// the next proxy, 301, to the page served).
			if b.refused() {
				ctx := context.WithoutCancel(req.Context())
				for _, h := range servedHops(req) {
					s.confirmRefusals(ctx, b, h.URL.String(), s.cfg.siteFunc(h.URL))
				}
			}
			if b.failed() {
				b.takeFailures(x.URL.String(), x.Site) // ... and so were its failures: their quarantines stay (storm.go)
			}
		}
		resp, err := a.hand(resp, nil)
		return false, resp, err
	}
	closeBody(resp)
	a.done()
	return t.retry(req, a, b, l, x, v)
}

// retry acts on a ban or a proxy failure: quarantine, then a new attempt,
// a restart of the chain, or a *BlockedError.
//
// A challenge seen on a redirect (a 3xx to a challenge page: not final) is
// the ban of the hop that redirected, on its own site. The retry through
// another proxy starts where a fresh client would (restartPoint): from the
// chain's first URL when every redirect that led to the hop was a
// temporary one (302, 303, 307: the site may send only this IP through
// them, as a login or session-refresh chain served to one IP does, and
// sending the hop again through other proxies would take them down the
// same chain and burn them); the transport answers with a 307 to that URL,
// which net/http and Colly follow like any redirect back to the page asked
// for. A hop reached through a permanent redirect (301, 308: the site's
// own structure, which every client follows) is sent again itself, like
// any banned hop: restarting the chain would pass that redirect's target
// a second time, a URL Colly has already marked visited, which its revisit
// check would refuse. A chain whose first request net/http would not
// replay (a POST) is not restarted: the request fails, NotResent set.
// A challenge page the chain landed on (final) restarts the chain too, and
// is blamed on the site of the hop that led to it.
//
// A hop that may not be sent again (resendable: a failure after a request
// net/http would not replay may have reached the site) is judged all the
// same and fails with its *BlockedError, NotResent set.
func (t *transport) retry(req *http.Request, a *attempt, b *binding, l *Lease, x *ban.Exchange, v ban.Verdict) (again bool, _ *http.Response, _ error) {
	s := t.s
	site := x.Site
	landed := v.Reason == ban.ReasonChallenge && x.Final()
	if landed && req.Response != nil && req.Response.Request != nil {
		// The site that redirected to its challenge page is the one that bans.
		site = s.cfg.siteFunc(req.Response.Request.URL)
	}
	b.dropLease(l)
	ctx := context.WithoutCancel(req.Context())
	// The URL Colly asked for (the chain's first hop, or one only
	// permanent redirects or restarts led to: firstHop), redirected to a
	// challenge page, is a strike awaiting its evidence, as any refusal:
	// confirmed when the page is served through another proxy, lifted when
	// every proxy tried gets it (ban.go, challengeStrike). A hop a
	// temporary redirect led to is one the site redirected this IP to,
	// maybe for this IP alone (a session refresh that ends on its login
	// page): other proxies asked for that hop say nothing of the page, so
	// a challenge there stays a ban at once, and only the witnesses judge
	// its other refusals.
	first := firstHop(req)
	challenge := unambiguous(v) && !landed && first && s.cfg.pageProxies > 0
	if challenge {
		l.challengeStrike.Store(true)
	}
	pen, err := s.penalizeLease(ctx, b, site, l, v)
	l.challengeStrike.Store(false)
	if err != nil {
		s.cfg.logger.Warn("proxyswitch: quarantine failed; the proxy's lease will expire by its TTL",
			"proxy", l.proxy.String(), "site", site, "reason", v.Reason, "err", err)
	}
	if l.scope != s.scopeOf(site) {
		s.releaseQuietly(l)
	}
	resend := resendable(a, l, x, v)
	blocked := &BlockedError{Site: site, Proxy: l.proxy.String(), Verdict: v, Attempts: x.Attempt,
		Status: x.StatusCode, NotResent: !resend, Err: redactErr(x.Err, l.proxy)}
	if pen.kept {
		// A soft refusal the task's session survived (sessionscore.go):
		// no quarantine, no retry, no evidence against the page.
		return false, nil, blocked
	}
	r := refusal{url: x.URL.String(), site: site, status: x.StatusCode, reason: v.Reason, challenge: challenge}
	if err == nil && v.Kind == ban.Ban && (!unambiguous(v) || challenge) && !rateLimited(x, v) {
		r.proxy, r.rp, r.pen = l.proxy, l.be.redis(), pen
	}
	b.addRefusal(r, blocked)
	if err == nil && siteFailure(v) && pen.healthy && pen.quarantine > 0 && !pen.dead && pen.local == nil && l.be.redis() != nil {
		// Taken back if the page fails so through every proxy (storm.go):
		// only a failure of a proxy that worked on the site since its
		// last failure there (pen.healthy) may be.
		b.addFailure(failure{url: r.url, site: site, proxy: l.proxy, rp: l.be.redis(), pen: pen})
	}
	last := first && (!resend || !rewindable(req) || !b.retryLeft(s.cfg.retries))
	if r.proxy != nil && s.pageRefused(ctx, b, r.url, site, last) {
		if s.storm(site) {
			// The site's breaker holds it: a storm of the site, not the
			// page's answer (storm.go).
			blocked.Storm = true
			return false, nil, blocked
		}
		// The page refuses every proxy: its answer, not theirs.
		blocked.Page = true
		s.observeEvidence(l.be.pool(), site, l.proxy, "page_refused", v.Reason)
		return false, nil, blocked
	}
	if callerDone(req) {
		s.stormLabel(blocked, site)
		return false, nil, blocked
	}
	if (landed && x.Redirected()) || (v.Reason == ban.ReasonChallenge && !landed && restartPoint(req) != req) {
		origin := chainOrigin(req)
		if !replayable(origin) {
			// The chain's first request reached the site (it answered with
			// a redirect): asking it again could make the site act twice.
			blocked.NotResent = true
			s.unresolvedRefusals(ctx, b, r.url, site)
			s.stormLabel(blocked, site)
			return false, nil, blocked
		}
		if chainLen(req) >= maxChainHops || !b.takeRetry(s.cfg.retries) {
			s.unresolvedRefusals(ctx, b, r.url, site)
			s.stormLabel(blocked, site)
			return false, nil, blocked
		}
		return false, restartResponse(req, origin.URL), nil
	}
	if !resend || !rewindable(req) || !b.takeRetry(s.cfg.retries) {
		s.unresolvedRefusals(ctx, b, r.url, site) // no retry left: evidence for the site's circuit breaker
		s.unresolvedFailures(ctx, b, r.url, site) // failed through every proxy: the page's or the site's (storm.go)
		s.stormLabel(blocked, site)
		return false, nil, blocked
	}
	return true, nil, nil
}

// resendable reports whether the hop of attempt a, judged v, may be sent
// again through another proxy (the rule in the transport's doc comment):
// it is replayable in net/http's sense, or the site refused it, or it
// failed before it could reach the site.
func resendable(a *attempt, l *Lease, x *ban.Exchange, v ban.Verdict) bool {
	if !a.watch || (v.Kind == ban.Ban && x.Err == nil && x.StatusCode != 0) {
		return true
	}
	return unsent(a, l, x)
}

// unsent reports whether attempt a ended before its request could reach
// the site: no connection was got for it (by an *http.Transport, whose
// trace is believed), its error is one of the proxy's set-up, or a
// plain-HTTP proxy answered it 407 itself.
func unsent(a *attempt, l *Lease, x *ban.Exchange) bool {
	if x.Err == nil {
		// An answer: only a forwarding proxy's refusal of its credentials
		// keeps the request from the site (inside a tunnel, or through
		// SOCKS, every answer is the site's).
		if x.StatusCode != http.StatusProxyAuthRequired || x.URL == nil || x.URL.Scheme != "http" {
			return false
		}
		pu := l.proxy.URL()
		return pu != nil && (pu.Scheme == "http" || pu.Scheme == "https")
	}
	var te *ban.TunnelError
	var op *net.OpError
	switch {
	case a.traced && !a.gotConn.Load():
		return true
	case errors.As(x.Err, &te):
		return true
	case errors.As(x.Err, &op) && op.Op == "proxyconnect":
		return true
	}
	return false
}

// buffer reads the body for classification, at most the collector's
// MaxBodySize (or defaultReadLimit when it sets none, streaming the rest to
// Colly unread), and puts the bytes read back in front of Colly.
//
// A body Colly would gunzip itself (see bodyCoding) is gunzipped here instead,
// once: the classifiers and Colly get the same decoded bytes, at most
// MaxBodySize of them whatever the compression ratio, and Colly gets the
// response as net/http hands over a body it decoded (Uncompressed set, no
// Content-Encoding nor Content-Length), so it decodes nothing again. Without
// MaxBodySize (Colly's "no limit") the body is not capped: Colly gets the
// whole decoded stream, decoded as it reads it, as it would have decoded it
// itself. A body that does not decode goes to Colly as it came (Colly then
// reports the error it meets), marked Undecoded for the classifiers.
func (t *transport) buffer(resp *http.Response, x *ban.Exchange, a *attempt, c *colly.Collector) error {
	if fileMedia(resp.Header.Get("Content-Type")) && bodyCoding(resp) != codingGzip {
		// A file no content check reads: Colly gets the body unread, as
		// without the transport, so that an OnResponseHeaders abort still
		// saves its download (per-GB proxies bill it). Not one Colly would
		// gunzip (a .xml.gz sitemap served as octet-stream): that is
		// decoded here, within MaxBodySize, against gzip bombs.
		a.stopTimer()
		x.Truncated = true // nothing read: the content checks judge nothing
		resp.Body = &doneBody{Reader: resp.Body, close: resp.Body.Close, done: a.done}
		return nil
	}
	limit, stream := t.s.cfg.readLimit, true
	if c != nil && c.MaxBodySize > 0 {
		limit, stream = int64(c.MaxBodySize), false
	}
	orig := resp.Body
	buf := bodyBuffers.Get().(*bytes.Buffer)
	buf.Reset()
	pooled := false // buf went to Colly in a body that hands it back on Close
	defer func() {
		if !pooled {
			putBodyBuffer(buf)
		}
	}()
	if n := resp.ContentLength; n > 0 && n <= limit {
		// Room for the whole body and the read that meets its end: one
		// allocation, where growing by doubling copies it several times.
		buf.Grow(int(n) + bytes.MinRead)
	}
	_, err := buf.ReadFrom(io.LimitReader(orig, limit))
	a.stopTimer()
	if err != nil {
		orig.Close()
		return err
	}
	raw := buf.Bytes()
	rawCut := int64(len(raw)) == limit && resp.ContentLength != limit
	x.Body, x.Truncated, x.Undecoded = raw, rawCut, false
	switch bodyCoding(resp) {
	case codingOpaque:
		x.Undecoded = true
	case codingGzip:
		body, cut, err := gunzip(raw, limit, rawCut)
		if err != nil {
			x.Undecoded = true
			break
		}
		x.Body, x.Truncated = body, rawCut || cut
		if stream && x.Truncated {
			// The classifiers saw the first limit bytes; Colly reads on to
			// the end, decoded on the way (the first bytes once more).
			zr, err := gzip.NewReader(io.MultiReader(bytes.NewReader(raw), orig))
			if err != nil { // the same header decoded a moment ago
				orig.Close()
				return err
			}
			decoded(resp, -1)
			resp.Body = &doneBody{Reader: zr, close: orig.Close, done: a.done}
			return nil
		}
		orig.Close()
		decoded(resp, int64(len(body)))
		resp.Body = io.NopCloser(bytes.NewReader(body))
		a.done()
		return nil
	}
	pooled = true // from here on, Colly reads raw: buf goes back when it closes the body
	if stream && x.Truncated {
		resp.Body = &doneBody{Reader: io.MultiReader(bytes.NewReader(raw), orig), close: orig.Close, done: a.done, buf: buf}
		return nil
	}
	orig.Close()
	resp.Body = &doneBody{Reader: bytes.NewReader(raw), close: noClose, done: a.done, buf: buf}
	return nil
}

// bodyBuffers are the buffers buffer reads bodies into: each goes back
// when Colly, having copied the body, closes it, so a crawl reuses a few
// buffers instead of allocating (and growing) one per page.
var bodyBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledBody is the largest buffer kept for reuse.
const maxPooledBody = 1 << 20

func putBodyBuffer(b *bytes.Buffer) {
	if b.Cap() <= maxPooledBody {
		bodyBuffers.Put(b)
	}
}

func noClose() error { return nil }

// How a response body is encoded, as the transport reads it.
const (
	codingPlain  = iota // as it came: unencoded, or decoded by net/http
	codingGzip          // gzip that Colly would decode: the transport decodes it instead
	codingOpaque        // another encoding (br, deflate, zstd...), which neither decodes
)

// bodyCoding tells how resp's body is encoded. It is gzip exactly when
// Colly (v2.3.0, http_backend.go) would gunzip it: net/http did not decode
// it and its Content-Encoding names gzip, or it has none and its
// Content-Type names gzip, or the URL's path ends in ".xml.gz".
// fileMedia reports whether a response of this Content-Type is a file (an
// image, a sound, a video, a font, a PDF, an office document, an archive
// other than gzip, or application/octet-stream) that the transport hands
// to Colly unread, unless Colly would gunzip it (bodyCoding). Gzip stays
// read: Colly decodes it (sitemaps), and so may the checks. An unknown or
// unparsable type is read.
func fileMedia(contentType string) bool {
	// On every response: no allocation (mime.ParseMediaType makes a map).
	mt, _, _ := strings.Cut(contentType, ";")
	mt = strings.TrimSpace(mt)
	for _, prefix := range filePrefixes {
		if len(mt) > len(prefix) && strings.EqualFold(mt[:len(prefix)], prefix) {
			return true
		}
	}
	for _, t := range fileTypes {
		if strings.EqualFold(mt, t) {
			return true
		}
	}
	return false
}

// The media types fileMedia names, by prefix and whole.
var (
	filePrefixes = []string{"image/", "audio/", "video/", "font/",
		"application/vnd.openxmlformats-officedocument.", "application/vnd.oasis.opendocument.", "application/vnd.ms-"}
	fileTypes = []string{"application/pdf", "application/octet-stream", "application/zip", "application/x-tar",
		"application/x-7z-compressed", "application/vnd.rar", "application/x-rar-compressed", "application/x-bzip2",
		"application/x-xz", "application/zstd", "application/msword", "application/epub+zip",
		"application/java-archive", "application/wasm"}
)

func bodyCoding(resp *http.Response) int {
	if resp.Uncompressed {
		return codingPlain
	}
	enc := strings.ToLower(strings.TrimSpace(resp.Header.Get("Content-Encoding")))
	switch {
	case strings.Contains(enc, "gzip"),
		enc == "" && strings.Contains(strings.ToLower(resp.Header.Get("Content-Type")), "gzip"),
		resp.Request != nil && resp.Request.URL != nil && strings.HasSuffix(strings.ToLower(resp.Request.URL.Path), ".xml.gz"):
		return codingGzip
	case enc == "" || enc == "identity":
		return codingPlain
	}
	return codingOpaque
}

// gunzip decodes raw, at most limit bytes of output whatever the
// compression ratio; cut reports that the output went on past them. A
// stream that ends early is an error unless raw itself was cut short
// (rawCut: read up to the limit).
func gunzip(raw []byte, limit int64, rawCut bool) (body []byte, cut bool, err error) {
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		return nil, false, err
	}
	defer zr.Close()
	body, err = io.ReadAll(io.LimitReader(zr, limit+1))
	switch {
	case int64(len(body)) > limit:
		return body[:limit], true, nil
	case errors.Is(err, io.ErrUnexpectedEOF) && rawCut:
		return body, true, nil
	case err != nil:
		return nil, false, err
	}
	return body, false, nil
}

// decoded makes resp what net/http makes of a response whose body it
// decoded: Uncompressed, without Content-Encoding and Content-Length, its
// ContentLength n (-1: unknown). Colly then takes the body as it is.
func decoded(resp *http.Response, n int64) {
	resp.Uncompressed = true
	resp.Header.Del("Content-Encoding")
	resp.Header.Del("Content-Length")
	resp.ContentLength = n
}

// attempt is one try of a hop through one proxy.
type attempt struct {
	req    *http.Request // what the inner transport gets
	ctx    context.Context
	cancel context.CancelCauseFunc // nil without an attempt timeout
	timer  *time.Timer             // set by startTimer, on the RoundTrip goroutine
	start  time.Time               // when the attempt was prepared, for the observer's latency
	// watch: the hop is not replayable in net/http's sense, so whether it
	// may have reached the site decides a retry (resendable); gotConn is
	// set by the trace's GotConn, before any byte of the request is
	// written; traced: the hop went through an *http.Transport, which
	// reports to the trace (send, sendPerProxy).
	watch   bool
	gotConn atomic.Bool
	traced  bool
}

// newAttempt prepares try n of req: its own context when attempts are
// bounded (the bound starts once a proxy is leased, at GetConn) or when the
// hop is not replayable (a trace of the connection it gets, see unsent),
// and a fresh body after the first try.
func (t *transport) newAttempt(req *http.Request, n int) (*attempt, error) {
	a := &attempt{req: req, ctx: req.Context(), start: time.Now(), watch: !replayable(req)}
	d := t.s.cfg.attemptTimeout
	if d > 0 || a.watch {
		trace := &httptrace.ClientTrace{}
		if d > 0 {
			a.ctx, a.cancel = context.WithCancelCause(a.ctx)
			trace.GetConn = func(string) { a.startTimer(d) }
		}
		if a.watch {
			trace.GotConn = func(httptrace.GotConnInfo) { a.gotConn.Store(true) }
		}
		a.ctx = httptrace.WithClientTrace(a.ctx, trace)
	}
	if n == 1 && a.cancel == nil && !a.watch {
		return a, nil
	}
	a.req = req.WithContext(a.ctx) // a shallow copy: the header map, the lease's key, stays the same
	if n > 1 && req.Body != nil && req.Body != http.NoBody {
		body, err := req.GetBody()
		if err != nil {
			a.done()
			return nil, fmt.Errorf("proxyswitch: rewinding the request body for a retry: %w", err)
		}
		a.req.Body = body
	}
	return a, nil
}

// startTimer starts the attempt's bound d, once: at GetConn, or when the
// client of its proxy is picked (client.go: a custom RoundTripper may never
// call the trace's hooks).
func (a *attempt) startTimer(d time.Duration) {
	if a.cancel != nil && a.timer == nil {
		a.timer = time.AfterFunc(d, func() { a.cancel(errAttemptTimeout) })
	}
}

func (a *attempt) timedOut() bool {
	return a.cancel != nil && errors.Is(context.Cause(a.ctx), errAttemptTimeout)
}

func (a *attempt) stopTimer() {
	if a.timer != nil {
		a.timer.Stop()
	}
}

// done ends the attempt's own context.
func (a *attempt) done() {
	a.stopTimer()
	if a.cancel != nil {
		a.cancel(nil)
	}
}

// hand gives the response to the caller, ending the attempt's context when
// its body is closed.
func (a *attempt) hand(resp *http.Response, err error) (*http.Response, error) {
	if resp == nil || a.cancel == nil {
		if resp == nil {
			a.done()
		}
		return resp, err
	}
	if _, ok := resp.Body.(*doneBody); !ok {
		body := resp.Body
		resp.Body = &doneBody{Reader: body, close: body.Close, done: a.done}
	}
	return resp, err
}

// doneBody is a response body that ends its attempt when closed, and
// hands back the buffer its bytes are read from, if any (bodyBuffers):
// once closed, it reads nothing more.
type doneBody struct {
	io.Reader
	close func() error
	done  func()
	buf   *bytes.Buffer
	once  sync.Once
}

func (d *doneBody) Close() error {
	err := d.close()
	d.done()
	d.once.Do(func() {
		if d.buf != nil {
			d.Reader = eofReader{}
			putBodyBuffer(d.buf)
		}
	})
	return err
}

// eofReader is the body of a doneBody after Close.
type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }

func closeBody(resp *http.Response) {
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
}

// callerDone reports whether the request's own deadline or cancellation
// ended it. net/http's Client cancels a request to a RoundTripper it does not
// know through Request.Cancel, a moment before the context's deadline shows,
// so both are looked at.
func callerDone(req *http.Request) bool {
	if req.Context().Err() != nil {
		return true
	}
	if dl, ok := req.Context().Deadline(); ok && !time.Now().Before(dl) {
		return true
	}
	select {
	case <-req.Cancel: //nolint:staticcheck // set by net/http's Client for our RoundTripper
		return true
	default:
		return false
	}
}

// chainOrigin is the first request of req's redirect chain.
func chainOrigin(req *http.Request) *http.Request {
	for req.Response != nil && req.Response.Request != nil {
		req = req.Response.Request
	}
	return req
}

// restartPoint is the hop a retry through another proxy starts from after
// req (a hop of a redirect chain) was redirected to a challenge: the
// chain's first request when every redirect that led to req was temporary
// (302, 303, 307), req itself otherwise (a permanent redirect, 301 or 308,
// on the way: the site's own structure, see retry).
func restartPoint(req *http.Request) *http.Request {
	r := req
	for r.Response != nil && r.Response.Request != nil {
		switch r.Response.StatusCode {
		case http.StatusMovedPermanently, http.StatusPermanentRedirect:
			return req
		}
		r = r.Response.Request
	}
	return r
}

// firstHop reports whether req is the first hop of its redirect chain as
// the page-or-IP judgment counts them (ban.go): the URL Colly asked for, or
// one only permanent redirects (301, 308: the site's own structure, which
// every client follows) led to from it, or from the chain's last restart
// (restartResponse: the page asked for again).
func firstHop(req *http.Request) bool {
	for r := req; r.Response != nil && r.Response.Request != nil; r = r.Response.Request {
		if restarted(r.Response) {
			return true
		}
		switch r.Response.StatusCode {
		case http.StatusMovedPermanently, http.StatusPermanentRedirect:
		default:
			return false
		}
	}
	return true
}

// servedHops is req (a hop served) and the hops of its redirect chain
// before it back to the chain's last restart or its first request: each
// answered without a ban, with a redirect that led to req.
func servedHops(req *http.Request) []*http.Request {
	hops := []*http.Request{req}
	for r := req; r.Response != nil && r.Response.Request != nil && !restarted(r.Response); {
		r = r.Response.Request
		hops = append(hops, r)
	}
	return hops
}

// chainLen is the number of hops of req's redirect chain so far.
func chainLen(req *http.Request) int {
	n := 1
	for ; req.Response != nil && req.Response.Request != nil; n++ {
		req = req.Response.Request
	}
	return n
}

// rewindable reports whether req's body can be sent again.
func rewindable(req *http.Request) bool {
	return req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
}

// replayable reports whether net/http would send req again after it may
// have been written (net/http's Request.isReplayable): its body rewinds,
// and its method is GET, HEAD, OPTIONS or TRACE, or it carries an
// Idempotency-Key or X-Idempotency-Key header (present, even nil: net/http
// asks only whether the key is there).
func replayable(req *http.Request) bool {
	if !rewindable(req) {
		return false
	}
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	_, ok := req.Header["Idempotency-Key"]
	if !ok {
		_, ok = req.Header["X-Idempotency-Key"]
	}
	return ok
}

// restartStatus is the Status of restartResponse's redirects (net/http
// reads StatusCode alone), telling them from the site's (restarted).
const restartStatus = "307 Temporary Redirect (proxyswitch restart)"

// restarted reports whether resp is a restart of its chain by the
// transport (restartResponse), not a redirect of the site.
func restarted(resp *http.Response) bool {
	return resp.StatusCode == http.StatusTemporaryRedirect && resp.Status == restartStatus
}

// restartResponse is a redirect back to the first URL of the chain: net/http
// follows it (Colly lets a chain come back to the page it asked for) and the
// ProxyFunc leases another proxy for it.
func restartResponse(req *http.Request, to *url.URL) *http.Response {
	return &http.Response{
		Status:     restartStatus,
		StatusCode: http.StatusTemporaryRedirect,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     http.Header{"Location": {to.String()}},
		Body:       http.NoBody,
		Request:    req,
	}
}
