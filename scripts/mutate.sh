#!/usr/bin/env bash
# Kept mutants: each step of the ordering argument (docs/ARCHITECTURE.md, "Order") broken on
# purpose, once, as a small patch under scripts/mutants/, with the tests that must fail.
# This script applies one mutant to a scratch copy of the work tree (the real work tree is
# never touched), runs the tests recorded for it, and says whether they caught it.
#
# Usage:
#   scripts/mutate.sh NAME [--test TARGET[:FILTER]]... [--cmd COMMAND] [--keep-going]
#   scripts/mutate.sh NAME SEEDS                the deterministic simulator instead of the
#                                               tests: SEEDS is COUNT (seeds 1..COUNT) or
#                                               FROM-TO; stops at the first failing seed and
#                                               prints it (scripts/sim.sh)
#   scripts/mutate.sh --all [--keep-going]      every mutant; exit 1 if any survived
#   scripts/mutate.sh --check                   every patch still applies (nothing built)
#   scripts/mutate.sh --list                    mutants and their recorded tests
#   scripts/mutate.sh --baseline                the recorded tests pass without any mutant
#
# A mutant is scripts/mutants/NAME.patch: a header of `#` lines (ignored by `git apply` and
# `patch`), then a unified diff against the repository root. Header fields:
#   # breaks: the step of the argument the patch breaks (free text, may span lines)
#   # test: TARGET [FILTER]   a test that must fail: `cargo test --test TARGET -- FILTER`
#                             (TARGET `lib`: the library's unit tests, `cargo test --lib`)
#                             (FILTER: a test name or substring; none = the whole target).
#                             One line per test; they run in order.
# scripts/mutants/README.md lists every mutant with the test that caught it and the time.
# scripts/mutants/survivors/NAME.patch: mutants no test catches, with the reason in a
# `# survives:` header; --check covers them, --all does not (run them by name).
#
# Options:
#   --test TARGET[:FILTER]  run this test instead of the recorded ones (repeatable)
#   --cmd COMMAND           run COMMAND (bash -c, in the scratch copy, mutant applied) instead
#                           of the tests: caught when it exits non-zero. Also TC_MUTANT_CMD.
#                           E.g. the deterministic simulator or the randomized checker:
#                             scripts/mutate.sh no-stamp --cmd \
#                               'cargo test --release --test randomized -- checker::randomized'
#   --keep-going            run every recorded test even after one caught the mutant (to
#                           list all the tests that catch it)
#
# Exit status (one mutant): 1 when CAUGHT (a test failed or timed out), 0 when it SURVIVED,
# 2 when it could not be tried (the patch does not apply, or the mutant does not build).
# With --all: 0 when every mutant was caught, 1 when any survived, 2 on an error.
# With --baseline: 0 when every recorded test passes on the unmutated copy, 1 otherwise.
#
# Environment:
#   TC_MUTANT_TARGET   cargo target directory, reused across runs so that a second mutant
#                      rebuilds only the crate (default: target/mutants under the repo)
#   TC_MUTANT_SCRATCH  the scratch copy (default: $TC_MUTANT_TARGET/../mutant-src, a
#                      fixed path so cargo's fingerprints stay valid across runs)
#   TC_MUTANT_TIMEOUT  seconds per test command (default 900); a timeout counts as caught
#   TC_MUTANT_CMD      as --cmd
#   TC_MUTANT_FEATURES cargo features for the recorded tests (default testing)
#   CARGO              cargo binary (default cargo)
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
mutants_dir="$repo/scripts/mutants"
target="${TC_MUTANT_TARGET:-$repo/target/mutants}"
mkdir -p "$target"
target="$(cd "$target" && pwd)"
scratch="${TC_MUTANT_SCRATCH:-$(dirname "$target")/mutant-src}"
timeout_s="${TC_MUTANT_TIMEOUT:-900}"
features="${TC_MUTANT_FEATURES:-testing}"
cargo="${CARGO:-cargo}"

# Cargo's selector of a recorded test target: `lib` is the library's unit tests; any other
# name is a suite module, `tests/BINARY/NAME.rs`, selected as `--test BINARY`.
target_arg() {
    if [ "$1" = lib ]; then echo --lib; return; fi
    local f
    for f in "$repo"/tests/*/"$1".rs; do
        [ -f "$f" ] && { echo --test "$(basename "$(dirname "$f")")"; return; }
    done
    die "no test suite '$1' (tests/*/$1.rs)"
}

# The test filter of a recorded test: the suite's module path, then the recorded filter.
target_filter() {
    if [ "$1" = lib ]; then echo "$2"; else echo "$1::$2"; fi
}

die() {
    echo "mutate.sh: $*" >&2
    exit 2
}

# The header field FIELD of patch FILE, one value per line.
field() {
    sed -n "/^[^#]/q; s/^# $2: *//p" "$1"
}

# The patch of mutant $1 (kept, or a known survivor).
patch_of() {
    local p
    for p in "$mutants_dir/$1.patch" "$mutants_dir/survivors/$1.patch"; do
        [ -f "$p" ] && { printf '%s\n' "$p"; return 0; }
    done
    die "no mutant '$1' (scripts/mutants/$1.patch or scripts/mutants/survivors/$1.patch)"
}

list() {
    local p name
    for p in "$mutants_dir"/*.patch "$mutants_dir"/survivors/*.patch; do
        [ -f "$p" ] || continue
        name="$(basename "$p" .patch)"
        case "$p" in */survivors/*) name="$name (known survivor)" ;; esac
        printf '%s\n' "$name"
        field "$p" test | sed 's/^/    test: /'
    done
}

# The recorded tests of patch $1, as TARGET[:FILTER] lines.
recorded_tests() {
    field "$1" test | sed 's/ \+/:/'
}

check_all() {
    local p bad=0
    for p in "$mutants_dir"/*.patch "$mutants_dir"/survivors/*.patch; do
        [ -f "$p" ] || continue
        if git -C "$repo" apply --check "$p" 2>/dev/null; then
            echo "applies: $(basename "$p" .patch)"
        else
            echo "DOES NOT APPLY: $(basename "$p" .patch)"
            git -C "$repo" apply --check "$p" 2>&1 | sed 's/^/    /' || true
            bad=1
        fi
    done
    return "$bad"
}

# A fresh copy of the work tree (tracked and untracked, not ignored files, as they are now,
# uncommitted changes included) at $scratch. Every file gets the current time as its mtime
# (tar -m): cargo decides what to rebuild by mtimes, and a file restored with its old mtime
# after a mutant changed it would let cargo reuse the mutant's build.
copy_tree() {
    [ "$scratch" != / ] && [ -n "$scratch" ] || die "bad scratch path '$scratch'"
    rm -rf "$scratch"
    mkdir -p "$scratch"
    (cd "$repo" && git ls-files -z --cached --others --exclude-standard |
        tar --null --ignore-failed-read -T - -cf - 2>/dev/null) | tar -xmf - -C "$scratch" ||
        die "could not copy the work tree to $scratch"
    [ -f "$scratch/Cargo.toml" ] || die "could not copy the work tree to $scratch"
}

# Runs one command in the scratch copy, with the timeout; prints its time. Returns its status.
run_in_scratch() {
    local what="$1" cmd="$2" log="$3" start rc
    start=$(date +%s)
    set +e
    (cd "$scratch" && CARGO_TARGET_DIR="$target" timeout "$timeout_s" bash -c "$cmd") >"$log" 2>&1
    rc=$?
    set -e
    echo "  $what: exit $rc in $(($(date +%s) - start)) s (log: $log)" >&2
    return "$rc"
}

# Tries mutant $1 with the tests in the array `tests` (TARGET[:FILTER] each) or `cmd`.
# Prints the verdict line; returns 1 caught, 0 survived, 2 error.
try_mutant() {
    local name="$1" patch logdir rc t tgt filter caught="" started
    patch="$(patch_of "$name")" || return 2
    started=$(date +%s)
    logdir="$target/logs/$name"
    rm -rf "$logdir" && mkdir -p "$logdir"
    copy_tree
    # The scratch copy may lie inside this repository (the default, under target/): git would
    # then take it for a subdirectory of the repository and silently skip every path of the
    # patch (they are relative to the root). GIT_CEILING_DIRECTORIES keeps git from finding
    # the repository, so the patch applies to the copy as a plain patch; and a patch that
    # applied nothing is an error, never a mutant that "survived".
    if ! (cd "$scratch" && GIT_CEILING_DIRECTORIES="$(dirname "$scratch")" git apply -v --whitespace=nowarn "$patch") >"$logdir/apply.log" 2>&1 ||
        grep -q '^Skipped patch' "$logdir/apply.log" || ! grep -q '^Applied patch' "$logdir/apply.log"; then
        echo "mutant $name: ERROR: the patch does not apply to the copy ($logdir/apply.log)"
        return 2
    fi
    local -a run=()
    if [ -n "$cmd" ]; then
        run=("cmd")
    elif [ "${#tests[@]}" -gt 0 ]; then
        run=("${tests[@]}")
    else
        while IFS= read -r t; do
            [ -n "$t" ] && run+=("$t")
        done < <(recorded_tests "$patch")
    fi
    [ "${#run[@]}" -gt 0 ] || die "mutant '$name' records no test (a '# test:' header line)"
    # Each test's target must exist: `target_arg` dies in this shell, not in the `$( )`
    # subshells below (where a bad target went on to build and run every test).
    if [ -z "$cmd" ] && [ -z "$seeds" ]; then
        for t in "${run[@]}"; do target_arg "${t%%:*}" >/dev/null; done
    fi
    # Build first, so that a mutant that does not compile is an error, not "caught".
    if [ -n "$seeds" ]; then
        if ! run_in_scratch "build" "$cargo test --release --test randomized --no-run" "$logdir/build.log"; then
            echo "mutant $name: ERROR: does not build ($logdir/build.log)"
            return 2
        fi
    elif [ -z "$cmd" ]; then
        local -a targets=()
        for t in "${run[@]}"; do targets+=($(target_arg "${t%%:*}")); done
        if ! run_in_scratch "build" "$cargo test --features $features --no-run ${targets[*]}" "$logdir/build.log"; then
            echo "mutant $name: ERROR: does not build ($logdir/build.log)"
            return 2
        fi
    fi
    for t in "${run[@]}"; do
        if [ "$t" = cmd ]; then
            rc=0
            run_in_scratch "$cmd" "$cmd" "$logdir/cmd.log" || rc=$?
            t="--cmd '$cmd'"
        else
            tgt="${t%%:*}"
            filter=""
            [ "$t" != "$tgt" ] && filter="${t#*:}"
            rc=0
            run_in_scratch "$tgt${filter:+ $filter}" \
                "$cargo test --features $features $(target_arg "$tgt") -- $(target_filter "$tgt" "$filter")" "$logdir/$tgt${filter:+-$filter}.log" || rc=$?
            t="$tgt${filter:+ $filter}"
        fi
        if [ "$t" != "--cmd '$cmd'" ] && [ "$rc" -eq 0 ] && ! grep -q '^running [1-9]' "$logdir/$tgt${filter:+-$filter}.log"; then
            echo "mutant $name: ERROR: '$t' runs no test ($logdir/$tgt${filter:+-$filter}.log)"
            return 2
        fi
        if [ "$rc" -ne 0 ]; then
            [ "$rc" -eq 124 ] && t="$t (timed out after $timeout_s s)"
            caught="${caught:+$caught, }$t"
            [ "$keep_going" = 1 ] || break
        fi
    done
    if [ -n "$caught" ]; then
        echo "mutant $name: caught by $caught ($(($(date +%s) - started)) s)"
        return 1
    fi
    echo "mutant $name: SURVIVED ($(($(date +%s) - started)) s)"
    return 0
}

# Every recorded test of the kept mutants, on the unmutated copy: all must pass (else a
# "caught" verdict means nothing).
baseline() {
    local logdir t tgt filter rc failed=0
    local -a run=() targets=()
    logdir="$target/logs/baseline"
    rm -rf "$logdir" && mkdir -p "$logdir"
    copy_tree
    while IFS= read -r t; do
        run+=("$t")
        target_arg "${t%%:*}" >/dev/null # dies here on a bad target (not in the `$( )` below)
        targets+=($(target_arg "${t%%:*}"))
    done < <(for p in "$mutants_dir"/*.patch; do recorded_tests "$p"; done | sort -u)
    # Each target once (`--test suite` and `--lib` are named by many recorded tests).
    local -a unique=()
    mapfile -t unique < <(for t in "${run[@]}"; do target_arg "${t%%:*}"; done | sort -u)
    run_in_scratch "build" "$cargo test --features $features --no-run ${unique[*]}" "$logdir/build.log" ||
        die "the unmutated copy does not build ($logdir/build.log)"
    for t in "${run[@]}"; do
        tgt="${t%%:*}"
        filter=""
        [ "$t" != "$tgt" ] && filter="${t#*:}"
        rc=0
        run_in_scratch "$tgt${filter:+ $filter}" "$cargo test --features $features $(target_arg "$tgt") -- $(target_filter "$tgt" "$filter")" \
            "$logdir/$tgt${filter:+-$filter}.log" || rc=$?
        if [ "$rc" -ne 0 ]; then
            echo "baseline: FAILS without a mutant: $tgt${filter:+ $filter}"
            failed=1
        elif ! grep -q '^running [1-9]' "$logdir/$tgt${filter:+-$filter}.log"; then
            echo "baseline: runs no test: $tgt${filter:+ $filter}"
            failed=1
        fi
    done
    [ "$failed" = 1 ] || echo "baseline: every recorded test passes without a mutant (${#run[@]} tests)"
    return "$failed"
}

tests=()
cmd="${TC_MUTANT_CMD:-}"
keep_going=0
seeds=""
mode=""
name=""
while [ $# -gt 0 ]; do
    case "$1" in
        --all) mode=all ;;
        --check) mode=check ;;
        --list) mode=list ;;
        --baseline) mode=baseline ;;
        --keep-going) keep_going=1 ;;
        --test) shift; [ $# -gt 0 ] || die "--test needs TARGET[:FILTER]"; tests+=("$1") ;;
        --cmd) shift; [ $# -gt 0 ] || die "--cmd needs a command"; cmd="$1" ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -*) die "unknown option $1" ;;
        [0-9]*)
            [ -n "$name" ] || die "SEEDS comes after the mutant's name"
            case "$1" in
                *-*) from="${1%-*}"; to="${1#*-}" ;;
                *) from=1; to="$1" ;;
            esac
            [[ "$from" =~ ^[0-9]+$ && "$to" =~ ^[0-9]+$ && "$to" -ge "$from" ]] || die "SEEDS: COUNT or FROM-TO, got $1"
            seeds="$from-$to"
            cmd="SIM_STOP_AT_FIRST=1 scripts/sim.sh $from $((to - from + 1))" ;;
        *) [ -z "$name" ] || die "one mutant at a time (or --all)"; name="$1" ;;
    esac
    shift
done

case "$mode" in
    list) list; exit 0 ;;
    check) check_all; exit $? ;;
esac

# One run at a time: the scratch copy and the target directory are shared.
exec 9>"$target/.lock"
flock -n 9 || die "another mutate.sh run holds $target/.lock"

if [ "$mode" = baseline ]; then
    baseline
    exit $?
fi

if [ "$mode" = all ]; then
    [ -z "$name" ] || die "--all takes no mutant name"
    survived=0 errors=0
    summary=()
    for p in "$mutants_dir"/*.patch; do
        rc=0
        line="$(try_mutant "$(basename "$p" .patch)")" || rc=$?
        echo "$line"
        summary+=("$line")
        case "$rc" in 0) survived=1 ;; 1) ;; *) errors=1 ;; esac
    done
    echo
    printf '%s\n' "${summary[@]}"
    [ "$errors" = 0 ] || exit 2
    exit "$survived"
fi

[ -n "$name" ] || die "usage: scripts/mutate.sh NAME [SEEDS] [--test TARGET[:FILTER]]... [--cmd COMMAND] | --all | --check | --list"
rc=0
try_mutant "$name" || rc=$?
if [ -n "$seeds" ]; then
    # The simulator's summary: its failing seeds are listed in increasing order.
    grep -E '^sim: ' "$target/logs/$name/cmd.log" || true
fi
exit "$rc"
