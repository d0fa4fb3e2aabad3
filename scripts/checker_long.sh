#!/usr/bin/env bash
# Long run of the randomized checker (tests/randomized/checker.rs) on one backend, release build.
#
#   scripts/checker_long.sh local   [OPS] [SEED] [CLIENTS] [SHARDS]   # defaults: 100000 7 8 4
#   scripts/checker_long.sh azurite [OPS] [SEED] [CLIENTS] [SHARDS]   # defaults: 20000 21 8 4
#
# Long runs check consistent reads and frozen racing pairs more sparsely than the bounded run
# (TC_CHECKER_READS 0.01, TC_CHECKER_FROZEN 0.1 unless set), as each costs a client up to
# seconds of waiting.
#
# TC_CHECKER_TASKDUMP=1 builds a checker that prints every task's backtrace on a stall (below).
#
# Online index changes (issue 13): TC_CHECKER_INDEX_CHANGES index adds and drops per run
# (default here 20; 0 disables), spread over the run by the clients' progress.
#
# SHARDS is the WAL shard count (TC_CHECKER_SHARDS: one count, or several separated by commas,
# which then share the OPS). Prints a progress line every 30 s and, at the end, one summary
# line (operations, faults injected, audit scans, violations) and one workload line per run
# (filters crossing shards, records moved between shards). A violation fails the run and
# prints the seed.
#
# The test binary is built first, copied to a private temporary directory and run from there,
# so the run holds no cargo lock and later builds in the same target directory (even of this
# test) neither wait for it nor change it. For Azurite, a private instance (AZURITE_INSTANCE)
# is started (scripts/azurite.sh) and stopped at the end, so several runs can go at once.
set -euo pipefail
cd "$(dirname "$0")/.."

backend="${1:-local}"
case "$backend" in
    local) ops="${2:-100000}"; seed="${3:-7}" ;;
    azurite) ops="${2:-20000}"; seed="${3:-21}" ;;
    *) echo "usage: $0 local|azurite [OPS] [SEED] [CLIENTS] [SHARDS]" >&2; exit 2 ;;
esac
clients="${4:-8}"
shards="${5:-4}"

work="$(mktemp -d "${TMPDIR:-/tmp}/checker-long.XXXXXX")"
started_azurite=
cleanup() {
    if [ -n "$started_azurite" ]; then scripts/azurite.sh stop || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

# The test binary is the artifact of the `randomized` test target, whose `checker` module is
# the checker (cargo also reports the package's binary, which integration tests get built).
# TC_CHECKER_TASKDUMP=1: a build whose checker prints every task's async backtrace when the
# clients stop making progress (tokio's task dumps; a full rebuild, so give it its own
# CARGO_TARGET_DIR).
dump=()
if [ "${TC_CHECKER_TASKDUMP:-0}" = 1 ]; then
    export RUSTFLAGS="${RUSTFLAGS:-} --cfg tokio_unstable --cfg tokio_taskdump"
    dump=(--features tokio/taskdump)
fi
exe="$(cargo test --release --test randomized "${dump[@]}" --no-run --message-format=json-render-diagnostics |
    grep '"kind":\["test"\]' | grep '"name":"randomized"' | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)"
[ -x "$exe" ] || { echo "checker_long: no test binary built" >&2; exit 1; }
cp "$exe" "$work/checker"

if [ "$backend" = azurite ]; then
    export AZURITE_INSTANCE="checker-$$"
    started_azurite=1
    # shellcheck source=scripts/azurite.sh
    source scripts/azurite.sh start
fi

echo "checker_long: backend=$backend ops=$ops seed=$seed clients=$clients shards=$shards index_changes=${TC_CHECKER_INDEX_CHANGES:-20} ($(nproc) CPUs, commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ', uncommitted changes'), binary $(basename "$exe"))"
TC_CHECKER_READS="${TC_CHECKER_READS:-0.01}" TC_CHECKER_FROZEN="${TC_CHECKER_FROZEN:-0.1}" \
TC_CHECKER_INDEX_CHANGES="${TC_CHECKER_INDEX_CHANGES:-20}" \
TC_CHECKER_OPS="$ops" TC_CHECKER_SEED="$seed" TC_CHECKER_CLIENTS="$clients" TC_CHECKER_SHARDS="$shards" \
    TC_CHECKER_BACKEND="$backend" "$work/checker" --nocapture checker::randomized
