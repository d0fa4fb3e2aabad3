#!/usr/bin/env python3
"""Drives the Python reference implementation (az-table-catalog==1.0.1) for the Rust tests
(tests/suite/python_compat.rs) and the benchmark script (scripts/bench_azurite.sh).

Run with the interpreter of .venv-ref/ (scripts/python_env.sh creates it). The storage
connection string is read from the environment, never from the command line:
TC_PY_CONNECTION, else AZURE_STORAGE_CONNECTION_STRING.

Common options: --table NAME --wal NAME --index-keys a,b,c --row-key FIELD.
The reference's default WAL table name, "<table>_WAL", is not a valid Azure table name
(letters and digits only), so --wal is required and must be alphanumeric.

Commands (one JSON document on stdout; diagnostics on stderr):
  insert    stdin: JSON lines, one record each; calls TableCatalogClient.insert(record)
            for each, in order. Prints {"inserted": n, "seconds": s}.
  query     stdin: JSON lines {"filter": {...}, "row_from": .., "row_to": ..}; prints
            {"results": [[record, ...], ...]} (one list per input line, in order), or an
            "error" string in place of a list when the reference raised.
  defects   reproduces the reference's known defects on fresh tables named after --table
            and prints what happened (see docs/COMPATIBILITY.md).
  bench     --file CSV --records N --lookups M [--seed S] [--sample-out CSV]: inserts the
            first N airports whose name has no Azure-forbidden key character (the reference
            writes names into the RowKey unescaped), one insert() call each, then looks up M
            of them by --field (default icao) with query(). Prints rates and latencies.
  lookups   --file CSV --lookups M [--field F] [--seed S]: only the query() lookups, on an
            existing table (also ours: the reference computes the same PartitionKeys).
"""

import argparse
import csv
import json
import os
import random
import sys
import time
import uuid

from azure.core.exceptions import HttpResponseError
from azure.data.tables import EntityProperty, TableServiceClient
from az_table_catalog import az_table_catalog as ref

FORBIDDEN = set("/\\#?") | {chr(c) for c in range(0x20)} | {chr(c) for c in range(0x7F, 0xA0)}


def connection_string() -> str:
    cs = os.environ.get("TC_PY_CONNECTION") or os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
    if not cs:
        sys.exit("ref_catalog.py: set TC_PY_CONNECTION or AZURE_STORAGE_CONNECTION_STRING")
    return cs


def plain(value):
    """A JSON-serialisable form of a property value read by azure-data-tables."""
    if isinstance(value, EntityProperty):  # Int64, Guid, Binary come back wrapped
        value = value.value
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def plain_record(record: dict) -> dict:
    return {k: plain(v) for k, v in record.items()}


def client(args, table=None, wal=None) -> ref.TableCatalogClient:
    return ref.TableCatalogClient(
        connection_string=connection_string(),
        table_name=table or args.table,
        wal_name=wal or args.wal,
        index_keys=args.index_keys,
        row_key=args.row_key,
    )


def json_lines(stream):
    for line in stream:
        line = line.strip()
        if line:
            yield json.loads(line)


def cmd_insert(args) -> dict:
    c = client(args)
    started = time.perf_counter()
    n = 0
    for record in json_lines(sys.stdin):
        c.insert(record)
        n += 1
    return {"inserted": n, "seconds": time.perf_counter() - started}


def cmd_query(args) -> dict:
    c = client(args)
    results = []
    for q in json_lines(sys.stdin):
        try:
            found = c.query(q["filter"], row_from=q.get("row_from"), row_to=q.get("row_to"))
            results.append([plain_record(r) for r in found])
        except Exception as e:  # the reference raises HttpResponseError for bad filters
            results.append({"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"})
    return {"results": results}


def cmd_defects(args) -> dict:
    """Each known defect, reproduced on its own fresh table. Values are plain facts."""
    out = {}
    svc = TableServiceClient.from_connection_string(connection_string())

    def rec(icao, name, iata="", lid=""):
        return {"icao": icao, "iata": iata, "lid": lid, "name": name}

    def fresh(suffix):
        return client(args, table=f"{args.table}{suffix}", wal=f"{args.table}{suffix}wal")

    # 1. delete is a no-op: the WAL property `operation` leaks into the stored rows, and the
    #    leaked "insert" overrides the "delete" when the record is logged again.
    c = fresh("del")
    c.insert(rec("KDEL", "delete me"))
    found = c.query({"icao": "KDEL"})
    out["operation_leaks_into_rows"] = bool(found) and found[0].get("operation") == "insert"
    c.delete({"icao": "KDEL"})
    out["delete_leaves_the_record"] = len(c.query({"icao": "KDEL"})) == 1

    # 2. One identifier containing '/' makes every later write fail: recover() retries the bad
    #    WAL entry first and the checkpoint never moves past it.
    c = fresh("slash")
    errors = []
    for r in [rec("A/B", "slash"), rec("KOK1", "fine one"), rec("KOK2", "fine two")]:
        try:
            c.insert(r)
            errors.append(None)
        except HttpResponseError as e:
            errors.append(type(e).__name__)
    out["slash_insert_errors"] = errors
    out["slash_wedges_later_writes"] = errors[1] is not None and errors[2] is not None
    out["slash_later_records_missing"] = not c.query({"icao": "KOK1"}) and not c.query({"icao": "KOK2"})

    # 3. A query value containing an apostrophe is not quote-escaped in the OData filter.
    c = fresh("quote")
    c.insert(rec("KQ1", "quote"))
    try:
        c.query({"icao": "O'HARE"})
        out["apostrophe_query_fails"] = False
    except HttpResponseError as e:
        out["apostrophe_query_fails"] = True
        out["apostrophe_query_error"] = str(e).splitlines()[0][:160]

    # 4. A WAL entry whose timestamp RowKey is older than the checkpoint (clock skew, slow
    #    writer) is never applied: replay reads only RowKey gt checkpoint.
    c = fresh("late")
    c.insert(rec("KLA1", "first"))
    late_key = f"2000-01-01T00:00:00.000000_{uuid.uuid4()}"
    c.wal.create_entity({"PartitionKey": "wal", "RowKey": late_key, "operation": "insert", **rec("KLA2", "late")})
    c.recover()
    c.insert(rec("KLA3", "after"))
    out["late_entry_never_applied"] = not c.query({"icao": "KLA2"}) and len(c.query({"icao": "KLA3"})) == 1

    # 5. The RowKey keeps the sort value's case, but range bounds are lowercased: a range query
    #    misses mixed-case sort values.
    c = fresh("case")
    c.insert(rec("KMIX", "Mixed Case Field"))
    whole = c.query({"icao": "KMIX"})
    ranged = c.query({"icao": "KMIX"}, row_from="Mixed Case Field", row_to="Mixed Case Field")
    out["mixed_case_range_misses"] = len(whole) == 1 and ranged == []

    # 6. Empty identifiers are filed under one shared partition ("4_iata" for iata="").
    c = fresh("empty")
    c.insert(rec("KEMP", "no iata"))
    t = svc.get_table_client(f"{args.table}empty")
    out["empty_iata_partition_rows"] = len(list(t.query_entities("PartitionKey eq '4_iata'")))

    # 7. A null identifier passes insert()'s presence check, but azure-data-tables drops None
    #    properties on the WAL write, so recover() raises KeyError on that entry, first, on
    #    every later insert. Python ints >= 2**31 are refused on the WAL write (Edm.Int32).
    c = fresh("null")
    errors = []
    for r in [{**rec("KNUL", "null iata", lid="X1"), "iata": None}, rec("KOK9", "after null")]:
        try:
            c.insert(r)
            errors.append(None)
        except KeyError:
            errors.append("KeyError")
    out["null_identifier_wedges_later_writes"] = errors == ["KeyError", "KeyError"]
    try:
        fresh("big").insert({**rec("KBIG", "big"), "n": 2**31})
        out["int_over_32_bits_rejected"] = False
    except TypeError:
        out["int_over_32_bits_rejected"] = True

    # 8. A payload field named `operation` overrides the WAL's own: the record is logged as
    #    that operation, which recover() neither inserts nor deletes, and skips for good.
    c = fresh("opfield")
    c.insert({**rec("KOPF", "operation field"), "operation": "audit"})
    out["operation_field_record_lost"] = c.query({"icao": "KOPF"}) == []

    # 9. The default WAL table name is not a valid Azure table name.
    try:
        ref.TableCatalogClient(
            connection_string=connection_string(),
            table_name=f"{args.table}dflt",
            index_keys=args.index_keys,
            row_key=args.row_key,
        )
        out["default_wal_name_rejected"] = False
    except HttpResponseError as e:
        out["default_wal_name_rejected"] = True
        out["default_wal_name_error"] = str(e).splitlines()[0][:160]
    return out


def percentile(sorted_ms, p):
    if not sorted_ms:
        return None
    return sorted_ms[round((len(sorted_ms) - 1) * p)]


def read_csv(path: str) -> list:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def lookups(c: ref.TableCatalogClient, records: list, field: str, n: int, seed: int) -> dict:
    """n query() lookups by `field` of the records' values, in a seeded random order."""
    values = [r[field] for r in records if r[field]]
    random.Random(seed).shuffle(values)
    targets = [values[i % len(values)] for i in range(n)]
    lookup_ms = []
    misses = 0
    started = time.perf_counter()
    for v in targets:
        t = time.perf_counter()
        found = c.query({field: v})
        lookup_ms.append((time.perf_counter() - t) * 1000)
        misses += not found
    lookup_s = time.perf_counter() - started
    lookup_ms.sort()
    return {
        "lookups": len(lookup_ms),
        "field": field,
        "not_found": misses,
        "lookup_p50_ms": percentile(lookup_ms, 0.50),
        "lookup_p90_ms": percentile(lookup_ms, 0.90),
        "lookup_p99_ms": percentile(lookup_ms, 0.99),
        "lookup_max_ms": percentile(lookup_ms, 1.0),
        "lookups_per_s": len(lookup_ms) / lookup_s if lookup_s else None,
    }


def cmd_bench(args) -> dict:
    rows = read_csv(args.file)
    sample = [r for r in rows if not (set(r[args.row_key]) & FORBIDDEN)][: args.records]
    if args.sample_out:
        with open(args.sample_out, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0].keys()), quoting=csv.QUOTE_NONNUMERIC)
            w.writeheader()
            w.writerows(sample)
    c = client(args)
    insert_ms = []
    started = time.perf_counter()
    for r in sample:
        t = time.perf_counter()
        c.insert(r)
        insert_ms.append((time.perf_counter() - t) * 1000)
    insert_s = time.perf_counter() - started
    insert_ms.sort()
    return {
        "records": len(sample),
        "insert_seconds": insert_s,
        "inserts_per_s": len(sample) / insert_s if insert_s else None,
        "insert_p50_ms": percentile(insert_ms, 0.50),
        "insert_p99_ms": percentile(insert_ms, 0.99),
        **lookups(c, sample, args.field, args.lookups, args.seed),
    }


def cmd_lookups(args) -> dict:
    """Lookups only, on an existing catalog table (the reference's, or ours: it reads our rows)."""
    return lookups(client(args), read_csv(args.file), args.field, args.lookups, args.seed)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--table", required=True)
    p.add_argument("--wal", required=True)
    p.add_argument("--index-keys", required=True)
    p.add_argument("--row-key", required=True)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("insert")
    sub.add_parser("query")
    sub.add_parser("defects")
    b = sub.add_parser("bench")
    b.add_argument("--file", required=True)
    b.add_argument("--records", type=int, default=2000)
    b.add_argument("--lookups", type=int, default=2000)
    b.add_argument("--field", default="icao")
    b.add_argument("--seed", type=int, default=1)
    b.add_argument("--sample-out")
    lk = sub.add_parser("lookups")
    lk.add_argument("--file", required=True)
    lk.add_argument("--lookups", type=int, default=2000)
    lk.add_argument("--field", default="icao")
    lk.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    if not args.wal.isalnum():
        sys.exit(f"ref_catalog.py: --wal '{args.wal}' must be alphanumeric (an Azure table name)")
    commands = {"insert": cmd_insert, "query": cmd_query, "defects": cmd_defects, "bench": cmd_bench, "lookups": cmd_lookups}
    result = commands[args.command](args)
    json.dump(result, sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
