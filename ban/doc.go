// Package ban classifies responses: what one response (or transport error)
// says about the proxy that carried it. It is the ban detection of
// proxyswitch, usable on its own: a Classifier is a plain function of an
// *Exchange, and a Detector runs the built-in checks configured by Rules.
//
// Where it runs. proxyswitch's Attach installs a RoundTripper in front of an
// *http.Transport whose Proxy is the Switch's ProxyFunc. It sees every hop of
// every request below Colly, reads the body (never more than the collector's
// MaxBodySize), classifies it with a Detector and, on a Ban or a
// ProxyFailure, quarantines the proxy and sends the request again through
// another one before Colly sees anything. Colly cannot stop its later
// OnResponse, OnHTML or OnXML callbacks from a hook, so deciding below Colly
// is the only place where a banned page can be kept from the user's parsing:
// a request whose retries run out fails with proxyswitch.ErrBanned or
// proxyswitch.ErrProxyFailed, reported by OnError and by Visit, never by
// OnResponse.
//
// Order of the checks, the first decisive one wins:
//
//  1. the user's classifiers (Rules.Classifiers, proxyswitch.WithClassifier),
//     in order;
//  2. a transport error: a proxy failure, by kind (reasons proxy_*);
//  3. a redirect (a 3xx with a Location) to a URL matching a challenge
//     pattern (captcha, login, block page), other than the URL the chain
//     asked for: a ban of the hop that redirected, "challenge_redirect",
//     judged before the client follows it (so the challenge page is never
//     requested, nor marked visited by Colly's revisit check); and the
//     final URL of a redirect chain matching a challenge pattern (one
//     reached through a redirect this check did not see, such as one a
//     classifier passed): the same ban;
//  4. 407 from the proxy, 502 from a plain-HTTP proxy: a proxy failure;
//  5. a ban status of the site (403, 429, 503 by default): "http_<code>",
//     with Retry-After as the minimum quarantine;
//  6. any other non-2xx answer: neutral (a real 404 is not a ban);
//  7. a 2xx page without a selector the site's pages must contain:
//     "missing_selector";
//  8. a 2xx body far smaller than the site's usual size: "size_drop";
//  9. otherwise the response is OK.
//
// A page that checks 7 and 8 apply to but cannot read is Neutral with the
// reason "unchecked" (ReasonUnchecked), never a ban: a body that did not
// decode, HTML the parser refuses (nested deeper than 512 elements), a
// selector missing from a body cut short by the read limit, the size of
// such a body. A page we could not check is no evidence against the proxy.
//
// A redirect hop that no check decides gets Pass: the client follows it and
// the next hop is judged.
package ban
