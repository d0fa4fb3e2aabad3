#!/usr/bin/env bash
# Scale-out on a simulated Azure account (numbers recorded in docs/BENCHMARKS.md, "Simulated
# Azure"): `table-catalog bench sim` runs N catalog instances in one process (each with its own
# queue worker and sweeper, like N Functions instances) on one in-memory embedded store behind
# simulated Azure latency and the 2,000 entities/s per-partition / 20,000 transactions/s
# per-account limits, for every WAL shard count S × N = 1, 2, 4, 8. Prints Markdown tables:
# acknowledged writes/s, entries applied/s, ack latency, visibility lag, storage requests per
# write (total and by operation), the WAL table's hot partitions, 503s by partition.
#
#   scripts/bench_sim.sh                       # S = 1,4,16 × N = 1,2,4,8, 16 clients per instance, 10 s each
#   SIM_SHARDS=4 SIM_INSTANCES=1,2 SIM_SECONDS=5 scripts/bench_sim.sh
#   SIM_SHARDS=16 SIM_INSTANCES=8 scripts/bench_sim.sh --rate 500,1000,1500   # offered load
#   SIM_SHARDS=1,8 SIM_INSTANCES=1,8 scripts/bench_sim.sh --backlog 20000     # apply throughput
#   scripts/bench_sim.sh --point-median-ms 8   # extra flags go to `bench sim`
#
# Settings (environment): SIM_SHARDS (1,4,16), SIM_INSTANCES (1,2,4,8), SIM_CLIENTS (16, per
# instance), SIM_SECONDS (10), SIM_SEED (1), SIM_DRAIN_SECS (600), BENCH_OUT (also write the
# report to this file). Uses $CARGO_TARGET_DIR.
# Nothing here asserts on time; the numbers depend on the machine and its load.
set -euo pipefail
cd "$(dirname "$0")/.."
target_dir="${CARGO_TARGET_DIR:-$(pwd)/target}"
cargo build --release --quiet --bin table-catalog
bin="$target_dir/release/table-catalog"

load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
report="$("$bin" bench sim --shards "${SIM_SHARDS:-1,4,16}" --instances "${SIM_INSTANCES:-1,2,4,8}" \
    --clients "${SIM_CLIENTS:-16}" --per-instance --seconds "${SIM_SECONDS:-10}" --seed "${SIM_SEED:-1}" \
    --drain-secs "${SIM_DRAIN_SECS:-600}" "$@")"
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"
commit="$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then commit="$commit (+ uncommitted changes)"; fi
full="$(printf '%s\n\nCommit %s, release build, %s cores, load average %s before / %s after, %s.\n' \
    "$report" "$commit" "$(nproc)" "$load_before" "$load_after" "$(date -u '+%Y-%m-%d %H:%M UTC')")"
echo "$full"
if [ -n "${BENCH_OUT:-}" ]; then echo "$full" >"$BENCH_OUT"; fi
