#!/usr/bin/env bash
# Benchmarks on Azurite, end to end: TableCatalog (release build) against the Python reference
# (az-table-catalog==1.0.1), same Azurite instance, same machine, one run.
#
#   scripts/bench_azurite.sh                 # prints a Markdown report on stdout
#   BENCH_OUT=report.md scripts/bench_azurite.sh
#
# What it does:
#   1. starts a private, in-memory Azurite (the pinned version of scripts/azurite.sh, installed
#      into .azurite/ if needed) on free loopback ports, and stops it on exit;
#   2. builds the release binary and the Python venv (scripts/python_env.sh);
#   3. ours: `table-catalog import` of data/airports.csv (all 28,403 airports);
#   4. the reference: insert() of a sample of REF_RECORDS airports, one call each, then query()
#      lookups by icao of the same sample (tests/python/ref_catalog.py bench); the sample is
#      saved as CSV;
#   5. ours: the same sample imported into a catalog of its own, so that lookups of the same
#      records are also measured on a table of the same size as the reference's (Azurite
#      answers a PartitionKey query by scanning the whole table: latency grows with the table,
#      whoever asks);
#   6. ours: `serve` + `table-catalog bench` lookups by icao, on the full catalog (all airports,
#      concurrency 1 and 8; the sample) and on the sample catalog (the sample);
#   7. control: the reference's query() on our full catalog (it reads our rows), same sample;
#   8. prints machine facts and a table. Raw results are kept in target/bench-azurite/
#      (under $CARGO_TARGET_DIR when that is set).
#
# Settings (environment): BENCH_REQUESTS (5000) lookups of all airports, REF_RECORDS (2000),
# REF_LOOKUPS (2000) lookups of the sample, per client. Nothing here asserts on time; the
# numbers depend on the machine and its load (the report records the load average).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"

REQUESTS="${BENCH_REQUESTS:-5000}"
REF_RECORDS="${REF_RECORDS:-2000}"
REF_LOOKUPS="${REF_LOOKUPS:-2000}"
DATA="$root/data/airports.csv"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
out_dir="$target_dir/bench-azurite"
mkdir -p "$out_dir"
log() { echo "bench_azurite: $*" >&2; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
now() { date +%s.%N; }

azurite_pid=""
serve_pid=""
cleanup() {
    if [ -n "$serve_pid" ]; then kill "$serve_pid" 2>/dev/null; wait "$serve_pid" 2>/dev/null || true; fi
    if [ -n "$azurite_pid" ]; then kill "$azurite_pid" 2>/dev/null; wait "$azurite_pid" 2>/dev/null || true; fi
}
trap cleanup EXIT

# --- 1. Azurite (private instance: not the one scripts/azurite.sh shares with the tests) -------
scripts/azurite.sh install
azurite_bin="$root/.azurite/node_modules/.bin/azurite"
tport="$(free_port)"; qport="$(free_port)"; bport="$(free_port)"
"$azurite_bin" --inMemoryPersistence --silent --skipApiVersionCheck --loose --disableTelemetry \
    --blobHost 127.0.0.1 --queueHost 127.0.0.1 --tableHost 127.0.0.1 \
    --blobPort "$bport" --queuePort "$qport" --tablePort "$tport" </dev/null >"$out_dir/azurite.log" 2>&1 &
azurite_pid=$!
for _ in $(seq 1 300); do
    if port_open "$tport" && port_open "$qport"; then break; fi
    kill -0 "$azurite_pid" 2>/dev/null || { cat "$out_dir/azurite.log" >&2; exit 1; }
    sleep 0.1
done
account=devstoreaccount1
key="Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==" # public emulator key
export AZURE_STORAGE_CONNECTION_STRING="DefaultEndpointsProtocol=http;AccountName=$account;AccountKey=$key;TableEndpoint=http://127.0.0.1:$tport/$account;QueueEndpoint=http://127.0.0.1:$qport/$account;"
export TC_PY_CONNECTION="$AZURE_STORAGE_CONNECTION_STRING"
unset AzureWebJobsStorage TABLE_CATALOG_NAME TABLE_CATALOG_INDEX_KEYS TABLE_CATALOG_ROW_KEY TABLE_CATALOG_WAL_NAME TABLE_CATALOG_QUEUE
log "azurite $(cat .azurite/.version) pid $azurite_pid on table port $tport"

# --- 2. builds ---------------------------------------------------------------------------------
log "cargo build --release"
cargo build --release --quiet
bin="$target_dir/release/table-catalog"
py="$(scripts/python_env.sh --print)"
load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
stamp="$(date +%s)"
ours="bench${stamp}"
small="bench${stamp}s"
refname="ref${stamp}"
keys=(--index-keys icao,iata,lid --row-key name)

import() { # catalog file log -> prints wall seconds
    local t0 t1
    t0=$(now)
    "$bin" --name "$1" "${keys[@]}" import --file "$2" 2>"$3"
    t1=$(now)
    cat "$3" >&2
    python3 -c "print(f'{$t1 - $t0:.2f}')"
}

# --- 3. ours: import of the whole file ---------------------------------------------------------
log "ours: import $DATA"
import_wall="$(import "$ours" "$DATA" "$out_dir/import.log")"
"$bin" --name "$ours" verify >"$out_dir/verify.json"

# --- 4. the reference --------------------------------------------------------------------------
log "reference: insert $REF_RECORDS airports one by one, then $REF_LOOKUPS lookups"
"$py" tests/python/ref_catalog.py --table "$refname" --wal "${refname}wal" "${keys[@]}" \
    bench --file "$DATA" --records "$REF_RECORDS" --lookups "$REF_LOOKUPS" --field icao --sample-out "$out_dir/sample.csv" \
    >"$out_dir/reference.json"
cat "$out_dir/reference.json" >&2

# --- 5. ours: the same sample, in a catalog of its own -----------------------------------------
log "ours: import the reference's sample"
small_wall="$(import "$small" "$out_dir/sample.csv" "$out_dir/import_sample.log")"

# --- 6. ours: lookups through serve ------------------------------------------------------------
serve() { # catalog
    local port
    port="$(free_port)"
    "$bin" --name "$1" serve --listen "127.0.0.1:$port" 2>"$out_dir/serve-$1.log" &
    serve_pid=$!
    for _ in $(seq 1 300); do
        curl -fsS "http://127.0.0.1:$port/api/health" >/dev/null 2>&1 && break
        kill -0 "$serve_pid" 2>/dev/null || { cat "$out_dir/serve-$1.log" >&2; exit 1; }
        sleep 0.1
    done
    url="http://127.0.0.1:$port"
}
stop_serve() { kill "$serve_pid" 2>/dev/null; wait "$serve_pid" 2>/dev/null || true; serve_pid=""; }
bench() { # catalog file requests concurrency output
    # `--name` of an existing catalog: the CLI opens a catalog before running any command,
    # `bench` included (it only needs the URL), and fails on a name without a stored schema.
    "$bin" --name "$1" bench --url "$url" --file "$2" --field icao --requests "$3" --concurrency "$4" >"$5"
    cat "$5" >&2
}
log "ours: lookups by icao on the full catalog"
serve "$ours"
bench "$ours" "$DATA" 200 1 "$out_dir/warmup.json"
bench "$ours" "$DATA" "$REQUESTS" 1 "$out_dir/lookups_all.json"
bench "$ours" "$DATA" "$REQUESTS" 8 "$out_dir/lookups_all_c8.json"
bench "$ours" "$out_dir/sample.csv" "$REF_LOOKUPS" 1 "$out_dir/lookups_sample_full.json"
stop_serve
log "ours: lookups by icao on the sample catalog"
serve "$small"
bench "$small" "$out_dir/sample.csv" 200 1 "$out_dir/warmup_small.json"
bench "$small" "$out_dir/sample.csv" "$REF_LOOKUPS" 1 "$out_dir/lookups_sample_small.json"
stop_serve

# --- 7. control: the reference's query() on our full catalog -----------------------------------
log "reference: lookups of the sample on our full catalog"
"$py" tests/python/ref_catalog.py --table "$ours" --wal "${ours}ref" "${keys[@]}" \
    lookups --file "$out_dir/sample.csv" --lookups "$REF_LOOKUPS" --field icao >"$out_dir/reference_on_full.json"
cat "$out_dir/reference_on_full.json" >&2
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"

# --- 8. report ---------------------------------------------------------------------------------
commit="$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then commit="$commit (+ uncommitted changes)"; fi
export BENCH_OUT_DIR="$out_dir" BENCH_IMPORT_WALL="$import_wall" BENCH_SMALL_WALL="$small_wall" BENCH_COMMIT="$commit" \
    BENCH_LOAD_BEFORE="$load_before" BENCH_LOAD_AFTER="$load_after" BENCH_AZURITE="$(cat .azurite/.version)" \
    BENCH_RUSTC="$(rustc --version)" BENCH_PY="$("$py" --version 2>&1)"
report="$(python3 - <<'EOF'
import datetime, json, os, platform, re
e = os.environ
d = e["BENCH_OUT_DIR"]
j = lambda n: json.load(open(os.path.join(d, n)))
ref, ref_full, ver = j("reference.json"), j("reference_on_full.json"), j("verify.json")
all1, all8, s_full, s_small = j("lookups_all.json"), j("lookups_all_c8.json"), j("lookups_sample_full.json"), j("lookups_sample_small.json")
def imported(log):
    line = next(l for l in open(os.path.join(d, log)) if l.startswith("imported"))
    return int(re.match(r"imported (\d+) of", line).group(1)), line.strip()
n_all, line_all = imported("import.log")
n_small, _ = imported("import_sample.log")
wall_all, wall_small = float(e["BENCH_IMPORT_WALL"]), float(e["BENCH_SMALL_WALL"])
import csv
sample = list(csv.DictReader(open(os.path.join(d, "sample.csv"), newline="", encoding="utf-8")))
ours_small_rows = sum(1 for r in sample for k in ("icao", "iata", "lid") if r[k])
ref_rows = 3 * len(sample)  # the reference writes every index field, empty ones included
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown")
mem = next((l.split(":", 1)[1].strip() for l in open("/proc/meminfo") if l.startswith("MemTotal")), "unknown")
f = lambda x, n=1: "n/a" if x is None else f"{x:.{n}f}"
ours_lat = lambda b: f"p50 **{f(b['p50_ms'])} ms**, p99 **{f(b['p99_ms'])} ms**, {f(b['lookups_per_s'], 0)}/s ({b['lookups']}, {b['not_found']} not found)"
ref_lat = lambda b: f"p50 **{f(b['lookup_p50_ms'])} ms**, p99 **{f(b['lookup_p99_ms'])} ms**, {f(b['lookups_per_s'], 0)}/s ({b['lookups']}, {b['not_found']} not found)"
print(f"""## Azurite: TableCatalog vs. the Python reference

`scripts/bench_azurite.sh`, {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}. One Azurite instance, one machine, one run.

| machine | |
| --- | --- |
| nproc | {os.cpu_count()} |
| CPU | {cpu} |
| memory | {mem} |
| OS | {platform.system()} {platform.release()} |
| Azurite | {e['BENCH_AZURITE']} (in-memory, loopback, same machine) |
| TableCatalog | commit {e['BENCH_COMMIT']}, release build, {e['BENCH_RUSTC']} |
| reference | az-table-catalog 1.0.1, azure-data-tables 12.7.0, {e['BENCH_PY']} |
| load average (1/5/15 min), before / after | {e['BENCH_LOAD_BEFORE']} / {e['BENCH_LOAD_AFTER']} |

### Writes

| | TableCatalog (`table-catalog import`: batched WAL appends, fan-out applied before exit) | reference (`insert()` per record: WAL row, then `recover()`) |
| --- | --- | --- |
| whole airports file | **{n_all / wall_all:.0f} records/s**: {n_all} records, {ver['rows']} index rows, {wall_all:.1f} s wall | (not run: ~10 min at its rate) |
| the {ref['records']}-airport sample | **{n_small / wall_small:.0f} records/s** ({wall_small:.1f} s wall, process start included) | **{f(ref['inserts_per_s'])} records/s** ({f(ref['insert_seconds'])} s; per insert p50 {f(ref['insert_p50_ms'])} ms, p99 {f(ref['insert_p99_ms'])} ms) |

### Lookups by icao (sequential unless noted)

Ours go through `table-catalog serve` over HTTP (`table-catalog bench`). The reference's are
in-process `query()` calls. Azurite scans the whole table for a PartitionKey query, so latency
depends on table size. Compare rows, not columns across rows.

| catalog table | TableCatalog | reference |
| --- | --- | --- |
| the sample only ({ref['records']} airports; each side its own table: {ours_small_rows} rows for us, {ref_rows} for the reference, which also files empty identifiers) | {ours_lat(s_small)} | {ref_lat(ref)} |
| all {n_all} airports ({ver['rows']} rows, our table; the reference reads it with its own `query()`), the sample's icao codes | {ours_lat(s_full)} | {ref_lat(ref_full)} |
| all airports, all icao codes | {ours_lat(all1)}; p90 {f(all1['p90_ms'])} ms | |
| all airports, all icao codes, concurrency 8 | {ours_lat(all8)} | |

Import as the binary reports it: `{line_all}`""")
EOF
)"
echo "$report"
if [ -n "${BENCH_OUT:-}" ]; then echo "$report" >"$BENCH_OUT"; fi
log "raw results in $out_dir"
