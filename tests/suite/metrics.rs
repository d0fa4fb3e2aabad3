//! `GET /api/metrics` end to end, on every backend: the counters move as writes, applies,
//! storage conflicts and injected faults happen (feature `testing`).
#![cfg(feature = "testing")]

use crate::common;

use std::sync::Arc;

use axum::body::Body;
use axum::http::StatusCode;
use serde_json::{json, Value};
use table_catalog::store::CountingStore;
use table_catalog::store::{Entity, IfMatch, StoreError};
use table_catalog::testing::names::Names;
use table_catalog::testing::store::fault::{unavailable, Fault, FaultStore, OpKind, Rule, Trigger};
use table_catalog::{Catalog, CatalogOptions};

use common::{airports_schema, call, store, unique_name};

/// Sum of the samples of `name` whose labels contain every `labels` item (e.g. `op="insert"`).
fn metric(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or(f64::NAN))
        .sum()
}

async fn scrape(app: &axum::Router) -> String {
    let (s, body) = call(app, "GET", "/api/metrics", None, Body::empty()).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    match body {
        Value::String(text) => text,
        other => panic!("metrics are not text: {other}"),
    }
}

common::backend_tests! {
    #[tokio::test]
    async fn metrics_move_with_writes_applies_conflicts_and_faults(backend) {
        let faults = Arc::new(FaultStore::new(store(backend), 7));
        let counting = CountingStore::new(faults.clone());
        let counts = counting.counts().clone();
        let names = Names::new(&unique_name("t"), None, None).unwrap();
        let catalog = Catalog::open(Arc::new(counting), names.clone(), airports_schema(), CatalogOptions::default())
            .await
            .unwrap()
            .with_request_counts(counts.clone());
        let catalog = Arc::new(catalog);
        let app = table_catalog::http::router(catalog.clone());

        let m0 = scrape(&app).await;
        assert_eq!(metric(&m0, "tablecatalog_apply_entries_total", &[]), 0.0, "{m0}");
        assert!(m0.contains("# TYPE tablecatalog_apply_duration_seconds histogram"), "{m0}");
        let requests0 = metric(&m0, "tablecatalog_storage_requests_total", &[]);
        assert!(requests0 > 0.0, "opening the catalog made requests: {m0}");

        // What one scrape costs in storage requests (documented in README.md, Metrics).
        let before = counts.snapshot();
        let m = scrape(&app).await;
        let cost = counts.snapshot().since(&before).total;
        let shards = m.lines().filter(|l| l.starts_with("tablecatalog_wal_pending{")).count() as u64;
        eprintln!("{backend:?}: one scrape with {shards} WAL shard(s) cost {cost} storage requests");
        assert_eq!(cost, 2 * shards + 3, "{m}");

        // A write applied before the answer: one apply pass, one entry, a duration sample.
        let jfk = json!({"icao": "KJFK", "iata": "JFK", "name": "John F Kennedy International Airport"});
        let (s, body) = call(&app, "POST", "/api/records?wait=true", Some("application/json"), jfk.to_string()).await;
        assert_eq!(s, StatusCode::CREATED, "{backend:?} {body}");
        let m1 = scrape(&app).await;
        assert!(metric(&m1, "tablecatalog_apply_entries_total", &[]) >= 1.0, "{backend:?} {m1}");
        assert!(metric(&m1, "tablecatalog_apply_passes_total", &[]) >= 1.0, "{backend:?} {m1}");
        assert!(metric(&m1, "tablecatalog_apply_duration_seconds_count", &[]) >= 1.0, "{backend:?} {m1}");
        assert!(metric(&m1, "tablecatalog_storage_requests_total", &[]) > requests0, "{m1}");
        assert_eq!(metric(&m1, "tablecatalog_wal_pending", &[]), 0.0, "{m1}");
        assert_eq!(metric(&m1, "tablecatalog_wal_oldest_pending_age_seconds", &[]), 0.0, "{m1}");

        // Real 409 and 412 answers of the store, through the catalog's (counting) store.
        let conflicts409 = metric(&m1, "tablecatalog_storage_conflicts_total", &["status=\"409\""]);
        let conflicts412 = metric(&m1, "tablecatalog_storage_conflicts_total", &["status=\"412\""]);
        let t = unique_name("m");
        let st = catalog.store();
        st.create_table(&t).await.unwrap();
        let v1 = st.insert(&t, &Entity::new("p", "r")).await.unwrap();
        assert!(matches!(st.insert(&t, &Entity::new("p", "r")).await, Err(StoreError::AlreadyExists(_))));
        st.upsert(&t, &Entity::new("p", "r")).await.unwrap();
        let stale = st.replace(&t, &Entity::new("p", "r"), &IfMatch::Etag(v1)).await;
        assert!(matches!(stale, Err(StoreError::PreconditionFailed(_))), "{stale:?}");
        let m2 = scrape(&app).await;
        assert_eq!(metric(&m2, "tablecatalog_storage_conflicts_total", &["status=\"409\""]), conflicts409 + 1.0);
        assert_eq!(metric(&m2, "tablecatalog_storage_conflicts_total", &["status=\"412\""]), conflicts412 + 1.0);
        assert!(metric(&m2, "tablecatalog_storage_requests_total", &["op=\"insert\"", "outcome=\"conflict\""]) >= 1.0);
        assert!(
            metric(&m2, "tablecatalog_storage_requests_total", &["op=\"replace\"", "outcome=\"precondition\""]) >= 1.0
        );

        // Injected 409 and 412 (fault rules below the counting layer) count the same way.
        faults.add(
            Rule::new(
                &[OpKind::Insert],
                Trigger::Nth(1),
                Fault::Fail(StoreError::AlreadyExists("injected 409".into())),
            )
            .on(&t),
        );
        faults.add(
            Rule::new(
                &[OpKind::Replace],
                Trigger::Nth(1),
                Fault::Fail(StoreError::PreconditionFailed("injected 412".into())),
            )
            .on(&t),
        );
        assert!(st.insert(&t, &Entity::new("p", "q")).await.is_err());
        assert!(st.replace(&t, &Entity::new("p", "r"), &IfMatch::Any).await.is_err());
        faults.clear();
        let m2b = scrape(&app).await;
        assert_eq!(
            metric(&m2b, "tablecatalog_storage_conflicts_total", &["status=\"409\""]),
            conflicts409 + 2.0,
            "{m2b}"
        );
        assert_eq!(
            metric(&m2b, "tablecatalog_storage_conflicts_total", &["status=\"412\""]),
            conflicts412 + 2.0,
            "{m2b}"
        );

        // Injected faults: every WAL request fails with 503 once, so handling a hint fails and
        // will be retried; the failed requests are counted as `unavailable`.
        faults.add(Rule::new(&[], Trigger::Always, Fault::Fail(unavailable())).on(&names.wal_table));
        let hint = table_catalog::testing::messages::hint_json("wal", "0");
        assert!(catalog.process_message(&hint, "m-retry").await.is_err());
        faults.clear();
        let m3 = scrape(&app).await;
        assert_eq!(metric(&m3, "tablecatalog_apply_retries_total", &[]), 1.0, "{m3}");
        assert!(metric(&m3, "tablecatalog_storage_requests_total", &["outcome=\"unavailable\""]) >= 1.0, "{m3}");

        // A message that can never succeed is poisoned and counted.
        use table_catalog::testing::dispatch::{Delivery, Dispatcher, Disposition};
        let delivery = Delivery { text: "not json", id: "m-poison", dequeue_count: 1 };
        let out = Dispatcher::apply(catalog.clone()).invoke(delivery).await.unwrap();
        assert!(matches!(out, Disposition::Poisoned(_)), "{out:?}");
        let m4 = scrape(&app).await;
        assert_eq!(metric(&m4, "tablecatalog_poisoned_messages_total", &[]), 1.0, "{m4}");
        assert!(metric(&m4, "tablecatalog_poison_queue_depth", &[]) >= 1.0, "{m4}");
    }
}

common::backend_tests! {
    /// Issue 27, item 4: a status read (and so a metrics scrape) costs a bounded number of
    /// storage requests under any backlog. 12,000 pending entries in one shard are counted up to
    /// `COUNT_CAP` (10,000): the status says `pending_capped`, and the count reads at most 11
    /// pages of keys on Azure (one request on the embedded store), not the 12 a full count needs.
    #[tokio::test]
    async fn a_status_read_under_a_large_backlog_counts_up_to_the_cap(backend) {
        use table_catalog::store::{BatchOp, TableStore};
        use table_catalog::testing::wal::COUNT_CAP;
        let counting = Arc::new(CountingStore::new(store(backend)));
        let names = Names::new(&unique_name("capped"), None, None).unwrap();
        let c =
            Catalog::open(counting.clone(), names.clone(), airports_schema(), CatalogOptions::default()).await.unwrap();
        // Pending entries of shard `wal` (never applied here: nothing runs the appliers).
        for chunk in 0..120 {
            let ops: Vec<BatchOp> = (0..100)
                .map(|i| {
                    BatchOp::Insert(Entity::new("wal", format!("2000-01-01T00:00:00.{:06}_pending", chunk * 100 + i)))
                })
                .collect();
            counting.batch(&names.wal_table, "wal", &ops).await.unwrap();
        }
        let before = counting.counts().snapshot();
        let status = c.status().await.unwrap();
        let cost = counting.counts().snapshot().since(&before);
        assert!(status.pending_capped, "{backend:?}: {status:?}");
        assert!((COUNT_CAP..12_000).contains(&status.pending), "{backend:?}: {}", status.pending);
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["pending_capped"], json!(true));
        assert_eq!(json["shards"][0]["pending_capped"], json!(true));
        // Shard count, backlog count, checkpoint, dead count, poison queue: the backlog
        // count is at most 11 requests.
        assert!(cost.table <= 11 + 4, "{backend:?}: {} table requests for one status read", cost.table);
    }
}
