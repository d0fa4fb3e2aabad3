//! A group that fails transiently is applied again within its pass (`Applier::apply_entries`),
//! and the second attempt writes only the rows the first did not (the row cache remembers
//! the schema version each row was written under, `src/apply/row_cache.rs`).
//!
//! Before, a 503 ended the pass: the next pass read the page again, passed the barrier again,
//! and read back every row the failed attempt had written. Under the randomized checker's
//! fault rate (4% of requests), a run of 64 upserts (about 200 row writes) could almost never
//! finish, and shard 0's serial filter path fell behind the clients (docs/RELIABILITY.md,
//! "Long runs").
#![cfg(feature = "testing")]

use crate::common;
use table_catalog::testing::CatalogInternals;

use std::sync::Arc;

use serde_json::json;
use table_catalog::catalog::{Catalog, CatalogOptions};
use table_catalog::config::Names;
use table_catalog::record::Record;
use table_catalog::store::LayeredStore;
use table_catalog::store::LocalStore;
use table_catalog::store::Store;
use table_catalog::testing::apply::DrainOutcome;
use table_catalog::testing::store::fault::{unavailable, Fault, FaultStore, OpKind, Rule, Trigger};
use table_catalog::testing::wal::ShardId;

const RECORDS: usize = 40;
/// Rows per record (index keys icao, iata, lid).
const INDEXES: usize = 3;

fn airport(i: usize) -> Record {
    json!({"icao": format!("K{i:03}"), "iata": format!("I{i:03}"), "lid": format!("L{i:03}"), "name": format!("Field {i}")})
        .as_object()
        .cloned()
        .unwrap()
}

/// One shard, rows written one at a time (the failing write is then always the same one),
/// `RECORDS` upserts logged and not applied. Returns the catalog, the fault injector and the
/// counter of catalog-table requests.
async fn logged(prefix: &str) -> (Catalog, Arc<FaultStore>, Arc<LayeredStore<common::CallCounter>>, Names) {
    let names = Names::new(&common::unique_name(prefix), None, None).unwrap();
    let table = names.table.clone();
    let counter = common::CallCounter::new(move |call| call.target == table);
    let counted = Arc::new(LayeredStore::with_layer(Arc::new(LocalStore::in_memory().unwrap()), counter));
    let faults = Arc::new(FaultStore::new(counted.clone() as Arc<dyn Store>, 1));
    let mut opts = CatalogOptions::default();
    opts.wal.shards = 1;
    opts.wal.apply_concurrency = 1;
    let c = Catalog::open(faults.clone(), names.clone(), common::airports_schema(), opts).await.unwrap();
    c.upsert_many((0..RECORDS).map(airport).collect(), false).await.unwrap();
    (c, faults, counted, names)
}

#[tokio::test]
async fn a_group_that_fails_transiently_is_applied_again_within_its_pass() {
    let (c, faults, _, names) = logged("retrypass").await;
    // The 50th row write of the group fails (after the first 49 rows landed), and so does
    // the 20th of its second attempt.
    let writes = [OpKind::Insert, OpKind::Replace, OpKind::Upsert];
    faults.add(Rule::new(&writes, Trigger::Nth(50), Fault::Fail(unavailable())).on(&names.table));
    faults.add(Rule::new(&writes, Trigger::Nth(70), Fault::CommitThenFail(unavailable())).on(&names.table));
    let outcome = c.applier().apply_shard(ShardId::ZERO).await.expect("one pass applies the group despite two 503s");
    assert_eq!(outcome, DrainOutcome::Drained { applied: RECORDS });
    assert_eq!(c.status().await.unwrap().pending, 0);
    for i in 0..RECORDS {
        let found =
            c.query_all(&table_catalog::query::Filter::new(vec![("lid".into(), format!("L{i:03}"))])).await.unwrap();
        assert_eq!(found.len(), 1, "record {i} by lid");
    }
}

#[tokio::test]
async fn a_group_applied_again_writes_only_the_rows_its_first_attempt_did_not() {
    let (c, faults, counted, names) = logged("retryrows").await;
    let writes = [OpKind::Insert, OpKind::Replace, OpKind::Upsert];
    faults.add(Rule::new(&writes, Trigger::Nth(100), Fault::Fail(unavailable())).on(&names.table));
    let before = counted.layer().get();
    c.applier().apply_shard(ShardId::ZERO).await.unwrap();
    let requests = counted.layer().get() - before;
    let rows = (RECORDS * INDEXES) as u64;
    // Every row once, plus the failed write; reading back the 99 rows the first attempt
    // wrote would cost 99 more.
    assert!(requests <= rows + 2, "{requests} catalog requests for {rows} rows and one 503");
}
