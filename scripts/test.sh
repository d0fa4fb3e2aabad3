#!/usr/bin/env bash
# Runs every test of the project, on a fresh machine, with nothing installed by hand:
#   - installs a pinned Azurite with npm into .azurite/ and starts it on loopback (two
#     instances, one per lane below, so their Azurite tests do not queue on one Node.js
#     thread), while the tests build;
#   - builds every test target once (with the `testing` feature: crash points, FaultStore;
#     every `cargo test` has it through the crate's dev-dependency on itself) and, beside it, the
#     Functions package the package check inspects (`scripts/package.sh`, profile
#     `package-check`, in its own target folder `target/package` so the two builds do not wait
#     on one cargo lock; niced, so it takes the CPU the others leave idle); the tests start
#     when the test build ends, the package build going on beside them, and the package check's own `scripts/package.sh` run waits for it on
#     cargo's lock and then finds it built;
#   - runs the tests in two lanes side by side, each part its own `cargo test`, printed whole
#     when it ends:
#       lane `long`: the `suite` binary's longest tests (three `serve` processes, kills, the
#                    Functions harness's airports import, the README, the package check),
#                    then the `randomized` binary (the checker's bounded runs, the
#                    simulator's seeds);
#       lane `main`: the rest of `suite`, then the library's unit tests, `faults`, the doc
#                    tests;
#     each `suite` part with TC_TEST_THREADS test threads (default 3: its tests mostly wait on
#     Azurite, child processes and timers). On a 2-core machine this keeps at most about six
#     tests running at once (docs/BENCHMARKS.md, "The test command");
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
#   TC_TEST_PARALLEL=0 scripts/test.sh  everything in one `cargo test`, one binary after another
#                                       (slower; for a machine where the lanes are too much)
#   scripts/test.sh ARGS...             one `cargo test --no-fail-fast ARGS...` instead (e.g.
#                                       `--test suite -- hostile::`), with Azurite and the checks
# Environment:
#   TC_TEST_PARALLEL  0 runs one `cargo test` instead of the lanes (above)
#   TC_TEST_THREADS   test threads of each part of the `suite` binary (default 3)
#   TC_TEST_PACKAGE   0 skips the package check (a release-like build of the Functions package)
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"

logs="$(mktemp -d "${TMPDIR:-/tmp}/table-catalog-test.XXXXXX")"
stop_all() {
    local i
    for i in "" long; do AZURITE_INSTANCE="$i" scripts/azurite.sh stop >/dev/null 2>&1 || true; done
}
trap stop_all EXIT

export TC_TEST_PACKAGE="${TC_TEST_PACKAGE:-1}"
export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"
threads="${TC_TEST_THREADS:-3}"
[[ "$threads" =~ ^[1-9][0-9]*$ ]] || { echo "scripts/test.sh: TC_TEST_THREADS: '$threads' is not a positive number" >&2; exit 2; }
status=0
started=$SECONDS
elapsed() { echo "$((SECONDS - started)) s"; }

if [ "$#" -gt 0 ] || [ "${TC_TEST_PARALLEL:-1}" = 0 ]; then
    # One `cargo test`, its binaries one after another, one Azurite.
    # shellcheck source=scripts/azurite.sh
    source scripts/azurite.sh start >/dev/null
    cargo test --no-fail-fast "$@" 2>&1 | tee "$logs/cargo.log" || status=$?
else
    # The builds start first; Azurite installs (npm) and starts meanwhile.
    cargo test --no-run >"$logs/build.log" 2>&1 &
    build_pid=$!
    package_pid=
    if [ "$TC_TEST_PACKAGE" = 1 ]; then
        # The package check's build, in its own target folder (TC_PACKAGE_TARGET_DIR, which the
        # package check passes on to its own scripts/package.sh run).
        export TC_PACKAGE_TARGET_DIR="$root/target/package"
        # Niced: it takes the CPU the test build and then the tests leave idle.
        TC_PACKAGE_PROFILE=package-check TC_PACKAGE_OUT="$logs/package" \
            nice -n 10 bash scripts/package.sh >"$logs/package-build.log" 2>&1 &
        package_pid=$!
    fi
    # shellcheck source=scripts/azurite.sh
    source scripts/azurite.sh start >/dev/null
    long_cs="$(AZURITE_INSTANCE=long bash scripts/azurite.sh start | sed -n 's/^TC_TEST_AZURE_CONNECTION=//p')"
    [ -n "${TC_TEST_AZURE_CONNECTION:-}" ] && [ -n "$long_cs" ] || { echo "scripts/test.sh: an Azurite instance did not start" >&2; exit 1; }
    wait "$build_pid" || status=$?
    cat "$logs/build.log"
    # The lanes start without waiting for the package build: it goes on beside the first
    # tests, and the package check's own scripts/package.sh run waits for it on cargo's lock.
    if [ "$status" -eq 0 ]; then
        echo "scripts/test.sh: built in $(elapsed); running the two lanes" >&2
        # The suite's longest tests (1-2 minutes each on 2 cores): run in name order among the
        # rest, they made the run's tail.
        long=(job_kill:: package:: functions_harness::airports_import crash_kill::
            read_your_writes::a_consistent_lookup_returns_every multi_process_kill:: readme::
            jobs::a_verify_job_counts)
        skip_long="${long[*]/#/--skip }"
        # Each part: name|its Azurite|its cargo test arguments. A lane runs its parts in order.
        lane_long=(
            "suite-long|$long_cs|--test suite -- --test-threads $threads ${long[*]}"
            "randomized|$long_cs|--test randomized"
        )
        lane_main=(
            "suite|$TC_TEST_AZURE_CONNECTION|--test suite -- --test-threads $threads $skip_long"
            "unit|$TC_TEST_AZURE_CONNECTION|--lib --bins"
            "faults|$TC_TEST_AZURE_CONNECTION|--test faults"
            "doc|$TC_TEST_AZURE_CONNECTION|--doc"
        )
        run_lane() {
            local part name rest s
            for part in "$@"; do
                name="${part%%|*}"
                rest="${part#*|}"
                s=0
                # shellcheck disable=SC2086 # the arguments are split on purpose
                TC_TEST_AZURE_CONNECTION="${rest%%|*}" cargo test --no-fail-fast ${rest#*|} >"$logs/$name.log" 2>&1 || s=$?
                echo "$s" >"$logs/$name.rc"
            done
        }
        run_lane "${lane_long[@]}" &
        long_pid=$!
        run_lane "${lane_main[@]}" &
        main_pid=$!
        # Print each part as it ends.
        pending=()
        for part in "${lane_long[@]}" "${lane_main[@]}"; do pending+=("${part%%|*}"); done
        while [ "${#pending[@]}" -gt 0 ]; do
            left=()
            for name in "${pending[@]}"; do
                if [ -f "$logs/$name.rc" ]; then
                    rc="$(cat "$logs/$name.rc")"
                    echo
                    echo "==== scripts/test.sh: $name (exit $rc, at $(elapsed)) ===="
                    cat "$logs/$name.log"
                    [ "$rc" -eq 0 ] || status="$rc"
                else
                    left+=("$name")
                fi
            done
            pending=("${left[@]+"${left[@]}"}")
            [ "${#pending[@]}" -eq 0 ] || sleep 1
        done
        # The lanes only: Azurite, started by this shell, is a background job too.
        wait "$long_pid" "$main_pid"
        echo "scripts/test.sh: both lanes ended after $(elapsed)" >&2
    fi
    if [ -n "$package_pid" ] && ! wait "$package_pid"; then
        # The package check reports it too (it runs scripts/package.sh again).
        echo "scripts/test.sh: the package build failed:" >&2
        tail -20 "$logs/package-build.log" >&2
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
