#!/usr/bin/env bash
# Whole-table scans at scale (numbers recorded in docs/BENCHMARKS.md, "Whole-table scan:
# verify and export"): for each size, a synthetic catalog (scripts/gen_catalog.sh: RECORDS
# records, 3 x RECORDS index rows), then, one after another, each under `/usr/bin/time -v`:
#   - `verify --parallel 0`        the serial prefix scan in one process;
#   - `verify --parallel N`        a verify job with N workers in this process, N in PARALLEL;
#   - `export --output FILE`       every record once (serial; its line count is checked).
# Prints one Markdown table: wall time, index rows/s, CPU time (user + system; on 2 cores at
# most 2 x wall), peak RSS ("Maximum resident set size"), the RSS sampled at half of the run
# (equal to the peak when memory does not grow during the run), what each run counted
# (findings must be 0: the catalog is consistent) and the load average before the run.
#
#   scripts/bench_scan.sh local RECORDS...      # embedded store, e.g. local 83334 350000
#   scripts/bench_scan.sh azurite RECORDS...    # a private in-memory Azurite per size, e.g. azurite 34000
#
# Settings (environment): PARALLEL ("1 2 4 8"), SEGMENT (1000, entities per scan query),
# SEED (1), BENCH_OUT (also write the table there), TC_BIN (default: the release build,
# built here), STORES (embedded store only: keep the stores in this folder and reuse one that
# exists instead of importing again; default: a temporary folder). Uses $CARGO_TARGET_DIR.
# Run nothing else heavy meanwhile: the numbers are wall times on a shared machine.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
# shellcheck source=bench_lib.sh
. scripts/bench_lib.sh
usage() { echo "usage: scripts/bench_scan.sh local|azurite RECORDS..." >&2; exit 2; }
[ $# -ge 2 ] || usage
backend="$1"
shift
case "$backend" in local | azurite) ;; *) usage ;; esac
for n in "$@"; do [[ "$n" =~ ^[0-9]+$ ]] || usage; done
parallel="${PARALLEL:-1 2 4 8}"
segment="${SEGMENT:-1000}"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
TC_BIN="$(bench_release_bin "$target_dir")"
export TC_BIN
work="$(mktemp -d)"
trap 'bench_cleanup; rm -rf "$work"' EXIT
stores="${STORES:-$work}"
log() { echo "bench_scan: $*" >&2; }

# sample_rss PID FILE: appends "seconds rss_kb" of PID's child (the catalog process under
# /usr/bin/time) every 0.5 s until PID exits.
sample_rss() {
    local pid="$1" file="$2" child="" start rss
    start="$(date +%s.%N)"
    : >"$file"
    while kill -0 "$pid" 2>/dev/null; do
        [ -n "$child" ] || child="$(pgrep -P "$pid" | head -1 || true)"
        if [ -n "$child" ]; then
            rss="$(awk '/^VmRSS/ {print $2}' "/proc/$child/status" 2>/dev/null || true)"
            [ -z "$rss" ] || awk -v now="$(date +%s.%N)" -v start="$start" -v rss="$rss" 'BEGIN { printf "%.2f %s\n", now - start, rss }' >>"$file"
        fi
        sleep 0.5
    done
}

# run LABEL ROWS ARGS...: runs `table-catalog ARGS...` under /usr/bin/time -v and prints a
# table row. Reads what was counted from the command's last JSON line on stderr.
run() {
    local label="$1" rows_expected="$2" status=0 load_before pid
    shift 2
    log "$label: table-catalog $*"
    load_before="$(cut -d' ' -f1 /proc/loadavg)"
    /usr/bin/time -v -o "$work/time" "$TC_BIN" "${catalog[@]}" "$@" >"$work/out" 2>"$work/err" &
    pid=$!
    sample_rss "$pid" "$work/rss" &
    wait "$pid" || status=$?
    wait
    if [ "$status" -ne 0 ]; then
        log "$label: exit status $status"
        tail -5 "$work/err" >&2
    fi
    mkdir -p "$target_dir/bench-scan" && cp "$work/rss" "$target_dir/bench-scan/$(echo "$label" | tr -c "a-z0-9\n" "_").rss"
    python3 - "$label" "$rows_expected" "$status" "$load_before" "$work/time" "$work/err" "$work/rss" <<'EOF'
import json, re, sys
label, expected, status, load, time_file, err_file, rss_file = sys.argv[1:]
t = open(time_file).read()
wall = re.search(r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)", t)
wall_s = int(wall.group(1) or 0) * 3600 + int(wall.group(2)) * 60 + float(wall.group(3))
rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", t).group(1))
cpu_s = sum(float(re.search(rf"{k} time \(seconds\): ([\d.]+)", t).group(1)) for k in ("User", "System"))
samples = [tuple(map(float, l.split())) for l in open(rss_file) if l.strip()]
half = [kb for s, kb in samples if s <= wall_s / 2]
half_mib = f"{half[-1] / 1024:.1f}" if half else "-"
lines = [l for l in open(err_file).read().splitlines() if l.startswith("{")]
counted = json.loads(lines[-1]) if lines else {}
rows = counted.get("rows", int(expected))
findings = counted.get("findings", 0)
if isinstance(findings, dict):
    findings = sum(findings.values())
what = f"{rows:,} rows, {findings} findings" if "exported" not in counted else f"{counted['exported']:,} records"
if int(status) != 0:
    what += f", exit {status}"
print(f"| {label} | {wall_s:.1f} | {rows / wall_s:,.0f} | {cpu_s:.1f} | {rss_kb / 1024:.1f} | {half_mib} | {what} | {load} |")
EOF
}

{
    echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(awk '/MemTotal/ {print $2, $3}' /proc/meminfo); commit $(git rev-parse --short HEAD); $(date -u '+%Y-%m-%d %H:%M UTC'); backend $backend; segment $segment"
    echo
    echo "| run | wall s | index rows/s | CPU s | peak RSS MiB | RSS MiB at ½ run | counted | load before |"
    echo "|---|---|---|---|---|---|---|---|"
} | tee "$work/table"

for records in "$@"; do
    rows=$((records * 3))
    name="scan$records"
    catalog=(--name "$name")
    if [ "$backend" = azurite ]; then
        bench_azurite_start "$work/azurite-$records"
    else
        catalog+=(--local-path "$stores/store-$records")
    fi
    if [ "$backend" = azurite ] || [ ! -s "$stores/store-$records/catalog.sqlite3" ]; then
        log "generating $records records ($rows index rows)"
        scripts/gen_catalog.sh "$records" "${catalog[@]}" --durability process >&2
    else
        log "reusing $stores/store-$records"
    fi
    "$TC_BIN" "${catalog[@]}" recover >&2
    pending="$("$TC_BIN" "${catalog[@]}" status | python3 -c 'import json,sys; print(json.load(sys.stdin)["pending"])')"
    [ "$pending" = 0 ] || { log "$pending entries still pending after recover"; exit 1; }
    {
        run "$backend, $rows rows: verify --parallel 0" "$rows" verify --parallel 0 --segment "$segment"
        for p in $parallel; do
            run "$backend, $rows rows: verify --parallel $p" "$rows" verify --parallel "$p" --segment "$segment"
        done
        run "$backend, $rows rows: export" "$rows" export --segment "$segment" --output "$work/export.jsonl"
        exported="$(wc -l <"$work/export.jsonl")"
        [ "$exported" = "$records" ] || log "export wrote $exported records, expected $records"
        rm -f "$work/export.jsonl"
    } | tee -a "$work/table"
    if [ "$backend" = azurite ]; then
        bench_azurite_stop
    fi
done
if [ -n "${BENCH_OUT:-}" ]; then
    cp "$work/table" "$BENCH_OUT"
fi
