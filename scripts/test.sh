#!/usr/bin/env bash
# Runs every test of the project, on a fresh machine, with nothing installed by hand:
#   - installs a pinned Azurite with npm into .azurite/ and starts it on loopback (three
#     instances with TC_TEST_PARALLEL=1: one for the `suite` binary's tests, one for its
#     longest tests, one for the other parts, so their Azurite tests do not queue on one
#     Node.js thread);
#   - runs every test target with one `cargo test` (with the `testing` feature: crash points,
#     FaultStore; every `cargo test` has it through the crate's dev-dependency on itself): the
#     three integration-test binaries (`suite`, `faults`, `randomized`: conformance and
#     integration tests on the embedded store and on Azurite, the Functions contract harness,
#     the package check) and the library's unit and doc tests, one after another;
#   - with TC_TEST_PARALLEL=1 it builds them once and runs the parts side by side instead,
#     each in its own `cargo test` (`suite` in two parts, its longest tests in one), on three
#     Azurite instances; a part's output is printed whole when it ends. 12.1 and 12.5 minutes
#     on a clean clone (2 cores), against 15.1 for the default, but each of its runs so far
#     had one Azurite test fail on a time bound under the load (docs/BENCHMARKS.md), so it is
#     not the default;
#   - stops Azurite at the end, whether the tests passed or not;
#   - fails if any part failed, and if any test reported a skip: a test that lacks a
#     prerequisite writes `SKIPPED: <test>: <reason>` (tests/common/skip.rs), and this script
#     provides every prerequisite, so a skip here means a suite silently did not run.
#     (Except the package check when the caller sets TC_TEST_PACKAGE=0.)
#
# The long checks are `#[ignore]`d tests, run by `scripts/test.sh --test suite -- --ignored`
# (README, "Long checks"): the Azurite variants of the job-kill test, of the index changes
# under 8 writers and of the composite index under 8 writers (their embedded variants run
# here), the import of all 28,403 airports into
# Azurite read back by the Python client (a sample runs here), and the 100,000-record export
# through the Functions harness.
#
# Usage:
#   scripts/test.sh                     everything, as CI runs it (.ci/run)
#   TC_TEST_PARALLEL=1 scripts/test.sh  everything, its parts side by side
#   scripts/test.sh ARGS...             one `cargo test --no-fail-fast ARGS...` instead (e.g.
#                                       `--test suite -- hostile::`), with Azurite and the checks
# Environment:
#   TC_TEST_PARALLEL  1 runs the parts side by side (above)
#   TC_TEST_THREADS   with TC_TEST_PARALLEL=1, test threads of each part of the `suite` binary
#                     (default 4: its tests mostly wait on Azurite, child processes and timers)
#   TC_TEST_PACKAGE   0 skips the package check (a release-like build of the Functions package)
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/azurite.sh
source scripts/azurite.sh start >/dev/null
logs="$(mktemp -d "${TMPDIR:-/tmp}/table-catalog-test.XXXXXX")"
stop_all() {
    local i
    for i in "" side long; do AZURITE_INSTANCE="$i" scripts/azurite.sh stop >/dev/null 2>&1 || true; done
}
trap stop_all EXIT

export TC_TEST_PACKAGE="${TC_TEST_PACKAGE:-1}"
export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"
threads="${TC_TEST_THREADS:-4}"
[[ "$threads" =~ ^[1-9][0-9]*$ ]] || { echo "scripts/test.sh: TC_TEST_THREADS: '$threads' is not a positive number" >&2; exit 2; }
status=0

if [ "$#" -gt 0 ] || [ "${TC_TEST_PARALLEL:-0}" != 1 ]; then
    # The default: one `cargo test`, its binaries one after another (the suite 2 tests at a
    # time on 2 cores), one Azurite.
    cargo test --no-fail-fast "$@" 2>&1 | tee "$logs/cargo.log" || status=$?
else
    started=$SECONDS
    # Two more Azurite instances: `long` for the suite's longest tests, `side` for the rest.
    azurite_of() {
        AZURITE_INSTANCE="$1" bash scripts/azurite.sh start | sed -n 's/^TC_TEST_AZURE_CONNECTION=//p'
    }
    side="$(azurite_of side)" && long_cs="$(azurite_of long)"
    [ -n "$side" ] && [ -n "$long_cs" ] || { echo "scripts/test.sh: an Azurite instance did not start" >&2; exit 1; }
    cargo test --no-run 2>&1 | tee "$logs/build.log" || status=$?
    if [ "$status" -eq 0 ]; then
        echo "scripts/test.sh: built in $((SECONDS - started)) s; running the parts side by side" >&2
        # The suite's longest tests (1-5 minutes each on 2 cores), in a part of their own that
        # starts with the others: run in name order among the rest, they made the run's tail.
        long=(job_kill:: package:: functions_harness::airports_import crash_kill::
            read_your_writes::a_consistent_lookup_returns_every multi_process_kill:: readme::
            jobs::a_verify_job_counts)
        skip_long="${long[*]/#/--skip }"
        # name, its Azurite, then its cargo test arguments.
        parts=(
            "suite|$TC_TEST_AZURE_CONNECTION|--test suite -- --test-threads $threads $skip_long"
            "suite-long|$long_cs|--test suite -- --test-threads $threads ${long[*]}"
            "randomized|$side|--test randomized"
            "faults|$side|--test faults"
            "unit|$side|--lib --bins"
            "doc|$side|--doc"
        )
        pending=()
        pids=()
        for part in "${parts[@]}"; do
            name="${part%%|*}"
            rest="${part#*|}"
            # shellcheck disable=SC2086 # the arguments are split on purpose
            (
                s=0
                TC_TEST_AZURE_CONNECTION="${rest%%|*}" cargo test --no-fail-fast ${rest#*|} >"$logs/$name.log" 2>&1 || s=$?
                echo "$s" >"$logs/$name.rc"
            ) &
            pids+=("$!")
            pending+=("$name")
        done
        # Print each part as it ends.
        while [ "${#pending[@]}" -gt 0 ]; do
            left=()
            for name in "${pending[@]}"; do
                if [ -f "$logs/$name.rc" ]; then
                    rc="$(cat "$logs/$name.rc")"
                    echo
                    echo "==== scripts/test.sh: $name (exit $rc, at $((SECONDS - started)) s) ===="
                    cat "$logs/$name.log"
                    [ "$rc" -eq 0 ] || status="$rc"
                else
                    left+=("$name")
                fi
            done
            pending=("${left[@]+"${left[@]}"}")
            [ "${#pending[@]}" -eq 0 ] || sleep 1
        done
        # The parts only: Azurite, started by this shell, is a background job too.
        wait "${pids[@]}"
        echo "scripts/test.sh: every part ended after $((SECONDS - started)) s" >&2
    fi
fi

skipped="$(cat "$logs"/*.log | grep -o 'SKIPPED:.*' || true)"
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
    echo "scripts/test.sh: exit $status; full output in $logs" >&2
else
    rm -rf "$logs"
fi
exit "$status"
