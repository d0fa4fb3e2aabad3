# Helpers shared by scripts/bench_writes.sh and scripts/bench_requests.sh (source it; it defines
# functions only). Each benchmark gets private processes on free loopback ports, all killed by
# bench_cleanup (call it from an EXIT trap).
#
#   bench_free_port                     -> prints a free TCP port
#   bench_azurite_start DIR [--debug]   -> private in-memory Azurite (the version pinned in
#                                          scripts/azurite.sh); exports AZURE_STORAGE_CONNECTION_STRING
#                                          and BENCH_AZURITE_LOG (its debug log with --debug)
#   bench_azurite_stop
#   bench_serve BIN LOG ARGS...         -> starts `BIN ARGS... serve --listen 127.0.0.1:PORT`,
#                                          waits for /api/health, sets BENCH_URL (call it
#                                          directly, not in $(...): it records the pid)
#   bench_stop_serves                   -> stops every serve started so far
#   bench_cleanup
#   bench_release_bin TARGET_DIR        -> the binary to measure: $TC_BIN when set, else the
#                                          release build of the working tree (built here)

BENCH_PIDS=()
BENCH_AZURITE_PID=""
BENCH_ACCOUNT=devstoreaccount1
BENCH_KEY="Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==" # public emulator key

bench_free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'; }
bench_port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

bench_azurite_start() { # dir [--debug]
    local dir="$1" debug=() tport qport bport
    mkdir -p "$dir"
    scripts/azurite.sh install
    if [ "${2:-}" = "--debug" ]; then
        BENCH_AZURITE_LOG="$dir/azurite-debug.log"
        : >"$BENCH_AZURITE_LOG"
        debug=(--debug "$BENCH_AZURITE_LOG")
    fi
    tport="$(bench_free_port)"; qport="$(bench_free_port)"; bport="$(bench_free_port)"
    .azurite/node_modules/.bin/azurite --inMemoryPersistence --silent --skipApiVersionCheck --loose --disableTelemetry \
        --blobHost 127.0.0.1 --queueHost 127.0.0.1 --tableHost 127.0.0.1 \
        --blobPort "$bport" --queuePort "$qport" --tablePort "$tport" "${debug[@]}" </dev/null >"$dir/azurite.out" 2>&1 &
    BENCH_AZURITE_PID=$!
    for _ in $(seq 1 300); do
        if bench_port_open "$tport" && bench_port_open "$qport"; then break; fi
        kill -0 "$BENCH_AZURITE_PID" 2>/dev/null || { cat "$dir/azurite.out" >&2; return 1; }
        sleep 0.1
    done
    export AZURE_STORAGE_CONNECTION_STRING="DefaultEndpointsProtocol=http;AccountName=$BENCH_ACCOUNT;AccountKey=$BENCH_KEY;TableEndpoint=http://127.0.0.1:$tport/$BENCH_ACCOUNT;QueueEndpoint=http://127.0.0.1:$qport/$BENCH_ACCOUNT;"
    export BENCH_AZURITE_LOG
}

bench_azurite_stop() {
    if [ -n "$BENCH_AZURITE_PID" ]; then
        kill "$BENCH_AZURITE_PID" 2>/dev/null || true
        wait "$BENCH_AZURITE_PID" 2>/dev/null || true
        BENCH_AZURITE_PID=""
    fi
    unset AZURE_STORAGE_CONNECTION_STRING
}

bench_serve() { # bin log args... -> sets BENCH_URL
    local bin="$1" log="$2" port pid
    shift 2
    port="$(bench_free_port)"
    RUST_LOG="${RUST_LOG:-warn}" "$bin" "$@" serve --listen "127.0.0.1:$port" >"$log" 2>&1 &
    pid=$!
    BENCH_PIDS+=("$pid")
    for _ in $(seq 1 600); do
        if curl -fsS "http://127.0.0.1:$port/api/health" >/dev/null 2>&1; then
            BENCH_URL="http://127.0.0.1:$port"
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; return 1; }
        sleep 0.1
    done
    echo "bench_serve: no health answer from $bin on port $port" >&2
    return 1
}

bench_stop_serves() {
    local pid
    for pid in "${BENCH_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${BENCH_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    BENCH_PIDS=()
}

bench_cleanup() {
    bench_stop_serves
    bench_azurite_stop
}

# bench_requests_total URLS OUT [DRAIN_SECONDS] -> waits (at most DRAIN_SECONDS, default 0) until
# the catalog has no pending WAL entry, then writes to OUT the storage requests made so far by
# the serves at URLS (comma-separated), summed: {"total": n, "table": n, "queue": n,
# "by_op": {op: n}}, from each one's `status` -> `requests`. A serve without counters adds nothing.
bench_requests_total() {
    python3 - "$1" "$2" "${3:-0}" <<'PY'
import json, sys, time, urllib.request
urls, out, drain = sys.argv[1].split(","), sys.argv[2], float(sys.argv[3])
def status(url):
    with urllib.request.urlopen(url + "/api/status", timeout=30) as r:
        return json.load(r)
deadline = time.time() + drain
while drain > 0 and time.time() < deadline and status(urls[0]).get("pending", 0) > 0:
    time.sleep(0.5)
total = {"total": 0, "table": 0, "queue": 0, "by_op": {}}
for url in urls:
    req = status(url).get("requests")
    if not req:
        continue
    for k in ("total", "table", "queue"):
        total[k] += req.get(k, 0)
    for op, c in req.get("by_op", {}).items():
        total["by_op"][op] = total["by_op"].get(op, 0) + c.get("total", 0)
json.dump(total, open(out, "w"))
PY
}

bench_release_bin() { # target_dir -> prints the binary's path
    if [ -n "${TC_BIN:-}" ]; then
        echo "$TC_BIN"
        return
    fi
    cargo build --release --quiet >&2
    echo "$1/release/table-catalog"
}
