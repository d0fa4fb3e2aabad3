//! Projections per index (issue 31, item 1; first slice): `index add FIELD --projection
//! keys|all|include:a,b` and `POST /api/indexes {"field": .., "projection": ..}` store the
//! projection with the index, `index list` / `GET /api/indexes` show it (identity fields:
//! `all`), and bad projections are refused with 400 naming the field and the limit, writing
//! nothing. On the embedded store and on Azurite.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{json, Value};
use table_catalog::catalog::Catalog;
use table_catalog::indexes::{self, Projection};
use table_catalog::query::Filter;
use table_catalog::record::Record;
use table_catalog::testing::schema::IndexState;

use crate::common::{self, Backend};
use crate::indexes::{airports, change_index, opts, verify_clean};

/// POST /api/indexes with `body`: (status, body).
async fn post(app: &axum::Router, body: serde_json::Value) -> (u16, serde_json::Value) {
    let (status, body) = common::call(app, "POST", "/api/indexes", Some("application/json"), body.to_string()).await;
    (status.as_u16(), body)
}

common::backend_tests! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn projections_are_stored_listed_and_validated(backend) {
        let label = format!("{backend:?}");
        let c = common::catalog_with(backend, common::airports_schema(), opts()).await;
        c.upsert_many(airports(5), true).await.unwrap();
        let app = table_catalog::http::router(c.clone());
        let many: Vec<String> = (0..33).map(|i| format!("f{i}")).collect();
        let many = format!("include:{}", many.join(","));
        let refused = [
            (json!({"field": "country", "projection": "KEYS"}), "projection: 'KEYS' is not a projection; use all, keys or include:"),
            (json!({"field": "country", "projection": "include:"}), "projection: include: lists no field"),
            (json!({"field": "country", "projection": "include:lat,,lon"}), "field 2 is empty"),
            (json!({"field": "country", "projection": "include:la-t"}), "field name 'la-t' is not a valid property name"),
            (json!({"field": "country", "projection": "include:lat,LAT"}), "'LAT' is listed twice"),
            (json!({"field": "country", "projection": many}), "lists 33 fields; the limit is 32"),
            (json!({"field": "country", "projection": 7}), "projection: a string"),
            (json!({"field": "country", "projections": "keys"}), "projections: unknown field"),
            (json!({"field": "icao", "projection": "keys"}), "projection: 'icao' is an identity field"),
        ];
        for (body, text) in refused {
            let (status, reply) = post(&app, body.clone()).await;
            let message = reply["error"]["message"].as_str().unwrap_or_default();
            assert_eq!(status, 400, "{label}: {body}: {reply}");
            assert!(message.contains(text), "{label}: {body}: {message}");
        }
        assert_eq!(indexes::list(&c).await.unwrap().len(), 3, "{label}: nothing was added");
        assert_eq!(c.schema().version(), 0, "{label}: the schema did not change");

        let (status, reply) = post(&app, json!({"field": "country", "projection": "keys"})).await;
        assert_eq!(status, 202, "{label}: {reply}");
        assert_eq!(reply["index"]["projection"], "keys", "{label}: {reply}");
        let change = indexes::add_projected(&c, "tz", Projection::parse("include:elevation,lat").unwrap()).await.unwrap();
        assert_eq!(change.index.projection, Projection::Include(vec!["elevation".into(), "lat".into()]));
        let (status, reply) = post(&app, json!({"field": "subd"})).await;
        assert_eq!(status, 202, "{label}: {reply}");
        assert_eq!(reply["index"]["projection"], "all", "{label}: absent means all");

        // Listed (and so stored: `list` re-reads the schema row).
        let (status, listed) = common::call(&app, "GET", "/api/indexes", None, "").await;
        assert_eq!(status.as_u16(), 200, "{label}: {listed}");
        let shown: Vec<(String, String)> = listed["indexes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| (i["field"].as_str().unwrap().to_string(), i["projection"].as_str().unwrap().to_string()))
            .collect();
        let want = [("icao", "all"), ("iata", "all"), ("lid", "all"), ("country", "keys"), ("tz", "include:elevation,lat"), ("subd", "all")];
        let want: Vec<(String, String)> = want.iter().map(|(f, p)| (f.to_string(), p.to_string())).collect();
        assert_eq!(shown, want, "{label}");
        assert_eq!(c.schema().projection_of("country"), &Projection::Keys, "{label}");
        assert_eq!(c.schema().projection_of("icao"), &Projection::All, "{label}");

        // The same index again: 409 as before, whatever the projection.
        let (status, reply) = post(&app, json!({"field": "country", "projection": "all"})).await;
        assert_eq!(status, 409, "{label}: {reply}");
    }
}

/// The PartitionKey of `r`'s row in index `index`.
fn partition_of(c: &table_catalog::catalog::Catalog, r: &Record, index: &str) -> String {
    let keys = c.schema().record_keys(r).unwrap();
    keys.partitions.into_iter().find(|(f, _)| f == index).map(|(_, pk)| pk).unwrap()
}

/// The records a lookup by `country` returns (all pages of 7), by RowKey.
async fn by_country(c: &table_catalog::catalog::Catalog, country: &str) -> BTreeMap<String, Record> {
    let filter = Filter::new(vec![("country".into(), country.into())]);
    let (mut out, mut token) = (BTreeMap::new(), None);
    loop {
        let page = c.query(&filter, 7, token.as_deref()).await.unwrap();
        assert_eq!(page.index, "country");
        for f in page.records {
            assert!(out.insert(f.row_key, f.record).is_none(), "a record twice");
        }
        token = page.continuation;
        if token.is_none() {
            return out;
        }
    }
}

common::backend_tests! {
    /// A `keys` index on `country`, added to a catalog with airports (its backfill writes the
    /// projected rows of the records there) and then written to (the fan-out writes them):
    /// its rows hold the identity, the indexed values and the fact row's PartitionKey only;
    /// a lookup through it returns whole records, exactly those of the value; verify is
    /// clean. A row left behind by a move (the record changed its country between the index
    /// page and the fact read) is not returned.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_keys_index_holds_keys_and_its_lookups_return_whole_records(backend) {
        let label = format!("{backend:?}");
        let c = common::catalog_with(backend, common::airports_schema(), opts()).await;
        let n = if backend == Backend::Azurite { 80 } else { 240 };
        let all = airports(n);
        let (early, late) = all.split_at(n / 2);
        c.upsert_many(early.to_vec(), true).await.unwrap();
        add_active(&c, "country", Projection::Keys, &label).await;
        c.upsert_many(late.to_vec(), true).await.unwrap();

        // Every country row (backfilled and fanned out) is projected.
        let table = &c.names().table;
        let us: Vec<&Record> = all.iter().filter(|r| r.get("country") == Some(&json!("US"))).collect();
        assert!(us.len() >= 10, "{label}: {} US airports", us.len());
        for r in all.iter().filter(|r| r.get("country").and_then(Value::as_str).is_some_and(|v| !v.is_empty())) {
            let keys = c.schema().record_keys(r).unwrap();
            let row = c.store().get(table, &partition_of(&c, r, "country"), &keys.row_key).await.unwrap().unwrap();
            let fact = &keys.partitions[0].1;
            assert_eq!(row.properties.get("_tcfact"), Some(&table_catalog::store::Value::String(fact.clone())), "{label}");
            for held in ["icao", "name", "country"] {
                assert_eq!(row.properties.contains_key(held), r.contains_key(held), "{label}: {held}");
            }
            for dropped in ["city", "elevation", "lat", "lon", "tz", "subd"] {
                assert!(!row.properties.contains_key(dropped), "{label}: {dropped} in a keys row: {row:?}");
            }
        }
        // Lookups return whole records, exactly those of the value.
        let want: BTreeMap<String, Record> =
            us.iter().map(|r| (c.schema().record_keys(r).unwrap().row_key, (*r).clone())).collect();
        assert_eq!(by_country(&c, "us").await, want, "{label}");
        let (status, body) = common::call(&table_catalog::http::router(c.clone()), "GET", "/api/records?country=US&limit=1000", None, "").await;
        assert_eq!(status.as_u16(), 200, "{label}: {body}");
        assert_eq!(body["records"].as_array().unwrap().len(), us.len(), "{label}: {body}");
        assert!(body["records"].as_array().unwrap().iter().all(|r| r.get("elevation").is_some() && r.get("_tcfact").is_none()), "{label}");
        verify_clean(&c, &label).await;

        // A concurrent move: the record leaves US for CA after a lookup read its US row. The
        // apply tombstones that row; putting it back live shows the lookup at that moment.
        let moved = us[0].clone();
        let rk = c.schema().record_keys(&moved).unwrap().row_key;
        let us_pk = partition_of(&c, &moved, "country");
        let stale = c.store().get(table, &us_pk, &rk).await.unwrap().unwrap();
        let mut now = moved.clone();
        now.insert("country".into(), json!("CA"));
        c.upsert(now.clone(), true).await.unwrap();
        c.store().upsert(table, &stale).await.unwrap();
        let found = by_country(&c, "US").await;
        assert!(!found.contains_key(&rk), "{label}: a record that moved away from US was returned");
        assert_eq!(found.len(), us.len() - 1, "{label}");
        assert_eq!(by_country(&c, "CA").await.get(&rk), Some(&now), "{label}: found whole under its new value");
        // The fact row gone altogether (a deleted record whose index row is still live).
        c.store().delete(table, &partition_of(&c, &moved, "icao"), &rk, &table_catalog::store::IfMatch::Any).await.unwrap();
        assert!(!by_country(&c, "CA").await.contains_key(&rk), "{label}: no fact row, no record");

        // `?fields=` naming fields the rows hold answers from the index rows: no fact read
        // (the record whose fact row is gone is still there), only those fields.
        let app = table_catalog::http::router(c.clone());
        let (status, body) = common::call(&app, "GET", "/api/records?country=CA&fields=icao,name&limit=1000", None, "").await;
        assert_eq!(status.as_u16(), 200, "{label}: {body}");
        let records = body["records"].as_array().unwrap();
        let icao = moved["icao"].clone();
        assert!(records.iter().any(|r| r["icao"] == icao), "{label}: answered from the index row: {body}");
        for r in records {
            let keys: Vec<&String> = r.as_object().unwrap().keys().collect();
            assert_eq!(keys, ["icao", "name"], "{label}: only the fields asked for: {r}");
        }
        for (query, text) in [
            ("country=CA&fields=icao,elevation", "fields: 'elevation' is not held by the rows of index 'country' (projection keys)"),
            ("country=CA&fields=", "fields: field name '' is not a valid property name"),
        ] {
            let (status, body) = common::call(&app, "GET", &format!("/api/records?{query}"), None, "").await;
            let message = body["error"]["message"].as_str().unwrap_or_default();
            assert_eq!(status.as_u16(), 400, "{label}: {query}: {body}");
            assert!(message.contains(text), "{label}: {query}: {message}");
        }
        // Through an `all` index any field can be asked for (and the record is read whole).
        let other = us[1];
        let uri = format!("/api/records?icao={}&fields=elevation", other["icao"].as_str().unwrap());
        let (status, body) = common::call(&app, "GET", &uri, None, "").await;
        assert_eq!(status.as_u16(), 200, "{label}: {body}");
        assert_eq!(body["records"], json!([{"elevation": other["elevation"]}]), "{label}");
    }
}

/// Adds `field` with `projection` and waits until it is active (its backfill run here).
async fn add_active(c: &Arc<Catalog>, field: &str, projection: Projection, label: &str) {
    let add = indexes::add_projected(c, field, projection);
    change_index(c, add, field, Some(IndexState::Active), label).await;
}

common::backend_tests! {
    /// Filters through a `keys` index: an index added after it (`tz`) is missing from its
    /// older rows, yet a lookup naming both finds exactly the records (decided on the fact
    /// row) and verify stays clean; a delete naming both removes exactly those records; a
    /// delete by the projected field removes every row of the records; a replace through it moves the record; `consistent=true` finds a write not
    /// yet applied whole; the online drop removes its rows and leaves the catalog clean.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn filters_through_a_keys_index_decide_on_the_fact_row(backend) {
        let label = format!("{backend:?}");
        let c = common::catalog_with(backend, common::airports_schema(), opts()).await;
        let n = if backend == Backend::Azurite { 80 } else { 200 };
        let mut all = airports(n);
        for r in all.iter_mut().skip(3).step_by(10) {
            r.insert("country".into(), json!("CA")); // the first airports are all in the US
        }
        c.upsert_many(all.clone(), true).await.unwrap();
        add_active(&c, "country", Projection::Keys, &label).await;
        add_active(&c, "tz", Projection::All, &label).await;
        verify_clean(&c, &label).await;
        // `tz`'s backfill refreshed the country rows written before it: they hold `tz` now
        // (`src/apply/refresh.rs`), so `?fields=` answers from them.
        for r in all.iter().filter(|r| r.get("tz").and_then(Value::as_str).is_some_and(|v| !v.is_empty())) {
            let rk = c.schema().record_keys(r).unwrap().row_key;
            let row = c.store().get(c.names().table.as_str(), &partition_of(&c, r, "country"), &rk).await.unwrap().unwrap();
            assert!(row.properties.contains_key("tz"), "{label}: a country row not refreshed: {row:?}");
        }
        let us_chicago: BTreeMap<String, Record> = all
            .iter()
            .filter(|r| r.get("country") == Some(&json!("US")) && r.get("tz") == Some(&json!("America/Chicago")))
            .map(|r| (c.schema().record_keys(r).unwrap().row_key, r.clone()))
            .collect();
        assert!(us_chicago.len() >= 3, "{label}: {}", us_chicago.len());
        let both = Filter::new(vec![("country".into(), "US".into()), ("tz".into(), "America/Chicago".into())]);
        let page = c.query(&both, 1000, None).await.unwrap();
        assert_eq!(page.index, "country", "{label}: the first field's index");
        let got: BTreeMap<String, Record> = page.records.into_iter().map(|f| (f.row_key, f.record)).collect();
        assert_eq!(got, us_chicago, "{label}");

        // A write filter naming another indexed field through the projected index: it
        // removes exactly the records with both values.
        let tz = |r: &Record| r.get("tz").and_then(Value::as_str).unwrap_or_default().to_string();
        let us = |r: &&Record| r.get("country") == Some(&json!("US"));
        let other_tz = all.iter().filter(us).map(tz).find(|t| !t.is_empty() && t != "America/Chicago").expect("a tz");
        let doomed = Filter::new(vec![("country".into(), "US".into()), ("tz".into(), other_tz.clone())]);
        let gone: Vec<&Record> = all.iter().filter(us).filter(|r| tz(r) == other_tz).collect();
        assert!(!gone.is_empty(), "{label}");
        c.delete(doomed.clone(), true).await.unwrap();
        assert!(c.query(&doomed, 1000, None).await.unwrap().records.is_empty(), "{label}");
        for r in &gone {
            let icao = r["icao"].as_str().unwrap();
            let page = c.query(&Filter::new(vec![("icao".into(), icao.into())]), 10, None).await.unwrap();
            assert!(page.records.is_empty(), "{label}: {icao} was deleted");
        }
        assert_eq!(c.query(&both, 1000, None).await.unwrap().records.len(), us_chicago.len(), "{label}");
        all.retain(|r| !(us(&r) && tz(r) == other_tz));
        verify_clean(&c, &label).await;

        // A delete by the projected field alone removes the records from every index.
        let country = |r: &Record| r.get("country").and_then(Value::as_str).unwrap_or_default().to_string();
        let other = all.iter().map(country).find(|v| !v.is_empty() && v != "US").expect("another country");
        let theirs: Vec<&Record> = all.iter().filter(|r| country(r) == other).collect();
        c.delete(Filter::new(vec![("country".into(), other.clone())]), true).await.unwrap();
        for r in &theirs {
            let icao = r["icao"].as_str().unwrap();
            let page = c.query(&Filter::new(vec![("icao".into(), icao.into())]), 10, None).await.unwrap();
            assert!(page.records.is_empty(), "{label}: {icao} was deleted");
        }
        // A replace through it: the record moves to another country.
        let (rk, mut moved) = us_chicago.iter().next().map(|(k, r)| (k.clone(), r.clone())).unwrap();
        let icao = moved["icao"].as_str().unwrap().to_string();
        moved.insert("country".into(), json!("MX"));
        let by_icao = Filter::new(vec![("icao".into(), icao.clone())]);
        c.replace(by_icao, moved.clone(), true).await.unwrap();
        let mx = c.query(&Filter::new(vec![("country".into(), "MX".into())]), 1000, None).await.unwrap();
        assert!(mx.records.iter().any(|f| f.row_key == rk && f.record == moved), "{label}");
        let us = c.query(&Filter::new(vec![("country".into(), "US".into())]), 1000, None).await.unwrap();
        assert!(us.records.iter().all(|f| f.row_key != rk), "{label}");
        verify_clean(&c, &label).await;

        // `consistent=true` reads through the same path: a write not yet applied is found
        // whole.
        let mut late = moved.clone();
        late.insert("elevation".into(), json!(-7));
        c.upsert(late.clone(), false).await.unwrap();
        let mx = c.query_consistent(&Filter::new(vec![("country".into(), "MX".into())]), 1000, None).await.unwrap();
        assert!(mx.records.iter().any(|f| f.row_key == rk && f.record == late), "{label}: {mx:?}");

        // The online drop removes the projected rows; the catalog stays clean.
        change_index(&c, indexes::drop(&c, "country"), "country", None, &label).await;
        let range = table_catalog::store::PartitionRange {
            after: Some("7_country".into()),
            before: None,
            to: Some("7_country\u{ffff}".into()),
        };
        let left = c.store().query_partitions(&c.names().table, &range, 1000, None).await.unwrap().entities;
        assert!(left.is_empty(), "{label}: {} country rows left", left.len());
        verify_clean(&c, &label).await;
    }
}

/// The `table-catalog` binary on the embedded store in `store`.
fn bin(store: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_table-catalog"))
        .env_remove("AZURE_STORAGE_CONNECTION_STRING")
        .env_remove("AzureWebJobsStorage")
        .env("RUST_LOG", "error")
        .args(["--name", "projcli", "--index-keys", "icao,iata", "--row-key", "name", "--local-path"])
        .arg(store)
        .args(args)
        .output()
        .expect("run table-catalog")
}

/// `index add FIELD --projection ...` stores the projection, `index list` shows it, and a
/// bad one fails with the message HTTP's 400 gives, adding nothing.
#[tokio::test]
async fn the_cli_adds_and_lists_projections() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path();
    let r = r#"{"icao":"KAAA","name":"Field KAAA","country":"US","elevation":12}"#;
    assert!(bin(store, &["insert", r]).status.success());
    let bad = bin(store, &["index", "add", "country", "--projection", "include:a,a", "--parallel", "0"]);
    assert_eq!(bad.status.code(), Some(1));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("projection: include: 'a' is listed twice"), "{err}");
    let added = bin(store, &["index", "add", "country", "--projection", "keys", "--parallel", "0"]);
    assert!(added.status.success(), "{}", String::from_utf8_lossy(&added.stderr));
    let change: Value = serde_json::from_slice(&added.stdout).unwrap();
    assert_eq!(change["index"]["projection"], "keys", "{change}");
    let list = bin(store, &["index", "list"]);
    let shown: Vec<(String, String)> = String::from_utf8_lossy(&list.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|i| (i["field"].as_str().unwrap().to_string(), i["projection"].as_str().unwrap().to_string()))
        .collect();
    let want: Vec<(String, String)> = [("icao", "all"), ("iata", "all"), ("country", "keys")]
        .iter()
        .map(|(f, p)| (f.to_string(), p.to_string()))
        .collect();
    assert_eq!(shown, want);
}

common::backend_tests! {
    /// An `include:elevation` index on `tz`: its rows hold the keys and `elevation`, no other
    /// field; a lookup returns whole records, and `?fields=icao,elevation` answers from its rows.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_include_index_holds_the_listed_fields(backend) {
        let label = format!("{backend:?}");
        let c = common::catalog_with(backend, common::airports_schema(), opts()).await;
        let all = airports(if backend == Backend::Azurite { 60 } else { 150 });
        c.upsert_many(all.clone(), true).await.unwrap();
        add_active(&c, "tz", Projection::parse("include:elevation").unwrap(), &label).await;
        let chicago: Vec<&Record> = all.iter().filter(|r| r.get("tz") == Some(&json!("America/Chicago"))).collect();
        assert!(chicago.len() >= 3, "{label}");
        let r = chicago[0];
        let rk = c.schema().record_keys(r).unwrap().row_key;
        let row = c.store().get(&c.names().table, &partition_of(&c, r, "tz"), &rk).await.unwrap().unwrap();
        assert!(row.properties.contains_key("elevation") && row.properties.contains_key("_tcfact"), "{label}: {row:?}");
        assert!(!row.properties.contains_key("city") && !row.properties.contains_key("lat"), "{label}: {row:?}");
        let tz = Filter::new(vec![("tz".into(), "America/Chicago".into())]);
        let page = c.query(&tz, 1000, None).await.unwrap();
        assert_eq!(page.records.len(), chicago.len(), "{label}");
        assert!(page.records.iter().all(|f| f.record.contains_key("city")), "{label}: whole records");
        let page = c.query(&tz.clone().returning(Some(vec!["icao".into(), "elevation".into()])), 1000, None).await.unwrap();
        let got: Vec<Record> = page.records.into_iter().map(|f| f.record).collect();
        let mut want: Vec<Record> = chicago
            .iter()
            .map(|r| [("icao", r["icao"].clone()), ("elevation", r["elevation"].clone())].into_iter().map(|(k, v)| (k.to_string(), v)).collect())
            .collect();
        let mut got_sorted = got.clone();
        let key = |r: &Record| r["icao"].as_str().unwrap().to_string();
        got_sorted.sort_by_key(key);
        want.sort_by_key(key);
        assert_eq!(got_sorted, want, "{label}");
        verify_clean(&c, &label).await;
    }
}

common::backend_tests! {
    /// History, verify and repair through a `keys` index on `country`: the history of
    /// `country=MX` (resolved through the projected rows and their tombstones) holds the
    /// record's upsert and its delete through that index, with the whole record; verify finds
    /// a missing projected row and a deleted record's projected row written back live; repair
    /// fixes them, and the row it writes is projected.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn projected_rows_are_covered_by_history_verify_and_repair(backend) {
        use table_catalog::history::{ChangeOp, HistoryOptions};
        use table_catalog::store::{Entity, IfMatch};
        use table_catalog::testing::repair;
        use table_catalog::testing::verify::{self, VerifyOptions};
        let label = format!("{backend:?}");
        let mut o = opts();
        o.history = HistoryOptions::on();
        let c = common::catalog_with(backend, common::airports_schema(), o).await;
        let mut records = airports(12);
        for (i, r) in records.iter_mut().enumerate() {
            r.insert("country".into(), json!(if i == 1 { "MX" } else { "CA" }));
        }
        c.upsert_many(records.clone(), true).await.unwrap();
        add_active(&c, "country", Projection::Keys, &label).await;

        // History through the projected index: the upsert and the delete of the MX record.
        c.delete(Filter::new(vec![("country".into(), "MX".into())]), true).await.unwrap();
        c.recover().await.unwrap();
        let page = c.history("country", "MX", 100, None).await.unwrap();
        let got: Vec<(ChangeOp, Option<Record>)> = page.history.into_iter().map(|h| (h.op, h.record)).collect();
        assert_eq!(got, [(ChangeOp::Delete, None), (ChangeOp::Upsert, Some(records[1].clone()))], "{label}");
        verify_clean(&c, &label).await;

        let (t, schema) = (c.names().table.clone(), c.schema());
        let rk = |r: &Record| schema.record_keys(r).unwrap().row_key;
        let (r2, r4) = (&records[2], &records[4]);
        // 1. r2's projected row is gone.
        c.store().delete(&t, &partition_of(&c, r2, "country"), &rk(r2), &IfMatch::Any).await.unwrap();
        // 2. r4 deleted, then its projected row written back live (a lost tombstone write).
        let row = c.store().get(&t, &partition_of(&c, r4, "country"), &rk(r4)).await.unwrap().unwrap();
        c.delete(Filter::new(vec![("icao".into(), r4["icao"].as_str().unwrap().into())]), true).await.unwrap();
        c.recover().await.unwrap();
        c.store().upsert(&t, &Entity { etag: None, ..row }).await.unwrap();

        let report = verify::verify(c.store().as_ref(), &t, &schema).await.unwrap();
        let found: Vec<(&str, u64)> = report.findings.iter().map(|(k, v)| (*k, *v)).collect();
        assert_eq!(found, [("missing_row", 1), ("split_state", 1)], "{label}: {:#?}", report.violations);
        repair::repair(&c, VerifyOptions::default(), |_| {}).await.unwrap();
        c.recover().await.unwrap();
        verify_clean(&c, &label).await;
        for r in [r2] {
            let row = c.store().get(&t, &partition_of(&c, r, "country"), &rk(r)).await.unwrap().unwrap();
            assert!(row.properties.contains_key("_tcfact"), "{label}: repaired row is projected: {row:?}");
            assert!(!row.properties.contains_key("elevation"), "{label}: repaired row is projected: {row:?}");
        }
        let ca = by_country(&c, "CA").await;
        assert_eq!(ca.get(&rk(r2)), Some(r2), "{label}: found whole again");
        assert!(ca.contains_key(&rk(r2)) && !ca.contains_key(&rk(r4)), "{label}");
        assert_eq!(ca.len(), 10, "{label}");
    }
}

common::backend_tests! {
    /// Found by the simulator (seed 810): a delete matching a `keys` row written before
    /// another index (`tz`) was added keyed the record by the row's payload, which lacks
    /// `tz`, so it wrote no tombstone in `tz`'s partition; `tz`'s backfill, having read the
    /// record live just before, then wrote its row there, and that row outlived the record.
    /// The apply now keys a matched projected row by its fact row's whole record (same
    /// version): the delete tombstones the `tz` row too, which fences the backfill's write.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_delete_through_a_projected_row_tombstones_the_row_of_an_index_added_after_it(backend) {
        let label = format!("{backend:?}");
        let c = common::catalog_with(backend, common::airports_schema(), opts()).await;
        let mut r = airports(1).remove(0);
        r.insert("country".into(), json!("CA"));
        c.upsert(r.clone(), true).await.unwrap();
        add_active(&c, "country", Projection::Keys, &label).await;
        // `tz` added, its backfill not run: the country row still lacks `tz`, and every
        // applier maintains the backfilling index.
        indexes::add(&c, "tz").await.unwrap();
        c.recover().await.unwrap();
        let (t, rk) = (c.names().table.clone(), c.schema().record_keys(&r).unwrap().row_key);
        let row = c.store().get(&t, &partition_of(&c, &r, "country"), &rk).await.unwrap().unwrap();
        assert!(row.properties.contains_key("_tcfact") && !row.properties.contains_key("tz"), "{label}: {row:?}");
        c.delete(Filter::new(vec![("country".into(), "CA".into())]), true).await.unwrap();
        let tz = c.store().get(&t, &partition_of(&c, &r, "tz"), &rk).await.unwrap();
        let tombstone = tz.as_ref().and_then(|e| e.properties.get("_tc")).map(|v| format!("{v:?}")).unwrap_or_default();
        assert!(tombstone.contains("\\\"d\\\":true"), "{label}: no tombstone in tz's partition: {tz:?}");
    }

    /// A write filter through a projected index may name a field the index's row lacks: a
    /// row written before that index was added and not refreshed by its backfill (here: the
    /// field stripped from the stored row, as a backfill racing the filter or an older
    /// release leaves it). The apply decides such a row by its fact row
    /// (`src/apply/fact.rs`): a delete whose filter the record matches removes it from
    /// every index; a replace and a delete it does not match leave it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_filter_naming_a_field_its_projected_row_lacks_is_decided_by_the_fact_row(backend) {
        let label = format!("{backend:?}");
        let c = common::catalog_with(backend, common::airports_schema(), opts()).await;
        let mut rs = airports(3);
        for (r, tz) in rs.iter_mut().zip(["Zone/A", "Zone/B", "Zone/A"]) {
            r.insert("country".into(), json!("CA"));
            r.insert("tz".into(), json!(tz));
        }
        c.upsert_many(rs.clone(), true).await.unwrap();
        add_active(&c, "country", Projection::Keys, &label).await;
        add_active(&c, "tz", Projection::All, &label).await;
        let t = c.names().table.clone();
        let strip = |r: &Record| {
            let (c, t, r) = (c.clone(), t.clone(), r.clone());
            async move {
                let rk = c.schema().record_keys(&r).unwrap().row_key;
                let pk = partition_of(&c, &r, "country");
                let mut row = c.store().get(&t, &pk, &rk).await.unwrap().unwrap();
                assert!(row.properties.remove("tz").is_some() && row.properties.contains_key("_tcfact"), "{row:?}");
                c.store().replace(&t, &row, &table_catalog::store::IfMatch::Any).await.unwrap();
            }
        };
        for r in &rs {
            strip(r).await;
        }
        let by_icao = |r: &Record| Filter::new(vec![("icao".into(), r["icao"].as_str().unwrap().into())]);
        let live = |f: Filter| {
            let c = c.clone();
            async move { c.query(&f, 10, None).await.unwrap().records.len() }
        };
        let ca = |tz: &str| Filter::new(vec![("country".into(), "CA".into()), ("tz".into(), tz.into())]);
        // Not matched by its fact row: nothing removed.
        c.delete(ca("Zone/C"), true).await.unwrap();
        for r in &rs {
            assert_eq!(live(by_icao(r)).await, 1, "{label}: {} was not matched", r["icao"]);
        }
        // Matched by its fact row: removed from every index (its country row too).
        c.delete(ca("Zone/A"), true).await.unwrap();
        for r in [&rs[0], &rs[2]] {
            assert_eq!(live(by_icao(r)).await, 0, "{label}: {} was deleted", r["icao"]);
        }
        assert_eq!(live(by_icao(&rs[1])).await, 1, "{label}");
        let country = c.query(&Filter::new(vec![("country".into(), "CA".into())]), 10, None).await.unwrap();
        assert_eq!(country.records.len(), 1, "{label}: {country:?}");
        // A replace through the stripped row replaces the record it matches by one of
        // another identity (so the old one is gone only if it was matched).
        let mut moved = rs[1].clone();
        moved.insert("icao".into(), json!("ZZZZ"));
        c.replace(ca("Zone/B"), moved.clone(), true).await.unwrap();
        assert_eq!(live(by_icao(&rs[1])).await, 0, "{label}: the replaced record is gone");
        let page = c.query(&by_icao(&moved), 10, None).await.unwrap();
        assert_eq!(page.records.iter().map(|f| &f.record).collect::<Vec<_>>(), vec![&moved], "{label}");
        verify_clean(&c, &label).await;
    }
}
