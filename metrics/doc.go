// Package metrics exports what proxyswitch sees and does as Prometheus
// metrics (github.com/prometheus/client_golang). It lives apart from the
// root package so that crawlers not using Prometheus do not pull it in.
//
// Three collectors:
//
//   - Collector, one per Switch in every worker: the Switch's observer. It
//     counts attempts and their verdicts, bans by reason, quarantines and
//     recoveries, per-proxy health (opt-in, top-K worst), sticky sessions
//     started and ended, and a ban-spike signal after the member list
//     grows. In-process, no Redis traffic:
//     each worker exports its own share under its own "server" label.
//   - StateCollector, one per pool in one process (the standalone exporter
//     "proxyswitch serve", or a single worker): reads the pool's state from
//     Redis at scrape time, proxies by state per site, dead and drained
//     proxies, live servers, live sticky sessions.
//   - QueueCollector, one per storage namespace in that same process: the
//     shared Colly request queue (package storage), ready, in flight and
//     dead-lettered requests.
//
// # Usage
//
//	sw, _ := proxyswitch.NewSwitch(rdb, proxyswitch.WithPool("datacenter"))
//	col := metrics.New(sw, metrics.WithServer(host), metrics.WithTopProxies(20))
//	prometheus.MustRegister(col)
//	m, _ := shard.NewMembership(rdb, shard.MemberConfig{Prefix: "proxyswitch", Pool: sw.Pool(), Self: host, Changed: col.ObserveMembers})
//	_ = m.Start(ctx)
//	http.Handle("/metrics", promhttp.Handler())
//
// and, in one process only:
//
//	prometheus.MustRegister(metrics.NewState(sw))
//
// # Deployment
//
// Attempts, bans, latency, quarantines and sessions are counted where they
// happen: each worker's Collector sees only that worker's requests. So every
// worker serves its own /metrics (promhttp on the registry holding its
// Collector, its server label from WithServer), Prometheus scrapes every
// worker, and the dashboard sums over the server label. The pool's state in
// Redis is the same whoever reads it: one StateCollector (and one
// QueueCollector per namespace) in one process, usually the standalone
// exporter "proxyswitch serve", which also shows it on a status page.
//
//	worker-1 /metrics ─┐
//	worker-2 /metrics ─┼─> Prometheus ─> dashboards/proxyswitch.json (sums by server)
//	worker-N /metrics ─┤
//	proxyswitch serve ─┘   /metrics: the pool's state from Redis; /: status page
//
// _examples/metrics in the repository runs this on loopback, with a
// prometheus.yml that scrapes it.
//
// # Metrics
//
// Collector (constant labels pool and server):
//
//	proxyswitch_attempts_total{site,outcome}                 counter    outcome: ok, neutral, ban, proxy_failure
//	proxyswitch_bans_total{site,kind,reason}                 counter    kind: ban, proxy_failure; reason: http_403, proxy_connect...
//	proxyswitch_attempt_duration_seconds{site}               histogram  time from sending an attempt to its verdict
//	proxyswitch_quarantine_duration_seconds{site,kind}       histogram  quarantine lengths applied (operator bans too)
//	proxyswitch_recovery_duration_seconds{site}              histogram  quarantine to the next good answer on the site
//	proxyswitch_proxies_marked_dead_total{reason}            counter
//	proxyswitch_proxy_success_ratio{proxy}                   gauge      top-K worst proxies only (WithTopProxies)
//	proxyswitch_proxy_latency_seconds{proxy}                 gauge      top-K worst proxies only
//	proxyswitch_proxy_window_attempts{proxy}                 gauge      top-K worst proxies only
//	proxyswitch_tracked_proxies                              gauge      with WithTopProxies
//	proxyswitch_members                                      gauge      once ObserveMembers was called
//	proxyswitch_member_joins_total                           counter    once ObserveMembers was called
//	proxyswitch_join_ban_spike                               gauge      once ObserveMembers was called
//	proxyswitch_last_member_join_timestamp_seconds           gauge      after a join
//	proxyswitch_join_ban_ratio{window}                       gauge      window: before, after; after a join
//	proxyswitch_evidence_total{site,what}                    counter    what: confirmed, lifted, page_refused, session_kept, session_spent
//	proxyswitch_sessions_started_total                       counter    sticky sessions this server started
//	proxyswitch_sessions_ended_total{reason}                 counter    retired (http_403, max_requests...) or ended (EndSession)
//	proxyswitch_session_requests                             histogram  requests a session served, when it ended
//	proxyswitch_session_duration_seconds                     histogram  a session's age when it ended
//
// StateCollector (constant label pool):
//
//	proxyswitch_pool_proxies                                 gauge
//	proxyswitch_dead_proxies{reason}                         gauge      reason: drained, proxy_connect...
//	proxyswitch_sites                                        gauge      sites leased within the idle TTL
//	proxyswitch_site_slots{site,state}                       gauge      state: free, leased, cooling, quarantined, dead
//	proxyswitch_pool_members                                 gauge      servers whose heartbeat is alive
//	proxyswitch_sessions_live                                gauge      live sticky sessions on every server
//	proxyswitch_state_up                                     gauge      1 if the last Redis read worked
//	proxyswitch_state_read_duration_seconds                  gauge
//
// QueueCollector (constant label namespace):
//
//	proxyswitch_queue_requests{state}                        gauge      state: ready, in_flight, dead
//	proxyswitch_queue_up                                     gauge      1 if the last Redis read worked
//
// An attempt is one request through one proxy: a request retried through
// another proxy after a ban counts once per attempt. "Success" is an
// attempt that was neither a ban nor a proxy failure (a real 404 is a
// success of the proxy). Success rates and the load split across servers
// are PromQL over the counters, for instance the share of each server over
// the last 5 minutes:
//
//	sum by (server) (rate(proxyswitch_attempts_total[5m]))
//	  / ignoring (server) group_left sum (rate(proxyswitch_attempts_total[5m]))
//
// dashboards/proxyswitch.json in the repository is a Grafana dashboard of
// these metrics.
//
// # Label cardinality
//
// Labels hold only bounded values: sites (the first WithMaxSites sites
// seen, 100 by default, the rest "_other"), verdict kinds and reasons, and
// proxy IDs (16 hex digits derived from the URL: never a host, user name or
// password) for at most WithTopProxies proxies, none by default.
//
// # The ban-spike signal
//
// When a server joins, the shards of the pool move; while two servers'
// shards overlap, two workers may use one IP on one site at once and sites
// ban it. Each Collector compares the ban share of its own attempts (Ban
// verdicts per attempt) in the join window (WithJoinWindow, 1m) before the
// member list last grew with the share since, for one window.
// proxyswitch_join_ban_spike is 1 when, after the join, at least 20
// attempts were made, the share at least doubled and rose by at least 5
// percentage points; it falls back to 0 two join windows after the join.
// The two shares are exported as proxyswitch_join_ban_ratio for rules of
// your own.
package metrics
