//! Interoperability with the Python reference implementation (`az-table-catalog==1.0.1`) and
//! an independent check of our keys with the official Python client (`azure-data-tables`),
//! both on Azurite. docs/COMPATIBILITY.md cites these tests by name.
//!
//! - `reference_rows_are_found_by_our_query`: records the reference writes are returned by our
//!   `query` for each identifier, with the same RowKey; our upsert then replaces them.
//! - `our_rows_are_found_by_the_reference_query`: records we write are returned by the
//!   reference's `query`, which computes the PartitionKey itself.
//! - `reference_defects_and_how_we_avoid_them`: the reference's known defects, reproduced,
//!   next to the same inputs through our catalog.
//! - `binary_import_keys_match_the_spec_by_an_independent_client`: a few hundred airports (and
//!   synthetic tricky identifiers) imported with the `table-catalog` binary, every entity read
//!   back with `azure-data-tables`, keys compared with the spec computed in Python.
//! - `full_airports_import_on_azurite_matches_the_spec`: the same for all 28,403 airports,
//!   plus `table-catalog verify`. 1.5-3 minutes in a debug build on 2 cores (load-dependent).
//!
//! They run only when `TC_TEST_AZURE_CONNECTION` is set (`scripts/test.sh` does it; by hand:
//! `source scripts/azurite.sh start`). Without it they print a `SKIPPED:` line (see
//! `tests/common/skip.rs`; `scripts/test.sh` fails on it), and fail under `CI`. The Python side needs no manual step: the tests run
//! `scripts/python_env.sh`, which creates `.venv-ref/` with the pinned packages on first use.
//! Helper scripts: `tests/python/ref_catalog.py` (drives the reference) and
//! `tests/python/check_keys.py` (the independent key check).

use crate::common;
use table_catalog::testing::CatalogInternals;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use table_catalog::catalog::Catalog;
use table_catalog::config::Config;
use table_catalog::query::Filter;
use table_catalog::record::Record;
use table_catalog::store::{Entity, RowRange, Value as Prop};
use table_catalog::testing::import::{self, Format};
use table_catalog::testing::schema::Schema;
use table_catalog::testing::wal::{Op, WalEntry, WalId, SHARD};

const INDEX_KEYS: [&str; 3] = ["icao", "iata", "lid"];
const ROW_KEY: &str = "name";

// ---------------------------------------------------------------------------------------
// Setup
// ---------------------------------------------------------------------------------------

/// The Azurite connection string, or `None` after reporting `test` as skipped.
fn azurite(test: &str) -> Option<String> {
    common::skip::azurite(test)
}

macro_rules! azurite_or_skip {
    ($name:expr) => {
        match azurite($name) {
            Some(cs) => cs,
            None => return,
        }
    };
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The interpreter of `.venv-ref/`, created by `scripts/python_env.sh` on first use.
fn python() -> PathBuf {
    static PYTHON: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let started = Instant::now();
            let out = Command::new("bash")
                .arg(root().join("scripts/python_env.sh"))
                .arg("--print")
                .stdin(Stdio::null())
                .output()
                .map_err(|e| format!("running scripts/python_env.sh: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "scripts/python_env.sh failed ({}):\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
            eprintln!("python env ready in {:.1} s: {path}", started.elapsed().as_secs_f64());
            Ok(PathBuf::from(path))
        })
        .clone()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `tests/python/{script}` with `args`, feeding `stdin`; the connection string goes
/// through the environment.
fn run_python(cs: &str, script: &str, args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(python())
        .arg(root().join("tests/python").join(script))
        .args(args)
        .env("TC_PY_CONNECTION", cs)
        .env("PYTHONIOENCODING", "utf-8")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {script}: {e}"));
    let mut pipe = child.stdin.take().unwrap();
    let input = stdin.to_string();
    let writer = std::thread::spawn(move || {
        let _ = pipe.write_all(input.as_bytes());
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    out
}

/// Runs a helper that must succeed and print one JSON document.
fn python_json(cs: &str, script: &str, args: &[&str], stdin: &str) -> Value {
    let out = run_python(cs, script, args, stdin);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{script} {args:?} failed ({}):\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{script}: output is not JSON ({e}): {stdout}"))
}

/// Arguments naming the reference's catalog: our table, its own (alphanumeric) WAL table.
fn reference_args<'a>(table: &'a str, wal: &'a str) -> Vec<&'a str> {
    vec!["--table", table, "--wal", wal, "--index-keys", "icao,iata,lid", "--row-key", ROW_KEY]
}

/// The `table-catalog` binary, on the Azure backend through `cs`.
fn catalog_bin(cs: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_table-catalog"));
    c.env("AZURE_STORAGE_CONNECTION_STRING", cs).env_remove("AzureWebJobsStorage").stdin(Stdio::null());
    for var in [
        "TABLE_CATALOG_NAME",
        "TABLE_CATALOG_INDEX_KEYS",
        "TABLE_CATALOG_ROW_KEY",
        "TABLE_CATALOG_WAL_NAME",
        "TABLE_CATALOG_QUEUE",
        "TABLE_CATALOG_SCAN_QUEUE",
    ] {
        c.env_remove(var);
    }
    c
}

fn unique_name(prefix: &str) -> String {
    format!("{prefix}{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

async fn open_catalog(cs: &str, name: &str) -> Catalog {
    Config::new(name).index_keys(INDEX_KEYS).row_key(ROW_KEY).connection_string(cs).open().await.unwrap()
}

fn schema() -> Schema {
    Schema::new(INDEX_KEYS.iter().map(|s| s.to_string()).collect(), ROW_KEY).unwrap()
}

fn airports_csv() -> PathBuf {
    root().join("data/airports.csv")
}

/// The airports as the reference's users read them (`csv.DictReader`): every cell a string.
fn airports_as_strings() -> Vec<Record> {
    let mut reader = csv::Reader::from_path(airports_csv()).unwrap();
    let headers: Vec<String> = reader.headers().unwrap().iter().map(String::from).collect();
    reader
        .records()
        .map(|r| {
            let r = r.unwrap();
            headers.iter().cloned().zip(r.iter().map(|c| Value::String(c.to_string()))).collect()
        })
        .collect()
}

fn text<'a>(r: &'a Record, field: &str) -> &'a str {
    r.get(field).and_then(Value::as_str).unwrap_or("")
}

/// True when the string has a character Azure forbids in keys (the reference does not
/// escape them and wedges on them).
fn has_forbidden(s: &str) -> bool {
    s.chars().any(table_catalog::testing::keys::is_forbidden_key_char)
}

/// (field, value) of each non-empty identifier of the record.
fn identifiers(r: &Record) -> Vec<(String, String)> {
    INDEX_KEYS.iter().filter(|f| !text(r, f).is_empty()).map(|f| (f.to_string(), text(r, f).to_string())).collect()
}

fn json_lines<'a>(values: impl IntoIterator<Item = &'a Value>) -> String {
    values.into_iter().map(|v| format!("{v}\n")).collect()
}

/// Picks records by kind, in file order, each at most once: `(predicate, how many)`.
/// A predicate on records.
type Kind<'a> = &'a dyn Fn(&Record) -> bool;

fn pick(all: &[Record], kinds: &[(Kind<'_>, usize)]) -> Vec<Record> {
    let mut taken = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for (pred, n) in kinds {
        let mut k = 0;
        for (i, r) in all.iter().enumerate() {
            if k == *n {
                break;
            }
            if !taken.contains(&i) && pred(r) {
                taken.insert(i);
                out.push(r.clone());
                k += 1;
            }
        }
        assert_eq!(k, *n, "the airports file has fewer records of a kind than the test wants");
    }
    out
}

// ---------------------------------------------------------------------------------------
// (a) The reference writes, we read
// ---------------------------------------------------------------------------------------

/// Records the reference writes (its `insert`, which also applies them) are returned by our
/// `query_all` for each identifier they have, with the RowKey we compute for them, and our
/// range query finds them. The reference leaks its WAL property `operation` into every row,
/// so we return it as a field (documented in docs/COMPATIBILITY.md). Our upsert of a record
/// with the same identity replaces the reference's rows (rows without our `_tc` property
/// count as older than any write of ours).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_rows_are_found_by_our_query() {
    let cs = azurite_or_skip!("reference_rows_are_found_by_our_query");
    let started = Instant::now();
    let all = airports_as_strings();
    let clean = |r: &Record| !has_forbidden(text(r, ROW_KEY));
    let full = |r: &Record| clean(r) && identifiers(r).len() == 3;
    let no_iata = |r: &Record| clean(r) && text(r, "iata").is_empty();
    let no_lid = |r: &Record| clean(r) && text(r, "lid").is_empty() && !text(r, "iata").is_empty();
    let quote = |r: &Record| clean(r) && text(r, ROW_KEY).contains('\'');
    let non_ascii = |r: &Record| clean(r) && !text(r, ROW_KEY).is_ascii();
    let mut records = pick(&all, &[(&full, 10), (&no_iata, 6), (&no_lid, 6), (&quote, 4), (&non_ascii, 4)]);
    for r in &mut records {
        // The reference does not lowercase its RowKey: lowercase sort values give the same
        // RowKey on both sides (our RowKeys are lowercased, as the product description says).
        let lower = text(r, ROW_KEY).to_lowercase();
        r.insert(ROW_KEY.into(), Value::String(lower));
        // Typed properties: Python int -> Edm.Int32, float -> Edm.Double.
        if let Ok(e) = text(r, "elevation").parse::<i64>() {
            r.insert("elevation".into(), json!(e));
        }
        for f in ["lat", "lon"] {
            if let Ok(x) = text(r, f).parse::<f64>() {
                r.insert(f.into(), json!(x));
            }
        }
    }

    let name = unique_name("pyref");
    let ref_wal = format!("{name}ref");
    let lines: Vec<Value> = records.iter().cloned().map(Value::Object).collect();
    let out = python_json(
        &cs,
        "ref_catalog.py",
        &[reference_args(&name, &ref_wal), vec!["insert"]].concat(),
        &json_lines(&lines),
    );
    assert_eq!(out["inserted"], records.len());

    let catalog = open_catalog(&cs, &name).await;
    assert_eq!(catalog.names().table, name);
    assert_eq!(catalog.names().wal_table, format!("{name}wal"), "our default WAL table");
    assert_ne!(catalog.names().wal_table, ref_wal, "the two WAL tables must differ");

    let mut lookups = 0;
    for r in &records {
        let mut expected = r.clone();
        expected.insert("operation".into(), json!("insert")); // the reference's leak
        let our_row_key = schema().record_keys(r).unwrap().row_key;
        for (field, value) in identifiers(r) {
            let found = catalog.query_all(&Filter::new(vec![(field.clone(), value.clone())])).await.unwrap();
            assert_eq!(found, vec![expected.clone()], "{field}={value}");
            // Same RowKey as ours, so range queries and identity agree.
            let page = catalog.query(&Filter::new(vec![(field.clone(), value.clone())]), 10, None).await.unwrap();
            assert_eq!(page.records.len(), 1);
            assert_eq!(page.records[0].row_key, our_row_key, "{field}={value}");
            let sort = text(r, ROW_KEY).to_string();
            let ranged = Filter::new(vec![(field.clone(), value.to_lowercase())]).range(Some(sort.clone()), Some(sort));
            assert_eq!(
                catalog.query_all(&ranged).await.unwrap().len(),
                1,
                "{field}={value} with a range on its sort value"
            );
            lookups += 1;
        }
    }
    assert!(lookups >= 60, "{lookups}");

    // The reference files records without an IATA code under one partition, "4_iata"; we never
    // write such rows, and an empty filter value is refused rather than answered.
    let without_iata = records.iter().filter(|r| text(r, "iata").is_empty()).count();
    let page = catalog.store().query_partition(&name, "4_iata", &RowRange::default(), 1000, None).await.unwrap();
    assert_eq!(page.entities.len(), without_iata);
    assert!(catalog.query_all(&Filter::new(vec![("iata".into(), String::new())])).await.is_err());

    // Our upsert of the same identity replaces the reference's rows (no duplicate, no leak).
    let mut ours = records[0].clone();
    ours.insert("city".into(), json!("Rewritten by table-catalog"));
    catalog.upsert(ours.clone(), true).await.unwrap();
    for (field, value) in identifiers(&ours) {
        let found = catalog.query_all(&Filter::new(vec![(field.clone(), value.clone())])).await.unwrap();
        assert_eq!(found, vec![ours.clone()], "{field}={value} after our upsert");
    }
    eprintln!(
        "reference_rows_are_found_by_our_query: {} records, {lookups} lookups, {:.1} s",
        records.len(),
        started.elapsed().as_secs_f64()
    );
}

// ---------------------------------------------------------------------------------------
// (b) We write, the reference reads
// ---------------------------------------------------------------------------------------

/// Records we write (`insert` and `upsert` with `wait`) are returned by the reference's
/// `query`, which computes the PartitionKey itself, for each identifier; its range query
/// finds our rows even for mixed-case sort values (our RowKey is lowercased, its bounds are
/// too). The reference returns our `_tc` system property as a field, and fields we store as
/// JSON text (null, arrays, objects) as that text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_rows_are_found_by_the_reference_query() {
    let cs = azurite_or_skip!("our_rows_are_found_by_the_reference_query");
    let started = Instant::now();
    // As our importer reads them: numeric columns typed, identifiers and names strings.
    let all: Vec<Record> = import::read_file(&airports_csv(), Format::Csv, &schema())
        .unwrap()
        .into_iter()
        .map(|(_, r)| r.unwrap())
        .collect();
    let full = |r: &Record| identifiers(r).len() == 3;
    let no_iata = |r: &Record| text(r, "iata").is_empty();
    let quote = |r: &Record| text(r, ROW_KEY).contains('\'');
    let slash = |r: &Record| text(r, ROW_KEY).contains('/');
    let non_ascii = |r: &Record| !text(r, ROW_KEY).is_ascii();
    let mut records = pick(&all, &[(&full, 10), (&no_iata, 6), (&quote, 4), (&slash, 4), (&non_ascii, 4)]);
    // Types beyond strings and small numbers: Int64, a boolean, and JSON-text fields.
    let special = json!({
        "icao": "ZZPY", "iata": "ZPY", "lid": "", "name": "Interop Check Field",
        "population": 5_000_000_000i64, "closed": false, "tags": ["a", "b"], "note": null
    });
    records.push(special.as_object().cloned().unwrap());

    let name = unique_name("pyours");
    let catalog = open_catalog(&cs, &name).await;
    for (i, r) in records.iter().enumerate() {
        if i % 2 == 0 {
            catalog.insert(r.clone(), true).await.unwrap();
        } else {
            catalog.upsert(r.clone(), true).await.unwrap();
        }
    }

    // One reference query per identifier, plus a range query on the (mixed-case) sort value
    // where the reference can express it (no `'`: it does not escape quotes; no forbidden
    // characters: it does not escape those either).
    let mut queries = Vec::new();
    let mut expect: Vec<(String, &Record)> = Vec::new();
    for r in &records {
        for (field, value) in identifiers(r) {
            queries.push(json!({"filter": {field.as_str(): value}}));
            expect.push((format!("{field}={value}"), r));
        }
        let sort = text(r, ROW_KEY);
        if !sort.contains('\'') && !has_forbidden(sort) && sort != sort.to_lowercase() {
            queries.push(json!({"filter": {"icao": text(r, "icao")}, "row_from": sort, "row_to": sort}));
            expect.push((format!("icao={} range {sort}", text(r, "icao")), r));
        }
    }
    let ranged = expect.iter().filter(|(q, _)| q.contains(" range ")).count();
    assert!(ranged >= 10, "{ranged} range queries");
    queries.push(json!({"filter": {"iata": ""}}));

    let wal = format!("{name}ref");
    let out = python_json(
        &cs,
        "ref_catalog.py",
        &[reference_args(&name, &wal), vec!["query"]].concat(),
        &json_lines(&queries),
    );
    let results = out["results"].as_array().unwrap();
    assert_eq!(results.len(), queries.len());
    for ((what, record), result) in expect.iter().zip(results) {
        let rows = result.as_array().unwrap_or_else(|| panic!("{what}: the reference failed: {result}"));
        assert_eq!(rows.len(), 1, "{what}: {result}");
        let mut row = rows[0].as_object().unwrap().clone();
        let meta = row.remove("_tc").unwrap_or_else(|| panic!("{what}: no _tc in {result}"));
        let meta: Value = serde_json::from_str(meta.as_str().unwrap()).unwrap();
        assert!(meta["w"].is_string(), "{what}: {meta}");
        // What the reference sees: JSON-text fields as text (their names are listed in _tc).
        let mut seen = (*record).clone();
        for (k, v) in seen.iter_mut() {
            if matches!(v, Value::Null | Value::Array(_) | Value::Object(_)) {
                assert!(meta["j"].as_array().unwrap().contains(&json!(k)), "{what}: {k} listed as JSON text");
                *v = Value::String(v.to_string());
            }
        }
        assert_eq!(row, seen, "{what}");
    }
    assert_eq!(results.last().unwrap(), &json!([]), "no row for an empty identifier");
    eprintln!(
        "our_rows_are_found_by_the_reference_query: {} records, {} queries, {:.1} s",
        records.len(),
        queries.len(),
        started.elapsed().as_secs_f64()
    );
}

// ---------------------------------------------------------------------------------------
// The reference's known defects, and ours on the same inputs
// ---------------------------------------------------------------------------------------

fn rec(icao: &str, name: &str) -> Record {
    json!({"icao": icao, "iata": "", "lid": "", "name": name}).as_object().cloned().unwrap()
}

async fn find(catalog: &Catalog, field: &str, value: &str) -> Vec<Record> {
    catalog.query_all(&Filter::new(vec![(field.into(), value.into())])).await.unwrap()
}

/// Reproduces each defect of the reference listed in docs/COMPATIBILITY.md on Azurite, then
/// shows our catalog on the same input: delete works (also on rows the reference wrote, with
/// the leaked `operation`, and the reference no longer sees them once tombstones are swept);
/// `/` is escaped and later writes go on; an unreadable WAL entry is set aside instead of
/// blocking; `'` is quoted; a WAL entry with an id older than the checkpoint is still applied;
/// mixed-case sort values are found by range; null and empty identifiers get no row and
/// block nothing; integers over 32 bits are stored; a field named `operation` is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_defects_and_how_we_avoid_them() {
    let cs = azurite_or_skip!("reference_defects_and_how_we_avoid_them");
    let started = Instant::now();
    let base = unique_name("pydef");
    let facts =
        python_json(&cs, "ref_catalog.py", &[reference_args(&base, &format!("{base}w")), vec!["defects"]].concat(), "");
    for fact in [
        "operation_leaks_into_rows",
        "delete_leaves_the_record",
        "slash_wedges_later_writes",
        "slash_later_records_missing",
        "apostrophe_query_fails",
        "late_entry_never_applied",
        "mixed_case_range_misses",
        "null_identifier_wedges_later_writes",
        "int_over_32_bits_rejected",
        "operation_field_record_lost",
        "default_wal_name_rejected",
    ] {
        assert_eq!(facts[fact], json!(true), "reference defect '{fact}' no longer reproduces: {facts}");
    }
    assert_eq!(facts["empty_iata_partition_rows"], json!(1), "{facts}");

    // Ours, on one catalog (tombstones swept immediately, to show the reference's view).
    let name = unique_name("pyfix");
    let mut config = Config::new(&name).index_keys(INDEX_KEYS).row_key(ROW_KEY).connection_string(&cs);
    config.options.wal.tombstone_grace = Duration::ZERO;
    let catalog = config.open().await.unwrap();
    let names = catalog.names().clone();

    // 1. Delete, including a record the reference wrote (it carries `operation`).
    let ref_wal = format!("{name}ref");
    let args = reference_args(&name, &ref_wal);
    python_json(
        &cs,
        "ref_catalog.py",
        &[args.clone(), vec!["insert"]].concat(),
        &json_lines([&Value::Object(rec("KDEL", "delete me"))]),
    );
    assert_eq!(find(&catalog, "icao", "KDEL").await.len(), 1);
    catalog.delete(Filter::new(vec![("icao".into(), "KDEL".into())]), true).await.unwrap();
    assert!(find(&catalog, "icao", "KDEL").await.is_empty(), "our delete removes it");
    let q = json_lines([&json!({"filter": {"icao": "KDEL"}})]);
    let seen = python_json(&cs, "ref_catalog.py", &[args.clone(), vec!["query"]].concat(), &q);
    let tomb = &seen["results"][0];
    assert_eq!(tomb.as_array().map(Vec::len), Some(1), "until swept, the reference sees our tombstone: {seen}");
    assert!(tomb[0]["_tc"].as_str().unwrap().contains("\"d\":true"), "{seen}");
    catalog.sweep().await.unwrap();
    let seen = python_json(&cs, "ref_catalog.py", &[args.clone(), vec!["query"]].concat(), &q);
    assert_eq!(seen["results"][0], json!([]), "after the sweep the row is gone for the reference too");

    // 2. `/` (and the other forbidden characters) are escaped; later writes go on.
    for (icao, n) in [("A/B", "slash"), ("C\\D#E?F", "more forbidden"), ("KOK1", "fine one")] {
        catalog.upsert(rec(icao, n), true).await.unwrap();
    }
    for icao in ["A/B", "C\\D#E?F", "KOK1"] {
        assert_eq!(find(&catalog, "icao", icao).await.len(), 1, "{icao}");
    }
    // An entry that can never be applied is moved aside, not retried first forever: planted
    // in the WAL shard the next write goes to, ahead of it.
    let next = rec("KOK2", "after a bad entry");
    let shard = catalog.applier().route(&Op::Upsert { record: next.clone() }).unwrap();
    let bad = Entity::new(shard.partition(), WalId::new(946_684_800_000_000, uuid::Uuid::new_v4()).as_str())
        .with("v", Prop::Int32(99));
    catalog.store().insert(&names.wal_table, &bad).await.unwrap();
    catalog.upsert(next, true).await.unwrap();
    assert_eq!(find(&catalog, "icao", "KOK2").await.len(), 1);
    let status = catalog.status().await.unwrap();
    assert_eq!((status.pending, status.dead), (0, 1), "{status:?}");

    // 3. Apostrophes in values are quoted in filters.
    catalog.upsert(rec("O'HARE", "quote"), true).await.unwrap();
    assert_eq!(find(&catalog, "icao", "O'HARE").await.len(), 1);
    assert!(find(&catalog, "icao", "O'HARE' or PartitionKey ne '").await.is_empty());

    // 4. An entry logged with an id older than the checkpoint is still applied.
    let late = WalEntry {
        id: WalId::new(946_684_800_000_001, uuid::Uuid::new_v4()),
        op: Op::Upsert { record: rec("KLA2", "late") },
        schema_version: 0,
        at: None,
        resume: None,
    };
    catalog.store().insert(&names.wal_table, &late.to_entity(SHARD)).await.unwrap();
    catalog.recover().await.unwrap();
    assert_eq!(find(&catalog, "icao", "KLA2").await.len(), 1, "late entry applied");
    assert!(catalog.status().await.unwrap().checkpoint.unwrap() > late.id.to_string());

    // 5. Mixed-case sort values are found by range.
    catalog.upsert(rec("KMIX", "Mixed Case Field"), true).await.unwrap();
    let ranged = Filter::new(vec![("icao".into(), "KMIX".into())])
        .range(Some("Mixed Case Field".into()), Some("Mixed Case Field".into()));
    assert_eq!(catalog.query_all(&ranged).await.unwrap().len(), 1);

    // 6. A null identifier is no identifier (no row, no failure); integers over 32 bits are
    // stored as Edm.Int64.
    let mut nul = rec("KNUL", "null iata");
    nul.insert("iata".into(), Value::Null);
    nul.insert("lid".into(), json!("X1"));
    nul.insert("n".into(), json!(1i64 << 31));
    catalog.upsert(nul.clone(), true).await.unwrap();
    catalog.upsert(rec("KOK9", "after null"), true).await.unwrap();
    assert_eq!(find(&catalog, "lid", "X1").await, vec![nul.clone()]);
    assert_eq!(find(&catalog, "icao", "KNUL").await, vec![nul]);
    assert_eq!(find(&catalog, "icao", "KOK9").await.len(), 1);

    // 7. A field named `operation` is just a field (our WAL body is JSON, apart from records).
    let mut opf = rec("KOPF", "operation field");
    opf.insert("operation".into(), json!("delete"));
    catalog.upsert(opf.clone(), true).await.unwrap();
    assert_eq!(find(&catalog, "icao", "KOPF").await, vec![opf]);

    // 8. Empty identifiers get no row. (The only "4_iata" row here is the one the reference
    // wrote for KDEL: our delete resolved KDEL through its icao row and removed the rows of the
    // identifiers it has; the reference's row for its empty iata is not one of ours.)
    catalog.upsert(rec("KEMP", "no iata"), true).await.unwrap();
    let page = catalog.store().query_partition(&name, "4_iata", &RowRange::default(), 10, None).await.unwrap();
    let icaos: Vec<_> =
        page.entities.iter().map(|e| (e.str("icao").unwrap_or_default().to_string(), e.str("_tc").is_some())).collect();
    assert_eq!(icaos, vec![("KDEL".to_string(), false)], "only the reference's row");
    eprintln!("reference_defects_and_how_we_avoid_them: {:.1} s", started.elapsed().as_secs_f64());
}

// ---------------------------------------------------------------------------------------
// (c) and the full file: our binary writes, an independent client checks the keys
// ---------------------------------------------------------------------------------------

/// Imports `file` with `table-catalog import` into catalog `name`; returns the seconds taken.
fn import_with_binary(cs: &str, name: &str, file: &Path) -> f64 {
    let started = Instant::now();
    let out = catalog_bin(cs)
        .args(["--name", name, "--index-keys", "icao,iata,lid", "--row-key", ROW_KEY, "import", "--file"])
        .arg(file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "table-catalog import failed ({}): {stderr}", out.status);
    assert!(stderr.contains("applied to every index") && stderr.contains("; 0 rejected"), "{stderr}");
    started.elapsed().as_secs_f64()
}

/// Runs tests/python/check_keys.py over the table; returns its report (asserted ok).
fn check_keys(cs: &str, name: &str, file: &Path) -> Value {
    let file = file.to_str().unwrap();
    let out = run_python(
        cs,
        "check_keys.py",
        &["--table", name, "--file", file, "--index-keys", "icao,iata,lid", "--row-key", ROW_KEY],
        "",
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!("check_keys.py printed no report ({e}): {stdout}\n{}", String::from_utf8_lossy(&out.stderr))
    });
    assert!(out.status.success() && report["ok"] == json!(true), "keys differ from the spec: {report:#}");
    report
}

fn write_csv(path: &Path, headers: &[String], rows: &[Vec<String>]) {
    let mut w = csv::WriterBuilder::new().quote_style(csv::QuoteStyle::Always).from_path(path).unwrap();
    w.write_record(headers).unwrap();
    for r in rows {
        w.write_record(r).unwrap();
    }
    w.flush().unwrap();
}

/// A few hundred airports (the first 250, and names with `?`, `/`, `'`, non-ASCII) plus
/// synthetic rows with identifiers and names full of characters that need escaping,
/// imported with the binary; every entity is read back with azure-data-tables and its keys
/// compared with the spec computed independently in Python. The binary's `query` finds the
/// escaped identifiers.
#[test]
fn binary_import_keys_match_the_spec_by_an_independent_client() {
    let cs = azurite_or_skip!("binary_import_keys_match_the_spec_by_an_independent_client");
    let started = Instant::now();
    let mut reader = csv::Reader::from_path(airports_csv()).unwrap();
    let headers: Vec<String> = reader.headers().unwrap().iter().map(String::from).collect();
    let all: Vec<Vec<String>> = reader.records().map(|r| r.unwrap().iter().map(String::from).collect()).collect();
    let name_col = headers.iter().position(|h| h == ROW_KEY).unwrap();
    let mut chosen: Vec<usize> = (0..250).collect();
    for (pred, n) in [
        (&(|s: &str| s.contains('?')) as &dyn Fn(&str) -> bool, 5),
        (&|s: &str| s.contains('/'), 40),
        (&|s: &str| s.contains('\''), 30),
        (&|s: &str| !s.is_ascii(), 30),
    ] {
        chosen.extend(all.iter().enumerate().filter(|(i, r)| *i >= 250 && pred(&r[name_col])).map(|(i, _)| i).take(n));
    }
    chosen.sort();
    chosen.dedup();
    let mut rows: Vec<Vec<String>> = chosen.iter().map(|i| all[*i].clone()).collect();
    // Synthetic: icao, iata, name, lid (other columns filled in).
    let synthetic = [
        ("ZZ/1", "A#B", "Tricky / Name #1? 100%", "L\\X"),
        ("ZZ%2F", "", "Percent %2F Literal", "É?"),
        ("ZZ'Q", "Q'Q", "O'Quote Field", ""),
        ("ZZ\tTAB", "C\u{1}D", "Ctl\u{7f}Name\u{85}", "E\u{9f}F"),
        ("İSTZZ", "ΣΑΣ", "ΟΔΟΣ Field", "ẞZZ"),
        ("ZZ😀", "", "Emoji 😀 Field", "Kelvin\u{212a}"),
    ];
    for (icao, iata, name, lid) in synthetic {
        let mut r = vec![String::new(); headers.len()];
        for (h, v) in
            [("icao", icao), ("iata", iata), ("name", name), ("lid", lid), ("city", "Synthetic"), ("country", "XX")]
        {
            r[headers.iter().position(|x| x == h).unwrap()] = v.to_string();
        }
        rows.push(r);
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sample.csv");
    write_csv(&file, &headers, &rows);
    let identifiers: usize = rows
        .iter()
        .map(|r| INDEX_KEYS.iter().filter(|f| !r[headers.iter().position(|h| h == *f).unwrap()].is_empty()).count())
        .sum();

    let name = unique_name("pykeys");
    let import_s = import_with_binary(&cs, &name, &file);
    let t = Instant::now();
    let report = check_keys(&cs, &name, &file);
    let check_s = t.elapsed().as_secs_f64();
    assert_eq!(report["records"], json!(rows.len()));
    assert_eq!(report["entities"], json!(identifiers), "one row per non-empty identifier");
    assert!(report["escaped_rows"].as_u64().unwrap() >= 40, "{report}");

    // The binary finds the escaped identifiers too.
    for (field, value) in
        [("icao", "ZZ/1"), ("iata", "A#B"), ("lid", "L\\X"), ("icao", "ZZ%2F"), ("icao", "ZZ'Q"), ("iata", "σας")]
    {
        let out = catalog_bin(&cs).args(["--name", &name, "query", &format!("{field}={value}")]).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(stdout.lines().count(), 1, "{field}={value}: {stdout}");
        assert!(stdout.contains("\"city\":\"Synthetic\""), "{field}={value}: {stdout}");
    }
    eprintln!(
        "binary_import_keys_match_the_spec_by_an_independent_client: {} records, {identifiers} rows; import {import_s:.1} s, check {check_s:.1} s, total {:.1} s",
        rows.len(),
        started.elapsed().as_secs_f64()
    );
}

/// All 28,403 airports through `table-catalog import` into Azurite; every entity read back
/// with azure-data-tables and checked against the spec (one row per non-empty identifier:
/// 48,978 rows), then `table-catalog verify` exits 0. Takes 1.5-3 minutes in a debug build
/// on 2 cores (see the report printed at the end).
#[test]
#[ignore = "long check (2.5 minutes on 2 cores): CI checks the import's keys on a sample with an independent client (binary_import_keys_match_the_spec_by_an_independent_client); scripts/test.sh --test suite -- --ignored"]
fn full_airports_import_on_azurite_matches_the_spec() {
    let cs = azurite_or_skip!("full_airports_import_on_azurite_matches_the_spec");
    let started = Instant::now();
    let records = airports_as_strings();
    assert_eq!(records.len(), 28_403);
    let identifiers: usize = records.iter().map(|r| identifiers(r).len()).sum();
    assert_eq!(identifiers, 48_978);

    let name = unique_name("pyfull");
    let import_s = import_with_binary(&cs, &name, &airports_csv());
    let t = Instant::now();
    let report = check_keys(&cs, &name, &airports_csv());
    let check_s = t.elapsed().as_secs_f64();
    assert_eq!(report["records"], json!(28_403));
    assert_eq!(report["entities"], json!(identifiers), "one row per non-empty identifier");

    let t = Instant::now();
    let out = catalog_bin(&cs).args(["--name", &name, "verify"]).output().unwrap();
    let verify_s = t.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "table-catalog verify exited {}: {stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // Findings go to stdout as JSON lines (none here), the counts to stderr's last line.
    assert!(stdout.trim().is_empty(), "findings: {stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let verified: Value = serde_json::from_str(stderr.lines().last().unwrap_or_default()).unwrap();
    assert_eq!(
        (verified["rows"].clone(), verified["records"].clone()),
        (json!(identifiers), json!(28_403)),
        "{verified}"
    );
    assert_eq!(verified["findings"], json!({}));
    let per_field: BTreeMap<&str, usize> =
        INDEX_KEYS.iter().map(|f| (*f, records.iter().filter(|r| !text(r, f).is_empty()).count())).collect();
    eprintln!(
        "full_airports_import_on_azurite_matches_the_spec: {identifiers} rows ({per_field:?}); import {import_s:.1} s ({:.0} records/s), key check {check_s:.1} s, verify {verify_s:.1} s, total {:.1} s",
        28_403.0 / import_s,
        started.elapsed().as_secs_f64()
    );
}
