#!/usr/bin/env bash
# The deterministic simulation (tests/randomized/sim.rs, docs/SIMULATION.md) over a range of seeds,
# release build. Every seed replays exactly: same seed, same execution, same digest.
#
#   scripts/sim.sh FROM COUNT          # seeds FROM .. FROM+COUNT-1
#   scripts/sim.sh --replay SEED       # one seed; its violations, digest and trace
#
# Settings (environment): SIM_OPS client operations per seed (200), SIM_SHARDS WAL shards
# (default: 1, 4 and 16 by seed), SIM_STOP_AT_FIRST=1 to stop after the first failing seed
# (scripts/mutate.sh NAME SEEDS sets it), SIM_LOG a tracing filter for the replay (e.g.
# table_catalog=debug, to stderr). Prints one summary line (seeds, operations, violations,
# time) and, for each failing seed, the command that replays it; the per-seed lines go to
# $CARGO_TARGET_DIR/sim/last.log. Exits non-zero when a seed fails.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
mkdir -p "$target/sim"
export TC_SIM_OPS="${SIM_OPS:-200}"
[ -n "${SIM_SHARDS:-}" ] && export TC_SIM_SHARDS="$SIM_SHARDS"
[ -n "${SIM_STOP_AT_FIRST:-}" ] && export TC_SIM_STOP_AT_FIRST="$SIM_STOP_AT_FIRST"
run() {
    cargo test --release --test randomized -- --nocapture --exact sim::bounded_seed_range_finds_no_violation
}
if [ "${1:-}" = "--replay" ]; then
    seed="${2:?usage: $0 --replay SEED}"
    trace="$target/sim/trace-$seed.txt"
    [ -n "${SIM_LOG:-}" ] && export TC_SIM_LOG="$SIM_LOG"
    TC_SIM_FROM="$seed" TC_SIM_COUNT=1 TC_SIM_TRACE="$trace" run >"$target/sim/replay-$seed.log" 2>&1 || status=$?
    grep -E '^sim seed|^  ' "$target/sim/replay-$seed.log" || true
    echo "trace: $trace"
    exit "${status:-0}"
fi
from="${1:?usage: $0 FROM COUNT | --replay SEED}"
count="${2:?usage: $0 FROM COUNT | --replay SEED}"
TC_SIM_FROM="$from" TC_SIM_COUNT="$count" run >"$target/sim/last.log" 2>&1 || status=$?
grep -E '^sim:|^replay:' "$target/sim/last.log" || { tail -30 "$target/sim/last.log"; exit 1; }
exit "${status:-0}"
