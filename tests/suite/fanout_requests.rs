//! What a fan-out row write costs, counted on the catalog table (issue 10, item 3): a new row
//! costs 1 request and a changed row at most 2 once the applier has seen what kind of rows it
//! is writing, even with a cold row cache (a process that never saw the rows before).

use crate::common;

use std::sync::Arc;

use serde_json::json;
use table_catalog::catalog::{Catalog, CatalogOptions};
use table_catalog::config::Names;
use table_catalog::record::Record;
use table_catalog::store::LayeredStore;
use table_catalog::store::LocalStore;
use table_catalog::testing::schema::Schema;

const RECORDS: usize = 60;
const INDEXES: usize = 3;
/// Unseen rows written before the applier's estimate flips (1 - (15/16)^11 > 1/2).
const WARM_UP: u64 = 11;

fn airport(i: usize, elevation: i64) -> Record {
    json!({"icao": format!("K{i:03}"), "iata": format!("I{i:03}"), "lid": format!("L{i:03}"), "name": format!("Field {i}"), "elevation": elevation})
        .as_object()
        .cloned()
        .unwrap()
}

async fn open(store: Arc<LayeredStore<common::CallCounter>>, names: &Names) -> Catalog {
    let mut opts = CatalogOptions::default();
    // One shard and one row at a time: the cost model is per row, and this makes the
    // warm-up exact.
    opts.wal.shards = 1;
    opts.wal.apply_concurrency = 1;
    let schema = Schema::new(vec!["icao".into(), "iata".into(), "lid".into()], "name").unwrap();
    Catalog::open(store, names.clone(), schema, opts).await.unwrap()
}

/// Catalog-table requests made by logging `records` and applying them.
async fn cost(c: &Catalog, store: &LayeredStore<common::CallCounter>, records: Vec<Record>) -> u64 {
    c.upsert_many(records, false).await.unwrap();
    let before = store.layer().get();
    c.recover().await.unwrap();
    assert_eq!(c.status().await.unwrap().pending, 0);
    store.layer().get() - before
}

#[tokio::test]
async fn new_rows_cost_one_request_and_changed_rows_two_with_a_cold_cache() {
    let names = Names::new("fanoutcost", None, None).unwrap();
    let table = names.table.clone();
    let layer = common::CallCounter::new(move |call| call.target == table);
    let store = Arc::new(LayeredStore::with_layer(Arc::new(LocalStore::in_memory().unwrap()), layer));
    let rows = (RECORDS * INDEXES) as u64;

    let first = open(store.clone(), &names).await;
    let new_rows = cost(&first, &store, (0..RECORDS).map(|i| airport(i, 1)).collect()).await;
    assert_eq!(new_rows, rows, "one insert per new row");

    // Another process (a cold row cache) changes every record: read, then replace, after a
    // warm-up of insert, 409, read, replace while it learns that rows exist.
    let second = open(store.clone(), &names).await;
    let changed = cost(&second, &store, (0..RECORDS).map(|i| airport(i, 2)).collect()).await;
    assert_eq!(changed, 2 * rows + WARM_UP, "read + replace per changed row, after the warm-up");

    // The same process then adds new records: it learns back that rows are new.
    let added = cost(&second, &store, (RECORDS..2 * RECORDS).map(|i| airport(i, 1)).collect()).await;
    assert_eq!(added, rows + WARM_UP, "one insert per new row, after the warm-up");
}
