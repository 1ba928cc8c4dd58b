#!/usr/bin/env bash
# Ban-evidence scenarios, run as a user would meet them: a local site that
# judges clients by IP, local forward proxies dialling out from their own
# 127.0.x.y addresses, default options, and one line of numbers per
# scenario (medians of RUNS runs, each run's value in brackets): pages
# served and failed by error kind, proxies quarantined at the end, breaker
# openings and pauses. main.go lists the scenarios (S1-S6: refused pages,
# login walls, 502 and refusal storms; R1-R4: broken proxies, banned IPs,
# challenges behind redirects; A1, A2: issue 16's acceptance; X1: a storm
# on a pool smaller than Breaker.Burst).
#
#   bash tools/scenarios/run.sh [scenario ...]     # all: ~14 min with RUNS=2
#   CHECKOUT=/path/to/other/clone bash tools/scenarios/run.sh S1 S4
#
# CHECKOUT runs the same scenarios against another clone of the library
# (a copy of this folder is built there), to compare two versions. It
# starts its own redis-server on a free loopback port (from 7311).
set -u
here=$(cd "$(dirname "$0")" && pwd)
co=$(cd "${CHECKOUT:-$here/../..}" && pwd)
runs=${RUNS:-2}
all="S1 S1i S2 S3 S4 S5 S5b S5c S6-403 S6-503 R1 R1t R1x R2 R2p2 R3 R3b R3p R4 A1 A2 X1"
work=$(mktemp -d)
trap 'rm -rf "$work"; [ -n "${rpid:-}" ] && kill "$rpid" 2>/dev/null' EXIT
mkdir -p "$co/tools/scenarios-run.tmp" && cp "$here/main.go" "$co/tools/scenarios-run.tmp/main.go"
(cd "$co" && go build -o "$work/driver" ./tools/scenarios-run.tmp) || { rm -rf "$co/tools/scenarios-run.tmp"; exit 1; }
rm -rf "$co/tools/scenarios-run.tmp"
port=${REDIS_PORT:-7311}
while (echo > /dev/tcp/127.0.0.1/$port) 2>/dev/null; do port=$((port+1)); done
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >"$work/redis.log" 2>&1 &
rpid=$!
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
out=$work/results.jsonl
echo "# checkout $co ($(git -C "$co" rev-parse --short HEAD 2>/dev/null)), redis 127.0.0.1:$port, runs $runs"
for s in ${*:-$all}; do
  for r in $(seq "$runs"); do
    timeout 60 "$work/driver" -redis "127.0.0.1:$port" -s "$s" -run "$r" >>"$out" 2>>"$work/err.log" ||
      echo "{\"scenario\":\"$s\",\"run\":$r,\"vals\":{\"crashed\":true},\"keys\":[\"crashed\"]}" >>"$out"
  done
done
"$work/driver" -summarize "$out"
