//! A filter entry that runs longer than its shard's lease keeps the lease (issue 27, item 4):
//! the applier renews it while the filter reads and writes (`Applier::keeping_lease`), so no
//! other applier takes shard 0 over halfway through one delete. Before, the lease was renewed
//! only between groups, and a delete matching many records on slow storage lost its shard to
//! the next applier, which started the same delete again.
//!
//! And it respects the pass's deadline inside the filter (issue 27, item 4): past the
//! deadline it stops between two pages of the filter's partition, records how far it got in
//! the entry, and the next pass goes on from there (`src/apply/filter.rs`, "Deadlines and
//! progress"). Before, a filter that had begun ran to its end, however long.
//!
//! Logic, not I/O: on the in-memory store under simulated time (the slow writes and the lease
//! take no real time).
#![cfg(feature = "testing")]

use crate::common;
use table_catalog::testing::CatalogInternals;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use table_catalog::catalog::{Catalog, CatalogOptions};
use table_catalog::config::Names;
use table_catalog::query::Filter;
use table_catalog::record::Record;
use table_catalog::store::Store;
use table_catalog::testing::apply::DrainOutcome;
use table_catalog::testing::store::fault::{Fault, FaultStore, OpKind, Rule, Trigger};
use table_catalog::testing::wal::ShardId;

const RECORDS: usize = 40;
const LEASE: Duration = Duration::from_secs(2);
/// Each catalog-row write of the slow applier: 40 records of 3 rows take about 12 s.
const SLOW: Duration = Duration::from_millis(100);

fn airport(i: usize) -> Record {
    json!({"icao": format!("K{i:03}"), "iata": "ZZZ", "lid": format!("L{i:03}"), "name": format!("Field {i}")})
        .as_object()
        .cloned()
        .unwrap()
}

async fn open(store: Arc<dyn Store>, names: &Names) -> Arc<Catalog> {
    let mut opts = CatalogOptions::default();
    opts.wal.shards = 1;
    opts.wal.lease_duration = LEASE;
    opts.wal.apply_concurrency = 1;
    Arc::new(Catalog::open(store, names.clone(), common::airports_schema(), opts).await.unwrap())
}

#[tokio::test(start_paused = true)]
async fn a_filter_entry_longer_than_its_lease_keeps_its_shard() {
    let _sim = common::simulated();
    let inner = common::mem_store();
    let names = Names::new(&common::unique_name("flease"), None, None).unwrap();
    let b = open(inner.clone(), &names).await;
    b.upsert_many((0..RECORDS).map(airport).collect(), true).await.unwrap();
    b.delete(Filter::new(vec![("iata".into(), "ZZZ".into())]), false).await.unwrap();

    let slow = Arc::new(FaultStore::new(inner.clone(), 1));
    slow.add(Rule::new(&[OpKind::Insert, OpKind::Replace], Trigger::Always, Fault::Delay(SLOW)).on(&names.table));
    let a = open(slow.clone(), &names).await;
    let started = table_catalog::testing::env::now();
    let pass = tokio::spawn({
        let a = a.clone();
        async move { a.applier().apply_shard(ShardId::ZERO).await }
    });
    // While A works on the delete, shard 0's lease is never free to B.
    let mut checks = 0;
    tokio::time::sleep(Duration::from_millis(300)).await;
    while !pass.is_finished() {
        let taken = b.wal().acquire_lease(ShardId::ZERO).await.unwrap();
        assert!(taken.is_none(), "B took shard 0 over {:?} into A's delete", started.elapsed());
        checks += 1;
        tokio::time::sleep(LEASE / 4).await;
    }
    let outcome = pass.await.unwrap().unwrap();
    assert!(started.elapsed() > 3 * LEASE, "the delete ran {:?}, not longer than its lease", started.elapsed());
    assert!(checks >= 8, "{checks} checks");
    assert_eq!(outcome, DrainOutcome::Drained { applied: 1 }, "A applied the delete in one pass");
    let left = b.query_all(&Filter::new(vec![("iata".into(), "ZZZ".into())])).await.unwrap();
    assert!(left.is_empty(), "{} records left", left.len());
    assert_eq!(b.status().await.unwrap().pending, 0);
}

/// Records sharing `iata=ZZZ`: the filter's partition holds 25 rows, read in pages of 10.
const MANY: usize = 25;

#[tokio::test(start_paused = true)]
async fn a_filter_past_its_deadline_stops_between_pages_and_the_next_pass_goes_on_from_there() {
    let _sim = common::simulated();
    let names = Names::new(&common::unique_name("fdeadline"), None, None).unwrap();
    let table = names.table.clone();
    // Counts the reads of the filter's partition (`iata` ZZZ) in the catalog table.
    let reads = common::CallCounter::new(move |call| {
        call.target == table && call.op == OpKind::Query && call.partition_key.is_some_and(|pk| pk.contains("iatazzz"))
    });
    let inner = Arc::new(table_catalog::store::LayeredStore::with_layer(common::mem_store(), reads));
    let b = open(inner.clone(), &names).await;
    b.upsert_many((0..MANY).map(airport).collect(), true).await.unwrap();
    b.delete(Filter::new(vec![("iata".into(), "ZZZ".into())]), false).await.unwrap();

    // A's passes end at once (budget 0): each handles one page of the filter (10 rows), then
    // stops.
    let mut opts = CatalogOptions::default();
    opts.wal.shards = 1;
    opts.wal.lease_duration = LEASE;
    opts.wal.apply_budget = Duration::ZERO;
    opts.wal.filter_page = 10;
    let a = Catalog::open(inner.clone(), names.clone(), common::airports_schema(), opts).await.unwrap();
    let live = || async { b.query_all(&Filter::new(vec![("iata".into(), "ZZZ".into())])).await.unwrap().len() };
    let mut outcomes = Vec::new();
    let mut left = Vec::new();
    let mut page_reads = Vec::new();
    while outcomes.len() < 6 {
        let before = inner.layer().get();
        let outcome = a.applier().apply_shard(ShardId::ZERO).await.unwrap();
        page_reads.push(inner.layer().get() - before);
        outcomes.push(outcome);
        left.push(live().await);
        if b.status().await.unwrap().pending == 0 {
            break;
        }
    }
    // The third pass applies the delete's last page and ends it (a pass past its deadline
    // says Partial, having applied one entry).
    let applied: Vec<usize> = outcomes.iter().map(|o| o.applied()).collect();
    assert_eq!(applied, [0, 0, 1], "outcomes {outcomes:?}, records left after each pass: {left:?}");
    assert_eq!(left, [15, 5, 0], "a page of 10 records per pass");
    // Each pass reads from where the last one stopped: the page it handles and the next
    // one (where it stopped); the last pass reads its page and the end.
    assert!(page_reads.iter().all(|n| *n <= 3), "reads of the filter's partition per pass: {page_reads:?}");
    assert_eq!(b.status().await.unwrap().pending, 0);
}

/// Regression (seeds 62 and 66 of the randomized checker's long runs): a pass past its
/// deadline went on to the end of its page, up to 128 entries. Under a shard-0 backlog of
/// deletes that each matched many records, a caller that applied shard 0 itself (`wait`, an
/// intent's queue invocation, a `consistent=true` read) was held for minutes. It now stops at
/// the first group boundary past its deadline; the next pass goes on from there.
#[tokio::test(start_paused = true)]
async fn a_pass_past_its_deadline_stops_after_the_group_in_hand_not_at_the_end_of_its_page() {
    let _sim = common::simulated();
    let inner = common::mem_store();
    let names = Names::new(&common::unique_name("fgroup"), None, None).unwrap();
    let b = open(inner.clone(), &names).await;
    b.upsert_many((0..6).map(airport).collect(), true).await.unwrap();
    for i in 0..4 {
        b.delete(Filter::new(vec![("icao".into(), format!("K{i:03}"))]), false).await.unwrap();
    }
    // A's passes end at once (budget 0): each applies the group in hand, one delete.
    let mut opts = CatalogOptions::default();
    opts.wal.shards = 1;
    opts.wal.lease_duration = LEASE;
    opts.wal.apply_budget = Duration::ZERO;
    let a = Catalog::open(inner.clone(), names.clone(), common::airports_schema(), opts).await.unwrap();
    let mut applied = Vec::new();
    let mut live = Vec::new();
    while applied.len() < 6 && b.status().await.unwrap().pending > 0 {
        applied.push(a.applier().apply_shard(ShardId::ZERO).await.unwrap().applied());
        live.push(b.query_all(&Filter::new(vec![("iata".into(), "ZZZ".into())])).await.unwrap().len());
    }
    assert_eq!(applied, [1, 1, 1, 1], "entries applied per pass (records left after each: {live:?})");
    assert_eq!(live, [5, 4, 3, 2]);
}
