#!/usr/bin/env bash
# A synthetic catalog for the whole-table benchmarks (docs/BENCHMARKS.md, "Whole-table scan:
# verify and export"): RECORDS records with three unique identifiers each (index keys
# eid,npi,email, row key lastname; see `table-catalog bench gen --help`), so RECORDS records
# are 3 x RECORDS index rows, imported with `table-catalog import` and applied to every index.
# Deterministic: the same RECORDS and SEED give the same records. Nothing is checked in.
#
#   scripts/gen_catalog.sh RECORDS [table-catalog flags...]
#   scripts/gen_catalog.sh 350000 --local-path /tmp/scan-1m          # embedded store, 1.05M rows
#   AZURE_STORAGE_CONNECTION_STRING=... scripts/gen_catalog.sh 34000 --name scan   # Azurite/Azure
#
# The flags go before `import` (catalog name, --local-path, --durability, ...). Without a
# connection string in the environment the catalog is on the embedded store.
#
# Settings (environment):
#   SEED      seed of the random fields (1)
#   GEN_DIR   where the JSON-lines file is kept and reused ($CARGO_TARGET_DIR/gen or target/gen)
#   TC_BIN    the binary (default: the release build, built if missing)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ] || ! [[ "$1" =~ ^[0-9]+$ ]]; then
    echo "usage: scripts/gen_catalog.sh RECORDS [table-catalog flags...]" >&2
    exit 2
fi
records="$1"
shift
seed="${SEED:-1}"
target_dir="${CARGO_TARGET_DIR:-$(pwd)/target}"
# shellcheck source=bench_lib.sh
. scripts/bench_lib.sh
bin="$(bench_release_bin "$target_dir")"
gen_dir="${GEN_DIR:-$target_dir/gen}"
mkdir -p "$gen_dir"
file="$gen_dir/catalog-$records-seed$seed.jsonl"
if [ ! -s "$file" ]; then
    "$bin" bench gen --records "$records" --seed "$seed" --output "$file.tmp"
    mv "$file.tmp" "$file"
fi
echo "gen_catalog: importing $file ($records records, $((records * 3)) index rows)" >&2
"$bin" --index-keys eid,npi,email --row-key lastname "$@" import --file "$file"
