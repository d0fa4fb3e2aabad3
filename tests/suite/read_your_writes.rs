//! Read-your-writes across processes (`GET /api/records?...&consistent=true`,
//! `src/apply/catch_up.rs`): three `serve` processes on one catalog in Azurite; a write
//! acknowledged by one process must be returned, at its acknowledged version, by a
//! consistent lookup through another, every time. The same trials without `consistent` must
//! show misses (reads served before the fan-out was applied), or the check could not fail.
//!
//! Each of [`WORKERS`] workers owns one record and, per trial, upserts it with the trial's
//! version through one process, then looks it up through another. `TC_RYW_TRIALS` (default
//! 1,000) sets the consistent trials; the plain trials are a fifth of them. Skipped visibly
//! without Azurite (a failure under `CI` / `TC_TEST_NO_SKIP=1`).
#![cfg(unix)]

use crate::common;
use table_catalog::testing::CatalogInternals;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

const PROCESSES: usize = 3;
const WORKERS: usize = 8;

#[derive(Default)]
struct Tally {
    /// Lookups that returned the acknowledged version.
    hits: AtomicU64,
    /// Lookups that returned nothing or an older version.
    misses: AtomicU64,
    /// 503 answers of consistent lookups (retried after `Retry-After`).
    busy: AtomicU64,
}

/// Runs `trials` trials over the processes at `bases`; returns the tally.
async fn run(bases: Arc<Vec<String>>, trials: u64, consistent: bool, tag: &str) -> Arc<Tally> {
    let tally = Arc::new(Tally::default());
    let next = Arc::new(AtomicU64::new(0));
    // A generous bound per request: a consistent read stops applying at a group boundary past
    // its 2 s deadline, but a group's requests to an Azurite saturated by the tests beside this
    // one took over 60 s once (TC_TEST_PARALLEL=1 on 2 cores).
    let client = reqwest::Client::builder().timeout(Duration::from_secs(180)).build().unwrap();
    let mut tasks = Vec::new();
    for w in 0..WORKERS {
        let (bases, tally, next, client, tag) =
            (bases.clone(), tally.clone(), next.clone(), client.clone(), tag.to_string());
        tasks.push(tokio::spawn(async move {
            let icao = format!("{tag}{w}");
            loop {
                let trial = next.fetch_add(1, Ordering::SeqCst);
                if trial >= trials {
                    return;
                }
                let writer = &bases[trial as usize % PROCESSES];
                let reader = &bases[(trial as usize + 1 + w % 2) % PROCESSES];
                let record = json!({"icao": icao, "iata": "", "lid": "", "name": format!("RYW field {w}"), "v": trial});
                let resp = client.post(format!("{writer}/api/records?upsert=true")).json(&record).send().await.unwrap();
                assert_eq!(resp.status(), 202, "write of trial {trial}: {}", resp.text().await.unwrap_or_default());
                let url =
                    format!("{reader}/api/records?icao={icao}{}", if consistent { "&consistent=true" } else { "" });
                let found: Value = loop {
                    let resp = client.get(&url).send().await.unwrap();
                    if resp.status() == 503 && consistent {
                        tally.busy.fetch_add(1, Ordering::Relaxed);
                        let secs: u64 = resp
                            .headers()
                            .get("retry-after")
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| v.parse().ok())
                            .expect("a 503 of a consistent read carries Retry-After");
                        tokio::time::sleep(Duration::from_secs(secs)).await;
                        continue;
                    }
                    assert_eq!(resp.status(), 200, "lookup of trial {trial}");
                    break resp.json().await.unwrap();
                };
                let v = found["records"].as_array().and_then(|r| r.first()).and_then(|r| r["v"].as_u64());
                if v == Some(trial) {
                    tally.hits.fetch_add(1, Ordering::Relaxed);
                } else {
                    tally.misses.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    tally
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_consistent_lookup_returns_every_write_acknowledged_before_it_through_any_process() {
    let Some(cs) = common::skip::azurite("read-your-writes across three serve processes") else { return };
    let trials: u64 = std::env::var("TC_RYW_TRIALS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let name = common::unique_name("ryw");
    let mut served = Vec::new();
    for _ in 0..PROCESSES {
        let global = ["--name", name.as_str(), "--index-keys", "icao,iata,lid", "--row-key", "name"];
        served.push(common::serve::start(&global, &[], &[("AZURE_STORAGE_CONNECTION_STRING", cs.as_str())]).await);
    }
    let bases = Arc::new(served.iter().map(|s| s.base.clone()).collect::<Vec<_>>());

    let consistent = run(bases.clone(), trials, true, "C").await;
    let (hits, misses, busy) = (
        consistent.hits.load(Ordering::Relaxed),
        consistent.misses.load(Ordering::Relaxed),
        consistent.busy.load(Ordering::Relaxed),
    );
    eprintln!("read-your-writes: consistent: {hits} of {trials} returned the acknowledged version, {misses} missed, {busy} answers were 503");
    assert_eq!((hits, misses), (trials, 0), "every consistent lookup returns the write acknowledged before it");

    let plain = run(bases, trials / 5, false, "P").await;
    let (hits, misses) = (plain.hits.load(Ordering::Relaxed), plain.misses.load(Ordering::Relaxed));
    eprintln!(
        "read-your-writes: without consistent: {hits} of {} returned the acknowledged version, {misses} missed",
        trials / 5
    );
    assert!(misses > 0, "plain lookups never missed a just-acknowledged write: this test could not fail");
}

fn airport(i: usize) -> table_catalog::record::Record {
    json!({"icao": format!("B{i:04}"), "iata": "", "lid": "", "name": format!("Backlog field {i}")})
        .as_object()
        .cloned()
        .unwrap()
}

/// A small backlog is applied by the consistent read itself; above the bound the read is
/// refused with 503 and `Retry-After`, never answered from a catalog that is behind.
#[tokio::test]
async fn a_consistent_lookup_applies_a_small_backlog_and_refuses_a_large_one() {
    use table_catalog::query::Filter;
    use table_catalog::testing::apply::catch_up::MAX_CATCH_UP;
    use tower::ServiceExt;

    let c = common::airports_catalog(common::Backend::Local).await;
    for i in 0..10 {
        c.upsert(airport(i), false).await.unwrap();
    }
    let by_icao = |i: usize| Filter::new(vec![("icao".into(), format!("B{i:04}"))]);
    assert!(c.query(&by_icao(9), 10, None).await.unwrap().records.is_empty(), "nothing applied yet");
    let page = c.query_consistent(&by_icao(9), 10, None).await.unwrap();
    assert_eq!(page.records.len(), 1, "the consistent read applied the 10 pending entries first");
    assert_eq!(c.status().await.unwrap().pending, 0);

    let many: Vec<_> = (10..(MAX_CATCH_UP as usize) + 20).map(airport).collect();
    c.upsert_many(many, false).await.unwrap();
    let e = c.query_consistent(&by_icao(10), 10, None).await.unwrap_err();
    assert!(matches!(e, table_catalog::Error::Busy { .. }), "{e}");
    let app = table_catalog::http::router(c.clone());
    let req =
        axum::http::Request::get("/api/records?icao=B0010&consistent=true").body(axum::body::Body::empty()).unwrap();
    let resp = app.oneshot(req).await.unwrap();
    assert_eq!(resp.status(), 503);
    let retry: u64 = resp.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    assert!(c.status().await.unwrap().pending > MAX_CATCH_UP, "a refused consistent read applies nothing");
}

/// The cost of `consistent=true` in storage requests (docs/BENCHMARKS.md): with nothing
/// pending, the shard count (another process may have raised it) and one request per WAL
/// shard (its oldest pending entry) before the lookup's own;
/// with one pending write, the catch-up adds what applying it costs.
#[tokio::test]
async fn a_consistent_lookup_costs_one_request_per_shard_and_one_more_when_nothing_is_pending() {
    use table_catalog::catalog::{Catalog, CatalogOptions};
    use table_catalog::config::Names;
    use table_catalog::query::Filter;
    use table_catalog::store::LayeredStore;
    use table_catalog::store::LocalStore;

    let store = Arc::new(LayeredStore::with_layer(
        Arc::new(LocalStore::in_memory().unwrap()),
        common::CallCounter::new(|_| true),
    ));
    let names = Names::new("ryw", None, None).unwrap();
    let c = Catalog::open(store.clone(), names, common::airports_schema(), CatalogOptions::default()).await.unwrap();
    let shards = u64::from(c.wal().shard_count());
    c.upsert(airport(1), true).await.unwrap();
    c.hints_settled().await;
    let by_icao = Filter::new(vec![("icao".into(), "B0001".into())]);
    let cost = |before: u64| store.layer().get() - before;

    let before = store.layer().get();
    assert_eq!(c.query(&by_icao, 10, None).await.unwrap().records.len(), 1);
    let plain = cost(before);
    let before = store.layer().get();
    assert_eq!(c.query_consistent(&by_icao, 10, None).await.unwrap().records.len(), 1);
    let consistent = cost(before);
    assert_eq!(plain, 1, "a lookup by one identifier reads one partition");
    assert_eq!(consistent, plain + 1 + shards, "the shard count, one oldest-pending read per shard, the lookup");

    c.upsert(airport(2), false).await.unwrap();
    c.hints_settled().await;
    let before = store.layer().get();
    let by_2 = Filter::new(vec![("icao".into(), "B0002".into())]);
    assert_eq!(c.query_consistent(&by_2, 10, None).await.unwrap().records.len(), 1);
    let with_backlog = cost(before);
    eprintln!(
        "storage requests per lookup ({shards} shards): plain {plain}, consistent with nothing pending {consistent}, consistent with one pending write {with_backlog}"
    );
    assert!(with_backlog > consistent, "the catch-up applied the pending write");
}
