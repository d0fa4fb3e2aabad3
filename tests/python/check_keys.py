#!/usr/bin/env python3
"""Independent check of the keys TableCatalog (Rust) wrote, with the official Python client.

Reads every entity of a catalog table with azure-data-tables (not with our Rust code, not
with the reference), computes the expected PartitionKey / RowKey of every record of the
input file from the product description, written out here from scratch:

    PartitionKey = escape(f"{len(field.lower())}_{(field + value).lower()}")
    RowKey       = escape((sort + ":" + md5("|".join(str(v).lower() for v in values
                          in alphabetical order of the index field names))[:8]).lower())

where escape() writes `/ \\ # ? %` and the control characters U+0000-U+001F and
U+007F-U+009F as %XX, one per UTF-8 byte, uppercase hex; and an empty identifier gets no
row. Then it compares the two sets exactly, and checks that each row carries its record's
identifiers and sort value and the `_tc` system property.

Usage: check_keys.py --table NAME --file F.csv|F.jsonl --index-keys a,b --row-key r
The connection string comes from TC_PY_CONNECTION, else AZURE_STORAGE_CONNECTION_STRING.
Prints one JSON report; exit status 0 only when everything matches.
"""

import argparse
import csv
import hashlib
import json
import os
import sys

from azure.data.tables import EntityProperty, TableServiceClient

ESCAPED = set("/\\#?%") | {chr(c) for c in range(0x20)} | {chr(c) for c in range(0x7F, 0xA0)}
SHOW = 10  # examples listed per kind of problem


def escape(s: str) -> str:
    return "".join("".join(f"%{b:02X}" for b in c.encode("utf-8")) if c in ESCAPED else c for c in s)


def key_text(v):
    """Python's str() of an identifier; None (null) is no value."""
    if v is None:
        return None
    return str(v)


def read_records(path: str) -> list:
    if path.endswith((".jsonl", ".ndjson", ".json")):
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def expected_keys(record: dict, index_keys: list, row_key: str):
    values = [key_text(record.get(k)) or "" for k in sorted(index_keys)]
    fp = hashlib.md5("|".join(v.lower() for v in values).encode("utf-8")).hexdigest()[:8]
    rk = escape((key_text(record[row_key]) + ":" + fp).lower())
    pks = []
    for field in index_keys:
        value = key_text(record.get(field))
        if value:
            pks.append((field, escape(f"{len(field.lower())}_{(field + value).lower()}")))
    return rk, pks


def plain(v):
    return v.value if isinstance(v, EntityProperty) else v


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--table", required=True)
    p.add_argument("--file", required=True)
    p.add_argument("--index-keys", required=True)
    p.add_argument("--row-key", required=True)
    args = p.parse_args()
    index_keys = [k.strip() for k in args.index_keys.split(",") if k.strip()]
    cs = os.environ.get("TC_PY_CONNECTION") or os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
    if not cs:
        sys.exit("check_keys.py: set TC_PY_CONNECTION or AZURE_STORAGE_CONNECTION_STRING")

    records = read_records(args.file)
    expected = {}  # (PartitionKey, RowKey) -> (field, record)
    identifiers = 0
    collisions = []
    for r in records:
        rk, pks = expected_keys(r, index_keys, args.row_key)
        for field, pk in pks:
            identifiers += 1
            if (pk, rk) in expected:
                collisions.append([pk, rk])
            expected[(pk, rk)] = (field, r)

    table = TableServiceClient.from_connection_string(cs).get_table_client(args.table)
    actual = {}
    for e in table.list_entities():
        actual[(e["PartitionKey"], e["RowKey"])] = e

    missing = sorted(set(expected) - set(actual))
    unexpected = sorted(set(actual) - set(expected))
    mismatched = []
    without_meta = []
    for key in sorted(set(expected) & set(actual)):
        field, r = expected[key]
        e = actual[key]
        for f in index_keys + [args.row_key]:
            want, got = key_text(r.get(f)), key_text(plain(e.get(f)))
            if want not in (None, "") and want != got:
                mismatched.append({"key": list(key), "field": f, "expected": want, "stored": got})
        meta = e.get("_tc")
        try:
            ok = isinstance(meta, str) and isinstance(json.loads(meta).get("w"), str)
        except ValueError:
            ok = False
        if not ok:
            without_meta.append(list(key))

    report = {
        "table": args.table,
        "records": len(records),
        "identifiers": identifiers,
        "expected_rows": len(expected),
        "entities": len(actual),
        "collisions": collisions[:SHOW],
        "missing": len(missing),
        "missing_examples": [list(k) for k in missing[:SHOW]],
        "unexpected": len(unexpected),
        "unexpected_examples": [list(k) for k in unexpected[:SHOW]],
        "mismatched": len(mismatched),
        "mismatched_examples": mismatched[:SHOW],
        "without_tc": len(without_meta),
        "without_tc_examples": without_meta[:SHOW],
        "escaped_rows": sum(1 for pk, rk in actual if "%" in pk or "%" in rk),
    }
    report["ok"] = not (collisions or missing or unexpected or mismatched or without_meta)
    json.dump(report, sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
