#!/usr/bin/env bash
# Runs every test of the project, on a fresh machine, with nothing installed by hand:
#   - installs a pinned Azurite with npm into .azurite/ and starts it on loopback ports;
#   - runs the whole cargo test suite (unit, conformance and integration tests on the
#     embedded store and on Azurite, the Functions contract harness, the package check),
#     with the `testing` feature (crash points, FaultStore; every `cargo test` has it through the crate's dev-dependency on itself);
#   - stops Azurite at the end, whether the tests passed or not;
#   - fails if any test reported a skip: a test that lacks a prerequisite writes
#     `SKIPPED: <test>: <reason>` (tests/common/skip.rs), and this script provides every
#     prerequisite, so a skip here means a suite silently did not run.
#     (Except the package check when the caller sets TC_TEST_PACKAGE=0.)
# cargo's output (with its `test result:` lines) is shown as usual and kept in a log.
# Usage: scripts/test.sh [extra cargo test arguments]
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/azurite.sh
source scripts/azurite.sh start >/dev/null
log="$(mktemp "${TMPDIR:-/tmp}/table-catalog-test.XXXXXX")"
trap 'scripts/azurite.sh stop >/dev/null 2>&1 || true' EXIT

export TC_TEST_PACKAGE="${TC_TEST_PACKAGE:-1}"
export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"
status=0
cargo test --no-fail-fast "$@" 2>&1 | tee "$log" || status=$?

skipped="$(grep -o 'SKIPPED:.*' "$log" || true)"
if [ "$TC_TEST_PACKAGE" != 1 ]; then
    # Asked for by the caller (TC_TEST_PACKAGE=0): the package check is expected to skip.
    skipped="$(printf '%s\n' "$skipped" | grep -v 'SKIPPED: package_' || true)"
fi
if [ -n "$skipped" ]; then
    echo >&2
    echo "scripts/test.sh: FAILED: tests were skipped although this script provides their prerequisites:" >&2
    printf '%s\n' "$skipped" | sed 's/^/  /' >&2
    [ "$status" -ne 0 ] || status=1
fi
if [ "$status" -ne 0 ]; then
    echo "scripts/test.sh: exit $status; full output in $log" >&2
else
    rm -f "$log"
fi
exit "$status"
