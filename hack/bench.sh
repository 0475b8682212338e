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
echo "ratios to the same run's baseline (medians; time = ns/op, bytes = B/op, allocs = allocs/op,"
echo "then any custom metric both report, e.g. sent-B/op; < 1 is cheaper):"
awk '
/^Benchmark/ {
  name=$1; sub(/-[0-9]+$/, "", name)
  top=name; sub(/\/.*/, "", top); sub_=name; sub(/^[^\/]*\/?/, "", sub_)
  key=top SUBSEP sub_; n[key]++
  for (i=3;i<NF;i+=2) {
    u=$(i+1); V[key,u,n[key]]=$i
    if (!((key,u) in has)) { has[key,u]=1; units[key]=units[key] " " u }
  }
  if (!(key in seen)) { seen[key]=1; order[++cnt]=key }
  if (sub_ ~ /^baseline/) base[top]=key
}
function median(key, u, cnt,   i, j, t, v) {
  for (i=1;i<=cnt;i++) v[i]=V[key,u,i]+0
  for (i=1;i<=cnt;i++) for (j=i+1;j<=cnt;j++) if (v[j]<v[i]) { t=v[i]; v[i]=v[j]; v[j]=t }
  return v[int((cnt+1)/2)]
}
function label(u) { return u=="ns/op" ? "time" : u=="B/op" ? "bytes" : u=="allocs/op" ? "allocs" : u }
END {
  for (k=1;k<=cnt;k++) {
    key=order[k]; split(key, p, SUBSEP); top=p[1]
    if (!(top in base) || key==base[top]) continue
    b=base[top]; line=""
    m=split(units[key], us, " ")
    for (j=1;j<=m;j++) {
      u=us[j]; if (!((b,u) in has)) continue
      bv=median(b,u,n[b]); if (bv==0) continue
      line=line sprintf("  %s %.2fx", label(u), median(key,u,n[key])/bv)
    }
    printf "  %-50s%s  (vs %s)\n", top "/" p[2], line, substr(b, index(b, SUBSEP)+1)
  }
}' "$out"
