//! Record history (issue 15, item 1): one row per record identity and applied change, newest
//! first, written once however often an entry is applied; read by `FIELD=VALUE` through the
//! catalog and the HTTP API; its cost in storage requests; retention. On both backends.

use crate::common;
use table_catalog::testing::CatalogInternals;

use std::sync::Arc;

use axum::body::Body;
use axum::http::StatusCode;
use futures::TryStreamExt;
use serde_json::{json, Value};
use table_catalog::catalog::{Catalog, CatalogOptions};
use table_catalog::config::Names;
use table_catalog::history::{ChangeOp, HistoryEntry, HistoryOptions};
use table_catalog::record::Record;
use table_catalog::store::LayeredStore;
use table_catalog::store::LocalStore;
use table_catalog::store::{IfMatch, Store};
use table_catalog::testing::store::pager;
use table_catalog::testing::wal::{Op, ShardId, WalEntry, WalId};

use common::history_fixtures::{f, jfk, lga, rec};

fn options(history: HistoryOptions) -> CatalogOptions {
    let mut o = CatalogOptions::default();
    o.wal.shards = 1; // every entry in one shard: upserts logged together apply as one run
    o.history = history;
    o
}

async fn open(store: Arc<dyn Store>, names: &Names, opts: CatalogOptions) -> Catalog {
    Catalog::open(store, names.clone(), common::airports_schema(), opts).await.unwrap()
}

/// Every history row of the catalog, as stored.
async fn all_rows(c: &Catalog) -> Vec<HistoryEntry> {
    let table = c.applier().history_table().expect("history on");
    pager::scan_entities(c.store().as_ref(), table, 1000)
        .map_err(table_catalog::Error::from)
        .and_then(|e| std::future::ready(HistoryEntry::from_entity(&e)))
        .try_collect()
        .await
        .unwrap()
}

/// The whole history of `field=value`, page by page (`limit` per page).
async fn history(c: &Catalog, field: &str, value: &str, limit: usize) -> Vec<HistoryEntry> {
    let mut out = Vec::new();
    let mut token = None;
    loop {
        let page = c.history(field, value, limit, token.as_deref()).await.unwrap();
        assert!(page.history.len() <= limit);
        out.extend(page.history);
        match page.continuation {
            Some(t) => token = Some(t),
            None => return out,
        }
    }
}

fn summary(h: &[HistoryEntry]) -> Vec<(ChangeOp, String, Option<Value>)> {
    h.iter().map(|e| (e.op, e.wal_id.clone(), e.record.as_ref().map(|r| r["elevation"].clone()))).collect()
}

common::backend_tests! {
    /// Upserts of one record logged together (one merged run: only the last reaches the catalog
    /// rows, each gets its history row), a replace in place, a replace that moves a record to
    /// a new identity, a delete: one row per (identity, change), newest first; applying every
    /// entry again writes no second row.
    #[tokio::test]
    async fn every_applied_change_has_exactly_one_history_row_newest_first(backend) {
        let store = common::store(backend);
        let names = Names::new(&common::unique_name("hist"), None, None).unwrap();
        let c = open(store.clone(), &names, options(HistoryOptions::on())).await;
        let ids = c.upsert_many(vec![jfk(1), jfk(2), jfk(3), lga("LGA", 21)], false).await.unwrap();
        let ids: Vec<String> = ids.into_iter().map(|r| r.unwrap()).collect();
        c.recover().await.unwrap();
        let replaced = c.replace(f("icao", "KLGA"), lga("LGA", 22), true).await.unwrap().id;
        let moved = c.replace(f("iata", "LGA"), lga("LGX", 23), true).await.unwrap().id;
        let deleted = c.delete(f("lid", "JFK"), true).await.unwrap().id;

        let jfk_history = history(&c, "icao", "KJFK", 1).await;
        let want = vec![
            (ChangeOp::Delete, deleted.clone(), None),
            (ChangeOp::Upsert, ids[2].clone(), Some(json!(3))),
            (ChangeOp::Upsert, ids[1].clone(), Some(json!(2))),
            (ChangeOp::Upsert, ids[0].clone(), Some(json!(1))),
        ];
        assert_eq!(summary(&jfk_history), want, "{backend:?}");
        assert_eq!(jfk_history[1].record, Some(jfk(3)));
        assert!(jfk_history.windows(2).all(|w| w[0].time_us >= w[1].time_us), "newest first");

        // icao=KLGA finds both identities (the old one by its tombstone), merged newest first.
        let lga_history = history(&c, "icao", "KLGA", 2).await;
        let ops: Vec<(ChangeOp, &str, bool)> =
            lga_history.iter().map(|e| (e.op, e.wal_id.as_str(), e.record.is_some())).collect();
        let moved_rows = [(ChangeOp::Replace, moved.as_str(), true), (ChangeOp::Replace, moved.as_str(), false)];
        assert!(ops[..2] == moved_rows || ops[..2] == [moved_rows[1], moved_rows[0]], "{backend:?} {ops:?}");
        assert_eq!(
            ops[2..],
            [(ChangeOp::Replace, replaced.as_str(), true), (ChangeOp::Upsert, ids[3].as_str(), true)],
            "{backend:?}"
        );
        assert_ne!(lga_history[0].identity, lga_history[1].identity, "two identities");
        let rows_before = all_rows(&c).await;
        assert_eq!(rows_before.len(), 4 + 1 + 2 + 1, "{backend:?}: one row per identity and change");

        // Apply every entry again (as after a crash before the checkpoint, or a redelivery):
        // put them back in the pending partition under their ids and recover. They were
        // applied before any filter entry sealed a shard; a seal left in place would make
        // them entries logged late (stamped after the delete), not the same entries again.
        for shard in ShardId::all(c.status().await.unwrap().shards.len() as u16) {
            let _ = store
                .delete(
                    &names.wal_table,
                    &shard.partition(),
                    table_catalog::testing::wal::seal::SEAL_ROW,
                    &IfMatch::Any,
                )
                .await;
        }
        let ops = [
            (&ids[0], Op::Upsert { record: jfk(1) }),
            (&ids[1], Op::Upsert { record: jfk(2) }),
            (&ids[2], Op::Upsert { record: jfk(3) }),
            (&ids[3], Op::Upsert { record: lga("LGA", 21) }),
            (&replaced, Op::Replace { filter: f("icao", "KLGA"), record: lga("LGA", 22) }),
            (&moved, Op::Replace { filter: f("iata", "LGA"), record: lga("LGX", 23) }),
            (&deleted, Op::Delete { filter: f("lid", "JFK") }),
        ];
        for (id, op) in ops {
            let entry = WalEntry { id: WalId::parse(id).unwrap(), op, schema_version: 0, at: None, resume: None };
            store.upsert(&names.wal_table, &entry.to_entity(&ShardId::ZERO.partition())).await.unwrap();
        }
        assert_eq!(c.status().await.unwrap().pending, 7);
        let again = open(store.clone(), &names, options(HistoryOptions::on())).await;
        again.recover().await.unwrap();
        assert_eq!(again.status().await.unwrap().pending, 0);
        assert_eq!(all_rows(&again).await, rows_before, "{backend:?}: re-applying wrote no second row");
        assert_eq!(history(&again, "lid", "JFK", 1000).await, jfk_history);
    }
}

/// History off (the default): no table, nothing written, and reading it says how to turn it
/// on.
#[tokio::test]
async fn without_history_nothing_is_written_and_reading_says_it_is_off() {
    let c = common::airports_catalog(common::Backend::Local).await;
    assert!(!CatalogOptions::default().history.enabled);
    c.upsert(jfk(1), true).await.unwrap();
    assert_eq!(c.applier().history_table(), None);
    let err = c.history("icao", "KJFK", 10, None).await.unwrap_err();
    assert!(matches!(err, table_catalog::Error::NotFound(_)) && err.to_string().contains("TABLE_CATALOG_HISTORY=on"));
    let err = c.store().query_partition(&c.names().history_table, "x", &Default::default(), 1, None).await;
    assert!(err.is_err(), "no history table was created");
}

/// Requests per write with history on, counted on the history table: one insert per record
/// per apply group, whatever the number of its upserts in the group; none with history off.
#[tokio::test]
async fn history_costs_one_insert_per_record_per_apply_group() {
    let names = Names::new("histcost", None, None).unwrap();
    let table = names.history_table.clone();
    let layer = common::CallCounter::new(move |call| call.target == table);
    let store = Arc::new(LayeredStore::with_layer(Arc::new(LocalStore::in_memory().unwrap()), layer));
    let c = open(store.clone(), &names, options(HistoryOptions::on())).await;
    let airports: Vec<Record> = (0..50)
        .map(|i| rec(json!({"icao": format!("K{i:03}"), "iata": format!("I{i:03}"), "lid": format!("L{i:03}"), "name": format!("Field {i}")})))
        .collect();
    let before = store.layer().get();
    c.upsert_many(airports, false).await.unwrap();
    c.recover().await.unwrap();
    assert_eq!(store.layer().get() - before, 50, "one insert per new record");
    let before = store.layer().get();
    c.upsert_many((1..=10).map(jfk).collect(), false).await.unwrap();
    c.recover().await.unwrap();
    assert_eq!(store.layer().get() - before, 1, "ten upserts of one record in one group: one transaction");
    assert_eq!(history(&c, "icao", "KJFK", 1000).await.len(), 10);

    let names = Names::new("histoff", None, None).unwrap();
    let off = open(store.clone(), &names, options(HistoryOptions::default())).await;
    let before = store.layer().get();
    off.upsert(jfk(1), true).await.unwrap();
    assert_eq!(store.layer().get(), before, "history off: no history request");
}

common::backend_tests! {
    /// `TABLE_CATALOG_HISTORY_MAX`: a record's history is trimmed back to the newest M rows when
    /// a change finds more than M + M/10; `TABLE_CATALOG_HISTORY_DAYS`: rows older than D days
    /// go at the record's next change.
    #[tokio::test]
    async fn retention_trims_by_count_and_by_age(backend) {
        let store = common::store(backend);
        let names = Names::new(&common::unique_name("histret"), None, None).unwrap();
        let max = HistoryOptions { max_per_record: Some(10), ..HistoryOptions::on() };
        let c = open(store.clone(), &names, options(max)).await;
        let mut ids = Vec::new();
        for elevation in 0..25 {
            ids.push(c.upsert(jfk(elevation), true).await.unwrap().id);
            let n = history(&c, "icao", "KJFK", 1000).await.len();
            assert!(n <= 11, "{backend:?}: {n} rows after {} changes (at most 10 + 1)", elevation + 1);
        }
        let kept: Vec<String> = history(&c, "icao", "KJFK", 1000).await.into_iter().map(|e| e.wal_id).collect();
        let newest: Vec<String> = ids.iter().rev().take(kept.len()).cloned().collect();
        assert_eq!(kept, newest, "{backend:?}: the newest rows are kept");
        assert!(kept.len() >= 10);

        // Age: changes logged by a writer whose clock is 10 days behind, then a change with
        // 7 days' retention.
        let store = common::store(backend);
        let names = Names::new(&common::unique_name("histage"), None, None).unwrap();
        let mut old = options(HistoryOptions::on());
        old.wal.clock_skew_us = -10 * 86_400_000_000;
        let past = open(store.clone(), &names, old).await;
        for elevation in 0..3 {
            past.upsert(jfk(elevation), true).await.unwrap();
        }
        assert_eq!(history(&past, "icao", "KJFK", 1000).await.len(), 3);
        let days = HistoryOptions { keep_days: Some(7), ..HistoryOptions::on() };
        let now = open(store.clone(), &names, options(days)).await;
        let last = now.upsert(jfk(99), true).await.unwrap().id;
        let left: Vec<String> = history(&now, "icao", "KJFK", 1000).await.into_iter().map(|e| e.wal_id).collect();
        assert_eq!(left, [last], "{backend:?}: the 10-day-old rows are gone");
    }
}

/// `GET /api/records/history?FIELD=VALUE[&limit&continuation]`, shared by `serve` and the
/// Functions handler.
#[tokio::test]
async fn the_http_api_pages_the_history_newest_first() {
    let opts = CatalogOptions { history: HistoryOptions::on(), ..CatalogOptions::default() };
    let c = common::catalog_with(common::Backend::Local, common::airports_schema(), opts).await;
    let app = table_catalog::functions::handler_router(c.clone());
    let mut ids = Vec::new();
    for elevation in 0..3 {
        ids.push(c.upsert(jfk(elevation), true).await.unwrap().id);
    }
    ids.push(c.delete(f("icao", "KJFK"), true).await.unwrap().id);
    let (s, body) = common::call(&app, "GET", "/api/records/history?iata=jfk&limit=3", None, Body::empty()).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let page: Vec<&str> = body["history"].as_array().unwrap().iter().map(|e| e["wal_id"].as_str().unwrap()).collect();
    assert_eq!(page, [ids[3].as_str(), ids[2].as_str(), ids[1].as_str()]);
    assert_eq!(body["history"][0]["op"], "delete");
    assert_eq!(body["history"][0]["record"], Value::Null);
    assert_eq!(body["history"][1]["record"], Value::Object(jfk(2)));
    assert!(body["history"][1]["time"].as_str().unwrap().ends_with('Z'));
    let token = body["continuation"].as_str().expect("a continuation").to_string();
    let uri = format!("/api/records/history?iata=jfk&limit=3&continuation={token}");
    let (s, body) = common::call(&app, "GET", &uri, None, Body::empty()).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["history"].as_array().unwrap().len(), 1);
    assert_eq!(body["history"][0]["wal_id"], ids[0].as_str());
    assert_eq!(body["continuation"], Value::Null);
    for bad in ["", "?icao=KJFK&iata=JFK", "?name=x", "?icao=KJFK&limit=0", "?icao=KJFK&continuation=zz"] {
        let (s, body) = common::call(&app, "GET", &format!("/api/records/history{bad}"), None, Body::empty()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}: {body}");
    }
    let plain = common::airports_catalog(common::Backend::Local).await;
    let app = table_catalog::http::router(plain);
    let (s, _) = common::call(&app, "GET", "/api/records/history?icao=KJFK", None, Body::empty()).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

common::backend_tests! {
    /// Storage requests per write, history off and on, counted by the `status` counting layer
    /// (`CountingStore`), on each backend: a bulk write of 1,000 new records (logged in one
    /// append, applied in runs of 64) and 100 single upserts applied one at a time (`wait`).
    /// History on costs exactly one request more per record and group. The numbers are printed
    /// for docs/BENCHMARKS.md.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn storage_requests_per_write_with_history_on_and_off(backend) {
        use table_catalog::store::CountingStore;
        let mut per_write = Vec::new();
        for history in [HistoryOptions::default(), HistoryOptions::on()] {
            let counting = Arc::new(CountingStore::new(common::store(backend)));
            let counts = counting.counts().clone();
            let names = Names::new(&common::unique_name("histreq"), None, None).unwrap();
            let mut opts = options(history);
            opts.wal.shards = 4;
            let c = open(counting, &names, opts).await;
            let bulk: Vec<Record> = (0..1000)
                .map(|i| rec(json!({"icao": format!("K{i:04}"), "iata": format!("I{i:04}"), "lid": format!("L{i:04}"), "name": format!("Field {i}")})))
                .collect();
            // Table requests (the queue requests of apply hints depend on timing).
            let before = counts.snapshot().table;
            c.upsert_many(bulk, false).await.unwrap();
            c.recover().await.unwrap();
            let bulk_total = counts.snapshot().table - before;
            let before = counts.snapshot().table;
            for i in 0..100 {
                c.upsert(jfk(i), true).await.unwrap();
            }
            let single_total = counts.snapshot().table - before;
            per_write.push((bulk_total, single_total));
        }
        let [(bulk_off, single_off), (bulk_on, single_on)] = per_write[..] else { unreachable!() };
        eprintln!(
            "{backend:?}: table requests per write, history off -> on: bulk (1,000 new records) {:.3} -> {:.3}; \
             single upserts with wait (100, one record) {:.2} -> {:.2}",
            bulk_off as f64 / 1000.0,
            bulk_on as f64 / 1000.0,
            single_off as f64 / 100.0,
            single_on as f64 / 100.0
        );
        assert_eq!(bulk_on - bulk_off, 1000, "{backend:?}: one history insert per new record");
        assert!(single_on >= single_off + 100, "{backend:?}: one history insert per applied upsert");
    }
}
