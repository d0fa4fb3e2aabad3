#!/usr/bin/env bash
# Single-record write throughput, an older version against this tree, side by side (numbers
# recorded in docs/BENCHMARKS.md, "Writes over HTTP"). Black-box: each version runs as `serve`
# and the load generator (`table-catalog bench writes` of this tree; it speaks only HTTP) sends
# `POST /api/records?upsert=true`, one new synthetic airport per request, from C clients for S
# seconds. Scenarios, each on fresh storage:
#   1. embedded store, full durability (fsync per commit), 1 process;
#   2. Azurite (private, in-memory), 1 process;
#   3. Azurite, 3 processes on one catalog, requests round-robin.
# Each cell also reports the CPU time (user + system) the serve processes used during the load,
# per acknowledged write (the load generator shares the machine, so CPU is often the limit),
# and on Azurite the CPU time Azurite used (its one JavaScript thread serves every request: at
# about 100% of a core, its CPU per write is the throughput),
# and the storage requests the serves made (their `status` counters, summed over processes,
# from before the load until the writes are applied) per acknowledged write.
#
#   scripts/bench_writes.sh            # compares with main~
#   scripts/bench_writes.sh 67a5551    # or any commit / ref
#
# It builds release binaries of REF (exported with `git archive` into a temporary folder, so no
# git metadata changes) and of the working tree, with
# the same $CARGO_TARGET_DIR so dependencies build once. Settings (environment): WRITES_CLIENTS
# (16), WRITES_SECONDS (20), WRITES_SCENARIOS (embedded,azurite1,azurite3), WRITES_OLD_BIN (a
# release binary of REF built earlier, instead of building it; a build of REF made by an earlier
# run is kept in $CARGO_TARGET_DIR/bench-writes/ and reused), BENCH_OUT (also write the report
# there). Raw JSON stays in $CARGO_TARGET_DIR/bench-writes/. Nothing here asserts
# on time; the numbers depend on the machine and its load.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
# shellcheck source=bench_lib.sh
. scripts/bench_lib.sh

ref="${1:-main~}"
old_sha="$(git rev-parse --verify --quiet "$ref^{commit}")" || { echo "bench_writes.sh: '$ref' is not a commit" >&2; exit 2; }
clients="${WRITES_CLIENTS:-16}"
seconds="${WRITES_SECONDS:-20}"
scenarios="${WRITES_SCENARIOS:-embedded,azurite1,azurite3}"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
out_dir="$target_dir/bench-writes"
mkdir -p "$out_dir"
work="$(mktemp -d)"
old_tree="$work/old-tree"
log() { echo "bench_writes: $*" >&2; }
cleanup() {
    bench_cleanup
    rm -rf "$work"
}
trap cleanup EXIT

# --- builds ------------------------------------------------------------------------------------
# Both builds share the target dir (dependencies build once). Cargo keys a package's build by
# name and version, not by folder, so the old tree gets another version: otherwise cargo would
# take it for the working tree's build and hand back the same binary.
log "building the working tree"
cargo build --release --quiet
cp "$target_dir/release/table-catalog" "$work/new"
cached_old="$out_dir/table-catalog-$old_sha" # each old build is kept, and reused by later runs
if [ -z "${WRITES_OLD_BIN:-}" ] && [ -x "$cached_old" ]; then WRITES_OLD_BIN="$cached_old"; fi
if [ -n "${WRITES_OLD_BIN:-}" ]; then
    # A release binary of REF built earlier (saves a full build on a busy machine).
    log "using $WRITES_OLD_BIN as the build of $ref ($old_sha)"
    cp "$WRITES_OLD_BIN" "$work/old"
else
    log "building $ref ($old_sha) in a temporary folder"
    mkdir -p "$old_tree"
    git archive "$old_sha" | tar -x -C "$old_tree"
    sed -i '0,/^version = .*/s//version = "0.0.0-bench-old"/' "$old_tree/Cargo.toml"
    (cd "$old_tree" && CARGO_TARGET_DIR="$target_dir" cargo build --release --quiet)
    cp "$target_dir/release/table-catalog" "$work/old"
    "$work/old" --version | grep -q bench-old || { echo "bench_writes.sh: the old build did not produce the old binary" >&2; exit 1; }
    cp "$work/old" "$cached_old"
    cargo build --release --quiet # puts the working tree's binary back in place for other scripts
fi
new_sha="$(git rev-parse --short=12 HEAD)"
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then new_sha="$new_sha (+ uncommitted changes)"; fi

schema=(--index-keys icao,iata,lid --row-key name)
ticks() { # CPU time (user + system, clock ticks) of the processes PIDS..., summed
    local pid total=0
    for pid in "$@"; do
        total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat")))
    done
    echo "$total"
}
seconds_since() { # TICKS_NOW TICKS_BEFORE -> CPU seconds between them
    awk -v a="$1" -v b="$2" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f\n", (a - b) / hz }'
}
load() { # label urls(comma-separated); also records the CPU seconds of the serves and of Azurite during the load
    local before az_before=""
    before="$(ticks "${BENCH_PIDS[@]}")"
    if [ -n "${BENCH_AZURITE_PID:-}" ]; then az_before="$(ticks "$BENCH_AZURITE_PID")"; fi
    bench_requests_total "$2" "$out_dir/$1.requests-before.json"
    "$work/new" bench writes --urls "$2" --clients "$clients" --seconds "$seconds" --seed 1 >"$out_dir/$1.json"
    seconds_since "$(ticks "${BENCH_PIDS[@]}")" "$before" >"$out_dir/$1.cpu"
    rm -f "$out_dir/$1.azcpu"
    if [ -n "$az_before" ]; then seconds_since "$(ticks "$BENCH_AZURITE_PID")" "$az_before" >"$out_dir/$1.azcpu"; fi
    # Requests until the writes are applied (at most 120 s more), so each write's apply counts.
    bench_requests_total "$2" "$out_dir/$1.requests-after.json" 120
    cat "$out_dir/$1.json" >&2
}
stop() { # serves, gracefully (in-flight requests finish), killed after 10 s (the stores are thrown away)
    local pid
    for pid in "${BENCH_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for _ in $(seq 1 100); do
        local alive=0
        for pid in "${BENCH_PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.1
    done
    for pid in "${BENCH_PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    bench_stop_serves
}

load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
for version in old new; do
    bin="$work/$version"
    if [[ ",$scenarios," == *",embedded,"* ]]; then
        log "$version: embedded store, 1 process"
        bench_serve "$bin" "$out_dir/serve-$version-embedded.log" --name benchw "${schema[@]}" \
            --local-path "$work/store-$version" --durability full
        load "$version-embedded" "$BENCH_URL"
        stop
    fi
    if [[ ",$scenarios," == *",azurite1,"* ]]; then
        log "$version: Azurite, 1 process"
        bench_azurite_start "$work/azurite-$version-1"
        bench_serve "$bin" "$out_dir/serve-$version-azurite1.log" --name benchw "${schema[@]}"
        load "$version-azurite1" "$BENCH_URL"
        stop
        bench_azurite_stop
    fi
    if [[ ",$scenarios," == *",azurite3,"* ]]; then
        log "$version: Azurite, 3 processes on one catalog"
        bench_azurite_start "$work/azurite-$version-3"
        urls=()
        for i in 1 2 3; do
            bench_serve "$bin" "$out_dir/serve-$version-azurite3-$i.log" --name benchw "${schema[@]}"
            urls+=("$BENCH_URL")
        done
        load "$version-azurite3" "$(IFS=,; echo "${urls[*]}")"
        stop
        bench_azurite_stop
    fi
done
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"

export BENCH_OUT_DIR="$out_dir" BENCH_OLD="$ref ($(git rev-parse --short=12 "$old_sha"))" BENCH_NEW="$new_sha" \
    BENCH_SCENARIOS="$scenarios" BENCH_CLIENTS="$clients" BENCH_SECONDS="$seconds" \
    BENCH_LOAD="$load_before / $load_after" BENCH_AZURITE="$(cat .azurite/.version 2>/dev/null || echo '?')"
report="$(python3 - <<'EOF'
import datetime, json, os
e = os.environ
names = {"embedded": "embedded store, full durability, 1 process",
         "azurite1": f"Azurite {e['BENCH_AZURITE']}, 1 process",
         "azurite3": f"Azurite {e['BENCH_AZURITE']}, 3 processes, one catalog"}
def cell(version, scenario):
    path = os.path.join(e["BENCH_OUT_DIR"], f"{version}-{scenario}.json")
    if not os.path.exists(path):
        return "not run"
    j = json.load(open(path))
    failed = f", **{j['failed']} failed**" if j["failed"] else ""
    cpu_path = path[:-len(".json")] + ".cpu"
    cpu = ""
    if os.path.exists(cpu_path) and j["acked"]:
        cpu = f", serve CPU {float(open(cpu_path).read()) / j['acked'] * 1e6:.0f} µs/write"
    az_path = path[:-len(".json")] + ".azcpu"
    if os.path.exists(az_path) and j["acked"]:
        az = float(open(az_path).read())
        cpu += f", Azurite CPU {az / j['acked'] * 1e6:.0f} µs/write ({az / j['seconds'] * 100:.0f}% of a core)"
    reqs = ""
    before, after = (path[:-len(".json")] + f".requests-{w}.json" for w in ("before", "after"))
    if os.path.exists(before) and os.path.exists(after) and j["acked"]:
        b, a = json.load(open(before)), json.load(open(after))
        if a["total"] > b["total"]:
            per = lambda k: (a[k] - b[k]) / j["acked"]
            ops = sorted(((a["by_op"][o] - b["by_op"].get(o, 0)) / j["acked"], o) for o in a["by_op"])
            top = ", ".join(f"{o} {n:.2f}" for n, o in reversed(ops[-4:]))
            reqs = f", {per('total'):.2f} storage requests/write ({per('table'):.2f} table + {per('queue'):.2f} queue; {top})"
    return f"**{j['writes_per_s']:.0f}/s**, ack p50 {j['ack_p50_ms']:.1f} ms, p99 {j['ack_p99_ms']:.1f} ms ({j['acked']} acked{failed}{cpu}{reqs})"
print(f"Writes over HTTP: `POST /api/records?upsert=true`, {e['BENCH_CLIENTS']} clients, {e['BENCH_SECONDS']} s per cell, "
      f"{datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}, {os.cpu_count()} cores, "
      f"load average {e['BENCH_LOAD']} (before / after).\n")
print(f"| scenario | old: {e['BENCH_OLD']} | new: {e['BENCH_NEW']} |")
print("| --- | --- | --- |")
for s in e["BENCH_SCENARIOS"].split(","):
    print(f"| {names.get(s, s)} | {cell('old', s)} | {cell('new', s)} |")
EOF
)"
echo "$report"
if [ -n "${BENCH_OUT:-}" ]; then echo "$report" >"$BENCH_OUT"; fi
log "raw results in $out_dir"
