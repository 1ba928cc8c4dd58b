#!/usr/bin/env bash
# Re-measures every number in BENCHMARKS.md in one session, writing the raw
# `go test -bench` output of each section to a directory (default
# /tmp/proxyswitch-bench). Rounds are interleaved: each round runs every
# contender of a section once, back to back, so a ratio compares the same
# minutes of load. The machine's load is logged before each round; read the
# medians and the per-round ratios, not one round.
#
#   bash tools/bench/run.sh [outdir] [rounds]    # ~10 minutes on 2 cores with 5 rounds
#
# SECTIONS picks some of them (default: all): hot lease storage session
# expect exits shard scale, e.g. SECTIONS="storage expect" bash tools/bench/run.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-/tmp/proxyswitch-bench}
rounds=${2:-3}
sections=" ${SECTIONS:-hot lease storage session expect exits shard scale} "
want() { [[ $sections == *" $1 "* ]]; }
mkdir -p "$out"
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go test -c -o "$bin/root.test" .
go test -c -o "$bin/storage.test" ./storage/
go test -c -o "$bin/ban.test" ./ban/
go test -c -o "$bin/shard.test" ./shard/
git rev-parse --short HEAD > "$out/commit"
date -u > "$out/started"

load() { echo "# $(date -u +%H:%M:%S) load: $(cut -d' ' -f1-3 /proc/loadavg)"; }
bench() { # file binary pattern benchtime [extra flags...]
  local f=$1 b=$2 p=$3 t=$4; shift 4
  { load; "$bin/$b" -test.run '^$' -test.bench "$p" -test.benchmem -test.benchtime "$t" "$@" | grep -E '^Benchmark|^ok|FAIL|_test.go:'; } >> "$out/$f" ||
    { echo "# FAILED: $b $p" >> "$out/$f"; echo "benchmark failed: $b $p (see $out/$f)"; failed=1; }
}
failed=0

for i in $(seq "$rounds"); do
  echo "round $i/$rounds"
  want hot && bench hot.txt root.test 'BenchmarkCrawl|BenchmarkLeasePairs|BenchmarkClientTimeout' 2s
  want lease && bench lease.txt root.test 'BenchmarkLease$' 2s
  want storage && bench storage.txt storage.test . 1s
  want session && bench session.txt root.test 'BenchmarkSessionUse$|BenchmarkClientSession' 300x
  want expect && bench expect.txt ban.test 'BenchmarkExpect' 1s
  want exits && bench exits.txt root.test 'BenchmarkLeaseExits' 2000x
done
if want shard; then
  bench shard.txt shard.test 'BenchmarkShare' 20x -test.count 3
  { load; "$bin/shard.test" -test.run 'TestShardingSimulation' -test.v -test.count 1 | grep -v '^=== RUN'; } > "$out/shard-sim.txt"
fi
if want scale; then
  { load; PROXYSWITCH_SCALE_STRICT=${PROXYSWITCH_SCALE_STRICT:-} "$bin/root.test" -test.run 'TestMillionProxies$' -test.v -test.count 1 -test.timeout 20m; load; } > "$out/scale.txt" 2>&1 || { echo "scale test failed: see $out/scale.txt"; failed=1; }
fi
date -u > "$out/finished"
echo "raw output in $out"
exit "$failed"
