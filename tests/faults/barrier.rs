//! The low-watermark barrier under faults (`src/apply/barrier.rs`): a replace or delete by
//! filter, logged in shard 0, applies only once every other shard has applied everything
//! below its id. Each scenario logs, on a 4-shard catalog, two applied records A and B
//! (shards 1 and 2) and an upsert of a new record C (shard 3) that is acknowledged but not
//! applied, then a delete by a filter matching all three (shard 0, so it must wait for
//! shard 3), then a newer upsert of A (after the delete: it must survive it).
//! - a crash at `barrier_wait` (the delete waits for shard 3): after a restart and recovery
//!   everything converges and the outcome is that of id order (A's newer version only; C,
//!   acknowledged before the delete, deleted);
//! - shard 3's applier frozen in C's fan-out (its row writes held by a [`Fault::Hold`] gate)
//!   while it holds the shard's lease: the delete stays pending and A and B stay visible as
//!   long as C is pending; the delete applies once the freeze ends, or once the frozen
//!   applier's lease expires and the barrier takes shard 3 over (the frozen writes then
//!   lose against the delete's tombstones).
//!
//! Each scenario fails when the barrier is removed (`Applier::shards_behind` returning no
//! shard): the delete then applies at once, before C, and C survives it.
//!
//! The crash-point hook is process-global, and the barrier passes `barrier_wait` in every
//! scenario, so the scenarios take turns ([`TURN`]).
#![cfg(feature = "testing")]

use crate::common;
use table_catalog::testing::CatalogInternals;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use table_catalog::catalog::{Catalog, CatalogOptions, Written};
use table_catalog::config::Names;
use table_catalog::query::Filter;
use table_catalog::record::Record;
use table_catalog::store::LayeredStore;
use table_catalog::store::LocalStore;
use table_catalog::store::Store;
use table_catalog::testing::apply::DrainOutcome;
use table_catalog::testing::faults;
use table_catalog::testing::store::fault::{Fault, FaultStore, Gate, OpKind, Rule, Trigger};
use table_catalog::testing::verify;
use table_catalog::testing::wal::{ShardId, WalId};

/// One scenario at a time (the crash-point hook is global).
use crate::TURN;

const SHARDS: u16 = 4;

/// Longest wait for each step; only a broken applier reaches it (180 s: an Azurite shared with
/// other tests can be slow, and a passing test never waits for the bound).
const DEADLINE: Duration = Duration::from_secs(180);

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, f).await.unwrap_or_else(|_| panic!("{what}: not within {DEADLINE:?}"))
}

/// A record with IATA code `ZZZ` (the filter of every scenario) whose RowKey lands in `shard`
/// (its name is varied until it does).
fn in_shard(tag: &str, shard: u16, v: u32) -> Record {
    let schema = common::airports_schema();
    (0..10_000)
        .map(|i| {
            json!({"icao": format!("K{tag}"), "iata": "ZZZ", "lid": format!("L{tag}"), "name": format!("{tag} field {i}"), "v": v})
                .as_object()
                .cloned()
                .unwrap()
        })
        .find(|r| ShardId::for_row_key(&schema.record_keys(r).unwrap().row_key, SHARDS).index() == shard)
        .unwrap()
}

fn a(v: u32) -> Record {
    let mut r = in_shard("AAA", 1, 1);
    r.insert("v".into(), json!(v));
    r
}
fn b() -> Record {
    in_shard("BBB", 2, 1)
}
fn c() -> Record {
    in_shard("CCC", 3, 1)
}

fn zzz() -> Filter {
    Filter::new(vec![("iata".into(), "ZZZ".into())])
}

fn options(lease: Duration) -> CatalogOptions {
    let mut o = CatalogOptions::default();
    o.wal.shards = SHARDS;
    o.wal.lease_duration = lease;
    o
}

async fn open(store: Arc<dyn Store>, names: &Names, lease: Duration) -> Arc<Catalog> {
    Arc::new(Catalog::open(store, names.clone(), common::airports_schema(), options(lease)).await.unwrap())
}

/// The records matching the filter, by name.
async fn visible(c: &Catalog) -> BTreeMap<String, Record> {
    by_name(c.query_all(&zzz()).await.unwrap())
}

fn by_name(records: impl IntoIterator<Item = Record>) -> BTreeMap<String, Record> {
    records.into_iter().map(|r| (r["name"].as_str().unwrap().to_string(), r)).collect()
}

fn id(w: &Written) -> WalId {
    WalId::parse(&w.id).unwrap()
}

/// The start of every scenario (see the module docs), written by `w`: A and B applied, C
/// logged (acknowledged) but not applied. Returns C's acknowledgement.
async fn log_start(w: &Catalog) -> Written {
    w.upsert(a(1), true).await.unwrap();
    w.upsert(b(), true).await.unwrap();
    let up = w.upsert(c(), false).await.unwrap();
    assert_eq!(up.shard, ShardId::new(3), "C is logged in shard 3");
    up
}

/// The rest: the delete (acknowledged after C), then A's newer version (acknowledged after
/// the delete). Returns the delete's acknowledgement.
async fn log_delete(w: &Catalog, up: &Written) -> Written {
    let del = w.delete(zzz(), false).await.unwrap();
    assert_eq!(del.shard, Some(ShardId::ZERO), "filter entries are logged in shard 0");
    assert!(id(up) < id(&del));
    let late = w.upsert(a(2), false).await.unwrap();
    assert!(id(&del) < id(&late));
    del
}

/// Applies everything with `y` (waiting out leases other appliers hold), then checks the
/// outcome of id order and convergence.
async fn drain_and_check(y: &Catalog, inner: &Arc<dyn Store>, names: &Names, label: &str) {
    within(&format!("{label}: drain"), async {
        while y.status().await.unwrap().pending > 0 {
            y.recover().await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(visible(y).await, by_name([a(2)]), "{label}: the outcome of id order (C deleted, A's later write kept)");
    let report = verify::verify(inner.as_ref(), &names.table, &y.schema()).await.unwrap();
    assert!(report.ok(), "{label}: {:?}", report.violations);
    let st = y.status().await.unwrap();
    assert_eq!((st.pending, st.dead), (0, 0), "{label}: {st:?}");
}

/// (a) The applier of shard 0 dies at `barrier_wait`: the delete waits for C (shard 3).
async fn crash_while_waiting(backend: common::Backend) {
    let label = format!("{backend:?} crash at barrier_wait");
    let inner = common::store(backend);
    let names = Names::new(&common::unique_name("bar"), None, None).unwrap();
    let lease = Duration::from_millis(300);
    let w = open(inner.clone(), &names, lease).await;
    let up = log_start(&w).await;
    let del = log_delete(&w, &up).await;

    let hits = Arc::new(AtomicU64::new(0));
    let h = hits.clone();
    faults::set_hook(move |name| name == "barrier_wait" && h.fetch_add(1, Ordering::SeqCst) == 0);
    let crashed = {
        let x = open(inner.clone(), &names, lease).await;
        x.applier().apply_shard(ShardId::ZERO).await
    };
    faults::clear_hook();
    assert!(hits.load(Ordering::SeqCst) >= 1, "{label}: the delete never waited at the barrier");
    assert!(crashed.is_err(), "{label}: the crash point fired: {crashed:?}");
    // The barrier checks before it applies anything: the delete and C are still pending, A
    // and B untouched.
    assert!(w.wal().is_pending(ShardId::ZERO, &id(&del)).await.unwrap(), "{label}: the delete is pending");
    assert_eq!(visible(&w).await, by_name([a(1), b()]), "{label}: nothing applied yet");

    // Restart: a new process recovers.
    let y = open(inner.clone(), &names, lease).await;
    drain_and_check(&y, &inner, &names, &label).await;
}

common::backend_tests! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn crash_while_a_filter_entry_waits_at_the_barrier_recovers_in_id_order(backend) {
        let _turn = TURN.lock().await;
        crash_while_waiting(backend).await;
    }
}

/// (b) Shard 3's applier X freezes in C's fan-out, holding the shard's lease. `thaw`: the
/// freeze ends (X finishes, releases the lease); otherwise X stays frozen and its lease
/// expires, and the barrier takes shard 3 over.
async fn frozen_shard(backend: common::Backend, thaw: bool) {
    let label = format!("{backend:?} frozen shard, {}", if thaw { "freeze ends" } else { "lease expires" });
    // Thaw: a lease that cannot expire during the test. Expiry: long enough for the checks
    // made while X holds it (a second at most), short enough to wait out.
    let lease = if thaw { Duration::from_secs(120) } else { Duration::from_secs(5) };
    let inner = common::store(backend);
    let names = Names::new(&common::unique_name("bar"), None, None).unwrap();
    let slow = Arc::new(FaultStore::new(inner.clone(), 1));
    let x = open(slow.clone(), &names, lease).await;
    let y = open(inner.clone(), &names, lease).await;

    let up = log_start(&y).await;

    // X starts applying shard 3 (C) and freezes: every catalog-row insert of X waits at the
    // gate, and C is new, so none of its three rows is written while X is frozen.
    let gate = Gate::new();
    slow.add(Rule::new(&[OpKind::Insert], Trigger::Always, Fault::Hold(gate.clone())).on(&names.table));
    let frozen = tokio::spawn({
        let x = x.clone();
        async move { x.applier().apply_shard(ShardId::new(3).unwrap()).await }
    });
    within(&format!("{label}: X freezes in C's fan-out"), gate.reached(1)).await;
    let del = log_delete(&y, &up).await;

    // Y applies shard 0 for a second: the delete waits for shard 3 (held by X) and stays
    // pending; nothing it would delete is gone.
    let out = y
        .applier()
        .apply_shard_by(ShardId::ZERO, table_catalog::testing::env::now() + Duration::from_secs(1))
        .await
        .unwrap();
    assert!(matches!(out, DrainOutcome::Partial { .. }), "{label}: shard 0 stops at the barrier: {out:?}");
    assert!(y.wal().is_pending(ShardId::ZERO, &id(&del)).await.unwrap(), "{label}: the delete is still pending");
    assert!(y.wal().is_pending(ShardId::new(3).unwrap(), &id(&up)).await.unwrap(), "{label}: C is still pending");
    assert_eq!(visible(&y).await, by_name([a(1), b()]), "{label}: A and B are still there");
    assert_eq!(gate.state().passed, 0, "{label}: X is still frozen");

    if thaw {
        // The freeze ends: X applies C and releases shard 3; then the delete applies.
        gate.open();
        let done = within(&format!("{label}: X finishes"), frozen).await.unwrap().unwrap();
        assert_eq!(done.applied(), 1, "{label}: X applied C");
        drain_and_check(&y, &inner, &names, &label).await;
    } else {
        // X stays frozen: once its lease expires, Y's barrier takes shard 3 over and applies
        // C, then the delete, all inside the freeze.
        drain_and_check(&y, &inner, &names, &label).await;
        assert_eq!(gate.state().passed, 0, "{label}: Y applied everything while X was frozen");
        // X wakes up: its stale writes of C lose against the delete's tombstones.
        gate.open();
        let _ = within(&format!("{label}: X finishes"), frozen).await.unwrap();
        assert!(gate.state().passed >= 1, "{label}: X's stale row writes went out");
        drain_and_check(&y, &inner, &names, &format!("{label}, after X woke up")).await;
    }
}

// The frozen-shard scenarios wait out a barrier deadline and a lease: logic, so on the
// in-memory store under simulated time (no real waiting); on Azurite in real time.

#[tokio::test(start_paused = true)]
async fn a_filter_entry_waits_for_a_frozen_shard_until_the_freeze_ends() {
    let _sim = common::simulated();
    let _turn = TURN.lock().await;
    frozen_shard(common::Backend::Simulated, true).await;
}

#[tokio::test(start_paused = true)]
async fn a_filter_entry_waits_for_a_frozen_shard_until_its_lease_expires() {
    let _sim = common::simulated();
    let _turn = TURN.lock().await;
    frozen_shard(common::Backend::Simulated, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_entry_waits_for_a_frozen_shard_on_azurite() {
    if let Some(azurite) = common::azurite() {
        let _turn = TURN.lock().await;
        frozen_shard(azurite, true).await;
        frozen_shard(azurite, false).await;
    }
}

/// A backlog of filter entries in shard 0 costs one barrier per page, not one per entry
/// (`barrier::PageClearance`): 20 deletes on 16 shards with nothing pending elsewhere cost 30
/// queries (the check before the seals and the one after, a query per other shard each)
/// instead of 600. Found by the long Azurite checker
/// run, whose quiescing took 2,259 s of barrier checks.
#[tokio::test]
async fn a_page_of_filter_entries_checks_the_barrier_once() {
    let _turn = TURN.lock().await;
    let names = Names::new("barrierpage", None, None).unwrap();
    // The queries addressed to the pending partitions of shards other than 0.
    let shard0 = ShardId::ZERO.partition();
    let layer = common::CallCounter::new(move |call| {
        call.op == OpKind::Query && call.partition_key.is_some_and(|p| p.starts_with(shard0.as_str()) && p != shard0)
    });
    let store = Arc::new(LayeredStore::with_layer(Arc::new(LocalStore::in_memory().unwrap()), layer));
    let mut o = options(Duration::from_secs(30));
    o.wal.shards = 16;
    let c = Catalog::open(store.clone(), names, common::airports_schema(), o).await.unwrap();
    for i in 0..20 {
        let w = c.delete(Filter::new(vec![("iata".into(), format!("Q{i:02}"))]), false).await.unwrap();
        assert_eq!(w.shard, Some(ShardId::ZERO));
    }
    let before = store.layer().get();
    let outcome = c.applier().apply_shard(ShardId::ZERO).await.unwrap();
    assert_eq!(outcome, DrainOutcome::Drained { applied: 20 });
    let queries = store.layer().get() - before;
    assert_eq!(queries, 30, "one barrier (two checks, a query per other shard each) for the page of 20 filter entries");
}
