#!/usr/bin/env bash
# Summarizes raw `go test -bench` output (run.sh's files): for every
# benchmark and unit, the median over the rounds and each round's value in
# order; with "-ratio A B" also, per round, the value of benchmark A over
# benchmark B for every unit both report, and the median of those ratios.
#
#   bash tools/bench/summary.sh /tmp/proxyswitch-bench/hot.txt
#   bash tools/bench/summary.sh hot.txt -ratio 'BenchmarkCrawl/proxies=100/engine=proxyswitch' \
#                                              'BenchmarkCrawl/proxies=100/engine=roundrobin'
set -euo pipefail
f=$1; shift
a= b=
if [[ ${1:-} == -ratio ]]; then a=$2 b=$3; fi
awk -v A="$a" -v B="$b" '
function median(s,   n, v, i, j, t) {
  n = split(s, v, " ")
  for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] + 0 < v[i] + 0) { t = v[i]; v[i] = v[j]; v[j] = t }
  return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
}
/^Benchmark/ && $2 ~ /^[0-9]+$/ {
  name = $1; sub(/-[0-9]+$/, "", name)
  if (!(name in seen)) { seen[name] = 1; order[++nn] = name }
  r = ++count[name]
  for (i = 3; i < NF; i += 2) {
    key = name SUBSEP $(i + 1)
    if (!(key in vals)) units[name] = units[name] " " $(i + 1)
    vals[key] = vals[key] " " $i
    at[key, r] = $i
  }
}
END {
  for (k = 1; k <= nn; k++) {
    name = order[k]; print name
    nu = split(units[name], us, " ")
    for (u = 1; u <= nu; u++) printf "  %-20s median %-12s rounds:%s\n", us[u], median(vals[name SUBSEP us[u]]), vals[name SUBSEP us[u]]
  }
  if (A == "") exit
  printf "\n%s / %s\n", A, B
  nu = split(units[A], us, " ")
  for (u = 1; u <= nu; u++) {
    s = ""
    for (r = 1; r <= count[A] && r <= count[B]; r++)
      if ((A SUBSEP us[u], r) in at && (B SUBSEP us[u], r) in at && at[B SUBSEP us[u], r] + 0 != 0)
        s = s " " sprintf("%.3f", at[A SUBSEP us[u], r] / at[B SUBSEP us[u], r])
    if (s != "") printf "  %-20s median %-8s rounds:%s\n", us[u], median(s), s
  }
}' "$f"
