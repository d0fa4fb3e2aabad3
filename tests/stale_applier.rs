//! A lease expires while its holder still works: the holder freezes in the middle of a
//! fan-out, another applier takes the shard over and applies newer writes, then the stale
//! holder wakes up and finishes its (older) writes. Fencing by WAL id must make those writes
//! lose: no old payload comes back, no deleted record is resurrected.
#![cfg(feature = "fault-injection")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use table_catalog::catalog::{Catalog, CatalogOptions};
use table_catalog::config::Names;
use table_catalog::query::Filter;
use table_catalog::record::Record;
use table_catalog::store::fault::{Fault, FaultStore, OpKind, Rule, Trigger};
use table_catalog::store::Store;
use table_catalog::verify;

fn jfk(v: u32) -> Record {
    json!({"icao": "KJFK", "iata": "JFK", "lid": "JFK", "name": "John F Kennedy International Airport", "v": v})
        .as_object()
        .cloned()
        .unwrap()
}

fn options() -> CatalogOptions {
    let mut o = CatalogOptions::default();
    o.wal.lease_duration = Duration::from_millis(300);
    o
}

/// Two catalog instances on one store: `x` through a fault injector (`slow`), `y` direct.
struct Pair {
    inner: Arc<dyn Store>,
    names: Names,
    slow: Arc<FaultStore>,
    x: Arc<Catalog>,
    y: Catalog,
}

async fn pair(backend: common::Backend, prefix: &str, opts: CatalogOptions) -> Pair {
    let inner = common::store(backend);
    let names = Names::new(&common::unique_name(prefix), None, None).unwrap();
    let slow = Arc::new(FaultStore::new(inner.clone(), 1));
    let schema = common::airports_schema();
    let x = Arc::new(Catalog::open(slow.clone(), names.clone(), schema.clone(), opts.clone()).await.unwrap());
    let y = Catalog::open(inner.clone(), names.clone(), schema, opts).await.unwrap();
    Pair { inner, names, slow, x, y }
}

async fn scenario(backend: common::Backend, then_delete: bool) {
    let Pair { inner, names, slow, x, y } = pair(backend, "stale", options()).await;

    // X logs v=1 and starts applying it; its second row write freezes for longer than the lease.
    x.upsert(jfk(1), false).await.unwrap();
    slow.add(Rule::new(&[OpKind::Insert], Trigger::Nth(2), Fault::Delay(Duration::from_millis(1500))).on(&names.table));
    let stale = tokio::spawn({
        let x = x.clone();
        async move { x.recover().await }
    });
    tokio::time::sleep(Duration::from_millis(600)).await;

    // Y takes over once X's lease has expired, and applies newer writes.
    y.upsert(jfk(2), true).await.unwrap();
    if then_delete {
        y.delete(Filter::new(vec![("iata".into(), "JFK".into())]), true).await.unwrap();
    }
    // X wakes up and finishes its stale fan-out.
    let _ = stale.await.unwrap();
    y.recover().await.unwrap();

    let report = verify::verify(inner.as_ref(), &names.table, y.schema()).await.unwrap();
    assert!(report.ok(), "{backend:?}: {:?}", report.violations);
    let found = y.query_all(&Filter::new(vec![("lid".into(), "JFK".into())])).await.unwrap();
    if then_delete {
        assert!(found.is_empty(), "{backend:?}: a stale applier resurrected a deleted record: {found:?}");
    } else {
        assert_eq!(found, vec![jfk(2)], "{backend:?}: a stale applier restored an old payload");
    }
    assert!(slow.counts().1 >= 1, "the freeze was injected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_lease_holder_cannot_restore_an_old_payload() {
    for backend in common::backends() {
        scenario(backend, false).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_lease_holder_cannot_resurrect_a_deleted_record() {
    for backend in common::backends() {
        scenario(backend, true).await;
    }
}

/// Found by the randomized checker (seed 20261121, local): a delete applied from a backlog
/// writes tombstones whose WAL id is already older than the tombstone grace period. The
/// sweeper used to remove them at once (it aged tombstones by their id), and a stale lease
/// holder still holding an older upsert of the same record then re-created a row of it: the
/// deleted record came back in one index. Tombstones now age from when they were written.
async fn late_tombstone_scenario(backend: common::Backend) {
    let grace = Duration::from_millis(1500);
    let mut opts = options();
    opts.wal.tombstone_grace = grace;
    opts.sweep_apply_after = Duration::from_secs(3600); // the sweeps below only collect
    let Pair { inner, names, slow, x, y } = pair(backend, "late", opts).await;

    // A backlog: an upsert and then a delete of the same record, both logged, neither
    // applied, until their ids are older than the grace period.
    x.upsert(jfk(1), false).await.unwrap();
    y.delete(Filter::new(vec![("icao".into(), "KJFK".into())]), false).await.unwrap();
    tokio::time::sleep(grace + Duration::from_millis(200)).await;

    // X starts applying the upsert; its second row write freezes past its lease.
    slow.add(Rule::new(&[OpKind::Insert], Trigger::Nth(2), Fault::Delay(Duration::from_millis(3000))).on(&names.table));
    let stale = tokio::spawn({
        let x = x.clone();
        async move { x.recover().await }
    });
    let deadline = std::time::Instant::now() + Duration::from_millis(2500);
    while slow.counts().1 == 0 {
        assert!(std::time::Instant::now() < deadline, "{backend:?}: X never reached the frozen write");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(400)).await; // X's lease (300 ms) expires

    // Y takes over, applies both entries (the delete writes fresh tombstones with old ids)
    // and sweeps while X is still frozen.
    let deadline = std::time::Instant::now() + Duration::from_millis(1500);
    while y.status().await.unwrap().pending > 0 {
        assert!(std::time::Instant::now() < deadline, "{backend:?}: Y could not take the shard over");
        y.recover().await.unwrap();
    }
    let swept = y.sweep().await.unwrap();
    assert_eq!(swept.tombstones_removed, 0, "{backend:?}: tombstones written just now were removed");
    assert!(!stale.is_finished(), "{backend:?}: X woke up before Y swept; the scenario did not happen");

    // X wakes up and sends its stale row write.
    let _ = stale.await.unwrap();
    assert!(slow.counts().1 >= 1, "the freeze was injected");
    y.recover().await.unwrap();
    let report = verify::verify(inner.as_ref(), &names.table, y.schema()).await.unwrap();
    assert!(report.ok(), "{backend:?}: {:?}", report.violations);
    for (field, value) in [("icao", "KJFK"), ("iata", "JFK"), ("lid", "JFK")] {
        let found = y.query_all(&Filter::new(vec![(field.into(), value.into())])).await.unwrap();
        assert!(found.is_empty(), "{backend:?}: the deleted record came back by {field}: {found:?}");
    }

    // Once the grace period has passed since they were written, the tombstones go.
    tokio::time::sleep(grace + Duration::from_millis(200)).await;
    let swept = y.sweep().await.unwrap();
    assert_eq!(swept.tombstones_removed, 3, "{backend:?}: {swept:?}");
    assert!(verify::scan_all(inner.as_ref(), &names.table).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_tombstone_applied_from_a_backlog_outlives_a_stale_lease_holder() {
    for backend in common::backends() {
        late_tombstone_scenario(backend).await;
    }
}

/// Found by the long randomized run on Azurite (seed 11): an applier removed applied entries
/// from the pending partition only after its whole page (up to 1,000 entries), so one that
/// lost its lease halfway through a page lost all of the page's progress, and with slow
/// storage appliers took the shard from one another forever. Progress is now committed per
/// group (at most 64 upserts, or one filter operation).
async fn lease_lost_mid_page_scenario(backend: common::Backend) {
    let Pair { inner, names, slow, x, y } = pair(backend, "page", options()).await;
    let records: Vec<Record> = (0..200)
        .map(|i| {
            json!({"icao": format!("T{i:03}"), "iata": format!("I{i:03}"), "lid": format!("L{i:03}"), "name": format!("Test field {i}")})
                .as_object()
                .cloned()
                .unwrap()
        })
        .collect();
    let logged = x.upsert_many(records, false).await.unwrap();
    assert!(logged.iter().all(Result::is_ok));

    // The first group (64 records, 192 new rows) goes through; a row write of the second
    // group freezes for longer than the lease.
    slow.add(
        Rule::new(&[OpKind::Insert], Trigger::Nth(200), Fault::Delay(Duration::from_millis(5000))).on(&names.table),
    );
    let stale = tokio::spawn({
        let x = x.clone();
        async move { x.recover().await }
    });
    let deadline = std::time::Instant::now() + Duration::from_millis(4000);
    let mut pending = y.status().await.unwrap().pending;
    while pending != 200 - 64 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        pending = y.status().await.unwrap().pending;
    }
    assert_eq!(pending, 200 - 64, "{backend:?}: the group applied before the freeze is still pending");
    let _ = stale.await.unwrap();
    assert!(slow.counts().1 >= 1, "the freeze was injected");
    y.recover().await.unwrap();
    assert_eq!(y.status().await.unwrap().pending, 0);
    let report = verify::verify(inner.as_ref(), &names.table, y.schema()).await.unwrap();
    assert!(report.ok(), "{backend:?}: {:?}", report.violations);
    assert_eq!(report.records, 200, "{backend:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_applier_losing_its_lease_mid_page_keeps_the_groups_it_applied() {
    for backend in common::backends() {
        lease_lost_mid_page_scenario(backend).await;
    }
}
