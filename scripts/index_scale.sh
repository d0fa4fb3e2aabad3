#!/usr/bin/env bash
# Online index changes at scale (issue 13, "Done when"; numbers in docs/BENCHMARKS.md,
# "Online index changes: backfill (issue 13)"). Not run by CI.
#
#   scripts/index_scale.sh local      # embedded store in a temporary folder
#   scripts/index_scale.sh azurite    # a private in-memory Azurite (scripts/bench_lib.sh)
#
# 1. `table-catalog import` of data/airports.csv (all 28,403 airports; index keys
#    icao,iata,lid, row key name), timed: the import rate. Then an export of it: the records
#    the writers start from.
# 2. A release `serve` (HTTP API, apply worker, 4 scan workers for the jobs).
# 3. For each field of FIELDS (default "country tz"), one after the other:
#    - WRITERS (default 8) clients keep writing over HTTP (scripts/index_scale.py write:
#      upserts that move records between countries and time zones, every 25th a delete);
#    - `POST /api/indexes {"field": F}`; polls the backfill job and `GET /api/indexes` until
#      the index is `active` (a lookup meanwhile must get 409 `index_not_ready`);
#    - stops the writers, waits until nothing is pending (`GET /api/status`);
#    - `table-catalog verify` (serial scan) must exit 0 (no finding);
#    - `table-catalog export`, then every value of F is looked up over HTTP in pages of at
#      most 1,000 and must return exactly the export's records with it, in ceil(n / 1,000)
#      pages (scripts/index_scale.py check).
# 4. With DROP=1 (default): `DELETE /api/indexes/country` while the writers write, until the
#    index is gone; then verify exits 0 and a lookup by country gets 400.
# Prints one Markdown table row per index change and a summary. Backfill throughput is the
# job's `counters.records / (finished - started)` (the job's times have whole seconds), and
# also records / the wall time from the POST until `active`.
#
# Settings (environment): TC_BIN (default: the release build, built here), WRITERS (8; 0
# measures the backfill alone), FIELDS ("country tz"), DROP (1), SCALE_OUT (also append the
# output there). Uses $CARGO_TARGET_DIR. Needs python3, curl and jq.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
# shellcheck source=bench_lib.sh
. scripts/bench_lib.sh
usage() { echo "usage: scripts/index_scale.sh local|azurite" >&2; exit 2; }
[ $# -eq 1 ] || usage
backend="$1"
case "$backend" in local | azurite) ;; *) usage ;; esac
writers="${WRITERS:-8}"
fields="${FIELDS:-country tz}"
drop="${DROP:-1}"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
bin="$(bench_release_bin "$target_dir")"
work="$(mktemp -d)"
stop_writers() { [ -z "${writer_pid:-}" ] || { touch "$work/stop"; wait "$writer_pid" || true; writer_pid=""; }; }
trap 'stop_writers; bench_cleanup; rm -rf "$work"' EXIT
trap 'exit 143' INT TERM
out() { echo "$*"; [ -z "${SCALE_OUT:-}" ] || echo "$*" >>"$SCALE_OUT"; }
log() { echo "index_scale: $*" >&2; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

catalog=(--name airports --index-keys icao,iata,lid --row-key name)
if [ "$backend" = local ]; then
    catalog+=(--local-path "$work/store")
else
    bench_azurite_start "$work/azurite"
fi
tc() { "$bin" "${catalog[@]}" "$@"; }

out "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), commit $(git rev-parse --short HEAD), backend $backend, load $(cut -d' ' -f1-3 /proc/loadavg)"

# 1. Import.
log "import data/airports.csv"
t0="$(now)"
tc import --file data/airports.csv >"$work/import.out" 2>"$work/import.err" || { cat "$work/import.err" >&2; exit 1; }
t1="$(now)"
import_s="$(secs "$t0" "$t1")"
tc export --output "$work/base.jsonl" 2>/dev/null
records="$(wc -l <"$work/base.jsonl")"
out "import: $records records in ${import_s} s ($(awk -v n="$records" -v s="$import_s" 'BEGIN { printf "%.0f", n / s }') records/s, logged and applied)"

# 2. serve.
bench_serve "$bin" "$work/serve.log" "${catalog[@]}"
url="$BENCH_URL"
log "serve at $url"

start_writers() {
    rm -f "$work/stop"
    python3 scripts/index_scale.py write --url "$url" --records "$work/base.jsonl" --clients "$writers" --stop "$work/stop" \
        --seed "$1" >"$work/writers.out" &
    writer_pid=$!
}

wait_drained() {
    local st
    for _ in $(seq 1 3000); do
        st="$(curl -fsS "$url/api/status")"
        if [ "$(jq -r .pending <<<"$st")" = 0 ]; then return 0; fi
        sleep 0.2
    done
    log "still pending: $st"
    return 1
}

index_state() { curl -fsS "$url/api/indexes" | jq -r --arg f "$1" '[.indexes[] | select(.field == $f) | .state][0] // "none"'; }

verify_clean() {
    local status=0
    tc verify >"$work/verify.out" 2>"$work/verify.err" || status=$?
    if [ "$status" -ne 0 ]; then
        log "verify exited $status"
        head -5 "$work/verify.out" >&2
        tail -3 "$work/verify.err" >&2
        return 1
    fi
    tail -1 "$work/verify.err"
}

out ""
out "| change | writers: ops (ops/s, errors) during it | backfill job: records / rows scanned / rows written | job time s | **records/s (job)** | wall s, POST to active | records/s (wall) | refused lookups while backfilling | verify | lookups: values / records / pages (largest) |"
out "|---|---|---|---|---|---|---|---|---|---|"
seed=1
for field in $fields; do
    start_writers "$seed"
    seed=$((seed + 1))
    sleep 3
    log "index add $field"
    t0="$(now)"
    change="$(curl -fsS -X POST -H 'content-type: application/json' -d "{\"field\":\"$field\"}" "$url/api/indexes")"
    job="$(jq -r .job <<<"$change")"
    refused=0
    while [ "$(index_state "$field")" != active ]; do
        code="$(curl -s -o /dev/null -w '%{http_code}' "$url/api/records?$field=US&limit=1")"
        [ "$code" != 409 ] || refused=$((refused + 1))
        sleep 0.5
    done
    t1="$(now)"
    stop_writers
    wait_drained
    job_json="$(curl -fsS "$url/api/jobs/$job")"
    [ "$(jq -r .state <<<"$job_json")" = done ] || { log "job $job: $job_json"; exit 1; }
    read -r jrec jrows jwritten jstart jend < <(jq -r '[.counters.records, .counters.rows, .counters.written, .started, .finished] | @tsv' <<<"$job_json")
    job_s="$(( $(date -d "$jend" +%s) - $(date -d "$jstart" +%s) ))"
    wall_s="$(secs "$t0" "$t1")"
    verify_json="$(verify_clean)"
    tc export --output "$work/export.jsonl" 2>/dev/null
    check_json="$(python3 scripts/index_scale.py check --url "$url" --export "$work/export.jsonl" --field "$field" --page 1000)" || {
        log "lookups by $field disagree with the export: $check_json"
        exit 1
    }
    w="$(cat "$work/writers.out")"
    out "| add $field | $(jq -r '"\(.operations) (\(.ops_per_s)/s, \(.errors) errors)"' <<<"$w") | $jrec / $jrows / $jwritten | $job_s | **$(awk -v n="$jrec" -v s="$job_s" 'BEGIN { printf "%.0f", (s > 0 ? n / s : 0) }')** | $wall_s | $(awk -v n="$jrec" -v s="$wall_s" 'BEGIN { printf "%.0f", n / s }') | $refused | $(jq -c '{rows, records, tombstones, findings}' <<<"$verify_json") | $(jq -r '"\(.values) / \(.records) / \(.pages) (\(.largest.value): \(.largest.records) in \(.largest.pages) pages)"' <<<"$check_json") |"
    log "add $field: job $job_json"
    log "add $field: verify $verify_json; check $check_json; writers $w"
    [ "$(jq -r .errors <<<"$w")" = 0 ] || { log "writer errors: $w"; exit 1; }
done

if [ "$drop" = 1 ]; then
    start_writers "$seed"
    sleep 3
    log "index drop country"
    t0="$(now)"
    curl -fsS -X DELETE "$url/api/indexes/country" >"$work/drop.json"
    while [ "$(index_state country)" != none ]; do sleep 0.5; done
    t1="$(now)"
    stop_writers
    wait_drained
    code="$(curl -s -o /dev/null -w '%{http_code}' "$url/api/records?country=US")"
    [ "$code" = 400 ] || { log "a lookup by a dropped index answered $code"; exit 1; }
    verify_json="$(verify_clean)"
    job_json="$(curl -fsS "$url/api/jobs/$(jq -r .job "$work/drop.json")")"
    left="not counted (verify reports a live row of a dropped index as unreadable)"
    if [ "$backend" = local ]; then
        # Every row of the index, tombstones included, straight from the store's file.
        left="$(python3 scripts/index_scale.py rows --sqlite "$work/store/catalog.sqlite3" --table airports --prefix 7_country) rows of country left"
        [ "${left%% *}" = 0 ] || { log "$left"; exit 1; }
    fi
    out "| drop country | $(jq -r '"\(.operations) (\(.ops_per_s)/s, \(.errors) errors)"' "$work/writers.out") | deleted $(jq -r .counters.deleted <<<"$job_json") rows | | | $(secs "$t0" "$t1") | | lookup by country: $code | $(jq -c '{rows, records, tombstones, findings}' <<<"$verify_json") | $left |"
fi
log "done"
