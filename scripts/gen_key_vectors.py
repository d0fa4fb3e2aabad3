#!/usr/bin/env python3
"""Generate key test vectors from the Python reference implementation.

The reference is ``az-table-catalog==1.0.1`` from PyPI. Its private helpers
``_partition_key`` and ``_row_key`` are called verbatim; nothing here
re-implements them. Run from the repository root, inside a virtualenv that has
exactly that version installed:

    python3 -m venv .venv-ref && .venv-ref/bin/pip install az-table-catalog==1.0.1 && .venv-ref/bin/python scripts/gen_key_vectors.py /path/to/airports.csv > tests/data/key_vectors.jsonl

and, for the hand-written edge cases:

    .venv-ref/bin/python scripts/gen_key_vectors.py --synthetic > tests/data/key_vectors_synthetic.jsonl

(``.venv-ref`` is gitignored.) In this project the airports file is
``/work/shared/data/airports.csv``.

Output is JSON Lines, UTF-8 (non-ASCII kept as is, not ``\\u`` escaped), one
object per line, deterministic (same input -> byte-identical output).

Airports mode (``key_vectors.jsonl``), index keys ["icao", "iata", "lid"],
row key "name"; one line per selected airport:

    {"record": {<all 11 columns, as strings exactly as in the file>},
     "row_key_ref": _row_key(record, record["name"], ["icao", "iata", "lid"]),
     "partition_keys_ref": {field: _partition_key(field, record[field])
                            for field in ["icao", "iata", "lid"]
                            if record[field] != ""}}

Selection (deterministic, by 0-based data-row index ``i``):
  * every 19th row (``i % 19 == 0``);
  * every row whose name contains ``'`` or ``/``, a non-ASCII character, one of
    ``\\ # ? %``, a control character, or leading/trailing whitespace;
  * every row whose icao, iata or lid contains anything but ASCII letters and
    digits;
  * rows with an empty iata or an empty lid: every 97th such row (counted
    among those rows only), on top of the many the every-19th rule already
    picks, so that both kinds of sparse identifier are well represented.

Synthetic mode (``key_vectors_synthetic.jsonl``): two kinds of line,
    {"case": .., "field": .., "value": .., "partition_key_ref": ..}
    {"case": .., "record": {..}, "index_keys": [..], "row_key_field": ..,
     "row_key_ref": ..}
where ``row_key_ref = _row_key(record, record[row_key_field], index_keys)``.
``case`` is a short human-readable label only.

The reference's RowKey is NOT lowercased and nothing is escaped: values are
recorded verbatim as the reference returns them.
"""

import csv
import json
import sys
from importlib.metadata import version

from az_table_catalog.az_table_catalog import _partition_key, _row_key

REF_PACKAGE = "az-table-catalog"
REF_VERSION = "1.0.1"
INDEX_KEYS = ["icao", "iata", "lid"]
ROW_KEY = "name"
COLUMNS = ["icao", "iata", "name", "city", "subd", "country", "elevation", "lat", "lon", "tz", "lid"]
EVERY_NTH = 19
EVERY_NTH_SPARSE = 97


def dump(obj):
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def awkward_name(name):
    if "'" in name or "/" in name:
        return True
    if any(ord(c) > 127 for c in name):
        return True
    if any(c in name for c in "\\#?%"):
        return True
    if any(ord(c) < 32 or 127 <= ord(c) <= 159 for c in name):
        return True
    return name != name.strip()


def odd_identifier(record):
    return any(not (c.isascii() and c.isalnum()) for k in INDEX_KEYS for c in record[k])


def airports(path, out):
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames != COLUMNS:
            raise SystemExit(f"unexpected header: {reader.fieldnames}")
        rows = list(reader)
    sparse_seen = 0
    written = 0
    for i, record in enumerate(rows):
        if None in record or any(v is None for v in record.values()):
            raise SystemExit(f"row {i}: wrong number of columns")
        sparse = record["iata"] == "" or record["lid"] == ""
        pick_sparse = False
        if sparse:
            pick_sparse = sparse_seen % EVERY_NTH_SPARSE == 0
            sparse_seen += 1
        if not (i % EVERY_NTH == 0 or awkward_name(record[ROW_KEY]) or odd_identifier(record) or pick_sparse):
            continue
        line = {
            "record": record,
            "row_key_ref": _row_key(record, record[ROW_KEY], INDEX_KEYS),
            "partition_keys_ref": {k: _partition_key(k, record[k]) for k in INDEX_KEYS if record[k] != ""},
        }
        out.write(dump(line) + "\n")
        written += 1
    print(f"{written} of {len(rows)} airports written", file=sys.stderr)


# (case, field, value)
PARTITION_CASES = [
    ("spec example: length prefix", "eid", "F314"),
    ("spec example: ':' in value", "a", "b:c"),
    ("spec example: ':' in field", "a:b", "c"),
    ("uppercase field and value", "ICAO", "KJFK"),
    ("mixed-case field and value", "IcAo", "kJfK"),
    ("empty value (reference does not skip it)", "iata", ""),
    ("e-acute", "name", "Café Ünïon"),
    ("sharp s stays sharp s", "name", "Straße"),
    ("capital sharp s U+1E9E lowercases to U+00DF", "name", "GROẞ"),
    ("final sigma inside value", "name", "ΟΔΟΣ"),
    ("sigma alone as value: whole string is lowercased, so it is word-final after the field", "a", "Σ"),
    ("sigma at end of field, followed by a cased value letter: not final", "ΑΣ", "x"),
    ("sigma at end of field, followed by a digit: final", "ΑΣ", "1"),
    ("dotted capital I expands on lowercasing; prefix is len of the ORIGINAL field", "İD", "x"),
    ("dotted capital I in value", "name", "İSTANBUL"),
    ("non-ASCII field: len counts code points", "é", "1"),
    ("emoji field: len counts code points (1), not UTF-16 units (2) nor bytes (4)", "😀", "x"),
    ("emoji in value", "name", "✈️ Sky 😀 Port"),
    ("kelvin sign lowercases to ASCII k", "name", "\u212a"),
    ("titlecase digraph", "name", "ǅemal"),
    ("percent", "name", "100% Field"),
    ("pipe", "name", "a|b"),
    ("apostrophe", "name", "O'Hare"),
    ("characters Azure forbids (not escaped by the reference)", "name", "a/b\\c#d?e"),
    ("control character", "name", "tab\there"),
    ("digits and space", "lid", "12 AB"),
]

# (case, record, index_keys, row_key_field)
AIRPORT_KEYS = ["icao", "iata", "lid"]
ROW_CASES = [
    ("uppercase identifiers", {"icao": "KJFK", "iata": "JFK", "lid": "JFK", "name": "John F Kennedy International Airport"}, AIRPORT_KEYS, "name"),
    ("same identifiers lowercase: same fingerprint", {"icao": "kjfk", "iata": "jfk", "lid": "jfk", "name": "John F Kennedy International Airport"}, AIRPORT_KEYS, "name"),
    ("mixed-case identifiers", {"icao": "KjFk", "iata": "jFK", "lid": "JfK", "name": "JOHN F kennedy International Airport"}, AIRPORT_KEYS, "name"),
    ("index keys in another order: fingerprint uses sorted field names", {"icao": "KJFK", "iata": "JFK", "lid": "JFK", "name": "John F Kennedy International Airport"}, ["lid", "icao", "iata"], "name"),
    ("empty iata and lid", {"icao": "00AA", "iata": "", "lid": "", "name": "Aero B Ranch Airport"}, AIRPORT_KEYS, "name"),
    ("all identifiers empty", {"icao": "", "iata": "", "lid": "", "name": "Nowhere"}, AIRPORT_KEYS, "name"),
    ("apostrophe and slash in name", {"icao": "KAVP", "iata": "AVP", "lid": "AVP", "name": "Wilkes-Barre/Wyoming Valley O'Brien's Field"}, AIRPORT_KEYS, "name"),
    ("colon, pipe and percent in name", {"icao": "ZZZZ", "iata": "ZZZ", "lid": "", "name": "A:B|C 100%"}, AIRPORT_KEYS, "name"),
    ("unicode name", {"icao": "LSZH", "iata": "ZRH", "lid": "", "name": "Zürich Flughafen Straße"}, AIRPORT_KEYS, "name"),
    ("final sigma in name and index value", {"icao": "ΟΔΟΣ", "iata": "ΣΣ", "lid": "Σ", "name": "ΟΔΟΣ ΑΕΡΟΔΡΟΜΙΟΣ"}, AIRPORT_KEYS, "name"),
    ("emoji in name and index value", {"icao": "😀", "iata": "✈️", "lid": "X", "name": "Smiley ✈️ 😀"}, AIRPORT_KEYS, "name"),
    ("sharp s vs SS in index value: different fingerprint", {"icao": "STRASSE", "iata": "", "lid": "", "name": "Straße"}, AIRPORT_KEYS, "name"),
    ("sharp s in index value", {"icao": "Straße", "iata": "", "lid": "", "name": "Straße"}, AIRPORT_KEYS, "name"),
    ("dotted capital I in index value expands on lowercasing", {"icao": "İST", "iata": "IST", "lid": "", "name": "İstanbul Havalimanı"}, AIRPORT_KEYS, "name"),
    ("leading/trailing spaces kept verbatim", {"icao": " KJFK ", "iata": "JFK", "lid": "", "name": "  Padded Name  "}, AIRPORT_KEYS, "name"),
    ("forbidden characters and control chars kept verbatim", {"icao": "A/B", "iata": "C#D", "lid": "E?F", "name": "back\\slash\ttab"}, AIRPORT_KEYS, "name"),
    ("pipe in index value: fingerprint collision, part 1", {"a": "x|y", "b": "", "name": "n"}, ["a", "b"], "name"),
    ("pipe in index value: fingerprint collision, part 2 (same row_key_ref)", {"a": "x", "b": "y|", "name": "n"}, ["a", "b"], "name"),
    ("uppercase index field names sort before lowercase (code-point order)", {"b": "1", "A": "2", "C": "3", "name": "Sorted"}, ["b", "A", "C"], "name"),
    ("row key field is also an index key", {"icao": "EGLL", "iata": "LHR", "lid": "", "name": "Heathrow"}, AIRPORT_KEYS, "icao"),
    ("single index key", {"eid": "F314", "title": "Mixed Case Title"}, ["eid"], "title"),
    ("empty row key value", {"icao": "KJFK", "iata": "JFK", "lid": "JFK", "name": ""}, AIRPORT_KEYS, "name"),
]


def synthetic(out):
    for case, field, value in PARTITION_CASES:
        out.write(dump({"case": case, "field": field, "value": value, "partition_key_ref": _partition_key(field, value)}) + "\n")
    for case, record, index_keys, rk_field in ROW_CASES:
        out.write(dump({
            "case": case,
            "record": record,
            "index_keys": index_keys,
            "row_key_field": rk_field,
            "row_key_ref": _row_key(record, record[rk_field], index_keys),
        }) + "\n")
    print(f"{len(PARTITION_CASES)} partition-key and {len(ROW_CASES)} row-key vectors written", file=sys.stderr)


def main(argv):
    installed = version(REF_PACKAGE)
    if installed != REF_VERSION:
        raise SystemExit(f"{REF_PACKAGE} {installed} is installed; these vectors need {REF_VERSION}")
    sys.stdout.reconfigure(encoding="utf-8", newline="\n")
    if argv == ["--synthetic"]:
        synthetic(sys.stdout)
    elif len(argv) == 1 and not argv[0].startswith("-"):
        airports(argv[0], sys.stdout)
    else:
        raise SystemExit(f"usage: {sys.argv[0]} AIRPORTS_CSV | --synthetic")


if __name__ == "__main__":
    main(sys.argv[1:])
