#!/usr/bin/env bash
# Single-partition mode against the WAL mode on the embedded store (docs/BENCHMARKS.md,
# "Single-partition mode against the WAL mode"): single writes over HTTP against one fresh
# `serve` per mode (release build with `--features bench`), 16 clients, 10 s each; storage
# requests per write = the `requests.total` of /api/status after minus before, divided by
# the acknowledged writes. A measurement, not a test.
#
#   cargo build --release --features bench && scripts/bench_modes.sh
set -euo pipefail
B="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/target/release/table-catalog"
for mode in wal single-partition; do
  d=$(mktemp -d); cd "$d"
  port=$([ "$mode" = wal ] && echo 7091 || echo 7092)
  extra=""; [ "$mode" = single-partition ] && extra="--mode single-partition --tenant bench"
  $B --name bench --index-keys icao,iata,lid --row-key name $extra serve --listen 127.0.0.1:$port >serve.log 2>&1 &
  pid=$!
  for i in $(seq 1 50); do curl -sf http://127.0.0.1:$port/api/health >/dev/null && break; sleep 0.2; done
  before=$(curl -s http://127.0.0.1:$port/api/status | python3 -c 'import json,sys; print(json.load(sys.stdin)["requests"]["total"])')
  $B bench writes --url http://127.0.0.1:$port --clients 16 --seconds 10 2>&1 | tail -15 > writes.out
  sleep 3
  after=$(curl -s http://127.0.0.1:$port/api/status | python3 -c 'import json,sys; print(json.load(sys.stdin)["requests"]["total"])')
  echo "=== $mode: requests before $before after $after"
  cat writes.out
  kill $pid; wait $pid 2>/dev/null || true
  cd /; rm -rf "$d"
done
