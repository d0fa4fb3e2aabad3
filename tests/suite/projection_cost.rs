//! What a projection saves (issue 31, item 1): storage bytes and catalog-table requests per
//! write and per lookup, `all` against `keys`, on airports and on records of about 64 KiB.
//! A measurement, not a check: ignored by default, it prints a table for docs/BENCHMARKS.md.
//!
//! `cargo test --test suite -- projection_cost --ignored --nocapture`
//!
//! Bytes follow Azure Table Storage's documented entity size: 4 + 2 × (PartitionKey +
//! RowKey length) + for each property 8 + 2 × name length + the value's size (a string
//! 4 + 2 × length, Int32 4, Int64 / Double / DateTime 8, Boolean 1, binary 4 + length).

use std::sync::Arc;

use serde_json::json;
use table_catalog::catalog::{Catalog, CatalogOptions};
use table_catalog::config::Names;
use table_catalog::indexes::{self, Projection};
use table_catalog::query::Filter;
use table_catalog::record::Record;
use table_catalog::server::ServeOptions;
use table_catalog::store::{Entity, LayeredStore, LocalStore, PartitionRange, Value};
use table_catalog::testing::schema::{IndexState, Schema};

use crate::common;
use crate::indexes::{airports, wait_state};

/// An entity's size by Azure's formula (module docs).
fn entity_bytes(e: &Entity) -> u64 {
    let utf16 = |s: &str| s.encode_utf16().count() as u64;
    let mut n = 4 + 2 * (utf16(&e.partition_key) + utf16(&e.row_key));
    for (name, value) in &e.properties {
        n += 8 + 2 * utf16(name);
        n += match value {
            Value::String(s) | Value::Guid(s) => 4 + 2 * utf16(s),
            Value::DateTime(_) | Value::Int64(_) | Value::Double(_) => 8,
            Value::Int32(_) => 4,
            Value::Bool(_) => 1,
            Value::Binary(b) => 4 + b.len() as u64,
        };
    }
    n
}

/// Rows and bytes of the partitions whose key starts with `prefix`.
async fn partition_bytes(c: &Catalog, prefix: &str) -> (u64, u64) {
    let range = PartitionRange { after: Some(prefix.to_string()), before: None, to: Some(format!("{prefix}\u{ffff}")) };
    let (mut rows, mut bytes, mut token) = (0, 0, None);
    loop {
        let page = c.store().query_partitions(&c.names().table, &range, 1000, token.as_deref()).await.unwrap();
        for e in &page.entities {
            rows += 1;
            bytes += entity_bytes(e);
        }
        token = page.continuation;
        if token.is_none() {
            return (rows, bytes);
        }
    }
}

/// 64 KiB-ish records: four 8,000-character text fields (64,000 bytes as UTF-16), in 8
/// countries.
fn big_records(n: usize) -> Vec<Record> {
    (0..n)
        .map(|i| {
            let text = |k: usize| format!("{i:05}{k}").repeat(1_334)[..8_000].to_string();
            json!({"icao": format!("B{i:04}"), "iata": "", "lid": "", "name": format!("Big {i}"),
                "country": format!("C{}", i % 8), "a": text(1), "b": text(2), "c": text(3), "d": text(4)})
            .as_object()
            .cloned()
            .unwrap()
        })
        .collect()
}

/// (per record written: catalog requests, country-row bytes, table bytes; per lookup of one
/// country, page of up to 100: requests, records; the same lookup with `?fields=icao,name`:
/// requests).
async fn measure(projection: Projection, records: Vec<Record>, lookup: &str) -> (f64, f64, f64, u64, f64, u64) {
    let names = Names::new("projcost", None, None).unwrap();
    let table = names.table.clone();
    let layer = common::CallCounter::new(move |call| call.target == table);
    let store = Arc::new(LayeredStore::with_layer(Arc::new(LocalStore::in_memory().unwrap()), layer));
    let mut opts = CatalogOptions::default();
    opts.wal.shards = 1;
    let schema = Schema::new(vec!["icao".into(), "iata".into(), "lid".into()], "name").unwrap();
    let c = Arc::new(Catalog::open(store.clone(), names, schema, opts).await.unwrap());
    let (stop, rx) = tokio::sync::watch::channel(false);
    let scan = tokio::spawn(table_catalog::server::run_scan_worker(
        c.clone(),
        ServeOptions { scan_workers: 1, ..ServeOptions::default() },
        rx,
    ));
    indexes::add_projected(&c, "country", projection).await.unwrap();
    c.recover().await.unwrap();
    wait_state(&c, "country", Some(IndexState::Active), "cost").await;
    stop.send_replace(true);
    scan.await.unwrap();
    let n = records.len() as f64;
    c.upsert_many(records, false).await.unwrap();
    let before = store.layer().get();
    c.recover().await.unwrap();
    let writes = (store.layer().get() - before) as f64 / n;
    let (_, country_bytes) = partition_bytes(&c, "7_country").await;
    let (_, all_bytes) = partition_bytes(&c, "").await;
    let before = store.layer().get();
    let page = c.query(&Filter::new(vec![("country".into(), lookup.into())]), 100, None).await.unwrap();
    let lookup_requests = store.layer().get() - before;
    let fields =
        Filter::new(vec![("country".into(), lookup.into())]).returning(Some(vec!["icao".into(), "name".into()]));
    let before = store.layer().get();
    let cut = c.query(&fields, 100, None).await.unwrap();
    let fields_requests = store.layer().get() - before;
    assert_eq!(cut.records.len(), page.records.len());
    (
        writes,
        country_bytes as f64 / n,
        all_bytes as f64 / n,
        lookup_requests,
        page.records.len() as f64,
        fields_requests,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement (docs/BENCHMARKS.md): cargo test --test suite -- projection_cost --ignored --nocapture"]
async fn projection_cost_all_against_keys() {
    println!("| records | projection | requests / write | country row bytes / record | table bytes / record | lookup (1 page) requests | records returned | `?fields=icao,name` requests |");
    println!("|---|---|---|---|---|---|---|---|");
    for (label, lookup) in [("airports (2,000)", "US"), ("64 KiB (200)", "C3")] {
        for projection in [Projection::All, Projection::Keys] {
            let records = if lookup == "US" { airports(2_000) } else { big_records(200) };
            let shown = projection.to_string();
            let (w, cb, tb, lr, lc, fr) = measure(projection, records, lookup).await;
            println!("| {label} | {shown} | {w:.2} | {cb:.0} | {tb:.0} | {lr} | {lc:.0} | {fr} |");
        }
    }
}
