//! Regression tests for issue 25 (deliverable 1): entries logged late, and a shard's oldest
//! pending entry hidden behind an empty first page. Each scenario is made deterministic with
//! [`Fault::Hold`] gates (an entry's insert into the WAL held until the test opens the gate)
//! or a store wrapper that shapes one kind of response; nothing depends on sleeps or clocks.
//!
//! - An upsert U whose id is taken but whose entry is not yet written (so it is pending
//!   nowhere) is concurrent with a delete by filter F issued meanwhile. With an index added
//!   online (not part of the RowKey), F may match U's record by a value U changes; every
//!   linearization of U and F keeps U's record (U before F: F no longer matches; F before U:
//!   U writes it again). The apply of U must not treat F's tombstones as "a newer version of
//!   this record".
//! - `Wal::oldest_pending` reads one entity (`$top=1`) and ignores the continuation token, but
//!   an empty page with a token is not the end of a query (docs/AZURE.md): a shard with a
//!   pending entry then looks empty to the barrier and to the read-your-writes catch-up.
//! - A delete D logged late (id below a later delete F of the same record, applied after F)
//!   is a valid order: F, D.
//! - The barrier's two own-shard and re-check steps (docs/ARCHITECTURE.md, "The low-watermark
//!   barrier", (2) and (4)), each with a choreography in which skipping the step loses an
//!   acknowledged write or applies it out of order (scripts/mutants: `no-restart`,
//!   `seal-without-recheck`).
//! - Found by the checker and the simulator after the fix, one test each: an entry logged
//!   late across an index drop; a delete between a superseded version and its successor
//!   (twice); an upsert applied, then stamped; a delete issued after a read saw a failed
//!   upsert whose id was never published.
#![cfg(feature = "testing")]

use crate::common;
use table_catalog::testing::CatalogInternals;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use table_catalog::catalog::{Catalog, CatalogOptions, Written};
use table_catalog::config::Names;
use table_catalog::history::{ChangeOp, HistoryOptions};
use table_catalog::indexes;
use table_catalog::query::Filter;
use table_catalog::record::Record;
use table_catalog::server::ServeOptions;
use table_catalog::store::{
    BatchOp, ETag, Entity, IfMatch, Page, PartitionRange, QueueStore, ReceivedMessage, RowRange, Store, StoreError,
    StoreResult, TableStore,
};
use table_catalog::store::{Call, Layer, LayeredStore, Returned};
use table_catalog::testing::apply::DRAIN_PAGE;
use table_catalog::testing::schema::IndexState;
use table_catalog::testing::store::fault::{Fault, FaultStore, Gate, OpKind, Rule, Trigger};
use table_catalog::testing::verify;
use table_catalog::testing::wal::{ShardId, WalId};

use common::Backend;

const SHARDS: u16 = 4;

/// Longest wait for each step; only a broken applier reaches it (180 s: an Azurite shared with
/// other tests can be slow, and a passing test never waits for the bound).
const DEADLINE: Duration = Duration::from_secs(180);

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, f).await.unwrap_or_else(|_| panic!("{what}: not within {DEADLINE:?}"))
}

fn options() -> CatalogOptions {
    let mut o = CatalogOptions::default();
    o.wal.shards = SHARDS;
    o.wal.lease_duration = Duration::from_secs(10);
    o
}

/// A failure that ends an apply pass where it happens, leaving the entry pending: not
/// transient, because a transient one is retried within the pass (`Applier::apply_entries`).
/// It stands for the process stopping there (a crash, a lost lease, retries exhausted), so
/// that something can happen between two attempts of one entry.
fn pass_ends() -> StoreError {
    StoreError::Other("injected: the apply pass stops here".into())
}

fn f(field: &str, value: &str) -> Filter {
    Filter::new(vec![(field.into(), value.into())])
}

fn id(w: &Written) -> WalId {
    WalId::parse(&w.id).unwrap()
}

/// Record R (icao KAAA) with this country.
fn r(country: &str) -> Record {
    json!({"icao": "KAAA", "iata": "AAA", "lid": "AAA", "name": "Alpha Field", "country": country})
        .as_object()
        .cloned()
        .unwrap()
}

async fn open(store: Arc<dyn Store>, names: &Names, opts: CatalogOptions) -> Arc<Catalog> {
    Arc::new(Catalog::open(store, names.clone(), common::airports_schema(), opts).await.unwrap())
}

async fn state_of(c: &Catalog, field: &str) -> Option<IndexState> {
    indexes::list(c).await.unwrap().into_iter().find(|i| i.field == field).map(|i| i.state)
}

/// Adds index `field` through `c` and runs its backfill until it is active.
async fn add_index_until_active(c: &Arc<Catalog>, field: &str, label: &str) {
    let (worker_stop, worker_rx) = tokio::sync::watch::channel(false);
    let opts = ServeOptions { scan_workers: 2, ..ServeOptions::default() };
    let scan = tokio::spawn(table_catalog::server::run_scan_worker(c.clone(), opts, worker_rx));
    indexes::add(c, field).await.unwrap();
    common::wait_for(&format!("{label}: {field} to turn active"), || async {
        c.recover().await.unwrap();
        (state_of(c, field).await == Some(IndexState::Active)).then_some(())
    })
    .await;
    worker_stop.send_replace(true);
    scan.await.unwrap();
}

/// Holds instance A's next entry insert into the WAL table (a single entry is written with
/// one `insert`; the clock publication of the same round is a batch or an upsert, so it goes
/// through and the id is published).
fn hold_next_entry(slow: &FaultStore, names: &Names) -> Gate {
    let gate = Gate::new();
    slow.add(Rule::new(&[OpKind::Insert], Trigger::Nth(1), Fault::Hold(gate.clone())).on(&names.wal_table));
    gate
}

/// Applies with every instance until nothing is pending, then checks nothing is dead.
async fn drain(cs: &[&Catalog], label: &str) {
    within(&format!("{label}: drain"), async {
        loop {
            for c in cs {
                c.recover().await.unwrap();
            }
            if cs[0].status().await.unwrap().pending == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let st = cs[0].status().await.unwrap();
    assert_eq!((st.pending, st.dead), (0, 0), "{label}: {st:?}");
}

async fn verify_clean(c: &Catalog, label: &str) {
    let report = verify::verify(c.store().as_ref(), &c.names().table, &c.schema()).await.unwrap();
    assert_eq!(report.total_findings(), 0, "{label}: verify: {:?}", report.findings);
}

/// R is live with country CA: found by icao and by CA, not by US; verify is clean.
async fn live_in_ca(c: &Catalog, label: &str) {
    let by_icao = c.query_all(&f("icao", "KAAA")).await.unwrap();
    let by_ca = c.query_all(&f("country", "CA")).await.unwrap();
    let by_us = c.query_all(&f("country", "US")).await.unwrap();
    assert_eq!(
        (by_icao.clone(), by_ca.clone(), by_us.clone()),
        (vec![r("CA")], vec![r("CA")], vec![]),
        "{label}: R (upserted to country=CA concurrently with the delete of country=US) must survive, \
         live with CA, in every linearization; got icao=KAAA -> {by_icao:?}, country=CA -> {by_ca:?}, \
         country=US -> {by_us:?}"
    );
    verify_clean(c, label).await;
}

/// The late upsert U (held at its entry insert through `a`) and the delete F of country=US
/// (through `b`, applied while U is pending nowhere). Returns after U is acknowledged.
async fn late_upsert_and_delete(a: &Arc<Catalog>, b: &Catalog, slow: &FaultStore, names: &Names, label: &str) {
    let gate = hold_next_entry(slow, names);
    let late = tokio::spawn({
        let a = a.clone();
        async move { a.upsert(r("CA"), false).await }
    });
    within(&format!("{label}: U's entry insert reaches the gate"), gate.reached(1)).await;

    // F, issued while U is in flight, passes the barrier (U is pending nowhere) and applies.
    let del = within(&format!("{label}: F applies"), b.delete(f("country", "US"), true)).await.unwrap();
    assert!(del.applied, "{label}: F applied");
    assert_eq!(b.status().await.unwrap().pending, 0, "{label}: U's entry is not written while held");
    assert!(b.query_all(&f("icao", "KAAA")).await.unwrap().is_empty(), "{label}: F deleted R0");
    assert_eq!(gate.state().passed, 0, "{label}: U is still held");

    // U's entry is written; U is acknowledged, with an id below F's (its id was published
    // before F read the clock).
    gate.open();
    let up = within(&format!("{label}: U is acknowledged"), late).await.unwrap().unwrap();
    assert_eq!(gate.state().passed, 1, "{label}: U's entry went through the gate");
    assert!(id(&up) < id(&del), "{label}: U's id {} is below F's {}", up.id, del.id);
}

common::backend_tests! {
    /// Issue 25, item 1. An index `country` added online; R0 {KAAA, country US} applied. U =
    /// upsert of the same identity with country CA through instance A: its id is taken, its
    /// entry insert held. F = delete country=US through instance B, applied (tombstones every row
    /// of R0, with F's id). Then U's entry is written and applied. U and F are concurrent, and
    /// both orders keep R with CA; the current apply finds F's tombstone (a larger id) on R's
    /// owner row, takes U as superseded and writes nothing: R is gone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_upsert_logged_late_survives_a_delete_by_an_added_index(backend) {
        let label = format!("{backend:?}");
        let inner = common::store(backend);
        let names = Names::new(&common::unique_name("late"), None, None).unwrap();
        let b = open(inner.clone(), &names, options()).await;
        add_index_until_active(&b, "country", &label).await;
        b.upsert(r("US"), true).await.unwrap();
        assert_eq!(b.query_all(&f("country", "US")).await.unwrap(), vec![r("US")], "{label}: R0 applied");

        // Instance A, opened after the change (it has the active index), through a fault
        // injector.
        let slow = Arc::new(FaultStore::new(inner.clone(), 1));
        let a = open(slow.clone(), &names, options()).await;
        late_upsert_and_delete(&a, &b, &slow, &names, &label).await;

        drain(&[&b, &a], &label).await;
        live_in_ca(&b, &label).await;
    }
}

common::backend_tests! {
    /// The same with the index added while U is held: R0 {KAAA, country US} applied before any
    /// added index; U (country CA) takes its id and is held (logged under the old schema, so
    /// ordered before the change); `index add country` runs and its backfill turns the index
    /// active (R0's row of US); then F = delete country=US applies; then U is written and
    /// applied. R must be live with CA.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_upsert_logged_late_across_an_index_add_survives_a_delete_by_the_new_index(backend) {
        let label = format!("{backend:?}");
        let inner = common::store(backend);
        let names = Names::new(&common::unique_name("lateadd"), None, None).unwrap();
        let b = open(inner.clone(), &names, options()).await;
        b.upsert(r("US"), true).await.unwrap();
        let slow = Arc::new(FaultStore::new(inner.clone(), 1));
        let a = open(slow.clone(), &names, options()).await;

        let gate = hold_next_entry(&slow, &names);
        let late = tokio::spawn({
            let a = a.clone();
            async move { a.upsert(r("CA"), false).await }
        });
        within(&format!("{label}: U's entry insert reaches the gate"), gate.reached(1)).await;

        add_index_until_active(&b, "country", &label).await;
        assert_eq!(b.query_all(&f("country", "US")).await.unwrap(), vec![r("US")], "{label}: R0 backfilled");
        let del = within(&format!("{label}: F applies"), b.delete(f("country", "US"), true)).await.unwrap();
        assert!(del.applied, "{label}: F applied");
        assert!(b.query_all(&f("icao", "KAAA")).await.unwrap().is_empty(), "{label}: F deleted R0");
        assert_eq!(gate.state().passed, 0, "{label}: U is still held");

        gate.open();
        let up = within(&format!("{label}: U is acknowledged"), late).await.unwrap().unwrap();
        assert!(id(&up) < id(&del), "{label}: U's id {} is below F's {}", up.id, del.id);

        drain(&[&b, &a], &label).await;
        live_in_ca(&b, &label).await;
    }
}

/// Runs the scan worker of `c` until index `field` is gone (its drop's job done).
async fn drop_index_until_gone(c: &Arc<Catalog>, field: &str, label: &str) {
    let (worker_stop, worker_rx) = tokio::sync::watch::channel(false);
    let opts = ServeOptions { scan_workers: 2, ..ServeOptions::default() };
    let scan = tokio::spawn(table_catalog::server::run_scan_worker(c.clone(), opts, worker_rx));
    common::wait_for(&format!("{label}: {field} to be gone"), || async {
        c.recover().await.unwrap();
        state_of(c, field).await.is_none().then_some(())
    })
    .await;
    worker_stop.send_replace(true);
    scan.await.unwrap();
}

/// Checks that the catalog table holds no row of index `field` (dropped), tombstones included.
async fn no_rows_of(store: &dyn Store, table: &str, field: &str, label: &str) {
    let rows = verify::scan_all(store, table).await.unwrap();
    let left: Vec<(&str, &str)> = rows
        .iter()
        .filter(|e| table_catalog::testing::keys::partition_field(&e.partition_key).as_deref() == Some(field))
        .map(|e| (e.partition_key.as_str(), e.row_key.as_str()))
        .collect();
    assert!(left.is_empty(), "{label}: rows of the dropped index left: {left:?}");
}

common::backend_tests! {
    /// Found by the checker on CI (seed 20261121, 4 shards): a row of an index written after
    /// the index's drop job had removed its rows stays behind, in an index that no longer
    /// exists. U = upsert of R (country CA), validated while `country` was active, takes its id
    /// through instance A and is held; `index drop country` runs through B; A reads the schema
    /// while the drop's job is not yet recorded (so its copy says "dropping, no job", and an
    /// entry validated before the drop still maintains the index, `Schema::with_dropping_maintained`); the job
    /// removes every row and the index leaves the schema; then U is written and A applies it.
    /// U is ordered after the drop: no row of `country` may be left, and R is live.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_upsert_logged_late_across_an_index_drop_leaves_no_row_of_the_dropped_index(backend) {
        let label = format!("{backend:?}");
        let inner = common::store(backend);
        let names = Names::new(&common::unique_name("latedrop"), None, None).unwrap();
        let b = open(inner.clone(), &names, options()).await;
        add_index_until_active(&b, "country", &label).await;
        b.upsert(r("US"), true).await.unwrap();
        let slow = Arc::new(FaultStore::new(inner.clone(), 1));
        let a = open(slow.clone(), &names, options()).await;

        let gate = hold_next_entry(&slow, &names);
        let late = tokio::spawn({
            let a = a.clone();
            async move { a.upsert(r("CA"), false).await }
        });
        within(&format!("{label}: U's entry insert reaches the gate"), gate.reached(1)).await;

        indexes::drop(&b, "country").await.unwrap();
        a.applier().reload_schema().await.unwrap();
        let seen = a.schema().added().iter().find(|i| i.field == "country").map(|i| (i.state, i.job.is_some()));
        assert_eq!(seen, Some((IndexState::Dropping, false)), "{label}: A's copy of the schema: dropping, no job yet");
        drop_index_until_gone(&b, "country", &label).await;

        gate.open();
        within(&format!("{label}: U is acknowledged"), late).await.unwrap().unwrap();
        drain(&[&a, &b], &label).await;

        no_rows_of(inner.as_ref(), &names.table, "country", &label).await;
        let by_icao = b.query_all(&f("icao", "KAAA")).await.unwrap();
        assert_eq!(by_icao, vec![r("CA")], "{label}: R is live with CA");
        verify_clean(&b, &label).await;
    }
}

common::backend_tests! {
    /// Issue 25, item 3. D = delete icao=KXXX takes its id and is held; F = delete iata=YYY (a
    /// larger id) matching the same record is logged and applied first; then D is written and
    /// applied. F, D is a valid order (D is concurrent with F): the record is gone, its history
    /// has exactly one removal row (F's, none of D's, which removed nothing), nothing is pending
    /// or dead.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_delete_logged_late_after_a_later_delete_of_the_same_record_is_a_valid_order(backend) {
        let label = format!("{backend:?}");
        let inner = common::store(backend);
        let names = Names::new(&common::unique_name("latedel"), None, None).unwrap();
        let mut opts = options();
        opts.history = HistoryOptions::on();
        let b = open(inner.clone(), &names, opts.clone()).await;
        let x: Record =
            json!({"icao": "KXXX", "iata": "YYY", "lid": "XXX", "name": "X-ray Field"}).as_object().cloned().unwrap();
        let upserted = b.upsert(x.clone(), true).await.unwrap();
        let slow = Arc::new(FaultStore::new(inner.clone(), 1));
        let a = open(slow.clone(), &names, opts).await;

        let gate = hold_next_entry(&slow, &names);
        let late = tokio::spawn({
            let a = a.clone();
            async move { a.delete(f("icao", "KXXX"), false).await }
        });
        within(&format!("{label}: D's entry insert reaches the gate"), gate.reached(1)).await;
        let later = within(&format!("{label}: F applies"), b.delete(f("iata", "YYY"), true)).await.unwrap();
        assert!(later.applied);
        assert_eq!(gate.state().passed, 0, "{label}: D is still held");
        gate.open();
        let d = within(&format!("{label}: D is acknowledged"), late).await.unwrap().unwrap();
        assert!(id(&d) < id(&later), "{label}: D's id {} is below F's {}", d.id, later.id);

        drain(&[&b, &a], &label).await;
        for (field, value) in [("icao", "KXXX"), ("iata", "YYY"), ("lid", "XXX")] {
            let found = b.query_all(&f(field, value)).await.unwrap();
            assert!(found.is_empty(), "{label}: the record is found by {field}: {found:?}");
        }
        verify_clean(&b, &label).await;
        let history = b.history("icao", "KXXX", 100, None).await.unwrap().history;
        let rows: Vec<(ChangeOp, &str, bool)> =
            history.iter().map(|e| (e.op, e.wal_id.as_str(), e.record.is_some())).collect();
        assert_eq!(
            rows,
            vec![(ChangeOp::Delete, later.id.as_str(), false), (ChangeOp::Upsert, upserted.id.as_str(), true)],
            "{label}: one removal row, F's (D = {} removed nothing, applied after F)",
            d.id
        );
    }
}

common::backend_tests! {
    /// Found by the simulator (seeds 7, 8, 115, 181; catalog right, history wrong). With an
    /// index `country` added online and history on: P = replace country=ZZ by R (country US,
    /// shard 0), F = delete country=US (shard 0), N = upsert R with country CA (shard 3), logged
    /// in that order. Shard 3 is applied first (N writes R with CA), then shard 0: P finds R's
    /// owner row written by N, a newer entry, and writes no row (superseded); F, between P and
    /// N, then found no row of R under country=US and recorded no removal, so R's history read
    /// "P wrote US, N wrote CA" with F's removal of the US version missing. In effective-id
    /// order R's history is P (US), F (removed), N (CA), and the catalog holds N's version.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_delete_between_a_superseded_replace_and_its_successor_records_its_removal(backend) {
        let label = format!("{backend:?}");
        let inner = common::store(backend);
        let names = Names::new(&common::unique_name("shadow"), None, None).unwrap();
        let mut opts = options();
        opts.history = HistoryOptions::on();
        let c = open(inner.clone(), &names, opts).await;
        add_index_until_active(&c, "country", &label).await;
        let base = in_shard(3, "KCCC", "CCC", "Charlie field");
        let rc = |country: &str| {
            let mut r = base.clone();
            r.insert("country".into(), json!(country));
            r
        };
        let p = c.replace(f("country", "ZZ"), rc("US"), false).await.unwrap();
        let del = c.delete(f("country", "US"), false).await.unwrap();
        let n = c.upsert(rc("CA"), false).await.unwrap();
        assert!(id(&p) < id(&del) && id(&del) < id(&n), "{label}: P < F < N");
        within(&format!("{label}: shard 3"), c.applier().apply_shard(ShardId::new(3).unwrap())).await.unwrap();
        drain(&[&c], &label).await;

        assert_eq!(c.query_all(&f("icao", "KCCC")).await.unwrap(), vec![rc("CA")], "{label}: R is N's version");
        assert!(c.query_all(&f("country", "US")).await.unwrap().is_empty(), "{label}: nothing under US");
        verify_clean(&c, &label).await;
        let history = c.history("icao", "KCCC", 100, None).await.unwrap().history;
        let rows: Vec<(ChangeOp, &str)> = history.iter().map(|e| (e.op, e.wal_id.as_str())).collect();
        assert_eq!(
            rows,
            vec![
                (ChangeOp::Upsert, n.id.as_str()),
                (ChangeOp::Delete, del.id.as_str()),
                (ChangeOp::Replace, p.id.as_str())
            ],
            "{label}: R's history, newest first: N, F's removal, P"
        );
    }
}

/// A store that answers the first page of a query of one partition (with one page size)
/// with no entity and a continuation token (Azure may: a page can be empty and still not be
/// the last, docs/AZURE.md). The token resumes, as Azure's `NextRowKey` does, at the RowKey
/// the real first page began with when the empty page was served. It may be served once
/// only.
struct EmptyFirstPage {
    inner: Arc<dyn Store>,
    /// The (table, partition, page size) answered so; `None`: none.
    target: Mutex<Option<(String, String, usize)>>,
    armed: AtomicBool,
    /// Disarm after serving one empty page.
    once: AtomicBool,
    /// Empty pages served.
    served: AtomicU64,
}

const TOKEN: &str = "empty-first-page-test-token:";

impl EmptyFirstPage {
    fn new(inner: Arc<dyn Store>) -> EmptyFirstPage {
        EmptyFirstPage {
            inner,
            target: Mutex::new(None),
            armed: AtomicBool::new(false),
            once: AtomicBool::new(false),
            served: AtomicU64::new(0),
        }
    }

    /// Answers `$top=1` queries of `partition` in `table` with an empty first page.
    fn arm(&self, table: &str, partition: &str) {
        self.arm_for(table, partition, 1, false);
    }

    fn arm_for(&self, table: &str, partition: &str, limit: usize, once: bool) {
        *self.target.lock().unwrap() = Some((table.to_string(), partition.to_string(), limit));
        self.once.store(once, Ordering::SeqCst);
        self.armed.store(true, Ordering::SeqCst);
    }

    fn disarm(&self) {
        self.armed.store(false, Ordering::SeqCst);
    }

    fn served(&self) -> u64 {
        self.served.load(Ordering::SeqCst)
    }

    fn shapes(&self, table: &str, pk: &str, limit: usize) -> bool {
        self.armed.load(Ordering::SeqCst)
            && self.target.lock().unwrap().as_ref().is_some_and(|(t, p, l)| t == table && p == pk && *l == limit)
    }

    /// The empty first page: its token names where the real first page begins now.
    async fn empty_page(&self, table: &str, pk: &str, range: &RowRange, limit: usize) -> StoreResult<Page> {
        if self.once.load(Ordering::SeqCst) {
            self.disarm();
        }
        let real = self.inner.query_partition(table, pk, range, limit, None).await?;
        let resume = real.entities.first().map_or(String::new(), |e| e.row_key.clone());
        self.served.fetch_add(1, Ordering::SeqCst);
        Ok(Page { entities: Vec::new(), continuation: Some(format!("{TOKEN}{resume}")) })
    }
}

#[async_trait]
impl TableStore for EmptyFirstPage {
    async fn create_table(&self, table: &str) -> StoreResult<()> {
        self.inner.create_table(table).await
    }
    async fn delete_table(&self, table: &str) -> StoreResult<()> {
        self.inner.delete_table(table).await
    }
    async fn get(&self, table: &str, pk: &str, rk: &str) -> StoreResult<Option<Entity>> {
        self.inner.get(table, pk, rk).await
    }
    async fn insert(&self, table: &str, entity: &Entity) -> StoreResult<ETag> {
        self.inner.insert(table, entity).await
    }
    async fn upsert(&self, table: &str, entity: &Entity) -> StoreResult<ETag> {
        self.inner.upsert(table, entity).await
    }
    async fn replace(&self, table: &str, entity: &Entity, if_match: &IfMatch) -> StoreResult<ETag> {
        self.inner.replace(table, entity, if_match).await
    }
    async fn delete(&self, table: &str, pk: &str, rk: &str, if_match: &IfMatch) -> StoreResult<()> {
        self.inner.delete(table, pk, rk, if_match).await
    }
    async fn query_partition(
        &self,
        table: &str,
        pk: &str,
        range: &RowRange,
        limit: usize,
        continuation: Option<&str>,
    ) -> StoreResult<Page> {
        match continuation {
            None if self.shapes(table, pk, limit) => self.empty_page(table, pk, range, limit).await,
            Some(token) if token.starts_with(TOKEN) => {
                let resume = &token[TOKEN.len()..];
                let range = if resume.is_empty() {
                    range.clone()
                } else {
                    RowRange { from: Some(resume.to_string()), after: None, ..range.clone() }
                };
                self.inner.query_partition(table, pk, &range, limit, None).await
            }
            other => self.inner.query_partition(table, pk, range, limit, other).await,
        }
    }
    async fn query_partitions(
        &self,
        table: &str,
        range: &PartitionRange,
        limit: usize,
        continuation: Option<&str>,
    ) -> StoreResult<Page> {
        self.inner.query_partitions(table, range, limit, continuation).await
    }
    async fn scan(&self, table: &str, limit: usize, continuation: Option<&str>) -> StoreResult<Page> {
        self.inner.scan(table, limit, continuation).await
    }
    async fn count_range(
        &self,
        table: &str,
        pk: &str,
        range: &RowRange,
        cap: u64,
    ) -> StoreResult<(u64, Option<String>)> {
        self.inner.count_range(table, pk, range, cap).await
    }
    async fn batch(&self, table: &str, pk: &str, ops: &[BatchOp]) -> StoreResult<Vec<Option<ETag>>> {
        self.inner.batch(table, pk, ops).await
    }
}

#[async_trait]
impl QueueStore for EmptyFirstPage {
    async fn create_queue(&self, queue: &str) -> StoreResult<()> {
        self.inner.create_queue(queue).await
    }
    async fn delete_queue(&self, queue: &str) -> StoreResult<()> {
        self.inner.delete_queue(queue).await
    }
    async fn put_message(&self, queue: &str, text: &str, visible_after: Duration) -> StoreResult<String> {
        self.inner.put_message(queue, text, visible_after).await
    }
    async fn receive_messages(
        &self,
        queue: &str,
        max: usize,
        visibility: Duration,
    ) -> StoreResult<Vec<ReceivedMessage>> {
        self.inner.receive_messages(queue, max, visibility).await
    }
    async fn delete_message(&self, queue: &str, id: &str, pop_receipt: &str) -> StoreResult<()> {
        self.inner.delete_message(queue, id, pop_receipt).await
    }
    async fn release_message(
        &self,
        queue: &str,
        id: &str,
        pop_receipt: &str,
        text: &str,
        visible_after: Duration,
    ) -> StoreResult<String> {
        self.inner.release_message(queue, id, pop_receipt, text, visible_after).await
    }
    async fn approximate_count(&self, queue: &str) -> StoreResult<u64> {
        self.inner.approximate_count(queue).await
    }
}

/// A record with IATA code ZZZ whose RowKey lands in shard 3 (its name varied until it does).
fn c_in_shard_3() -> Record {
    let schema = common::airports_schema();
    (0..10_000)
        .map(|i| {
            json!({"icao": "KCCC", "iata": "ZZZ", "lid": "CCC", "name": format!("Charlie field {i}")})
                .as_object()
                .cloned()
                .unwrap()
        })
        .find(|r| ShardId::for_row_key(&schema.record_keys(r).unwrap().row_key, SHARDS).index() == 3)
        .unwrap()
}

/// A catalog over [`EmptyFirstPage`] with C upserted (acknowledged, not applied) in shard 3,
/// and the wrapper armed on shard 3's pending partition.
async fn c_pending_behind_an_empty_page(backend: Backend) -> (Arc<EmptyFirstPage>, Arc<Catalog>, Written) {
    let shaped = Arc::new(EmptyFirstPage::new(common::store(backend)));
    let names = Names::new(&common::unique_name("empty"), None, None).unwrap();
    let c = open(shaped.clone(), &names, options()).await;
    let up = c.upsert(c_in_shard_3(), false).await.unwrap();
    let shard = up.shard.unwrap();
    assert_eq!(shard, ShardId::new(3).unwrap());
    assert!(c.wal().is_pending(shard, &id(&up)).await.unwrap(), "C is pending");
    shaped.arm(&names.wal_table, &shard.partition());
    (shaped, c, up)
}

common::backend_tests! {
    /// Issue 25, item 2 (the barrier). C is upserted and acknowledged (pending in shard 3); then
    /// a delete of iata=ZZZ is issued with `wait`. The barrier must see C pending below the
    /// delete's id (and apply shard 3 first), so C is deleted. When shard 3's `$top=1` query
    /// answers an empty page with a continuation token, `oldest_pending` reports nothing pending,
    /// the barrier passes, the delete applies before C, and C survives a delete issued after it
    /// was acknowledged.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_delete_sees_an_upsert_behind_an_empty_first_page(backend) {
        let label = format!("{backend:?}");
        let (shaped, c, up) = c_pending_behind_an_empty_page(backend).await;
        let del = within(&format!("{label}: the delete applies"), c.delete(f("iata", "ZZZ"), true)).await.unwrap();
        assert!(id(&up) < id(&del));
        assert!(shaped.served() >= 1, "{label}: shard 3 answered an empty first page");
        shaped.disarm();
        drain(&[&c], &label).await;
        let found = c.query_all(&f("iata", "ZZZ")).await.unwrap();
        assert!(
            found.is_empty(),
            "{label}: C (acknowledged as {} before the delete {} was issued) survived the delete; \
             shard 3 answered {} empty first page(s) with a continuation token: {found:?}",
            up.id,
            del.id,
            shaped.served()
        );
        verify_clean(&c, &label).await;
    }
}

common::backend_tests! {
    /// Issue 25, item 2 (read-your-writes). C is upserted and acknowledged (pending in shard 3);
    /// a consistent read by icao must return it. With shard 3's `$top=1` query answering an empty
    /// page with a continuation token, the catch-up finds nothing pending and the read misses C.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_consistent_read_sees_an_upsert_behind_an_empty_first_page(backend) {
        let label = format!("{backend:?}");
        let (shaped, c, up) = c_pending_behind_an_empty_page(backend).await;
        let page = within(&format!("{label}: the consistent read"), c.query_consistent(&f("icao", "KCCC"), 10, None))
            .await
            .unwrap();
        assert!(shaped.served() >= 1, "{label}: shard 3 answered an empty first page");
        assert_eq!(
            page.records.len(),
            1,
            "{label}: a consistent read missed C, acknowledged as {} before the read began; shard 3 \
             answered {} empty first page(s) with a continuation token",
            up.id,
            shaped.served()
        );
        shaped.disarm();
        drain(&[&c], &label).await;
    }
}

/// A door for the store layers below: calls held at it wait until the test opens it.
#[derive(Clone)]
struct Door(Arc<tokio::sync::watch::Sender<(u64, bool)>>);

impl Door {
    fn new() -> Door {
        Door(Arc::new(tokio::sync::watch::Sender::new((0, false))))
    }

    /// Waits here until the door is open (counted as arrived at once).
    async fn pass(&self) {
        let mut rx = self.0.subscribe();
        self.0.send_modify(|s| s.0 += 1);
        let _ = rx.wait_for(|s| s.1).await;
    }

    /// Resolves once `n` calls have arrived at the door.
    async fn reached(&self, n: u64) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|s| s.0 >= n).await;
    }

    fn arrived(&self) -> u64 {
        self.0.borrow().0
    }

    fn open(&self) {
        self.0.send_modify(|s| s.1 = true);
    }
}

/// A store layer that, once armed, holds the read of the page that follows a full page
/// ([`DRAIN_PAGE`] entries) of one WAL pending partition: an apply pass has read its first
/// page, and its read of the second waits at the door.
struct HoldNextPage {
    table: String,
    partition: String,
    armed: AtomicBool,
    next: AtomicBool,
    door: Door,
}

impl HoldNextPage {
    fn new(table: &str, partition: &str) -> HoldNextPage {
        HoldNextPage {
            table: table.to_lowercase(),
            partition: partition.to_string(),
            armed: AtomicBool::new(false),
            next: AtomicBool::new(false),
            door: Door::new(),
        }
    }
}

impl Layer for HoldNextPage {
    async fn run<'a, T, F, Fut>(&'a self, call: Call<'a>, mut attempt: F) -> StoreResult<T>
    where
        T: Returned + Send + 'a,
        F: FnMut() -> Fut + Send + 'a,
        Fut: std::future::Future<Output = StoreResult<T>> + Send + 'a,
    {
        let pending_query = call.op == OpKind::Query
            && call.target.to_lowercase() == self.table
            && call.partition_key == Some(self.partition.as_str());
        if pending_query && self.next.swap(false, Ordering::SeqCst) {
            self.door.pass().await;
        }
        let result = attempt().await;
        if pending_query
            && result.as_ref().is_ok_and(|r| r.returned() == DRAIN_PAGE)
            && self.armed.swap(false, Ordering::SeqCst)
        {
            self.next.store(true, Ordering::SeqCst);
        }
        result
    }
}

/// A record in `shard` (of [`SHARDS`]), its name varied until its RowKey lands there.
fn in_shard(shard: u16, icao: &str, iata: &str, name: &str) -> Record {
    let schema = common::airports_schema();
    (0..10_000)
        .map(|i| {
            json!({"icao": icao, "iata": iata, "lid": iata, "name": format!("{name} {i}")})
                .as_object()
                .cloned()
                .unwrap()
        })
        .find(|r| ShardId::for_row_key(&schema.record_keys(r).unwrap().row_key, SHARDS).index() == shard)
        .unwrap()
}

common::backend_tests! {
    /// Barrier step (2) for the filter entry's own shard ([`Passed::Restart`]). U, an upsert in
    /// shard 0, takes its id and is held; a backlog of `DRAIN_PAGE + 1` upserts is logged in
    /// shard 0 after it; the applier of shard 0 reads the backlog's first page (without U) and
    /// its read of the next page is held. U is then written and acknowledged, and only then is a
    /// delete F of U's record issued (shard 0, id above everything). The next page holds the
    /// rest of the backlog and F, not U (its id is below the first page's last one). U was
    /// acknowledged before F was issued, so F must delete U's record: F's barrier finds U
    /// pending below F and outside the page, and the pass restarts from U. An applier that
    /// ignores such an entry lets F resolve without U, and U, read after F's seal, is stamped
    /// above F: U's record survives a delete issued after U was acknowledged.
    /// (`scripts/mutants/no-restart.patch`.)
    ///
    /// [`Passed::Restart`]: table_catalog::testing::apply::barrier::Passed::Restart
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_delete_sees_an_upsert_of_its_own_shard_that_became_durable_behind_the_page_being_applied(backend) {
        let label = format!("{backend:?}");
        let inner = common::store(backend);
        let names = Names::new(&common::unique_name("restart"), None, None).unwrap();
        let layer = Arc::new(HoldNextPage::new(&names.wal_table, &ShardId::ZERO.partition()));
        let b = open(Arc::new(LayeredStore::with_layer(inner.clone(), layer.clone())), &names, options()).await;
        let slow = Arc::new(FaultStore::new(inner.clone(), 1));
        let a = open(slow.clone(), &names, options()).await;

        // U takes its id; its entry is held.
        let u = in_shard(0, "KUUU", "UUU", "Uniform field");
        let gate = hold_next_entry(&slow, &names);
        let late = tokio::spawn({
            let (a, u) = (a.clone(), u.clone());
            async move { a.upsert(u, false).await }
        });
        within(&format!("{label}: U's entry insert reaches the gate"), gate.reached(1)).await;

        // A backlog in shard 0, logged after U's id was taken.
        let backlog: Vec<Record> = (0..10_000)
            .map(|i| in_shard(0, &format!("E{i:03}"), &format!("X{i:03}"), &format!("Echo field {i}")))
            .take(DRAIN_PAGE + 1)
            .collect();
        let logged = b.upsert_many(backlog, false).await.unwrap();
        assert!(logged.iter().all(Result::is_ok), "{label}: the backlog is logged");

        // The applier of shard 0 reads the first page; its read of the next page is held.
        layer.armed.store(true, Ordering::SeqCst);
        let pass = tokio::spawn({
            let b = b.clone();
            async move { b.applier().apply_shard(ShardId::ZERO).await }
        });
        within(&format!("{label}: the read of the second page reaches the door"), layer.door.reached(1)).await;
        assert_eq!(gate.state().passed, 0, "{label}: U was not durable when the first page was read");

        // U is written and acknowledged; then F is issued.
        gate.open();
        let up = within(&format!("{label}: U is acknowledged"), late).await.unwrap().unwrap();
        assert_eq!(up.shard, Some(ShardId::ZERO), "{label}: U is logged in shard 0");
        let del = b.delete(f("iata", "UUU"), false).await.unwrap();
        assert!(id(&up) < id(&del), "{label}: U's id {} is below F's {}", up.id, del.id);
        let first = WalId::parse(logged[0].as_ref().unwrap()).unwrap();
        assert!(id(&up) < first, "{label}: U's id {} is below the backlog's {first}", up.id);

        layer.door.open();
        within(&format!("{label}: the pass over shard 0"), pass).await.unwrap().unwrap();
        assert_eq!(layer.door.arrived(), 1, "{label}: the second page was held once");
        drain(&[&b, &a], &label).await;
        let found = b.query_all(&f("icao", "KUUU")).await.unwrap();
        assert!(
            found.is_empty(),
            "{label}: U (acknowledged as {} before the delete {} was issued) survived the delete: {found:?}",
            up.id,
            del.id
        );
        verify_clean(&b, &label).await;
    }
}

/// A store layer that, once armed, holds every write of a seal row at the door (a barrier
/// that passed its first check waits there before any seal is raised; reads of the seals, as
/// the stamping after each page makes, go on), and counts the completed queries of one WAL
/// pending partition.
struct HoldSeals {
    table: String,
    partition: String,
    armed: AtomicBool,
    door: Door,
    queries: AtomicU64,
}

impl HoldSeals {
    fn new(table: &str, partition: &str) -> HoldSeals {
        HoldSeals {
            table: table.to_lowercase(),
            partition: partition.to_string(),
            armed: AtomicBool::new(false),
            door: Door::new(),
            queries: AtomicU64::new(0),
        }
    }

    fn queries(&self) -> u64 {
        self.queries.load(Ordering::SeqCst)
    }
}

impl Layer for HoldSeals {
    async fn run<'a, T, F, Fut>(&'a self, call: Call<'a>, mut attempt: F) -> StoreResult<T>
    where
        T: Returned + Send + 'a,
        F: FnMut() -> Fut + Send + 'a,
        Fut: std::future::Future<Output = StoreResult<T>> + Send + 'a,
    {
        let wal = call.target.to_lowercase() == self.table;
        let seal_write =
            matches!(call.op, OpKind::Insert | OpKind::Replace | OpKind::Upsert) && call.row_key == Some("seal");
        if wal && seal_write && self.armed.load(Ordering::SeqCst) {
            self.door.pass().await;
        }
        let result = attempt().await;
        if wal && call.op == OpKind::Query && call.partition_key == Some(self.partition.as_str()) {
            self.queries.fetch_add(1, Ordering::SeqCst);
        }
        result
    }
}

common::backend_tests! {
    /// Barrier step (4), the check after the seals. An index `country` added online; R0
    /// (country US, in shard 3) applied. U = upsert of R with country CA takes its id and is
    /// held; F = delete country=US is logged, and its applier passes the first check (U is
    /// pending nowhere) and is held before it raises the seals. U is then written and
    /// acknowledged, and U's applier reads U and shard 3's seal (not raised yet: U is not
    /// stamped) and is held before it reads R's owner row. Then the seals are raised. U is
    /// concurrent with F and every order keeps R with CA (as in the first test). The check after
    /// the seals finds U pending below F and waits until U is applied, so F no longer matches R.
    /// A barrier that seals without checking again lets F resolve now: it tombstones R0's rows
    /// with F's id, and U, applied afterwards with its own (smaller, unstamped) id, finds F's
    /// tombstone on the owner row and writes nothing: R is gone.
    /// (`scripts/mutants/seal-without-recheck.patch`.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_upsert_read_before_the_seals_were_raised_is_applied_before_the_delete_resolves(backend) {
        let label = format!("{backend:?}");
        let inner = common::store(backend);
        let names = Names::new(&common::unique_name("reseal"), None, None).unwrap();
        let shard = ShardId::new(3).unwrap();
        let layer = Arc::new(HoldSeals::new(&names.wal_table, &shard.partition()));
        let b = open(Arc::new(LayeredStore::with_layer(inner.clone(), layer.clone())), &names, options()).await;
        add_index_until_active(&b, "country", &label).await;
        let base = in_shard(3, "KRRR", "RRR", "Romeo field");
        let r3 = |country: &str| {
            let mut r = base.clone();
            r.insert("country".into(), json!(country));
            r
        };
        b.upsert(r3("US"), true).await.unwrap();
        assert_eq!(b.query_all(&f("country", "US")).await.unwrap(), vec![r3("US")], "{label}: R0 applied");
        let slow = Arc::new(FaultStore::new(inner.clone(), 1));
        let a = open(slow.clone(), &names, options()).await;

        // U takes its id; its entry is held.
        let gate = hold_next_entry(&slow, &names);
        let late = tokio::spawn({
            let (a, u) = (a.clone(), r3("CA"));
            async move { a.upsert(u, false).await }
        });
        within(&format!("{label}: U's entry insert reaches the gate"), gate.reached(1)).await;

        // F is logged; its applier passes the first check and waits before the seals.
        let del = b.delete(f("country", "US"), false).await.unwrap();
        layer.armed.store(true, Ordering::SeqCst);
        let pass_f = tokio::spawn({
            let b = b.clone();
            async move { b.applier().apply_shard(ShardId::ZERO).await }
        });
        within(&format!("{label}: F's barrier reaches the seals"), layer.door.reached(1)).await;

        // U is written and acknowledged; its applier reads it and the seal, and is held at
        // its first read of the catalog table (R's owner row).
        gate.open();
        let up = within(&format!("{label}: U is acknowledged"), late).await.unwrap().unwrap();
        assert_eq!(up.shard, Some(shard), "{label}: U is logged in shard 3");
        assert!(id(&up) < id(&del), "{label}: U's id {} is below F's {}", up.id, del.id);
        let owner_read = Gate::new();
        slow.add(Rule::new(&[OpKind::Get], Trigger::Nth(1), Fault::Hold(owner_read.clone())).on(&names.table));
        let pass_u = tokio::spawn({
            let a = a.clone();
            async move { a.applier().apply_shard(shard).await }
        });
        within(&format!("{label}: U's applier reaches R's owner row"), owner_read.reached(1)).await;

        // The seals are raised. Then either F's barrier checks shard 3 again (and finds U
        // pending), or F resolves at once: wait for whichever happens, then let U go on.
        let before = layer.queries();
        layer.door.open();
        within(&format!("{label}: F's barrier checks again or F resolves"), async {
            while !pass_f.is_finished() && layer.queries() == before {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        owner_read.open();
        within(&format!("{label}: U's pass"), pass_u).await.unwrap().unwrap();
        within(&format!("{label}: F's pass"), pass_f).await.unwrap().unwrap();
        assert_eq!(owner_read.state().passed, 1, "{label}: U's owner-row read was held");

        drain(&[&b, &a], &label).await;
        let by_icao = b.query_all(&f("icao", "KRRR")).await.unwrap();
        let by_us = b.query_all(&f("country", "US")).await.unwrap();
        assert_eq!(
            (by_icao.clone(), by_us.clone()),
            (vec![r3("CA")], vec![]),
            "{label}: R (upserted to CA concurrently with the delete of US, acknowledged as {} below the \
             delete's {}) must survive, live with CA; got icao=KRRR -> {by_icao:?}, country=US -> {by_us:?}",
            up.id,
            del.id
        );
        verify_clean(&b, &label).await;
    }
}

common::backend_tests! {
    /// Found by the simulator (seed 2173: two history rows of one WAL entry). U, an upsert in
    /// shard 3, takes its id and is held; F = a delete (shard 0) passes its barrier's first check
    /// and is held before it raises the seals; U is written and acknowledged, and U's applier
    /// applies it under its own id (U is not stamped: the seal is not raised yet), writes its
    /// history row, and fails to remove it from the pending partition. Then the seals are raised,
    /// F's second check finds U still pending, and U is applied again, now stamped after F's
    /// seal. U takes effect once, at the stamp: its history holds one row, the stamped one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_upsert_applied_once_then_stamped_keeps_one_history_row(backend) {
        let label = format!("{backend:?}");
        let inner = common::store(backend);
        let names = Names::new(&common::unique_name("twice"), None, None).unwrap();
        let shard = ShardId::new(3).unwrap();
        let layer = Arc::new(HoldSeals::new(&names.wal_table, &shard.partition()));
        let mut opts = options();
        opts.history = HistoryOptions::on();
        let b = open(Arc::new(LayeredStore::with_layer(inner.clone(), layer.clone())), &names, opts.clone()).await;
        let slow = Arc::new(FaultStore::new(inner.clone(), 1));
        let a = open(slow.clone(), &names, opts).await;
        let r = in_shard(3, "KRRR", "RRR", "Romeo field");

        let gate = hold_next_entry(&slow, &names);
        let late = tokio::spawn({
            let (a, r) = (a.clone(), r.clone());
            async move { a.upsert(r, false).await }
        });
        within(&format!("{label}: U's entry insert reaches the gate"), gate.reached(1)).await;
        let del = b.delete(f("icao", "KNONE"), false).await.unwrap();
        layer.armed.store(true, Ordering::SeqCst);
        let pass_f = tokio::spawn({
            let b = b.clone();
            async move { b.applier().apply_shard(ShardId::ZERO).await }
        });
        within(&format!("{label}: F's barrier reaches the seals"), layer.door.reached(1)).await;

        gate.open();
        let up = within(&format!("{label}: U is acknowledged"), late).await.unwrap().unwrap();
        assert_eq!(up.shard, Some(shard), "{label}: U is logged in shard 3");
        assert!(id(&up) < id(&del), "{label}: U's id {} is below F's {}", up.id, del.id);
        // U's group is written; removing it from the pending partition (a batch) fails.
        slow.add(Rule::new(&[OpKind::Batch], Trigger::Nth(1), Fault::Fail(pass_ends())).on(&names.wal_table));
        let first = within(&format!("{label}: U's first pass"), a.applier().apply_shard(shard)).await;
        assert!(first.is_err(), "{label}: U's first pass fails at the removal: {first:?}");
        let rows = b.history("icao", "KRRR", 100, None).await.unwrap().history;
        assert_eq!(rows.len(), 1, "{label}: U's first application wrote its row: {rows:?}");

        layer.door.open();
        within(&format!("{label}: F's pass"), pass_f).await.unwrap().unwrap();
        drain(&[&b, &a], &label).await;

        let rows = b.history("icao", "KRRR", 100, None).await.unwrap().history;
        let ids: Vec<&str> = rows.iter().map(|e| e.wal_id.as_str()).collect();
        assert_eq!(ids.len(), 1, "{label}: one history row for U, got {ids:?}");
        assert!(
            WalId::parse_effective(ids[0]).is_some_and(|w| w.is_stamped()) && ids[0].ends_with(&up.id),
            "{label}: U's row is the stamped one: {ids:?}"
        );
        assert_eq!(b.query_all(&f("icao", "KRRR")).await.unwrap(), vec![r], "{label}: R is live");
        verify_clean(&b, &label).await;
    }
}

common::backend_tests! {
    /// Found by the simulator (seed 9366, one shard). A write whose clock publication failed is
    /// indeterminate, but its entry may be stored with an id nobody published. Once an applier
    /// makes its effect visible, an operation issued after someone saw it must be ordered after
    /// it. U = upsert of R through instance A, whose clock runs 10 s ahead and whose publication
    /// fails: U's entry is stored, U answers an error. B applies U and reads R. Then D = delete of
    /// R through B: its id came from the clock, below U's unpublished one, so D was ordered
    /// before U and R survived a delete issued after a read had seen it. The applier now
    /// publishes an entry's id before applying it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_delete_issued_after_a_read_saw_a_failed_upsert_removes_it(backend) {
        let label = format!("{backend:?}");
        let inner = common::store(backend);
        let names = Names::new(&common::unique_name("unpub"), None, None).unwrap();
        let b = open(inner.clone(), &names, options()).await;
        let slow = Arc::new(FaultStore::new(inner.clone(), 1));
        let mut ahead = options();
        ahead.wal.clock_skew_us = 10_000_000;
        let a = open(slow.clone(), &names, ahead).await;
        let rec: Record =
            json!({"icao": "KUUU", "iata": "UUU", "lid": "UUU", "name": "Uniform Field"}).as_object().cloned().unwrap();

        // U's entry is stored; its clock publication (a replace of the high row) fails.
        slow.add(
            Rule::new(&[OpKind::Replace], Trigger::Nth(1), Fault::Fail(StoreError::Unavailable("test".into())))
                .on(&names.wal_table)
                .partition(table_catalog::testing::wal::clock::CLOCK),
        );
        let failed = a.upsert(rec.clone(), false).await;
        assert!(failed.is_err(), "{label}: U's publication failed, so U answers an error: {failed:?}");
        assert_eq!(b.status().await.unwrap().pending, 1, "{label}: U's entry is stored");

        drain(&[&b], &label).await;
        assert_eq!(b.query_all(&f("icao", "KUUU")).await.unwrap(), vec![rec.clone()], "{label}: B reads U's record");

        let del = b.delete(f("icao", "KUUU"), true).await.unwrap();
        assert!(del.applied, "{label}: D applied");
        let left = b.query_all(&f("icao", "KUUU")).await.unwrap();
        assert!(
            left.is_empty(),
            "{label}: D, issued after a read saw R, must remove it (D = {}); found {left:?}",
            del.id
        );
        verify_clean(&b, &label).await;
    }
}

/// Holds every write to one partition of one table at a door.
struct HoldPartition {
    table: String,
    partition: String,
    door: Door,
}

impl Layer for HoldPartition {
    async fn run<'a, T, F, Fut>(&'a self, call: Call<'a>, mut attempt: F) -> StoreResult<T>
    where
        T: Returned + Send + 'a,
        F: FnMut() -> Fut + Send + 'a,
        Fut: std::future::Future<Output = StoreResult<T>> + Send + 'a,
    {
        let write = matches!(call.op, OpKind::Insert | OpKind::Replace | OpKind::Upsert);
        if write && call.target.to_lowercase() == self.table && call.partition_key == Some(self.partition.as_str()) {
            self.door.pass().await;
        }
        attempt().await
    }
}

/// A catalog keeping history, with the added index `country` active (`tune` adjusts the
/// options first). Returns the label, the store, the names, the options and the catalog.
async fn history_catalog(
    backend: Backend,
    prefix: &str,
    tune: impl FnOnce(&mut CatalogOptions),
) -> (String, Arc<dyn Store>, Names, CatalogOptions, Arc<Catalog>) {
    let label = format!("{backend:?}");
    let inner = common::store(backend);
    let names = Names::new(&common::unique_name(prefix), None, None).unwrap();
    let mut opts = options();
    opts.history = HistoryOptions::on();
    tune(&mut opts);
    let c = open(inner.clone(), &names, opts.clone()).await;
    add_index_until_active(&c, "country", &label).await;
    (label, inner, names, opts, c)
}

/// A second instance over `inner` whose writes to the partition of `field`=`value` wait at
/// the returned layer's door.
async fn held_instance(
    inner: &Arc<dyn Store>,
    names: &Names,
    opts: CatalogOptions,
    field: &str,
    value: &str,
) -> (Arc<HoldPartition>, Arc<Catalog>) {
    let partition = table_catalog::testing::keys::partition_key(field, value).unwrap();
    let layer = Arc::new(HoldPartition { table: names.table.to_lowercase(), partition, door: Door::new() });
    let held = open(Arc::new(LayeredStore::with_layer(inner.clone(), layer.clone())), names, opts).await;
    (layer, held)
}

/// An apply pass of shard 3, held at a door.
type HeldPass = tokio::task::JoinHandle<table_catalog::Result<table_catalog::testing::apply::DrainOutcome>>;

/// Starts an apply pass of shard 3 through `held` and returns once it waits at the door.
async fn held_pass_of_shard_3(held: &Arc<Catalog>, layer: &HoldPartition, what: &str) -> HeldPass {
    let pass = tokio::spawn({
        let held = held.clone();
        async move { held.applier().apply_shard(ShardId::new(3).unwrap()).await }
    });
    within(what, layer.door.reached(1)).await;
    pass
}

/// Opens the door and waits for the held pass to end.
async fn finish_held_pass(layer: &HoldPartition, pass: HeldPass, label: &str) {
    layer.door.open();
    within(&format!("{label}: the held pass"), pass).await.unwrap().unwrap();
}

/// Record R: KCCC (iata and lid CCC, shard 3) with this country.
fn kccc(country: &str) -> Record {
    let mut r = in_shard(3, "KCCC", "CCC", "Charlie field");
    r.insert("country".into(), json!(country));
    r
}

/// KCCC's history, newest first: (operation, WAL id).
async fn history_of_kccc(c: &Catalog) -> Vec<(ChangeOp, String)> {
    let history = c.history("icao", "KCCC", 100, None).await.unwrap().history;
    history.into_iter().map(|e| (e.op, e.wal_id)).collect()
}

/// P = replace writing R (shard 0; its filter `field`=ZZZ matches nothing), F = delete
/// `field`=`value`, N = upsert of R (shard 3), ids P < F < N, in a catalog with the added
/// index `country` (R has `country` = `country` when given). N's apply is held after its
/// owner row, before its row of `field`=`value`; shard 0 is applied meanwhile (P finds N's
/// owner row and is superseded; F resolves), then N. R must be N's version, and its history,
/// newest first: N, F's removal, P.
async fn delete_between_a_superseded_replace_and_its_successor(
    backend: common::Backend,
    prefix: &str,
    field: &str,
    value: &str,
    country: Option<&str>,
) {
    let (label, inner, names, opts, c) = history_catalog(backend, prefix, |_| {}).await;
    let (layer, held) = held_instance(&inner, &names, opts, field, value).await;
    let base = in_shard(3, "KCCC", "CCC", "Charlie field");
    let rc = |elevation: i64| {
        let mut r = base.clone();
        if let Some(country) = country {
            r.insert("country".into(), json!(country));
        }
        r.insert("elevation".into(), json!(elevation));
        r
    };
    let p = c.replace(f(field, "ZZZ"), rc(1), false).await.unwrap();
    let del = c.delete(f(field, value), false).await.unwrap();
    let n = c.upsert(rc(2), false).await.unwrap();
    assert!(id(&p) < id(&del) && id(&del) < id(&n), "{label}: P < F < N");
    // N: owner row written, its row of `field`=`value` held.
    let pass_n = held_pass_of_shard_3(&held, &layer, &format!("{label}: N reaches its row of {field}={value}")).await;
    // P is superseded, F resolves.
    within(&format!("{label}: shard 0"), c.applier().apply_shard(ShardId::ZERO)).await.unwrap();
    assert_eq!(c.status().await.unwrap().pending, 1, "{label}: only N is pending");
    finish_held_pass(&layer, pass_n, &label).await;
    drain(&[&c], &label).await;

    assert_eq!(c.query_all(&f(field, value)).await.unwrap(), vec![rc(2)], "{label}: R is N's version");
    verify_clean(&c, &label).await;
    assert_eq!(
        history_of_kccc(&c).await,
        vec![(ChangeOp::Upsert, n.id), (ChangeOp::Delete, del.id), (ChangeOp::Replace, p.id)],
        "{label}: R's history, newest first: N, F's removal, P"
    );
}

common::backend_tests! {
    /// Found by the simulator (seed 2717): as the test above, but N keeps P's value of the added
    /// index (country US) and its apply is held after its owner row, before its row of US. P
    /// (shard 0) finds N's owner row and is superseded; F = delete country=US (between P and N)
    /// then found no row of R under US at all, and recorded no removal. P's version must leave a
    /// tombstone there that F finds, and that N's row, written afterwards, replaces.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_delete_between_a_superseded_replace_and_its_successor_still_being_written_records_its_removal(backend) {
        delete_between_a_superseded_replace_and_its_successor(backend, "shadow2", "country", "US", Some("US")).await;
    }
}

common::backend_tests! {
    /// Found by the simulator with random short pages (seed 2882): the case of the test above on
    /// an identity field (the catalog has an added index, which R has no value for, so the
    /// applier takes the owner-row-first path that finds P superseded). F = delete iata=CCC found
    /// no row of R under iata CCC and recorded no removal, though in id order it removed P's
    /// version. A superseded version now leaves its tombstone (just below N's id) in every
    /// partition but the owner's, identity fields included.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_delete_by_an_identity_field_between_a_superseded_replace_and_its_successor_records_its_removal(backend) {
        delete_between_a_superseded_replace_and_its_successor(backend, "shadow3", "iata", "CCC", None).await;
    }
}

/// Fails the first write to one partition of one table after it committed (armed on demand).
struct FailAfterCommit {
    table: String,
    partition: String,
    armed: AtomicBool,
}

impl Layer for FailAfterCommit {
    async fn run<'a, T, F, Fut>(&'a self, call: Call<'a>, mut attempt: F) -> StoreResult<T>
    where
        T: Returned + Send + 'a,
        F: FnMut() -> Fut + Send + 'a,
        Fut: std::future::Future<Output = StoreResult<T>> + Send + 'a,
    {
        let write = matches!(call.op, OpKind::Insert | OpKind::Replace | OpKind::Upsert);
        let ours =
            write && call.target.to_lowercase() == self.table && call.partition_key == Some(self.partition.as_str());
        let result = attempt().await;
        if ours && result.is_ok() && self.armed.swap(false, Ordering::SeqCst) {
            return Err(pass_ends());
        }
        result
    }
}

common::backend_tests! {
    /// Found by the simulator (seeds 849, 915, 1296, 1333): instance A, whose copy of the schema
    /// still shows `country` dropping after the drop's job finished, applies an upsert and writes
    /// its row of `country` (an entry maintains a dropping index); the write commits and answers
    /// an error, so the attempt fails. The retry, by B, which knows the index is gone, writes
    /// nothing there, and A's row stayed behind in an index that no longer exists. A failed
    /// attempt now checks the rows it may have written at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_row_of_a_dropped_index_written_by_a_failed_attempt_is_removed(backend) {
        let label = format!("{backend:?}");
        let inner = common::store(backend);
        let names = Names::new(&common::unique_name("dropfail"), None, None).unwrap();
        let b = open(inner.clone(), &names, options()).await;
        add_index_until_active(&b, "country", &label).await;
        let ca = table_catalog::testing::keys::partition_key("country", "CA").unwrap();
        let layer = Arc::new(FailAfterCommit {
            table: names.table.to_lowercase(),
            partition: ca,
            armed: AtomicBool::new(false),
        });
        let a = open(Arc::new(LayeredStore::with_layer(inner.clone(), layer.clone())), &names, options()).await;

        indexes::drop(&b, "country").await.unwrap();
        a.applier().reload_schema().await.unwrap();
        drop_index_until_gone(&b, "country", &label).await;
        let seen = a.schema().added().iter().find(|i| i.field == "country").map(|i| i.state);
        assert_eq!(seen, Some(IndexState::Dropping), "{label}: A's copy still shows the index dropping");

        let up = a.upsert(r("CA"), false).await.unwrap();
        layer.armed.store(true, Ordering::SeqCst);
        let failed = a.applier().apply_shard(up.shard.unwrap()).await;
        assert!(failed.is_err(), "{label}: A's attempt fails after its row of CA committed: {failed:?}");
        assert!(!layer.armed.load(Ordering::SeqCst), "{label}: the row of CA was written");
        drain(&[&b], &label).await;

        no_rows_of(inner.as_ref(), &names.table, "country", &label).await;
        assert_eq!(b.query_all(&f("icao", "KAAA")).await.unwrap(), vec![r("CA")], "{label}: R is live");
        verify_clean(&b, &label).await;
    }
}

common::backend_tests! {
    /// Found by `indexes_added_and_dropped_while_8_writers_write_leave_a_consistent_catalog` on
    /// CI (rows of the dropped index left live): A starts applying an upsert while its copy of
    /// the schema shows `country` dropping, so the entry still writes R's row of CA; the drop's
    /// job finishes and A re-reads the schema (a concurrent group's check does this) between
    /// the entry's owner row and its row of CA. A noted rows only for indexes it saw dropping,
    /// so the row of CA, written after the index was gone, was never noted nor removed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_row_of_a_dropped_index_written_after_the_applier_saw_the_index_gone_is_removed(backend) {
        let label = format!("{backend:?}");
        let inner = common::store(backend);
        let names = Names::new(&common::unique_name("dropgone"), None, None).unwrap();
        let b = open(inner.clone(), &names, options()).await;
        add_index_until_active(&b, "country", &label).await;
        let owner = table_catalog::testing::keys::partition_key("icao", "KAAA").unwrap();
        let layer = Arc::new(HoldPartition { table: names.table.to_lowercase(), partition: owner, door: Door::new() });
        let a = open(Arc::new(LayeredStore::with_layer(inner.clone(), layer.clone())), &names, options()).await;

        indexes::drop(&b, "country").await.unwrap();
        a.applier().reload_schema().await.unwrap();
        drop_index_until_gone(&b, "country", &label).await;
        let seen = a.schema().added().iter().find(|i| i.field == "country").map(|i| i.state);
        assert_eq!(seen, Some(IndexState::Dropping), "{label}: A's copy still shows the index dropping");

        let up = a.upsert(r("CA"), false).await.unwrap();
        let applying = {
            let a = a.clone();
            tokio::spawn(async move { a.applier().apply_shard(up.shard.unwrap()).await })
        };
        within(&format!("{label}: A's owner row"), layer.door.reached(1)).await;
        a.applier().reload_schema().await.unwrap();
        assert!(a.schema().added().iter().all(|i| i.field != "country"), "{label}: A now sees the index gone");
        layer.door.open();
        within(&format!("{label}: A's apply"), applying).await.unwrap().unwrap();
        drain(&[&b], &label).await;

        no_rows_of(inner.as_ref(), &names.table, "country", &label).await;
        assert_eq!(b.query_all(&f("icao", "KAAA")).await.unwrap(), vec![r("CA")], "{label}: R is live");
        verify_clean(&b, &label).await;
    }
}

common::backend_tests! {
    /// Found by the simulator with random short pages (seed 2835): D = delete country=US matches
    /// R through its row of US, and its first attempt fails after tombstoning one of R's rows
    /// (the lid row). Before the retry, R's row of US no longer shows R: in the simulation, an
    /// older replace of R, applied again by a paused applier, found D's tombstone on R's owner row
    /// and shadowed its own version there with a tombstone just below D's id; here that row is
    /// written by hand. The retry read the US partition, found an older tombstone, matched
    /// nothing, and left R live in its other rows, although D was acknowledged. A filter's retry
    /// now completes whatever its index tombstones name, through any index.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_delete_retried_after_its_partition_stopped_showing_the_record_completes_its_removal(backend) {
        let label = format!("{backend:?}");
        let inner = common::store(backend);
        let names = Names::new(&common::unique_name("retryrm"), None, None).unwrap();
        let b = open(inner.clone(), &names, options()).await;
        add_index_until_active(&b, "country", &label).await;
        b.upsert(r("US"), true).await.unwrap();
        let faulty = Arc::new(FaultStore::new(inner.clone(), 1));
        let mut one_at_a_time = options();
        one_at_a_time.wal.apply_concurrency = 1;
        let a = open(faulty.clone(), &names, one_at_a_time).await;

        let del = a.delete(f("country", "US"), false).await.unwrap();
        // Each tombstone replaces a live row: the first replace commits and answers 503.
        faulty.add(Rule::new(&[OpKind::Replace], Trigger::Nth(1), Fault::CommitThenFail(pass_ends())).on(&names.table));
        let failed = a.applier().apply_shard(ShardId::ZERO).await;
        assert!(failed.is_err(), "{label}: D's first attempt fails after its first tombstone: {failed:?}");
        let schema = b.schema();
        let keys = schema.record_keys(&r("US")).unwrap();
        let tombstoned: Vec<&str> = {
            let mut t = Vec::new();
            for (_, pk) in &keys.partitions {
                let row = inner.get(&names.table, pk, &keys.row_key).await.unwrap().unwrap();
                if table_catalog::record::RowMeta::of(&row).deleted {
                    t.push(pk.as_str());
                }
            }
            t
        };
        assert_eq!(tombstoned.len(), 1, "{label}: one row of R tombstoned by the first attempt: {tombstoned:?}");
        // R's row of US stops showing R: a tombstone of an earlier entry, just below D's id.
        let (us, _) = keys.partitions.iter().find(|(field, _)| field == "country").map(|(_, pk)| (pk, ())).unwrap();
        let below = format!("{}_00000000-0000-0000-0000-000000000000", &del.id[..26]); // D's time, smallest uuid
        assert!(below < del.id);
        let props = table_catalog::record::tombstone_properties(&r("US"), &below, 0);
        inner
            .upsert(&names.table, &Entity { properties: props, ..Entity::new(us, keys.row_key.as_str()) })
            .await
            .unwrap();

        drain(&[&a, &b], &label).await;
        assert!(
            b.query_all(&f("icao", "KAAA")).await.unwrap().is_empty(),
            "{label}: R survived D, acknowledged as {}",
            del.id
        );
        verify_clean(&b, &label).await;
    }
}

common::backend_tests! {
    /// Found by the simulator with random short pages (seed 432): A writes R's row of a dropped
    /// index (its copy of the schema shows the index dropping, its entry was validated while the
    /// index was active), notes it, and its check after the writes fails removing it (a 503 on
    /// the delete). The notes it had taken were dropped with the error, and the entry's retry
    /// by B, which sees the index gone, writes nothing there: the row stayed behind the job.
    /// A failed check now notes its rows again, and A's next check removes them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_row_of_a_dropped_index_whose_removal_failed_is_removed_by_the_next_check(backend) {
        let label = format!("{backend:?}");
        let inner = common::store(backend);
        let names = Names::new(&common::unique_name("dropfail"), None, None).unwrap();
        let b = open(inner.clone(), &names, options()).await;
        add_index_until_active(&b, "country", &label).await;
        let faulty = Arc::new(FaultStore::new(inner.clone(), 1));
        let a = open(faulty.clone(), &names, options()).await;

        indexes::drop(&b, "country").await.unwrap();
        a.applier().reload_schema().await.unwrap();
        drop_index_until_gone(&b, "country", &label).await;
        let seen = a.schema().added().iter().find(|i| i.field == "country").map(|i| i.state);
        assert_eq!(seen, Some(IndexState::Dropping), "{label}: A's copy still shows the index dropping");

        let up = a.upsert(r("CA"), false).await.unwrap();
        faulty.add(Rule::new(&[OpKind::Delete], Trigger::Nth(1), Fault::Fail(pass_ends())).on(&names.table));
        let failed = a.applier().apply_shard(up.shard.unwrap()).await;
        assert!(failed.is_err(), "{label}: A's check after the writes fails: {failed:?}");
        drain(&[&b], &label).await; // B applies the entry again: nothing of `country`

        let other = json!({"icao": "KBBB", "iata": "BBB", "lid": "BBB", "name": "Bravo Field"});
        let next = a.upsert(other.as_object().cloned().unwrap(), false).await.unwrap();
        a.applier().apply_shard(next.shard.unwrap()).await.unwrap();
        drain(&[&b], &label).await;

        no_rows_of(inner.as_ref(), &names.table, "country", &label).await;
        assert_eq!(b.query_all(&f("icao", "KAAA")).await.unwrap(), vec![r("CA")], "{label}: R is live");
        verify_clean(&b, &label).await;
    }
}

common::backend_tests! {
    /// Found by the simulator (seed 1410): a filter through an index being dropped, applied in
    /// two attempts with the drop's job run between them. D = delete country=US, validated by A
    /// while `country` was active and logged late (its entry insert held) across the drop, so it
    /// is stamped above the drop and applied after it. D's first attempt tombstones every row of
    /// R (owner row included) and fails writing R's history row. The drop's job then removes
    /// every row of `country`, D's tombstones there too, and the index is gone. The retry found
    /// nothing under country=US, so R's removal was never recorded: the catalog had removed R,
    /// its history kept it live. The retry now completes what its index tombstones name.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_delete_through_a_dropped_index_retried_after_the_drop_records_its_removal(backend) {
        let label = format!("{backend:?}");
        let inner = common::store(backend);
        let names = Names::new(&common::unique_name("dropretry"), None, None).unwrap();
        let mut opts = options();
        opts.history = HistoryOptions::on();
        let b = open(inner.clone(), &names, opts.clone()).await;
        add_index_until_active(&b, "country", &label).await;
        let up = b.upsert(r("US"), true).await.unwrap();
        let slow = Arc::new(FaultStore::new(inner.clone(), 1));
        let a = open(slow.clone(), &names, opts.clone()).await;

        // D's id is taken while `country` is active; its entry lands after the drop applied.
        let gate = hold_next_entry(&slow, &names);
        let late = tokio::spawn({
            let a = a.clone();
            async move { a.delete(f("country", "US"), false).await }
        });
        within(&format!("{label}: D's entry insert reaches the gate"), gate.reached(1)).await;
        indexes::drop(&b, "country").await.unwrap();
        within(&format!("{label}: the drop applies"), b.applier().apply_shard(ShardId::ZERO)).await.unwrap();
        assert_eq!(state_of(&b, "country").await, Some(IndexState::Dropping), "{label}: job not run yet");
        gate.open();
        let refused = within(&format!("{label}: D returns"), late).await.unwrap();
        assert!(refused.is_err(), "{label}: D is not acknowledged (indexes changed): {refused:?}");

        // D's first attempt, through an instance whose history write fails (not written).
        let identity = common::airports_schema().record_keys(&r("US")).unwrap().row_key;
        let failing = Arc::new(FaultStore::new(inner.clone(), 1));
        failing.add(Rule::new(&[OpKind::Insert], Trigger::Nth(1), Fault::Fail(pass_ends())).on(&names.history_table));
        let x = open(failing, &names, opts).await;
        let first = within(&format!("{label}: D's first attempt"), x.applier().apply_shard(ShardId::ZERO)).await;
        assert!(first.is_err(), "{label}: D's first attempt fails at R's history row: {first:?}");
        assert!(b.query_all(&f("icao", "KAAA")).await.unwrap().is_empty(), "{label}: D tombstoned R");

        // The drop's job runs to the end before D is applied again.
        let (worker_stop, worker_rx) = tokio::sync::watch::channel(false);
        let scan_opts = ServeOptions { scan_workers: 2, ..ServeOptions::default() };
        let scan = tokio::spawn(table_catalog::server::run_scan_worker(b.clone(), scan_opts, worker_rx));
        common::wait_for(&format!("{label}: country to be gone"), || async {
            state_of(&b, "country").await.is_none().then_some(())
        })
        .await;
        worker_stop.send_replace(true);
        scan.await.unwrap();
        drain(&[&b], &label).await;

        assert!(b.query_all(&f("icao", "KAAA")).await.unwrap().is_empty(), "{label}: R is deleted");
        let history = b.history("icao", "KAAA", 100, None).await.unwrap().history;
        let ops: Vec<ChangeOp> = history.iter().map(|e| e.op).collect();
        assert_eq!(ops, vec![ChangeOp::Delete, ChangeOp::Upsert], "{label}: R's history, newest first ({identity})");
        assert_eq!(history[1].wal_id, up.id, "{label}: the upsert");
        no_rows_of(inner.as_ref(), &names.table, "country", &label).await;
        verify_clean(&b, &label).await;
    }
}

/// Makes version 1 of the schema (index `country` added, backfilling) and raises the clock's
/// schema version, as the first two steps of `index add` do, without logging the schema
/// entry (as when the change's process is slow to take its next step).
async fn schema_v1_without_its_entry(c: &Catalog) {
    use table_catalog::testing::schema::AddedIndex;
    use table_catalog::testing::wal::{clock::Clock, schema_row};
    let (store, wal_table) = (c.store().as_ref(), &c.names().wal_table);
    schema_row::update(store, wal_table, |_, added, version| {
        *version += 1;
        added.push(AddedIndex {
            field: "country".into(),
            state: IndexState::Backfilling,
            version: *version,
            job: None,
            projection: Default::default(),
        });
        Ok(true)
    })
    .await
    .unwrap();
    Clock::raise_schema_version(store, wal_table, 1).await.unwrap();
}

/// Runs the scan worker of `c` until index `field`, added already, turns active.
async fn backfill_until_active(c: &Arc<Catalog>, field: &str, label: &str) {
    let (worker_stop, worker_rx) = tokio::sync::watch::channel(false);
    let opts = ServeOptions { scan_workers: 2, ..ServeOptions::default() };
    let scan = tokio::spawn(table_catalog::server::run_scan_worker(c.clone(), opts, worker_rx));
    common::wait_for(&format!("{label}: {field} to turn active"), || async {
        c.recover().await.unwrap();
        (state_of(c, field).await == Some(IndexState::Active)).then_some(())
    })
    .await;
    worker_stop.send_replace(true);
    scan.await.unwrap();
}

common::backend_tests! {
    /// Simulator seed 277. An upsert U of record R (country CA, shard 3) and then a delete D of
    /// R by `lid` (shard 0) are logged before `country` is added. Instance A adopts the new
    /// schema (version 1, `country` backfilling) before the schema entry is logged, and applies
    /// U with it: a live row of R in `country`'s partition, under U's id. Instance B, still on
    /// version 0, applies D, which tombstones R's rows in the partitions it knows. In every
    /// order R is deleted (D follows U), so once the backfill is done no lookup finds R; but D
    /// left the `country` row live, the backfill skips R (its owner row is D's tombstone), and
    /// `country=CA` found R until a later replace by country recorded the removal of a record
    /// absent for 22 s.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_delete_applied_before_an_index_add_reaches_a_row_written_early_under_the_new_schema(backend) {
        let label = format!("{backend:?}");
        let store = common::store(backend);
        let names = Names::new(&common::unique_name("earlyrow"), None, None).unwrap();
        let a = open(store.clone(), &names, options()).await;
        let b = open(store.clone(), &names, options()).await;
        let mut rec = in_shard(3, "KEEE", "EEE", "Echo Field");
        rec.insert("country".into(), json!("CA"));
        let up = a.upsert(rec.clone(), false).await.unwrap();
        let shard = up.shard.unwrap();
        let del = b.delete(f("lid", "EEE"), false).await.unwrap();
        assert!(id(&up) < id(&del), "{label}: D after U");

        schema_v1_without_its_entry(&a).await;
        a.applier().reload_schema().await.unwrap();
        assert!(within(&format!("{label}: A applies U"), a.wait_applied(shard, &id(&up))).await.unwrap());
        assert_eq!(b.schema().version(), 0, "{label}: B has not seen version 1");
        let d_shard = del.shard.unwrap();
        assert!(within(&format!("{label}: B applies D"), b.wait_applied(d_shard, &id(&del))).await.unwrap());

        // The change's last steps (the schema entry, its job), run again, complete it.
        indexes::add(&b, "country").await.unwrap();
        backfill_until_active(&b, "country", &label).await;
        drain(&[&a, &b], &label).await;
        assert_eq!(b.query_all(&f("lid", "EEE")).await.unwrap(), Vec::<Record>::new(), "{label}: D deleted R");
        assert_eq!(
            b.query_all(&f("country", "CA")).await.unwrap(),
            Vec::<Record>::new(),
            "{label}: R, deleted by D, must not be found by its country"
        );
        verify_clean(&b, &label).await;
    }
}

common::backend_tests! {
    /// Simulator seed 809. R = {KCCC, iata CCC, country US} is applied; F1 = delete country=US,
    /// then F2 = delete iata=CCC (both shard 0, pending), then L = upsert of R with country MX
    /// (shard 3), ids F1 < F2 < L. L's apply moves R out of US (a tombstone there, under L's id)
    /// and writes its owner row, and is held before its row of iata CCC; shard 0 is applied
    /// meanwhile. F1 meets L's tombstone, and through the history finds that the version before
    /// it (US) matched: it removed R. F2 then found R's row of iata CCC still holding that
    /// version, live under its old id, and recorded a second removal of a record F1 had removed.
    /// F1 now tombstones that version's rows too, where L has not written yet.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_delete_after_a_filter_removed_a_version_that_a_later_upsert_is_still_moving_records_no_second_removal(backend) {
        let (label, inner, names, opts, c) = history_catalog(backend, "moving", |_| {}).await;
        let (layer, held) = held_instance(&inner, &names, opts, "iata", "CCC").await;
        let v0 = c.upsert(kccc("US"), true).await.unwrap();
        let f1 = c.delete(f("country", "US"), false).await.unwrap();
        let f2 = c.delete(f("iata", "CCC"), false).await.unwrap();
        let l = c.upsert(kccc("MX"), false).await.unwrap();
        assert!(id(&f1) < id(&f2) && id(&f2) < id(&l), "{label}: F1 < F2 < L");
        let pass_l = held_pass_of_shard_3(&held, &layer, &format!("{label}: L reaches its row of iata CCC")).await;
        within(&format!("{label}: shard 0"), c.applier().apply_shard(ShardId::ZERO)).await.unwrap();
        finish_held_pass(&layer, pass_l, &label).await;
        drain(&[&c], &label).await;

        assert_eq!(c.query_all(&f("iata", "CCC")).await.unwrap(), vec![kccc("MX")], "{label}: R is L's version");
        verify_clean(&c, &label).await;
        assert_eq!(
            history_of_kccc(&c).await,
            vec![(ChangeOp::Upsert, l.id), (ChangeOp::Delete, f1.id), (ChangeOp::Upsert, v0.id)],
            "{label}: R's history, newest first: L, F1's removal, the first version (F2 found R removed)"
        );
    }
}

common::backend_tests! {
    /// The sweeper's horizon, its pending half (docs/ARCHITECTURE.md, "Order", step 9; found with
    /// the mutant `sweep-ignores-pending` under the simulator, seed 2). R = {KCCC, country US} is
    /// applied; F = delete country=US is logged (shard 0) and stays pending; then L = upsert of
    /// R with country MX (shard 3, id above F's) is applied, which moves R out of US: a tombstone
    /// there under L's id. A sweep runs past the grace period while F is still pending. F was
    /// acknowledged before L was issued, so F removed R's US version; it learns so from L's
    /// tombstone (a row a later entry hid, then the history). A sweep that removed that tombstone
    /// because it is older than the grace period, though F, below it, is pending, leaves F with
    /// nothing to find: no removal, and R's history says the US version lived on until L.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sweep_keeps_a_later_entrys_tombstone_that_a_pending_delete_below_it_still_needs(backend) {
        let (label, _, _, _, c) = history_catalog(backend, "horizon", |o| o.wal.tombstone_grace = Duration::ZERO).await;
        let v0 = c.upsert(kccc("US"), true).await.unwrap();
        let del = c.delete(f("country", "US"), false).await.unwrap();
        let l = c.upsert(kccc("MX"), false).await.unwrap();
        assert!(id(&del) < id(&l), "{label}: F < L");
        within(&format!("{label}: L applies"), c.applier().apply_shard(ShardId::new(3).unwrap())).await.unwrap();
        assert!(c.wal().is_pending(ShardId::ZERO, &id(&del)).await.unwrap(), "{label}: F is pending");
        // Past the grace period (zero here); the sweep applies nothing (F is not overdue).
        let swept = within(&format!("{label}: sweep"), c.applier().sweep(Duration::from_secs(3600))).await.unwrap();
        assert_eq!(swept.applied, 0, "{label}: {swept:?}");
        drain(&[&c], &label).await;

        assert_eq!(c.query_all(&f("icao", "KCCC")).await.unwrap(), vec![kccc("MX")], "{label}: R is L's version");
        verify_clean(&c, &label).await;
        assert_eq!(
            history_of_kccc(&c).await,
            vec![(ChangeOp::Upsert, l.id), (ChangeOp::Delete, del.id), (ChangeOp::Upsert, v0.id)],
            "{label}: R's history, newest first: L, F's removal of the US version, the US version"
        );
    }
}

common::backend_tests! {
    /// Simulator seed 5215 (the mirror of seed 277). Replace P writes record R with country CA
    /// (shard 0), then upsert U of R with country US (shard 3) is logged, both before `country`
    /// is added. Instance B adopts the new schema (version 1) before the change's entry is
    /// logged and applies P with it: R's rows, one of them in `country`'s partition CA. Instance
    /// A, still on version 0, applies U, which does not know `country` and so left R's CA row
    /// live; the backfill then wrote U's US row, and `country=CA` kept finding R. U now meets
    /// rows written under version 1, re-reads the schema and applies again with it, moving R out
    /// of CA.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_upsert_applied_under_the_old_schema_after_a_row_written_under_the_new_one_moves_it(backend) {
        let label = format!("{backend:?}");
        let store = common::store(backend);
        let names = Names::new(&common::unique_name("oldschema"), None, None).unwrap();
        let a = open(store.clone(), &names, options()).await;
        let b = open(store.clone(), &names, options()).await;
        let version = |country: &str| {
            let mut r = in_shard(3, "KFFF", "FFF", "Foxtrot Field");
            r.insert("country".into(), json!(country));
            r
        };
        let p = b.replace(f("icao", "KZZZ"), version("CA"), false).await.unwrap();
        let up = a.upsert(version("US"), false).await.unwrap();
        assert!(id(&p) < id(&up), "{label}: P < U");

        schema_v1_without_its_entry(&b).await;
        b.applier().reload_schema().await.unwrap();
        assert!(within(&format!("{label}: B applies P"), b.wait_applied(ShardId::ZERO, &id(&p))).await.unwrap());
        assert_eq!(a.schema().version(), 0, "{label}: A has not seen version 1");
        assert!(within(&format!("{label}: A applies U"), a.wait_applied(up.shard.unwrap(), &id(&up))).await.unwrap());

        indexes::add(&b, "country").await.unwrap();
        backfill_until_active(&b, "country", &label).await;
        drain(&[&a, &b], &label).await;
        assert_eq!(b.query_all(&f("icao", "KFFF")).await.unwrap(), vec![version("US")], "{label}: R is U's version");
        assert_eq!(
            b.query_all(&f("country", "CA")).await.unwrap(),
            Vec::<Record>::new(),
            "{label}: R, moved to US by U, must not be found by CA"
        );
        verify_clean(&b, &label).await;
    }
}

common::backend_tests! {
    /// Open (docs/RELIABILITY.md, "Seeds 172, 884, 1136"): the multi-field analogue of
    /// `a_delete_between_a_superseded_replace_and_its_successor_records_its_removal`. With
    /// `country` and `tz` added online and history on: P = upsert R (US, tz X), applied; F =
    /// delete country=US&tz=X (shard 0); N = upsert R (US, tz Y; shard 3), logged in that
    /// order. Shard 3 is applied first: R's row under country=US now shows N, which does not
    /// match tz=X, so F skips R and records no removal, though in effective-id order R's
    /// history is P, F (removed), N. The catalog ends right (N's version). Ignored until
    /// fixed: it fails today.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]

    async fn a_delete_by_two_fields_before_a_version_changing_the_field_it_does_not_read_records_its_removal(backend) {
        let label = format!("{backend:?}");
        let inner = common::store(backend);
        let names = Names::new(&common::unique_name("twofield"), None, None).unwrap();
        let mut opts = options();
        opts.history = HistoryOptions::on();
        let c = open(inner.clone(), &names, opts).await;
        add_index_until_active(&c, "country", &label).await;
        add_index_until_active(&c, "tz", &label).await;
        let base = in_shard(3, "KCCC", "CCC", "Charlie field");
        let rc = |tz: &str| {
            let mut r = base.clone();
            r.insert("country".into(), json!("US"));
            r.insert("tz".into(), json!(tz));
            r
        };
        let p = c.upsert(rc("X"), true).await.unwrap();
        let del = c.delete(Filter::new(vec![("country".into(), "US".into()), ("tz".into(), "X".into())]), false).await.unwrap();
        let n = c.upsert(rc("Y"), false).await.unwrap();
        assert!(id(&p) < id(&del) && id(&del) < id(&n), "{label}: P < F < N");
        within(&format!("{label}: shard 3"), c.applier().apply_shard(ShardId::new(3).unwrap())).await.unwrap();
        drain(&[&c], &label).await;

        assert_eq!(c.query_all(&f("icao", "KCCC")).await.unwrap(), vec![rc("Y")], "{label}: R is N's version");
        let history = c.history("icao", "KCCC", 100, None).await.unwrap().history;
        let rows: Vec<(ChangeOp, &str)> = history.iter().map(|e| (e.op, e.wal_id.as_str())).collect();
        assert_eq!(
            rows,
            vec![(ChangeOp::Upsert, n.id.as_str()), (ChangeOp::Delete, del.id.as_str()), (ChangeOp::Upsert, p.id.as_str())],
            "{label}: R's history, newest first: N, F's removal, P"
        );
    }
}

common::backend_tests! {
    /// Found by the simulator (seed 712). D = delete country=US, read in pages of one row, and
    /// U = upsert of R (shard 3), U < D. An instance H applying U is held at R's owner row
    /// (its read done: U is newer than what it saw). Another instance applies U and D's first
    /// attempt, which tombstones R's owner row and stops (a failure) before R's row of US.
    /// H then goes on: it finds D's tombstone on the owner row, so U is superseded, and U's
    /// shadow (just below D's id) replaces U's live row of US. D's next attempt no longer sees
    /// R on its first page, stops at its deadline after it, and records its progress past R;
    /// the attempt after that completes earlier removals only above that point. The removal of
    /// R was in no attempt's history: R's history ended with U while R was gone. An attempt
    /// that stops at its deadline now first completes the earlier attempts' removals up to
    /// where it stops.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_filter_stopping_at_its_deadline_records_an_earlier_attempts_removal_that_a_superseded_version_shadowed(backend) {
        let (label, inner, names, opts, c) = history_catalog(backend, "shadowresume", |o| {
            o.wal.lease_duration = Duration::from_millis(300);
            o.wal.apply_concurrency = 1;
        })
        .await;
        let base = in_shard(3, "KCCC", "CCC", "Charlie field");
        let rc = |v: i64| {
            let mut r = base.clone();
            r.insert("country".into(), json!("US"));
            r.insert("v".into(), json!(v));
            r
        };
        // S: matched by D too, on the page after R's.
        let s = json!({"icao": "KZZZ", "iata": "ZZZ", "lid": "ZZZ", "name": "Zulu field", "country": "US"});
        let s = s.as_object().cloned().unwrap();
        let v1 = c.upsert(rc(1), true).await.unwrap();
        c.upsert(s, true).await.unwrap();
        let u = c.upsert(rc(2), false).await.unwrap();
        let del = c.delete(f("country", "US"), false).await.unwrap();
        assert!(id(&u) < id(&del), "{label}: U < D");

        // H applies U, held at R's owner row.
        let (layer, held) = held_instance(&inner, &names, opts.clone(), "icao", "KCCC").await;
        let pass_h = held_pass_of_shard_3(&held, &layer, &format!("{label}: H reaches R's owner row")).await;
        // Once H's lease has expired, C applies U.
        within(&format!("{label}: C applies U"), async {
            while c.status().await.unwrap().pending > 1 {
                c.applier().apply_shard(ShardId::new(3).unwrap()).await.unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        // D's first attempt: R's owner row tombstoned, then the write of R's row of US fails.
        let us = table_catalog::testing::keys::partition_key("country", "US").unwrap();
        let faulty = Arc::new(FaultStore::new(inner.clone(), 1));
        faulty.add(
            Rule::new(&[OpKind::Insert, OpKind::Replace, OpKind::Upsert], Trigger::Nth(1), Fault::Fail(pass_ends()))
                .on(&names.table)
                .partition(&us),
        );
        let mut paged = opts.clone();
        paged.wal.filter_page = 1;
        let z = open(faulty.clone(), &names, paged.clone()).await;
        assert!(z.applier().apply_shard(ShardId::ZERO).await.is_err(), "{label}: D's first attempt fails");
        assert_eq!(faulty.counts().1, 1, "{label}: the fault was injected");
        // H goes on: U is superseded by D and shadows itself in US.
        layer.door.open();
        let _ = within(&format!("{label}: the held pass"), pass_h).await.unwrap();
        // D's second attempt stops at its deadline after R's page.
        let mut stopping = paged.clone();
        stopping.wal.apply_budget = Duration::ZERO;
        let w = open(inner.clone(), &names, stopping).await;
        within(&format!("{label}: D's second attempt"), async {
            loop {
                let outcome = w.applier().apply_shard(ShardId::ZERO).await.unwrap();
                if !matches!(outcome, table_catalog::testing::apply::DrainOutcome::Busy) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        drain(&[&c], &label).await;

        assert_eq!(c.query_all(&f("country", "US")).await.unwrap(), vec![], "{label}: D removed R and S");
        verify_clean(&c, &label).await;
        assert_eq!(
            history_of_kccc(&c).await,
            vec![(ChangeOp::Delete, del.id), (ChangeOp::Upsert, u.id), (ChangeOp::Upsert, v1.id)],
            "{label}: R's history, newest first: D's removal, U, R's first version"
        );
    }
}
