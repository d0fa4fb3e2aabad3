#!/usr/bin/env bash
# Benchmarks on the embedded store (numbers recorded in docs/BENCHMARKS.md):
#   1. import throughput of data/airports.csv into a fresh store (logged + applied to every index);
#   2. lookup latency by icao over HTTP against `serve` (p50/p90/p99), 1 and 8 clients.
# Usage: scripts/bench_local.sh [durability: full|process]
set -euo pipefail
cd "$(dirname "$0")/.."
durability="${1:-full}"
cargo build --release --quiet
bin=target/release/table-catalog
dir="$(mktemp -d)"
trap 'kill "${pid:-}" 2>/dev/null || true; rm -rf "$dir"' EXIT
common=(--name airports --index-keys icao,iata,lid --row-key name --local-path "$dir/store" --durability "$durability")

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), commit $(git rev-parse --short HEAD)"
echo "== import (durability $durability)"
"$bin" "${common[@]}" import --file data/airports.csv 2>&1 | tail -1
"$bin" "${common[@]}" verify

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
RUST_LOG=warn "$bin" "${common[@]}" serve --listen "127.0.0.1:$port" 2>/dev/null &
pid=$!
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$port/api/health" >/dev/null && break; sleep 0.1; done
echo "== lookups by icao over HTTP"
"$bin" "${common[@]}" bench --url "http://127.0.0.1:$port" --file data/airports.csv --field icao --requests 2000 --concurrency 1 >/dev/null # warm-up
"$bin" "${common[@]}" bench --url "http://127.0.0.1:$port" --file data/airports.csv --field icao --requests 20000 --concurrency 1
"$bin" "${common[@]}" bench --url "http://127.0.0.1:$port" --file data/airports.csv --field icao --requests 20000 --concurrency 8
