#!/usr/bin/env bash
# Storage requests per write, ours against the Python reference (az-table-catalog 1.0.1), on
# one private Azurite whose debug log records every request it receives (numbers recorded in
# docs/BENCHMARKS.md, "Storage requests per write"). Black-box: each side is counted from
# Azurite's log; ours is also read from its own counters (`status` -> `requests`), which must
# agree.
#
#   scripts/bench_requests.sh
#
# Phases (fresh catalog each, synthetic airports with 3 identifiers, no key characters the
# reference mishandles):
#   1. reference: insert() once per record, REQ_SINGLE records (it has no bulk write: a bulk
#      load is the same loop);
#   2. ours, single writes: `serve`, then REQ_SINGLE sequential `POST /api/records?upsert=true`;
#      the window closes when every entry is applied and every apply hint consumed;
#   3. ours, bulk: one `POST /api/records/batch` of REQ_BULK records, same closing rule.
# Our windows contain the `status` polls that detect the end; their requests (measured, about
# 4 each) are subtracted from both counts. They also contain the idle polls of `serve`'s queue
# worker (at most one receive per 2 s), which are part of running it and are not subtracted.
#
# Settings (environment): REQ_SINGLE (200), REQ_BULK (1000), BENCH_OUT. Uses $CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
# shellcheck source=bench_lib.sh
. scripts/bench_lib.sh
target_dir="${CARGO_TARGET_DIR:-$root/target}"
out_dir="$target_dir/bench-requests"
mkdir -p "$out_dir"
work="$(mktemp -d)"
trap 'bench_cleanup; rm -rf "$work"' EXIT
log() { echo "bench_requests: $*" >&2; }

cargo build --release --quiet
bin="$target_dir/release/table-catalog"
py="$(scripts/python_env.sh --print)"
bench_azurite_start "$work/azurite" --debug
export TC_PY_CONNECTION="$AZURE_STORAGE_CONNECTION_STRING"
log "azurite debug log: $BENCH_AZURITE_LOG"

bench_serve "$bin" "$out_dir/serve.log" --name reqours --index-keys icao,iata,lid --row-key name
export BENCH_URL BENCH_BIN="$bin" BENCH_PY="$py" BENCH_SINGLE="${REQ_SINGLE:-200}" BENCH_BULK="${REQ_BULK:-1000}" \
    BENCH_OUT_DIR="$out_dir"
report="$(python3 - <<'EOF'
import collections, json, os, re, subprocess, sys, time, urllib.request
e = os.environ
LOG, URL = e["BENCH_AZURITE_LOG"], e["BENCH_URL"]
N, BULK = int(e["BENCH_SINGLE"]), int(e["BENCH_BULK"])
LINE = re.compile(r"(Table|Queue)StorageContextMiddleware: RequestMethod=(\w+) RequestURL=(\S+)")

def requests_logged():
    """(Table|Queue, method, path shape) of every request Azurite logged so far."""
    out = []
    with open(LOG, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = LINE.search(line)
            if m:
                path = re.sub(r"\?.*", "", m.group(3).split("/devstoreaccount1", 1)[-1])
                path = re.sub(r"\(\)$", " query", path)
                path = re.sub(r"\(.+\)$", "(entity)", path)
                path = re.sub(r"/messages/[^/]+", "/messages/{id}", path)
                out.append((m.group(1), m.group(2), path))
    return out

def settle():
    """Waits until Azurite's log stops growing (it is written asynchronously)."""
    last = -1
    while True:
        n = len(requests_logged())
        if n == last:
            return n
        last = n
        time.sleep(0.5)

def airport(tag, i):
    return {"icao": f"Q{tag}{i:05d}", "iata": f"J{tag}{i:05d}", "lid": f"M{tag}{i:05d}",
            "name": f"Request Field {tag} {i}", "city": "Countville", "elevation": i}

def http(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(URL + path, data=data, method=method, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)

def status():
    return http("GET", "/api/status")

def window(label, write, hints):
    """Runs `write`, then polls status until nothing is pending and `hints` more apply hints
    were deleted. Returns (our count, Azurite's count, our count by op), status polls excluded."""
    costs = []
    s0 = status()
    for _ in range(3):  # the cost of one status call, measured
        s1 = status()
        costs.append(s1["requests"]["total"] - s0["requests"]["total"])
        s0 = s1
    cost = min(costs)
    logged0 = settle()
    s0 = status()
    logged0 += cost  # the log has that status call's requests too
    write()
    polls = 0
    deadline = time.time() + 300
    while True:
        time.sleep(0.5)
        s = status()
        polls += 1
        deleted = s["requests"]["by_op"].get("delete_message", {}).get("total", 0) - \
            s0["requests"]["by_op"].get("delete_message", {}).get("total", 0)
        if (s["pending"] == 0 and deleted >= hints) or time.time() > deadline:
            break
    logged = settle() - logged0 - polls * cost
    ours = s["requests"]["total"] - s0["requests"]["total"] - polls * cost
    by_op = {op: c["total"] - s0["requests"]["by_op"].get(op, {}).get("total", 0) for op, c in s["requests"]["by_op"].items()}
    by_op = {op: n for op, n in by_op.items() if n}
    print(f"{label}: ours {ours}, Azurite log {logged}, status cost {cost} x {polls} polls", file=sys.stderr)
    return ours, logged, by_op, s["pending"]

# 1. the reference
recs = [airport("R", i) for i in range(N)]
before = settle()
subprocess.run([e["BENCH_PY"], "tests/python/ref_catalog.py", "--table", "reqref", "--wal", "reqrefwal",
                "--index-keys", "icao,iata,lid", "--row-key", "name", "insert"],
               input="\n".join(json.dumps(r) for r in recs), text=True, check=True, stdout=subprocess.DEVNULL)
# Only the reference's tables: our `serve` (already running, idle) polls its queue meanwhile.
ref_reqs = [r for r in requests_logged()[before:settle()] if r[2] == "/Tables" or r[2].startswith("/reqref")]
ref_setup = sum(1 for r in ref_reqs if r[2] == "/Tables")  # the constructor's create-table calls
ref_kinds = collections.Counter(f"{m} {p}" for _, m, p in ref_reqs if p != "/Tables")
ref_per = (len(ref_reqs) - ref_setup) / N

# 2. ours, single writes
def singles():
    for i in range(N):
        http("POST", "/api/records?upsert=true", airport("S", i))
s_ours, s_log, s_ops, s_pending = window("single", singles, N)

# 3. ours, bulk
b_ours, b_log, b_ops, b_pending = window("bulk", lambda: http("POST", "/api/records/batch", [airport("B", i) for i in range(BULK)]), 1)

json.dump({"reference": {"records": N, "requests": len(ref_reqs), "setup": ref_setup, "by_kind": ref_kinds},
           "single": {"records": N, "ours": s_ours, "azurite": s_log, "by_op": s_ops, "pending_left": s_pending},
           "bulk": {"records": BULK, "ours": b_ours, "azurite": b_log, "by_op": b_ops, "pending_left": b_pending}},
          open(os.path.join(e["BENCH_OUT_DIR"], "requests.json"), "w"), indent=1)
fmt_ops = lambda ops, n: ", ".join(f"{op} {c / n:.2f}" for op, c in sorted(ops.items(), key=lambda kv: -kv[1]))
print(f"| | requests per record (Azurite's log) | our own counters | breakdown per record |")
print(f"| --- | --- | --- | --- |")
print(f"| reference 1.0.1, `insert()` per record ({N}; also its only bulk path) | **{ref_per:.2f}** | | "
      + ", ".join(f"{k} {v / N:.2f}" for k, v in ref_kinds.most_common()) + f" (+ {ref_setup} create-table calls once) |")
print(f"| ours, single `POST /api/records?upsert=true` ({N}, sequential) | **{s_log / N:.2f}** | {s_ours / N:.2f} | {fmt_ops(s_ops, N)} |")
print(f"| ours, bulk `POST /api/records/batch` ({BULK} records in one request) | **{b_log / BULK:.3f}** | {b_ours / BULK:.3f} | {fmt_ops(b_ops, BULK)} |")
EOF
)"
echo "$report"
if [ -n "${BENCH_OUT:-}" ]; then echo "$report" >"$BENCH_OUT"; fi
log "raw results in $out_dir"
