#!/usr/bin/env bash
# Runs the Go benchmarks and reports each sub-benchmark as a ratio to its sibling whose name
# starts with "baseline", measured in the same run (project rule: no absolute timings).
# Usage: hack/bench.sh [go test -bench flags...]; BENCH_COUNT (default 5) repetitions.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp)
trap 'rm -f "$out"' EXIT
go test -short -run '^$' -bench . -benchmem -count "${BENCH_COUNT:-5}" "$@" ./... | tee "$out"
echo
echo "ratios to the same run's baseline (median ns/op, B/op, allocs/op; < 1 is cheaper):"
awk '
/^Benchmark/ {
  name=$1; sub(/-[0-9]+$/, "", name)
  top=name; sub(/\/.*/, "", top); sub_=name; sub(/^[^\/]*\/?/, "", sub_)
  ns=""; bytes=""; allocs=""
  for (i=2;i<=NF;i++) { if ($i=="ns/op") ns=$(i-1); if ($i=="B/op") bytes=$(i-1); if ($i=="allocs/op") allocs=$(i-1) }
  key=top SUBSEP sub_; n[key]++; NS[key,n[key]]=ns; BY[key,n[key]]=bytes; AL[key,n[key]]=allocs
  if (!(key in seen)) { seen[key]=1; order[++cnt]=key }
  if (sub_ ~ /^baseline/) base[top]=key
}
function median(arr, key, cnt,   i, j, t, v) {
  for (i=1;i<=cnt;i++) v[i]=arr[key,i]+0
  for (i=1;i<=cnt;i++) for (j=i+1;j<=cnt;j++) if (v[j]<v[i]) { t=v[i]; v[i]=v[j]; v[j]=t }
  return v[int((cnt+1)/2)]
}
END {
  for (k=1;k<=cnt;k++) {
    key=order[k]; split(key, p, SUBSEP); top=p[1]
    if (!(top in base) || key==base[top]) continue
    b=base[top]
    bns=median(NS,b,n[b]); bb=median(BY,b,n[b]); ba=median(AL,b,n[b])
    printf "  %-60s time %.2fx  bytes %.2fx  allocs %.2fx  (vs %s)\n", top "/" p[2],
      median(NS,key,n[key])/bns, (bb? median(BY,key,n[key])/bb : 0), (ba? median(AL,key,n[key])/ba : 0), p[2] == "" ? "" : substr(b, index(b, SUBSEP)+1)
  }
}' "$out"
