package storage

import (
	"strconv"
	"strings"

	"github.com/proxyswitch/proxyswitch/internal/engine"
)

// keyspace names the Redis keys of one namespace. In the keys, ns stands
// for the namespace escaped by engine.EscapeName ('%' as "%25", ':' as
// "%3A"; a namespace without either is itself). The layout makes the key
// sets of two namespaces disjoint without any glob: namespaces contain no
// braces, so in "{ns}:..." the first "}" ends the namespace, and in
// "ns:v:{b}" the first ":" does (the escaped ns holds none); a key of one
// kind never starts like a key of the other ("{" versus a namespace
// character). Nor does a key of a pool of the root package: its tag
// "{prefix:pool}" always holds a ':', "{ns}" never does.
//
//	{ns}:meta           hash  shared settings ("buckets")
//	{ns}:cookiedomains  set   registrable domains that have a cookie jar (the registry Clear reads)
//	{ns}:cj:<domain>    hash  "<domain>;<path>;<name>" -> "<created µs>|<flags>|<expires ms>|<Set-Cookie line>"
//	{ns}:cookiehosts    set   earlier versions: hosts that have a cookie hash (read by Clear)
//	{ns}:c:<host>       hash  earlier versions: "<name>;<path>;<domain>" -> Set-Cookie line
//	                          (moved into {ns}:cj:<domain> when the host is next read or
//	                          written, storage/cookies.go)
//	{ns}:q:seq          string  last request ID handed out
//	{ns}:q:data         hash  request ID -> serialized Colly request
//	{ns}:q:ready        list  request IDs ready for delivery (FIFO; retries first)
//	{ns}:q:inflight     zset  request ID -> unix ms at which it is delivered again
//	{ns}:q:tries        hash  request ID -> "<deliveries so far>|<pop ID of the latest>" (pop ID: a random nonce)
//	{ns}:q:dead         zset  request ID -> unix ms it was dead-lettered
//	{ns}:q:why          hash  request ID -> last failure (dead letters, failed tries)
//	{ns}:q:pops         hash  pop ID -> request ID, while that pop's delivery is the latest and not dead
//	ns:v:{<bucket>}     hash  8-byte request hash -> "0" (forever) or expiry (unix ms),
//	                          then "|<queue request ID>" for a claim made for a queued
//	                          delivery, "|" for any other (a mark without "|" is an
//	                          earlier version's; storage/visited.go)
//
// Every "{ns}" key shares one Redis Cluster hash tag, so each Lua script
// touches one slot. The visited buckets carry their own tags instead
// ("{0}" .. "{ffff}"), so a large visited set spreads over every node.
type keyspace struct {
	tag     string // "{ns}"
	visited string // "ns:v:{"
}

func newKeyspace(ns string) keyspace {
	ns = engine.EscapeName(ns)
	return keyspace{tag: "{" + ns + "}", visited: ns + ":v:{"}
}

func (k keyspace) meta() string          { return k.tag + ":meta" }
func (k keyspace) cookieDomains() string { return k.tag + ":cookiedomains" }

// cookieJar is the cookie jar of a registrable domain (storage/cookies.go).
func (k keyspace) cookieJar(domain string) string { return k.tag + ":cj:" + domain }

// cookieHosts and legacyCookies are the keys of the cookies of earlier
// versions, one hash per host (and port), read to move them into the jars
// and deleted by Clear.
func (k keyspace) cookieHosts() string { return k.tag + ":cookiehosts" }
func (k keyspace) legacyCookies(host string) string {
	return k.tag + ":c:" + host
}

// bucket returns the key of visited bucket b.
func (k keyspace) bucket(b uint64) string {
	var sb strings.Builder
	sb.Grow(len(k.visited) + 8)
	sb.WriteString(k.visited)
	sb.WriteString(strconv.FormatUint(b, 16))
	sb.WriteByte('}')
	return sb.String()
}

// queueKeys are the keys of the queue, in the order the Lua scripts take
// them as KEYS (see internal/engine/lua/storage/q_*.lua).
type queueKeys struct {
	ready, data, tries, inflight, dead, why, seq, pops string
}

func (k keyspace) queue() queueKeys {
	p := k.tag + ":q:"
	return queueKeys{
		ready: p + "ready", data: p + "data", tries: p + "tries",
		inflight: p + "inflight", dead: p + "dead", why: p + "why", seq: p + "seq",
		pops: p + "pops",
	}
}

// all returns the queue's keys in the order every queue script takes them:
// ready, data, tries, inflight, dead, why, seq, pops.
func (q queueKeys) all() []string {
	return []string{q.ready, q.data, q.tries, q.inflight, q.dead, q.why, q.seq, q.pops}
}
