//! Single-partition mode (issue 31, item 3; seed 001): every row of a catalog in one
//! partition named by a tenant key, every write one entity group transaction (EGT)
//! conditional on the record's owner row. Checked here, on the embedded store and on Azurite:
//! lookups by each index on airports, atomicity (a failed EGT leaves nothing), concurrent
//! writers converge with one row per identifier and no stale index row, replace and delete
//! by any identifier, the limits (100 operations, 4 MiB per EGT) refused with the field and
//! nothing written, reopening in the other mode refused, the HTTP API (unsupported routes
//! answer 409 `not_supported_in_single_partition_mode`), and the requests each write costs
//! against the WAL mode.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axum::body::Body;
use axum::http::StatusCode;
use serde_json::{json, Value};
use table_catalog::catalog::{Catalog, CatalogOptions, Mode};
use table_catalog::config::{Names, Schema};
use table_catalog::query::Filter;
use table_catalog::record::Record;
use table_catalog::store::{CountingStore, Entity, RowRange, Store};
use table_catalog::Error;

use crate::common::{self, call, Backend};

const TENANT: &str = "acme";

fn mode() -> Mode {
    Mode::SinglePartition { tenant: TENANT.into() }
}

fn rec(v: Value) -> Record {
    v.as_object().expect("an object").clone()
}

fn filter(field: &str, value: &str) -> Filter {
    Filter::new(vec![(field.into(), value.into())])
}

/// A fresh single-partition catalog with `schema` on `store`.
async fn open(store: Arc<dyn Store>, schema: Schema) -> Arc<Catalog> {
    let names = Names::new(&common::unique_name("sp"), None, None).unwrap();
    Arc::new(Catalog::open_with_mode(store, names, Some(schema), CatalogOptions::default(), &mode()).await.unwrap())
}

/// Every row of the tenant's partition (written out here, not through the code under test).
async fn partition_rows(c: &Catalog) -> Vec<Entity> {
    let mut all = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let page =
            c.store().query_partition(&c.names().table, TENANT, &RowRange::default(), 1000, token.as_deref()).await;
        let page = page.unwrap();
        all.extend(page.entities);
        match page.continuation {
            Some(t) => token = Some(t),
            None => return all,
        }
    }
}

/// The record a row holds, without the system property.
fn payload(e: &Entity) -> Value {
    Value::Object(table_catalog::record::from_entity(e).expect("a live row"))
}

/// Checks the partition's invariant from its rows alone: rows are owner rows `0%;{id}` or
/// index rows `{n}_{field}{value}%;{id}`; each record has exactly one row per index value it
/// holds (lowercased), each a copy of the owner row, and no index row lacks its owner or
/// names a value the owner does not hold. Returns the records by identity.
fn check_invariant(rows: &[Entity], index_keys: &[&str]) -> BTreeMap<String, Value> {
    let mut owners = BTreeMap::new();
    let mut index: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for e in rows {
        let (head, id) = e.row_key.split_once("%;").unwrap_or_else(|| panic!("row key {}", e.row_key));
        if head == "0" {
            owners.insert(id.to_string(), payload(e));
        } else {
            index.entry(id.to_string()).or_default().insert(head.to_string());
        }
    }
    for (id, heads) in &index {
        let owner = owners.get(id).unwrap_or_else(|| panic!("index rows {heads:?} of {id} have no owner row"));
        let expected: BTreeSet<String> = index_keys
            .iter()
            .filter_map(|f| {
                owner[*f].as_str().filter(|v| !v.is_empty()).map(|v| format!("{}_{f}{}", f.len(), v.to_lowercase()))
            })
            .collect();
        assert_eq!(heads, &expected, "record {id}: its index rows");
    }
    for e in rows {
        let (head, id) = e.row_key.split_once("%;").unwrap();
        if head != "0" {
            assert_eq!(payload(e), owners[id], "index row {} copies its owner row", e.row_key);
        }
    }
    for (id, owner) in &owners {
        let has_value = index_keys.iter().any(|f| owner[*f].as_str().is_some_and(|v| !v.is_empty()));
        assert!(!has_value || index.contains_key(id), "record {id} has no index row");
    }
    owners
}

fn airports_sample(n: usize) -> Vec<Record> {
    crate::indexes::airports(n)
}

common::backend_tests! {
    /// A sample of airports imported through the batch path, then looked up by each of
    /// icao, iata and lid: every airport is found by each identifier it has, with the same
    /// answer as the records themselves give; paging over a shared value returns each once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lookups_by_each_index_on_airports(backend) {
        let n = if backend == Backend::Azurite { 150 } else { 400 };
        let c = open(common::store(backend), common::airports_schema()).await;
        let airports = airports_sample(n);
        let results = c.upsert_many(airports.clone(), false).await.unwrap();
        assert!(results.iter().all(|r| r.is_ok()), "{:?}", results.iter().find(|r| r.is_err()));
        let mut by: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
        for a in &airports {
            for f in ["icao", "iata", "lid"] {
                if let Some(v) = a.get(f).and_then(Value::as_str).filter(|v| !v.is_empty()) {
                    by.entry((f.to_string(), v.to_lowercase())).or_default().insert(Value::Object(a.clone()).to_string());
                }
            }
        }
        for ((f, v), want) in &by {
            let page = c.query(&filter(f, &v.to_uppercase()), 1000, None).await.unwrap();
            let got: BTreeSet<String> = page.records.iter().map(|r| Value::Object(r.record.clone()).to_string()).collect();
            assert_eq!(&got, want, "{backend:?}: {f}={v}");
            assert_eq!(page.index, *f);
        }
        let rows = partition_rows(&c).await;
        let owners = check_invariant(&rows, &["icao", "iata", "lid"]);
        assert_eq!(owners.len(), n, "one owner row per airport");
        // A value many records share, paged 2 at a time: each once, in sort order.
        let shared: Vec<Record> = (0..5).map(|i| rec(json!({"icao": format!("ZZ{i:02}"), "lid": "SHARED", "name": format!("Shared {i}")}))).collect();
        c.upsert_many(shared, false).await.unwrap();
        let (mut token, mut names) = (None::<String>, Vec::new());
        loop {
            let page = c.query(&filter("lid", "shared"), 2, token.as_deref()).await.unwrap();
            names.extend(page.records.iter().map(|r| r.record["name"].as_str().unwrap().to_string()));
            match page.continuation { Some(t) => token = Some(t), None => break }
        }
        assert_eq!(names, (0..5).map(|i| format!("Shared {i}")).collect::<Vec<_>>());
        let ranged = c.query(&filter("lid", "SHARED").range(Some("shared 1".into()), Some("shared 3".into())), 10, None).await.unwrap();
        assert_eq!(ranged.records.len(), 3, "row_from/row_to within one value");
        // One identity twice in a batch: written in input order, the last wins.
        let dup = |v: i64| rec(json!({"icao": "ZDUP", "name": "Dup", "v": v}));
        let results = c.upsert_many(vec![dup(1), rec(json!({"icao": "ZOTH", "name": "Other"})), dup(2)], false).await.unwrap();
        assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
        assert_eq!(c.query_all(&filter("icao", "zdup")).await.unwrap(), vec![dup(2)]);
        // consistent=true needs no catch-up: the same answer.
        let consistent = c.query_consistent(&filter("lid", "SHARED"), 10, None).await.unwrap();
        assert_eq!(consistent.records.len(), 5);
    }
}

common::backend_tests! {
    /// Replace and delete by any identifier: a replace that changes an identifier moves the
    /// record in one EGT (no row of the old identity is left); a delete by iata removes every
    /// row; a replace by a filter matching two records leaves only the new one.
    #[tokio::test]
    async fn replace_and_delete_by_any_identifier(backend) {
        let c = open(common::store(backend), common::airports_schema()).await;
        let jfk = rec(json!({"icao": "KJFK", "iata": "JFK", "lid": "JFK", "name": "John F Kennedy International Airport"}));
        c.insert(jfk.clone(), false).await.unwrap();
        assert!(matches!(c.insert(jfk.clone(), false).await, Err(Error::Conflict(_))), "insert of an existing identity");
        let moved = rec(json!({"icao": "KJFK", "iata": "JFX", "lid": "JFK", "name": "John F Kennedy International Airport"}));
        let w = c.replace(filter("lid", "jfk"), moved.clone(), false).await.unwrap();
        assert!(w.applied);
        assert!(c.query_all(&filter("iata", "JFK")).await.unwrap().is_empty());
        assert_eq!(c.query_all(&filter("iata", "JFX")).await.unwrap(), vec![moved.clone()]);
        assert_eq!(c.query_all(&filter("icao", "KJFK")).await.unwrap(), vec![moved.clone()]);
        assert_eq!(partition_rows(&c).await.len(), 4, "owner + 3 index rows, nothing of the old identity");
        check_invariant(&partition_rows(&c).await, &["icao", "iata", "lid"]);
        // Two records share lid=NYC; a replace by it leaves one record, the new one.
        for (icao, name) in [("KLGA", "LaGuardia"), ("KEWR", "Newark")] {
            c.upsert(rec(json!({"icao": icao, "lid": "NYC", "name": name})), false).await.unwrap();
        }
        let merged = rec(json!({"icao": "KNYC", "lid": "NYC", "name": "All of them"}));
        c.replace(filter("lid", "NYC"), merged.clone(), false).await.unwrap();
        assert_eq!(c.query_all(&filter("lid", "nyc")).await.unwrap(), vec![merged]);
        // Delete by each kind of identifier.
        c.delete(filter("iata", "jfx"), false).await.unwrap();
        assert!(c.query_all(&filter("icao", "KJFK")).await.unwrap().is_empty());
        c.delete(filter("icao", "KNYC"), false).await.unwrap();
        assert!(partition_rows(&c).await.is_empty(), "no row left");
        // A filter on a field that is not an index is refused.
        assert!(matches!(c.delete(filter("city", "x"), false).await, Err(Error::Invalid(_))));
    }
}

common::backend_tests! {
    /// Eight tasks write the same records at once: upserts of one identity with changing
    /// payloads, replaces that move a record between IATA codes, deletes by IATA code and
    /// re-inserts. Every write either commits whole or retries: at the end each record has
    /// exactly one row per identifier, every index row copies its owner row, no index row is
    /// stale, and lookups agree with the owner rows.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_writers_converge_with_one_row_per_identifier(backend) {
        let c = open(common::store(backend), common::airports_schema()).await;
        let rounds = if backend == Backend::Azurite { 6 } else { 12 };
        let tasks: Vec<_> = (0..8)
            .map(|t| {
                let c = c.clone();
                tokio::spawn(async move {
                    for i in 0..rounds {
                        let upsert = rec(json!({"icao": "KSFO", "iata": "SFO", "name": "San Francisco", "elevation": t * 100 + i}));
                        c.upsert(upsert, false).await.unwrap();
                        let code = ["OAK", "SJC", "SMF"][(t + i) % 3];
                        let moved = rec(json!({"icao": "KOAK", "iata": code, "name": "Oakland", "writer": t}));
                        c.replace(filter("icao", "KOAK"), moved, false).await.unwrap();
                        if (t + i) % 4 == 0 {
                            c.delete(filter("iata", code), false).await.unwrap();
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let owners = check_invariant(&partition_rows(&c).await, &["icao", "iata", "lid"]);
        let sfo: Vec<&Value> = owners.values().filter(|o| o["icao"] == "KSFO").collect();
        assert_eq!(sfo.len(), 1, "one San Francisco record: {owners:?}");
        for o in owners.values() {
            for f in ["icao", "iata"] {
                let v = o[f].as_str().unwrap();
                let found = c.query_all(&filter(f, v)).await.unwrap();
                let want: Vec<&Value> = owners.values().filter(|x| x[f].as_str().is_some_and(|x| x.eq_ignore_ascii_case(v))).collect();
                assert_eq!(found.len(), want.len(), "{f}={v}");
            }
        }
    }
}

common::backend_tests! {
    /// The limits of one EGT: a record needing more than 100 operations (100 index values
    /// plus its owner row) and one whose copies exceed 4 MiB are refused with 400-class
    /// `Invalid` naming `record` and the limit, and nothing is written; 99 values pass.
    #[tokio::test]
    async fn egt_limits_are_refused_naming_the_field_and_write_nothing(backend) {
        let keys: Vec<String> = (0..100).map(|i| format!("f{i}")).collect();
        let c = open(common::store(backend), Schema::new(keys.clone(), "name").unwrap()).await;
        let with = |n: usize| {
            let mut r = rec(json!({"name": format!("with {n}")}));
            for k in keys.iter().take(n) {
                r.insert(k.clone(), json!(format!("v{k}")));
            }
            r
        };
        match c.upsert(with(100), false).await {
            Err(Error::Invalid(m)) => assert!(m.starts_with("record:") && m.contains("101 operations") && m.contains("limit is 100"), "{m}"),
            other => panic!("100 index values: {other:?}"),
        }
        assert!(partition_rows(&c).await.is_empty(), "nothing written");
        c.upsert(with(99), false).await.unwrap();
        assert_eq!(partition_rows(&c).await.len(), 100, "99 index rows and the owner row: one EGT of 100");
        // Over 4 MiB: 20 copies of a record of about 240 KB.
        let keys: Vec<String> = (0..19).map(|i| format!("k{i}")).collect();
        let big = open(common::store(backend), Schema::new(keys.clone(), "name").unwrap()).await;
        let mut r = rec(json!({"name": "big"}));
        for k in &keys {
            r.insert(k.clone(), json!(k));
        }
        for i in 0..8 {
            r.insert(format!("blob{i}"), json!("x".repeat(30_000)));
        }
        match big.upsert(r, false).await {
            Err(e @ Error::Invalid(_)) => {
                let m = e.to_string();
                assert!(m.starts_with("record:") && m.contains("4194304 bytes"), "{m}");
                let api = table_catalog::http::ApiError::from(e);
                assert_eq!(api.status, StatusCode::BAD_REQUEST);
            }
            other => panic!("over 4 MiB: {other:?}"),
        }
        assert!(partition_rows(&big).await.is_empty(), "nothing written");
    }
}

common::backend_tests! {
    /// A write whose EGT fails leaves nothing: an injected failure of the batch request
    /// writes no row; and a delete whose EGT fails at its last operation (an index row
    /// removed behind the catalog's back) leaves the owner row and the other index rows in
    /// place, and ends with 503-class `Busy` after its retries, never half done.
    #[tokio::test]
    async fn a_failed_egt_leaves_nothing_behind(backend) {
        use table_catalog::store::OpKind;
        use table_catalog::testing::store::fault::{unavailable, Fault, FaultStore, Rule, Trigger};
        let faulty = Arc::new(FaultStore::new(common::store(backend), 7));
        let c = open(faulty.clone(), common::airports_schema()).await;
        faulty.add(Rule::new(&[OpKind::Batch], Trigger::Always, Fault::Fail(unavailable())));
        let jfk = rec(json!({"icao": "KJFK", "iata": "JFK", "lid": "JFK", "name": "JFK"}));
        assert!(c.upsert(jfk.clone(), false).await.unwrap_err().is_transient());
        faulty.clear();
        assert!(partition_rows(&c).await.is_empty(), "a failed EGT wrote nothing");
        c.upsert(jfk.clone(), false).await.unwrap();
        let rows = partition_rows(&c).await;
        assert_eq!(rows.len(), 4);
        // Remove the lid row directly: the delete (by icao) now fails at that operation of its
        // EGT, after the owner row's and the iata row's deletes.
        let lid = rows.iter().find(|e| e.row_key.starts_with("3_lidjfk%;")).map(|e| e.row_key.clone()).unwrap();
        c.store().delete(&c.names().table, TENANT, &lid, &table_catalog::store::IfMatch::Any).await.unwrap();
        match c.delete(filter("icao", "KJFK"), false).await {
            Err(Error::Busy { .. }) => {}
            other => panic!("delete over a missing index row: {other:?}"),
        }
        assert_eq!(partition_rows(&c).await.len(), 3, "the failed EGT removed nothing");
    }
}

common::backend_tests! {
    /// The mode is stored with the catalog: opening a single-partition catalog in WAL mode,
    /// a WAL catalog in single-partition mode, or the tenant with another schema is refused
    /// (`SchemaMismatch`); reopening without a schema uses the stored one.
    #[tokio::test]
    async fn reopening_in_the_other_mode_is_refused(backend) {
        let store = common::store(backend);
        let names = Names::new(&common::unique_name("sp"), None, None).unwrap();
        let schema = common::airports_schema();
        let sp = Catalog::open_with_mode(store.clone(), names.clone(), Some(schema.clone()), CatalogOptions::default(), &mode()).await.unwrap();
        sp.upsert(rec(json!({"icao": "KJFK", "name": "JFK"})), false).await.unwrap();
        let wal = Catalog::open_with_mode(store.clone(), names.clone(), Some(schema.clone()), CatalogOptions::default(), &Mode::Wal).await;
        match wal {
            Err(Error::SchemaMismatch(m)) => assert!(m.contains("single-partition mode"), "{m}"),
            other => panic!("WAL mode over a single-partition catalog: {:?}", other.map(|_| ())),
        }
        let other = Schema::new(vec!["icao".into()], "name").unwrap();
        assert!(matches!(
            Catalog::open_with_mode(store.clone(), names.clone(), Some(other), CatalogOptions::default(), &mode()).await,
            Err(Error::SchemaMismatch(_))
        ));
        let again = Catalog::open_with_mode(store.clone(), names.clone(), None, CatalogOptions::default(), &mode()).await.unwrap();
        assert_eq!(again.schema().identity_keys(), schema.identity_keys());
        assert_eq!(again.query_all(&filter("icao", "kjfk")).await.unwrap().len(), 1);
        // A new WAL catalog opens through `open_with_mode` (its check finds no table yet).
        let fresh = Names::new(&common::unique_name("wal"), None, None).unwrap();
        Catalog::open_with_mode(store.clone(), fresh, Some(schema.clone()), CatalogOptions::default(), &Mode::Wal)
            .await
            .unwrap();
        // A WAL catalog is not opened in single-partition mode.
        let wal_names = Names::new(&common::unique_name("wal"), None, None).unwrap();
        Catalog::open(store.clone(), wal_names.clone(), schema.clone(), CatalogOptions::default()).await.unwrap();
        match Catalog::open_with_mode(store.clone(), wal_names, Some(schema), CatalogOptions::default(), &mode()).await {
            Err(Error::SchemaMismatch(m)) => assert!(m.contains("created in WAL mode"), "{m}"),
            other => panic!("single-partition mode over a WAL catalog: {:?}", other.map(|_| ())),
        }
    }
}

const JSON_CT: Option<&str> = Some("application/json");

common::backend_tests! {
    /// The same HTTP app in single-partition mode: writes answer 201 applied (the write was
    /// committed), lookups by each identifier, `consistent=true`, replace, delete, export;
    /// history, jobs, index changes and the WAL's routes answer 409
    /// `not_supported_in_single_partition_mode`; status shows the mode, the tenant and nothing
    /// pending.
    #[tokio::test]
    async fn http_round_trip_and_the_unsupported_routes(backend) {
        let c = open(common::store(backend), common::airports_schema()).await;
        let app = table_catalog::http::router(c.clone());
        let jfk = json!({"icao": "KJFK", "iata": "JFK", "lid": "JFK", "name": "John F Kennedy International Airport"});
        let (s, body) = call(&app, "POST", "/api/records", JSON_CT, jfk.to_string()).await;
        assert_eq!((s, body["applied"].as_bool()), (StatusCode::CREATED, Some(true)), "{body}");
        let (s, _) = call(&app, "POST", "/api/records", JSON_CT, jfk.to_string()).await;
        assert_eq!(s, StatusCode::CONFLICT);
        for q in ["icao=KJFK", "iata=jfk", "lid=JFK&consistent=true", "icao=KJFK&iata=JFK"] {
            let (s, body) = call(&app, "GET", &format!("/api/records?{q}"), None, Body::empty()).await;
            assert_eq!((s, &body["records"]), (StatusCode::OK, &json!([jfk])), "{q}");
        }
        let moved = json!({"icao": "KJFK", "iata": "JFY", "lid": "JFK", "name": "John F Kennedy International Airport"});
        let (s, _) = call(&app, "PUT", "/api/records?iata=JFK", JSON_CT, moved.to_string()).await;
        assert_eq!(s, StatusCode::CREATED);
        let (_, body) = call(&app, "GET", "/api/records?iata=JFY", None, Body::empty()).await;
        assert_eq!(body["records"], json!([moved]));
        let batch = json!([{"icao": "KLGA", "name": "LaGuardia"}, {"name": "no identifiers"}]);
        let (s, body) = call(&app, "POST", "/api/records/batch", JSON_CT, batch.to_string()).await;
        assert_eq!(s, StatusCode::ACCEPTED);
        assert!(body["results"][0]["id"].is_string(), "{body}");
        assert_eq!(body["results"][1]["error"]["code"], "invalid_input", "{body}");
        let (s, _) = call(&app, "DELETE", "/api/records?icao=KLGA", None, Body::empty()).await;
        assert_eq!(s, StatusCode::OK);
        let (s, body) = call(&app, "GET", "/api/export", None, Body::empty()).await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(body, moved, "one record, one JSON line");
        let (s, body) = call(&app, "GET", "/api/status", None, Body::empty()).await;
        assert_eq!((s, body["pending"].as_u64()), (StatusCode::OK, Some(0)));
        assert_eq!(body["mode"], "single-partition", "status says the mode: {body}");
        assert!(body["tenant"].as_str().is_some_and(|t| !t.is_empty()), "and the tenant: {body}");
        let (s, body) = call(&app, "GET", "/api/indexes", None, Body::empty()).await;
        assert_eq!((s, body["indexes"].as_array().map(Vec::len)), (StatusCode::OK, Some(3)));
        for (method, uri, payload) in [
            ("POST", "/api/jobs", r#"{"kind":"verify"}"#),
            ("GET", "/api/jobs", ""),
            ("POST", "/api/indexes", r#"{"field":"country"}"#),
            ("DELETE", "/api/indexes/lid", ""),
            ("GET", "/api/records/history?icao=KJFK", ""),
            ("GET", "/api/wal/dead", ""),
            ("POST", "/api/wal/dead/redrive", ""),
        ] {
            let (s, body) = call(&app, method, uri, JSON_CT, payload.to_string()).await;
            assert_eq!(s, StatusCode::CONFLICT, "{method} {uri}: {body}");
            assert_eq!(body["error"]["code"], "not_supported_in_single_partition_mode", "{method} {uri}");
        }
        let (s, body) = call(&app, "DELETE", "/api/records?lid=jfk", None, Body::empty()).await;
        assert_eq!((s, body["applied"].as_bool()), (StatusCode::OK, Some(true)), "{body}");
        assert!(partition_rows(&c).await.is_empty());
    }
}

/// The storage requests of one write (table and queue, all kinds), on `c`'s counting store.
async fn cost<F: std::future::Future<Output = ()>>(
    counts: &table_catalog::store::RequestCounts,
    write: F,
) -> (u64, u64) {
    let before = counts.snapshot();
    write.await;
    let d = counts.snapshot().since(&before);
    (d.total, d.by_op.get(&table_catalog::store::OpKind::Batch).map_or(0, |c| c.total))
}

common::backend_tests! {
    /// Requests per write, counted by the store's request counters: in single-partition mode
    /// an upsert is one read of the owner row and one EGT (2 requests, 1 batch), a delete by
    /// an identifier one index read, one owner read and one EGT (3), a replace one index read,
    /// two owner reads and one EGT (4); the WAL mode's applied write (`wait`) costs more.
    #[tokio::test]
    async fn requests_per_write_in_each_mode(backend) {
        let counting = Arc::new(CountingStore::new(common::store(backend)));
        let counts = counting.counts().clone();
        let sp = open(counting.clone(), common::airports_schema()).await;
        let jfk = rec(json!({"icao": "KJFK", "iata": "JFK", "lid": "JFK", "name": "JFK"}));
        let jfy = rec(json!({"icao": "KJFK", "iata": "JFY", "lid": "JFK", "name": "JFK"}));
        let single = [
            cost(&counts, async { sp.upsert(jfk.clone(), false).await.unwrap(); }).await,
            cost(&counts, async { sp.upsert(jfk.clone(), false).await.unwrap(); }).await,
            cost(&counts, async { sp.replace(filter("iata", "JFK"), jfy.clone(), false).await.unwrap(); }).await,
            cost(&counts, async { sp.delete(filter("iata", "JFY"), false).await.unwrap(); }).await,
        ];
        assert_eq!(single, [(2, 1), (2, 1), (4, 1), (3, 1)], "{backend:?}: (requests, EGTs) of insert, upsert, replace, delete");
        // A batch of 50 new records of 3 identifiers: 4 rows each, 25 records per EGT of 100
        // operations: one owner-row read per record and 2 EGTs.
        let many: Vec<Record> = (0..50).map(|i| rec(json!({"icao": format!("K{i:03}"), "iata": format!("I{i:02}"), "lid": format!("L{i:02}"), "name": format!("n{i}")}))).collect();
        let batch = cost(&counts, async { assert!(sp.upsert_many(many.clone(), false).await.unwrap().iter().all(|r| r.is_ok())); }).await;
        assert_eq!(batch, (52, 2), "{backend:?}: (requests, EGTs) of a batch of 50");
        check_invariant(&partition_rows(&sp).await, &["icao", "iata", "lid"]);
        // The same batch again (every owner row exists now): replaced under their ETags.
        let again = cost(&counts, async { assert!(sp.upsert_many(many, false).await.unwrap().iter().all(|r| r.is_ok())); }).await;
        assert_eq!(again, (52, 2), "{backend:?}: a batch over existing records");
        let names = Names::new(&common::unique_name("wal"), None, None).unwrap();
        let wal = Catalog::open(counting.clone(), names, common::airports_schema(), CatalogOptions::default()).await.unwrap();
        wal.upsert(rec(json!({"icao": "KAAA", "name": "warm-up"})), true).await.unwrap();
        wal.hints_settled().await;
        let upsert = cost(&counts, async {
            wal.upsert(jfk.clone(), true).await.unwrap();
            wal.hints_settled().await;
        })
        .await;
        eprintln!("{backend:?}: single-partition (requests, EGTs) {single:?}; WAL-mode applied upsert {upsert:?}");
        assert!(upsert.0 > single[0].0, "{backend:?}: WAL upsert {upsert:?} vs single-partition {:?}", single[0]);
    }
}

/// Deterministic and backend-free: the mode parses from its setting names.
#[test]
fn the_mode_parses_from_its_settings() {
    assert_eq!(Mode::parse("M", "wal", None).unwrap(), Mode::Wal);
    assert_eq!(
        Mode::parse("M", "Single-Partition", Some("t1")).unwrap(),
        Mode::SinglePartition { tenant: "t1".into() }
    );
    assert!(Mode::parse("M", "single-partition", None).unwrap_err().to_string().contains("TABLE_CATALOG_TENANT"));
    assert!(Mode::parse("M", "sharded", None).unwrap_err().to_string().contains("M: 'sharded'"));
    let c = table_catalog::Config::new("x").single_partition("t2");
    assert_eq!(c.mode.name(), "single-partition");
}

common::backend_tests! {
    /// Eight tasks insert the same record at once: the insert is one EGT that inserts the
    /// owner row, so exactly one succeeds and the others get `Conflict`; the record has one
    /// row per identifier.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_inserts_of_one_record_exactly_one_wins(backend) {
        let c = open(common::store(backend), common::airports_schema()).await;
        let tasks: Vec<_> = (0..8)
            .map(|t| {
                let c = c.clone();
                tokio::spawn(async move {
                    let r = rec(json!({"icao": "KBOS", "iata": "BOS", "name": "Logan", "writer": t}));
                    c.insert(r, false).await
                })
            })
            .collect();
        let mut won = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(_) => won += 1,
                Err(Error::Conflict(_)) => {}
                Err(e) => panic!("{backend:?}: {e}"),
            }
        }
        assert_eq!(won, 1, "{backend:?}: exactly one insert wins");
        let owners = check_invariant(&partition_rows(&c).await, &["icao", "iata", "lid"]);
        assert_eq!(owners.len(), 1);
        assert_eq!(partition_rows(&c).await.len(), 3, "owner + icao + iata rows");
    }
}

/// The CLI in single-partition mode (embedded store): writes and lookups as in WAL mode,
/// whole-table commands refused with the mode's reason (exit status 1), and the catalog
/// refused when opened in WAL mode.
#[test]
fn the_cli_in_single_partition_mode() {
    let dir = tempfile::tempdir().unwrap();
    let run_with = |env: &[(&str, &str)], name: &str, args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_table-catalog"))
            .env_remove("AZURE_STORAGE_CONNECTION_STRING")
            .env_remove("AzureWebJobsStorage")
            .env_remove("TABLE_CATALOG_MODE")
            .env_remove("TABLE_CATALOG_TENANT")
            .envs(env.iter().copied())
            .env("RUST_LOG", "error")
            .args(["--name", name, "--local-path"])
            .arg(dir.path())
            .args(args)
            .output()
            .expect("run table-catalog")
    };
    let run = |args: &[&str]| run_with(&[], "clisp", args);
    let sp = ["--mode", "single-partition", "--tenant", "acme"];
    let create = [&sp[..], &["--index-keys", "icao,iata", "--row-key", "name"]].concat();
    let out = run(&[&create[..], &["insert", r#"{"icao":"KJFK","iata":"JFK","name":"JFK"}"#]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let written: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(written["applied"], true);
    let out = run(&[&sp[..], &["query", "iata=jfk"]].concat());
    assert!(String::from_utf8_lossy(&out.stdout).contains("KJFK"), "{out:?}");
    let out = run(&[&sp[..], &["verify"]].concat());
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not supported in single-partition mode"), "{out:?}");
    let out = run(&["query", "iata=jfk"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("created in single-partition mode"), "{out:?}");
    let out = run(&["--mode", "single-partition", "query", "iata=jfk"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("TABLE_CATALOG_TENANT"), "{out:?}");
    // The settings, as the Functions app gives them; empty ones (its placeholders) are unset.
    let env = [("TABLE_CATALOG_MODE", "single-partition"), ("TABLE_CATALOG_TENANT", "acme")];
    let out = run_with(&env, "clisp", &["query", "icao=KJFK"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("KJFK"), "{out:?}");
    let empty = [("TABLE_CATALOG_MODE", ""), ("TABLE_CATALOG_TENANT", "")];
    let out = run_with(&empty, "clispwal", &["--index-keys", "icao", "--row-key", "name", "status"]);
    assert!(out.status.success(), "an empty mode setting is WAL mode: {out:?}");
}

common::backend_tests! {
    /// Two replaces of one record, the second held after resolving its filter until the first
    /// committed: the second finds its match gone, resolves the filter again and replaces the
    /// first's record, so one record is left (not one per replace).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replace_whose_match_was_replaced_meanwhile_resolves_again(backend) {
        use table_catalog::store::OpKind;
        use table_catalog::testing::store::fault::{Fault, FaultStore, Gate, Rule, Trigger};
        let inner = common::store(backend);
        let faulty = Arc::new(FaultStore::new(inner.clone(), 3));
        let held = open(faulty.clone(), common::airports_schema()).await;
        let other = Arc::new(
            Catalog::open_with_mode(inner, held.names().clone(), None, CatalogOptions::default(), &mode()).await.unwrap(),
        );
        let oak = |iata: &str| rec(json!({"icao": "KOAK", "iata": iata, "name": "Oakland"}));
        held.upsert(oak("OAK"), false).await.unwrap();
        // The held replace's first point read (the matched record's owner row) waits at the gate.
        let gate = Gate::new();
        faulty.add(Rule::new(&[OpKind::Get], Trigger::Nth(1), Fault::Hold(gate.clone())));
        let second = tokio::spawn({
            let held = held.clone();
            async move { held.replace(filter("icao", "KOAK"), oak("SMF"), false).await }
        });
        gate.reached(1).await;
        other.replace(filter("icao", "KOAK"), oak("SJC"), false).await.unwrap();
        gate.open();
        second.await.unwrap().unwrap();
        let left = held.query_all(&filter("icao", "KOAK")).await.unwrap();
        assert_eq!(left, vec![oak("SMF")], "{backend:?}: the second replace replaced the first's record");
        check_invariant(&partition_rows(&held).await, &["icao", "iata", "lid"]);
    }
}
