#!/usr/bin/env python3
"""Helpers of scripts/index_scale.sh (standard library only; talks HTTP to a running `serve`).

  index_scale.py write --url URL --records FILE --clients 8 --stop FILE
      C writer clients, each with one request in flight, until FILE exists. Each operation
      takes a random record of FILE (JSON lines, as `table-catalog export` writes them) and
      upserts it with a new `country` and `tz` (so records move between index values while
      an index is backfilled) and a new `elevation`; every 25th operation deletes a record
      by `icao` instead. Prints one JSON line: operations, upserts, deletes, errors (with up
      to 5 examples). Exit status 1 when a request failed.

  index_scale.py check --url URL --export FILE --field F [--page 1000]
      For every value of F in the export (the catalog's live records, every record once),
      reads `GET /api/records?F=value&limit=PAGE` through every continuation and checks that
      it returns exactly the export's records with that value, in ceil(n / PAGE) pages of at
      most PAGE, every page but the last full (one more, empty, page is allowed when n is a
      multiple of PAGE: tombstones after the page that filled up give it a continuation).
      Prints one JSON line (values, records, pages, the largest value, mismatches with up to
      5 examples). Exit status 1 on any mismatch.

  index_scale.py rows --sqlite FILE --table T --prefix P
      Embedded store only: counts the rows (live or tombstones) of table T whose PartitionKey
      starts with P in the store's SQLite file (read-only). Prints the number.
"""

import argparse
import concurrent.futures
import json
import math
import os
import random
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

COUNTRIES = ["US", "CA", "MX", "GB", "FR", "DE", "BR", "AU"]
ZONES = ["America/Chicago", "America/New_York", "Europe/Paris", "Europe/London", "Australia/Sydney", "UTC"]


def request(method, url, body=None, timeout=120):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write(args):
    records = read_jsonl(args.records)
    lock = threading.Lock()
    totals = {"operations": 0, "upserts": 0, "deletes": 0, "errors": 0}
    examples = []

    def client(n):
        rng = random.Random(args.seed * 1000 + n)
        op = 0
        while not os.path.exists(args.stop):
            op += 1
            r = dict(rng.choice(records))
            if op % 25 == 0 and r.get("icao"):
                kind = "deletes"
                status, body = request("DELETE", f"{args.url}/api/records?icao={urllib.parse.quote(r['icao'], safe='')}")
            else:
                kind = "upserts"
                r["country"] = rng.choice(COUNTRIES)
                r["tz"] = rng.choice(ZONES)
                r["elevation"] = op
                status, body = request("POST", f"{args.url}/api/records?upsert=true", r)
            with lock:
                totals["operations"] += 1
                if 200 <= status < 300:
                    totals[kind] += 1
                else:
                    totals["errors"] += 1
                    if len(examples) < 5:
                        examples.append(f"{kind}: {status} {body[:200].decode(errors='replace')}")

    started = time.monotonic()
    threads = [threading.Thread(target=client, args=(n,)) for n in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.monotonic() - started
    totals.update({"clients": args.clients, "seconds": round(seconds, 1),
                   "ops_per_s": round(totals["operations"] / seconds, 1) if seconds else 0, "examples": examples})
    print(json.dumps(totals))
    return 1 if totals["errors"] else 0


def canonical(record):
    return json.dumps(record, sort_keys=True)


def check(args):
    expected = {}
    for r in read_jsonl(args.export):
        v = r.get(args.field)
        if isinstance(v, str) and v:
            # Lookups compare values case-insensitively: group by the lower-case value.
            expected.setdefault(v.lower(), (v, []))[1].append(canonical(r))

    def lookup(item):
        value, want = item
        got, sizes, token = [], [], None
        while True:
            q = {args.field: value, "limit": str(args.page)}
            if token:
                q["continuation"] = token
            status, body = request("GET", f"{args.url}/api/records?{urllib.parse.urlencode(q)}")
            if status != 200:
                return value, len(want), len(sizes), f"{args.field}={value}: {status} {body[:200].decode(errors='replace')}"
            page = json.loads(body)
            if len(page["records"]) > args.page:
                return value, len(want), len(sizes), f"{args.field}={value}: a page of {len(page['records'])}"
            got.extend(canonical(r) for r in page["records"])
            sizes.append(len(page["records"]))
            token = page.get("continuation")
            if not token:
                break
        n, pages = len(want), len(sizes)
        if sorted(got) != sorted(want):
            missing, extra = len(set(want) - set(got)), len(set(got) - set(want))
            return value, n, pages, f"{args.field}={value}: {len(got)} found, {n} expected ({missing} missing, {extra} not expected)"
        # The right page count: every page but the last is full, so ceil(n / PAGE) pages; one
        # more, empty, only when n is a multiple of PAGE (the page that filled up had rows
        # after it, tombstones, so it carried a continuation).
        full = all(size == args.page for size in sizes[:-1])
        expected = max(1, math.ceil(n / args.page))
        trailing_empty = n > 0 and n % args.page == 0 and pages == expected + 1 and sizes[-1] == 0
        if not full or not (pages == expected or trailing_empty):
            return value, n, pages, f"{args.field}={value}: {n} records in pages of {sizes}"
        return value, n, pages, None

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        results = list(pool.map(lookup, [(v, want) for v, want in expected.values()]))
    mismatches = [m for _, _, _, m in results if m]
    largest = max(results, key=lambda r: r[1]) if results else ("", 0, 0, None)
    print(json.dumps({
        "field": args.field,
        "values": len(results),
        "records": sum(n for _, n, _, _ in results),
        "pages": sum(p for _, _, p, _ in results),
        "largest": {"value": largest[0], "records": largest[1], "pages": largest[2]},
        "mismatches": len(mismatches),
        "examples": mismatches[:5],
        "seconds": round(time.monotonic() - started, 1),
    }))
    return 1 if mismatches or not results else 0


def rows(args):
    import sqlite3

    db = sqlite3.connect(f"file:{args.sqlite}?mode=ro", uri=True)
    # The store declares its keys with a collation of its own (UTF-16 code unit order); the
    # count does not compare keys with it, but SQLite needs it registered to read the table.
    db.create_collation("UTF16", lambda a, b: (a.encode("utf-16-be") > b.encode("utf-16-be")) - (a.encode("utf-16-be") < b.encode("utf-16-be")))
    (n,) = db.execute("SELECT count(*) FROM entities WHERE tbl = ? AND substr(pk, 1, ?) = ?",
                      (args.table, len(args.prefix), args.prefix)).fetchone()
    print(n)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write")
    w.add_argument("--url", required=True)
    w.add_argument("--records", required=True)
    w.add_argument("--clients", type=int, default=8)
    w.add_argument("--stop", required=True)
    w.add_argument("--seed", type=int, default=1)
    c = sub.add_parser("check")
    c.add_argument("--url", required=True)
    c.add_argument("--export", required=True)
    c.add_argument("--field", required=True)
    c.add_argument("--page", type=int, default=1000)
    c.add_argument("--concurrency", type=int, default=8)
    r = sub.add_parser("rows")
    r.add_argument("--sqlite", required=True)
    r.add_argument("--table", required=True)
    r.add_argument("--prefix", required=True)
    args = p.parse_args()
    return {"write": write, "check": check, "rows": rows}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
