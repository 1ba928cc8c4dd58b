package storage

import (
	"strings"
	"testing"

	"github.com/proxyswitch/proxyswitch/internal/engine"
	"github.com/proxyswitch/proxyswitch/internal/testbed"
)

// nsKeys are every key of one namespace, with the pattern it falls under:
// a tag key's tag ("{ns}"), or a visited bucket's "ns:v:{".
func nsKeys(k keyspace) []string {
	out := append([]string{k.meta(), k.cookieHosts(), k.cookieDomains(), k.cookieJar("a:b"), k.cookieJar("x}"), k.legacyCookies("a:b"), k.legacyCookies("x}")}, k.queue().all()...)
	return append(out, k.bucket(0), k.bucket(0xffff))
}

// keyOwnerPattern is what a key belongs to: the tag for "{...}" keys, the
// text up to and with ":v:{" for visited buckets.
func keyOwnerPattern(t *testing.T, key string) string {
	if strings.HasPrefix(key, "{") {
		return key[:strings.IndexByte(key, '}')+1]
	}
	i := strings.Index(key, ":v:{")
	if i < 0 {
		t.Fatalf("key %q is of no known kind", key)
	}
	return key[:i+4]
}

// Distinct namespaces never share a key or a key pattern, and no key of a
// namespace is a key of a pool of the root package, whatever its prefix and
// pool (issue 13, item 9): namespace "a:b" and prefix "a" with pool "b"
// once shared "{a:b}:meta".
func TestNamespacesDisjoint(t *testing.T) {
	names := testbed.Spellings("a:%3A", 3)
	pools := map[string]bool{} // every pool tag "{prefix:pool}"
	for _, prefix := range names {
		for _, pool := range names {
			base, err := engine.KeyBase(prefix, pool)
			if err != nil {
				t.Fatal(err)
			}
			pools[base] = true
		}
	}
	owner := map[string]string{} // pattern -> namespace
	for _, ns := range names {
		if err := checkNamespace(ns); err != nil {
			t.Fatal(err)
		}
		k := newKeyspace(ns)
		mine := map[string]bool{}
		for _, key := range nsKeys(k) {
			pat := keyOwnerPattern(t, key)
			if pools[pat] {
				t.Fatalf("key %q of namespace %q is a key of pool %s", key, ns, pat)
			}
			if o, ok := owner[pat]; ok && o != ns {
				t.Fatalf("key %q of namespace %q falls under namespace %q's %s", key, ns, o, pat)
			}
			owner[pat] = ns
			mine[pat] = true
		}
		if len(mine) != 2 {
			t.Fatalf("namespace %q has key patterns %v, want its tag and its visited prefix", ns, mine)
		}
	}
	// Names without ':' or '%' keep the keys of earlier releases.
	k := newKeyspace("colly")
	if got := k.meta() + " " + k.bucket(0x1f); got != "{colly}:meta colly:v:{1f}" {
		t.Fatalf("keys of namespace colly: %s", got)
	}
}
