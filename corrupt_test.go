package proxyswitch

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/proxyswitch/proxyswitch/ban"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// maxCorruptMsg bounds the message of an error about a corrupt value: a
// huge stored value is never copied into it.
const maxCorruptMsg = 512

// hugeValue is a stored value far larger than any error may be.
var hugeValue = strings.Repeat("9x", 32<<10)

// spoil is one way to damage one key of a pool.
type spoil struct {
	name  string
	key   func(k keyspace, ids []string) string
	write func(ctx context.Context, rdb redis.UniversalClient, key string, ids []string) error
}

func hashField(field func(ids []string) string, val string) func(context.Context, redis.UniversalClient, string, []string) error {
	return func(ctx context.Context, rdb redis.UniversalClient, key string, ids []string) error {
		return rdb.HSet(ctx, key, field(ids), val).Err()
	}
}

func zsetMember(member func(ids []string) string, score float64) func(context.Context, redis.UniversalClient, string, []string) error {
	return func(ctx context.Context, rdb redis.UniversalClient, key string, ids []string) error {
		return rdb.ZAdd(ctx, key, redis.Z{Score: score, Member: member(ids)}).Err()
	}
}

func asString(ctx context.Context, rdb redis.UniversalClient, key string, _ []string) error {
	return errors.Join(rdb.Del(ctx, key).Err(), rdb.Set(ctx, key, hugeValue, 0).Err())
}

func asHash(ctx context.Context, rdb redis.UniversalClient, key string, _ []string) error {
	return errors.Join(rdb.Del(ctx, key).Err(), rdb.HSet(ctx, key, "x", "y").Err())
}

func asZset(ctx context.Context, rdb redis.UniversalClient, key string, _ []string) error {
	return errors.Join(rdb.Del(ctx, key).Err(), rdb.ZAdd(ctx, key, redis.Z{Score: 1, Member: "x"}).Err())
}

const corruptSite = "corrupt.example"

func corruptSpoils() []spoil {
	var out []spoil
	id := func(i int) func([]string) string { return func(ids []string) string { return ids[i] } }
	slot := func(i int) func([]string) string { return func(ids []string) string { return ids[i] + ":0" } }
	lit := func(s string) func([]string) string { return func([]string) string { return s } }
	bad := map[string]string{"not a number": "x", "empty": "", "huge": hugeValue, "pipes": "a|b|c", "NaN": "nan", "inf": "inf"}
	hashKinds := []struct {
		name  string
		key   func(keyspace) string
		field func([]string) string
	}{
		{"meta slots", keyspace.meta, lit("slots")},
		{"meta version", keyspace.meta, lit("version")},
		{"meta hold", keyspace.meta, lit("hold")},
		{"lease", func(k keyspace) string { return k.leases(corruptSite) }, slot(0)},
		{"strikes", func(k keyspace) string { return k.strikes(corruptSite) }, id(1)},
		{"fails", keyspace.fails, id(0)},
		{"health", func(k keyspace) string { return k.health(corruptSite) }, id(0)},
		{"pace", func(k keyspace) string { return k.pace(corruptSite) }, lit("c")},
		{"dead", keyspace.dead, id(2)},
		{"proxies", keyspace.proxies, id(0)},
		{"member-owners", keyspace.memberOwners, lit("m1")},
	}
	for _, h := range hashKinds {
		key := h.key
		for what, v := range bad {
			out = append(out, spoil{h.name + ": " + what, func(k keyspace, _ []string) string { return key(k) }, hashField(h.field, v)})
		}
		out = append(out, spoil{h.name + ": a string", func(k keyspace, _ []string) string { return key(k) }, asString})
		out = append(out, spoil{h.name + ": a zset", func(k keyspace, _ []string) string { return key(k) }, asZset})
	}
	session := func(k keyspace, _ []string) string { return k.session("task") }
	for what, v := range bad {
		for _, f := range []string{"id", "proxy", "exp", "n", "created", "gen", "s:" + corruptSite} {
			out = append(out, spoil{"session " + f + ": " + what, session,
				func(ctx context.Context, rdb redis.UniversalClient, key string, ids []string) error {
					rec := map[string]any{"id": "ab", "proxy": ids[0], "gen": "1", "created": "1", "n": "0", "exp": "99999999999999"}
					rec[f] = v
					return rdb.HSet(ctx, key, rec).Err()
				}})
		}
	}
	out = append(out, spoil{"session: a string", session, asString}, spoil{"session: a zset", session, asZset})
	zsetKinds := []struct {
		name   string
		key    func(keyspace) string
		member func([]string) string
	}{
		{"free", func(k keyspace) string { return k.free(corruptSite) }, lit("garbage")},
		{"free slot", func(k keyspace) string { return k.free(corruptSite) }, func(ids []string) string { return ids[0] + ":x" }},
		{"free foreign", func(k keyspace) string { return k.free(corruptSite) }, lit("0123456789abcdef:0")},
		{"sites", keyspace.sites, lit(hugeValue)},
		{"quarantine", keyspace.quarantine, lit("garbage")},
		{"sessions", keyspace.liveSessions, lit("garbage")},
		{"members", keyspace.members, lit(hugeValue)},
		{"modes", keyspace.modes, lit("m1")},
	}
	for _, z := range zsetKinds {
		key := z.key
		out = append(out, spoil{z.name + ": member", func(k keyspace, _ []string) string { return key(k) }, zsetMember(z.member, 1)})
		out = append(out, spoil{z.name + ": +inf", func(k keyspace, _ []string) string { return key(k) }, zsetMember(z.member, math.Inf(1))})
		out = append(out, spoil{z.name + ": -inf", func(k keyspace, _ []string) string { return key(k) }, zsetMember(z.member, math.Inf(-1))})
		out = append(out, spoil{z.name + ": a string", func(k keyspace, _ []string) string { return key(k) }, asString})
		out = append(out, spoil{z.name + ": a hash", func(k keyspace, _ []string) string { return key(k) }, asHash})
	}
	return out
}

// TestCorruptValues damages every kind of key of a pool, one way at a time,
// and drives every public operation that reads it: each fails with
// ErrCorrupt naming the key in a message of bounded size, or handles the
// value (ignores or repairs it); none surfaces a raw script error, and
// nothing panics (issue 13, item 10).
func TestCorruptValues(t *testing.T) {
	rdb := shared.Client(t)
	for _, sp := range corruptSpoils() {
		t.Run(sp.name, func(t *testing.T) {
			ctx := context.Background()
			s := newSwitch(t, rdb, WithTimeouts(Timeouts{MaxWait: Off}), WithRotation(Rotation{Concurrency: 1, Cooldown: Off}))
			urls := proxyURLs(3)
			_, err := s.Add(ctx, urls...)
			require.NoError(t, err)
			ids := proxyIDsOf(t, urls)
			held := leaseProxy(t, s, corruptSite, ids[0])
			require.NoError(t, s.Ban(ctx, ids[1], corruptSite, time.Hour))
			key := sp.key(s.keys, ids)
			require.NoError(t, sp.write(ctx, rdb, key, ids))

			check := func(op string, err error) {
				t.Helper()
				if err == nil {
					return
				}
				msg := err.Error()
				switch {
				case errors.Is(err, ErrCorrupt):
					if !strings.Contains(msg, key) {
						t.Errorf("%s: ErrCorrupt does not name the key %s: %.300s", op, key, msg)
					}
					if len(msg) > maxCorruptMsg {
						t.Errorf("%s: error of %d bytes: %.300s...", op, len(msg), msg)
					}
				case errors.Is(err, ErrRedis), strings.Contains(msg, "script"), strings.Contains(msg, "attempt to"):
					t.Errorf("%s: %.300s", op, msg)
				default:
					t.Logf("%s: %.200s", op, msg)
				}
			}
			call := func(op string, f func() error) {
				t.Helper()
				defer func() {
					if r := recover(); r != nil {
						t.Errorf("%s panicked: %v", op, r)
					}
				}()
				check(op, f())
			}
			call("Stats", func() error { _, err := s.Stats(ctx, corruptSite); return err })
			call("ProxyStates", func() error { _, err := s.ProxyStates(ctx, corruptSite); return err })
			call("SiteState", func() error { _, err := s.SiteState(ctx, corruptSite); return err })
			call("Sites", func() error { _, err := s.Sites(ctx); return err })
			call("List", func() error { _, err := s.List(ctx); return err })
			call("Dead", func() error { _, err := s.Dead(ctx); return err })
			call("LiveSessions", func() error { _, err := s.LiveSessions(ctx); return err })
			call("Session", func() error { _, err := s.Session(ctx, "task"); return err })
			call("Members", func() error { _, err := s.Members(ctx); return err })
			call("Extend", func() error { return held.Extend(ctx, time.Minute) })
			call("Lease", func() error {
				l, err := s.Lease(ctx, corruptSite)
				if err == nil {
					defer func() { check("Release of new lease", l.Release(ctx)) }()
					check("Report of new lease", l.Report(ctx, ban.Verdict{Kind: ban.ProxyFailure, Reason: "x"}))
				}
				return err
			})
			call("Report", func() error { return held.Report(ctx, ban.Verdict{Kind: ban.Ban, Reason: "x"}) })
			call("Release", func() error { return held.Release(ctx) })
			call("Ban", func() error { return s.Ban(ctx, ids[0], corruptSite, time.Hour) })
			call("Unban", func() error { return s.Unban(ctx, ids[1], corruptSite) })
			call("Drain", func() error { _, err := s.Drain(ctx, "", ids[2]); return err })
			call("Revive", func() error { _, err := s.Revive(ctx, "", ids[2]); return err })
			call("Add", func() error { _, err := s.Add(ctx, proxyURLs(4)[3]); return err })
			call("Remove", func() error { _, err := s.Remove(ctx, ids[0]); return err })
			call("Replace", func() error { _, err := s.Replace(ctx, urls); return err })
			call("EndSession", func() error { _, err := s.EndSession(ctx, "task"); return err })
			call("Clear", func() error { return s.Clear(ctx) })
		})
	}
}

// TestCorruptValuesOnMiniredis: the checks of lib.lua behave alike in
// gopher-lua (miniredis, what proxyswitchtest embeds): a damaged value and a
// key of the wrong kind are ErrCorrupt naming the key.
func TestCorruptValuesOnMiniredis(t *testing.T) {
	ctx := context.Background()
	rdb := miniredisClient(t)
	s := newSwitch(t, rdb, WithTimeouts(Timeouts{MaxWait: Off}))
	_, err := s.Add(ctx, proxyURLs(2)...)
	require.NoError(t, err)
	_, err = s.Lease(ctx, corruptSite)
	require.NoError(t, err)

	require.NoError(t, rdb.HSet(ctx, s.keys.meta(), "slots", hugeValue).Err())
	_, err = s.SiteState(ctx, corruptSite)
	require.ErrorIs(t, err, ErrCorrupt)
	require.Contains(t, err.Error(), s.keys.meta())
	require.Less(t, len(err.Error()), maxCorruptMsg)

	require.NoError(t, rdb.Del(ctx, s.keys.meta()).Err())
	require.NoError(t, rdb.Set(ctx, s.keys.fails(), "x", 0).Err())
	_, err = s.Remove(ctx, proxyURLs(1)[0])
	require.ErrorIs(t, err, ErrCorrupt)
	require.Contains(t, err.Error(), s.keys.fails())
}

// TestCorruptScanMarks: a garbage value in the meta hash's scan marks (the
// order's "index", the gateway index's "gwindex", each a scan cursor or
// "done") starts their scan over instead of failing every lease or update
// with Redis' "invalid cursor" until someone edits Redis by hand.
func TestCorruptScanMarks(t *testing.T) {
	rdb := shared.Client(t)
	for _, field := range []string{"index", "gwindex"} {
		t.Run(field, func(t *testing.T) {
			ctx := context.Background()
			s := newSwitch(t, rdb, WithTimeouts(Timeouts{MaxWait: Off}))
			_, err := s.Add(ctx, "http://127.0.0.1:10001", "http://u-{session:3}:p@127.0.0.1:3128")
			require.NoError(t, err)
			require.NoError(t, rdb.HSet(ctx, s.keys.meta(), field, "x").Err())
			l, err := s.Lease(ctx, corruptSite)
			require.NoError(t, err)
			require.NoError(t, l.Release(ctx))
			_, err = s.Add(ctx, "http://127.0.0.1:10002")
			require.NoError(t, err)
			_, err = s.Remove(ctx, "http://127.0.0.1:10002")
			require.NoError(t, err)
			ch, err := s.Replace(ctx, []string{"http://127.0.0.1:10001", "http://u-{session:2}:p@127.0.0.1:3128"})
			require.NoError(t, err)
			require.Equal(t, 3, ch.Size)
			for range 8 { // the scan's later pages, if any, run with the calls
				l, err := s.Lease(ctx, corruptSite)
				require.NoError(t, err)
				require.NoError(t, l.Release(ctx))
			}
			v, err := rdb.HGet(ctx, s.keys.meta(), field).Result()
			require.NoError(t, err)
			require.Equal(t, "done", v)
		})
	}
}
