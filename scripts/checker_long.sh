#!/usr/bin/env bash
# Long run of the randomized checker (tests/checker.rs) on one backend, release build.
#
#   scripts/checker_long.sh local   [OPS] [SEED] [CLIENTS]   # defaults: 100000 7 8
#   scripts/checker_long.sh azurite [OPS] [SEED] [CLIENTS]   # defaults: 20000 21 8
#
# Prints a progress line every 30 s and, at the end, one summary line (operations, faults
# injected, audit scans, violations). A violation fails the run and prints the seed. For
# Azurite, a private instance is started (scripts/azurite.sh) and stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

backend="${1:-local}"
case "$backend" in
    local) ops="${2:-100000}"; seed="${3:-7}" ;;
    azurite) ops="${2:-20000}"; seed="${3:-21}" ;;
    *) echo "usage: $0 local|azurite [OPS] [SEED] [CLIENTS]" >&2; exit 2 ;;
esac
clients="${4:-8}"

if [ "$backend" = azurite ]; then
    # shellcheck source=scripts/azurite.sh
    source scripts/azurite.sh start
    trap 'scripts/azurite.sh stop' EXIT
fi

echo "checker_long: backend=$backend ops=$ops seed=$seed clients=$clients ($(nproc) CPUs, commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown))"
TC_CHECKER_OPS="$ops" TC_CHECKER_SEED="$seed" TC_CHECKER_CLIENTS="$clients" TC_CHECKER_BACKEND="$backend" \
    cargo test --release --features fault-injection --test checker -- --nocapture
