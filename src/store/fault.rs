//! A fault-injecting wrapper of the storage traits, for the reliability tests (compiled only
//! with the `testing` feature: no cost in release builds).
//!
//! Rules match calls by operation (and optionally table or queue) and fire on the N-th
//! matching call or with a probability drawn from a seeded generator, so every run is
//! reproducible from its seed. A fault can fail the call before it reaches the store (any
//! [`StoreError`], e.g. 409/412/500/503), let it commit and then fail the response (the
//! caller sees an error for a write that happened), add latency, or freeze the caller long
//! enough for its lease to expire while it still works (for a fixed time, or until the test
//! opens a [`Gate`]).
//!
//! **Late WAL entries** ([`Fault::Late`], with a rule restricted by [`Rule::pending_entries`]):
//! a write of pending WAL entries is held for a random time before it reaches the store. The
//! entry's id was taken from the clock before the write, and the clock publication runs
//! concurrently, so entries with larger ids can be logged and applied meanwhile: the entry is
//! *logged late*. The hold is drawn from the store's seeded generator when the rule fires.
//!
//! The wrapper also records every committed WAL-entry write (table and entity), so a checker
//! can know exactly which operations were logged even when the caller saw an error.
//!
//! Which writes are WAL entries is the WAL's business: the caller says how to recognise one
//! ([`FaultStore::with_entries`], e.g. with `crate::wal::is_pending_entry`); without it no
//! write is one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rand::{Rng, SeedableRng};

use super::error::{StoreError, StoreResult};
pub use super::op::OpKind;
use super::page::{Page, PartitionRange, RowRange};
use super::queue::{QueueStore, ReceivedMessage, Store};
use super::table::{BatchOp, IfMatch, TableStore};
use super::value::{ETag, Entity};

/// What happens to a matched call.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Fail without calling the store.
    Fail(StoreError),
    /// Call the store, then fail the response anyway (the write may have happened).
    CommitThenFail(StoreError),
    /// Wait, then call the store.
    Delay(Duration),
    /// Wait until the gate is opened, then call the store: a freeze that lasts exactly as long
    /// as the test needs, whatever the machine's speed.
    Hold(Gate),
    /// Wait a random time between 0 and this (uniform, drawn from the store's seeded
    /// generator when the rule fires), then call the store: with
    /// [`Rule::pending_entries`], a WAL entry that becomes durable late (see the module docs).
    /// [`FaultStore::late`] counts the holds begun and ended.
    Late(Duration),
}

/// A gate for [`Fault::Hold`]: closed until [`Gate::open`]; tells when a call reached it.
#[derive(Debug, Clone)]
pub struct Gate(Arc<tokio::sync::watch::Sender<GateState>>);

/// Calls that reached a [`Gate`], and whether it is open.
#[derive(Debug, Clone, Copy, Default)]
pub struct GateState {
    /// Calls that reached the gate so far.
    pub arrived: u64,
    /// Calls that went through it so far.
    pub passed: u64,
    /// Open: held calls go on, later ones pass at once.
    pub open: bool,
}

impl Default for Gate {
    fn default() -> Self {
        Gate(Arc::new(tokio::sync::watch::Sender::new(GateState::default())))
    }
}

impl Gate {
    /// A closed gate.
    pub fn new() -> Gate {
        Gate::default()
    }

    /// Opens the gate: held calls go on.
    pub fn open(&self) {
        self.0.send_modify(|s| s.open = true);
    }

    /// The current state.
    pub fn state(&self) -> GateState {
        *self.0.borrow()
    }

    /// Resolves once `n` calls have reached the gate (held there while it is closed).
    pub async fn reached(&self, n: u64) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|s| s.arrived >= n).await;
    }

    async fn pass(&self) {
        let mut rx = self.0.subscribe();
        self.0.send_modify(|s| s.arrived += 1);
        let _ = rx.wait_for(|s| s.open).await;
        self.0.send_modify(|s| s.passed += 1);
    }
}

/// When a rule fires.
#[derive(Debug, Clone)]
pub enum Trigger {
    /// On the N-th matching call (1-based), once.
    Nth(u64),
    /// On each matching call with this probability.
    Probability(f64),
    /// On every matching call.
    Always,
}

/// One injection rule.
#[derive(Debug, Clone)]
pub struct Rule {
    /// Operations it applies to (empty: all).
    pub ops: Vec<OpKind>,
    /// Table or queue it applies to (`None`: all).
    pub target: Option<String>,
    /// When it fires.
    pub trigger: Trigger,
    /// What it does.
    pub fault: Fault,
    /// Only calls that write pending WAL entries (see [`Rule::pending_entries`]).
    pub pending_entries: bool,
    /// Only calls on this partition (`None`: all; see [`Rule::partition`]).
    pub partition: Option<String>,
    matched: u64,
}

impl Rule {
    /// A rule for these operations.
    pub fn new(ops: &[OpKind], trigger: Trigger, fault: Fault) -> Rule {
        Rule { ops: ops.to_vec(), target: None, trigger, fault, pending_entries: false, partition: None, matched: 0 }
    }

    /// Restricts the rule to one table or queue (builder style).
    pub fn on(mut self, target: &str) -> Rule {
        self.target = Some(target.to_lowercase());
        self
    }

    /// Restricts the rule to calls on one partition: entity operations (get, insert, upsert,
    /// replace, delete) and entity group transactions whose PartitionKey is `partition`
    /// (builder style). Other calls do not count as matched.
    pub fn partition(mut self, partition: &str) -> Rule {
        self.partition = Some(partition.to_string());
        self
    }

    /// Restricts the rule to calls that write at least one pending WAL entry (an insert of
    /// one, or a batch inserting one, in a shard partition: `wal`, `wal-01`, ...), leaving
    /// the clock, leases, checkpoints and markers alone (builder style; the store must
    /// recognise entries: [`FaultStore::with_entries`]). Other calls do not
    /// count as matched.
    pub fn pending_entries(mut self) -> Rule {
        self.pending_entries = true;
        self
    }
}

/// Holds of [`Fault::Late`]: begun, and ended (the held call then went on).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LateState {
    /// Holds begun so far.
    pub begun: u64,
    /// Holds ended so far.
    pub ended: u64,
}

/// Shorthand: a transient 503.
pub fn unavailable() -> StoreError {
    StoreError::Unavailable("injected 503 ServerBusy".into())
}

struct State {
    rules: Vec<Rule>,
    rng: rand::rngs::StdRng,
}

/// The wrapper.
pub struct FaultStore {
    inner: Arc<dyn Store>,
    state: Mutex<State>,
    calls: AtomicU64,
    injected: AtomicU64,
    /// Committed WAL-entry writes: (table, entity), for checkers.
    wal_log: Mutex<Vec<(String, Entity)>>,
    /// Recognises a pending WAL entry ([`FaultStore::with_entries`]).
    is_entry: fn(&Entity) -> bool,
    /// Holds of [`Fault::Late`].
    late: tokio::sync::watch::Sender<LateState>,
}

impl FaultStore {
    /// Wraps `inner`; `seed` makes probabilistic rules reproducible.
    pub fn new(inner: Arc<dyn Store>, seed: u64) -> FaultStore {
        FaultStore {
            inner,
            state: Mutex::new(State { rules: Vec::new(), rng: rand::rngs::StdRng::seed_from_u64(seed) }),
            calls: AtomicU64::new(0),
            injected: AtomicU64::new(0),
            wal_log: Mutex::new(Vec::new()),
            is_entry: |_| false,
            late: tokio::sync::watch::Sender::new(LateState::default()),
        }
    }

    /// Recognises pending WAL entries by `is_entry` (builder style): writes of them are what
    /// [`Rule::pending_entries`] matches and [`FaultStore::committed_entries`] records. The
    /// WAL's test is `crate::wal::is_pending_entry`.
    pub fn with_entries(mut self, is_entry: fn(&Entity) -> bool) -> FaultStore {
        self.is_entry = is_entry;
        self
    }

    /// Adds a rule. A [`Trigger::Nth`] rule is removed once it fired.
    pub fn add(&self, rule: Rule) {
        if let Ok(mut s) = self.state.lock() {
            s.rules.push(rule);
        }
    }

    /// Removes every rule.
    pub fn clear(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.rules.clear();
        }
    }

    /// Calls seen and faults injected so far.
    pub fn counts(&self) -> (u64, u64) {
        (self.calls.load(Ordering::Relaxed), self.injected.load(Ordering::Relaxed))
    }

    /// Every committed write of a pending WAL entry, in any shard, in commit order: (table,
    /// entity).
    pub fn committed_entries(&self) -> Vec<(String, Entity)> {
        self.wal_log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Watches the holds of [`Fault::Late`] (e.g. to issue an operation while an entry is
    /// surely being held, without sleeping).
    pub fn late(&self) -> tokio::sync::watch::Receiver<LateState> {
        self.late.subscribe()
    }

    /// The fault for a call of `op` on `target`; `entries`: whether it writes pending WAL
    /// entries. A [`Fault::Late`] comes back with the hold drawn for this call.
    fn pick(&self, op: OpKind, target: &str, partition: Option<&str>, entries: bool) -> Option<Fault> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let mut s = self.state.lock().ok()?;
        let State { rules, rng } = &mut *s;
        let mut picked = None;
        for rule in rules.iter_mut() {
            if !rule.ops.is_empty() && !rule.ops.contains(&op) {
                continue;
            }
            if rule.target.as_deref().is_some_and(|t| t != target.to_lowercase()) {
                continue;
            }
            if rule.pending_entries && !entries {
                continue;
            }
            if rule.partition.as_deref().is_some_and(|p| Some(p) != partition) {
                continue;
            }
            rule.matched += 1;
            let fire = match rule.trigger {
                Trigger::Nth(n) => rule.matched == n,
                Trigger::Probability(p) => rng.gen_bool(p.clamp(0.0, 1.0)),
                Trigger::Always => true,
            };
            if fire {
                self.injected.fetch_add(1, Ordering::Relaxed);
                let fault = match &rule.fault {
                    Fault::Late(max) => {
                        let micros = u64::try_from(max.as_micros()).unwrap_or(u64::MAX);
                        Fault::Late(Duration::from_micros(rng.gen_range(0..=micros)))
                    }
                    other => other.clone(),
                };
                picked = Some(fault);
                break;
            }
        }
        if picked.is_some() {
            // Spent: a test that arms one-shot rules again and again keeps the list short.
            rules.retain(|r| !matches!(r.trigger, Trigger::Nth(n) if r.matched >= n));
        }
        picked
    }

    async fn run<T>(
        &self,
        op: OpKind,
        target: &str,
        call: impl std::future::Future<Output = StoreResult<T>>,
    ) -> StoreResult<T> {
        self.run_on(op, target, None, false, call).await
    }

    /// [`FaultStore::run`] of a call on one `partition`, which writes pending WAL entries
    /// when `entries`.
    async fn run_on<T>(
        &self,
        op: OpKind,
        target: &str,
        partition: Option<&str>,
        entries: bool,
        call: impl std::future::Future<Output = StoreResult<T>>,
    ) -> StoreResult<T> {
        match self.pick(op, target, partition, entries) {
            None => call.await,
            Some(Fault::Fail(e)) => Err(e),
            Some(Fault::CommitThenFail(e)) => {
                let _ = call.await;
                Err(e)
            }
            Some(Fault::Delay(d)) => {
                crate::env::sleep(d).await;
                call.await
            }
            Some(Fault::Hold(gate)) => {
                gate.pass().await;
                call.await
            }
            Some(Fault::Late(hold)) => {
                self.late.send_modify(|s| s.begun += 1);
                crate::env::sleep(hold).await;
                self.late.send_modify(|s| s.ended += 1);
                call.await
            }
        }
    }

    fn record(&self, table: &str, entities: impl IntoIterator<Item = Entity>) {
        if let Ok(mut log) = self.wal_log.lock() {
            for e in entities {
                if (self.is_entry)(&e) {
                    log.push((table.to_string(), e));
                }
            }
        }
    }
}

#[async_trait]
impl TableStore for FaultStore {
    async fn create_table(&self, table: &str) -> StoreResult<()> {
        self.run(OpKind::CreateTable, table, self.inner.create_table(table)).await
    }
    async fn delete_table(&self, table: &str) -> StoreResult<()> {
        self.run(OpKind::DeleteTable, table, self.inner.delete_table(table)).await
    }
    async fn get(&self, table: &str, pk: &str, rk: &str) -> StoreResult<Option<Entity>> {
        self.run_on(OpKind::Get, table, Some(pk), false, self.inner.get(table, pk, rk)).await
    }
    async fn insert(&self, table: &str, entity: &Entity) -> StoreResult<ETag> {
        self.run_on(OpKind::Insert, table, Some(&entity.partition_key), (self.is_entry)(entity), async {
            let r = self.inner.insert(table, entity).await;
            if r.is_ok() {
                self.record(table, [entity.clone()]);
            }
            r
        })
        .await
    }
    async fn upsert(&self, table: &str, entity: &Entity) -> StoreResult<ETag> {
        self.run_on(OpKind::Upsert, table, Some(&entity.partition_key), false, self.inner.upsert(table, entity)).await
    }
    async fn replace(&self, table: &str, entity: &Entity, if_match: &IfMatch) -> StoreResult<ETag> {
        let pk = Some(entity.partition_key.as_str());
        self.run_on(OpKind::Replace, table, pk, false, self.inner.replace(table, entity, if_match)).await
    }
    async fn delete(&self, table: &str, pk: &str, rk: &str, if_match: &IfMatch) -> StoreResult<()> {
        self.run_on(OpKind::Delete, table, Some(pk), false, self.inner.delete(table, pk, rk, if_match)).await
    }
    async fn query_partition(
        &self,
        table: &str,
        pk: &str,
        range: &RowRange,
        limit: usize,
        continuation: Option<&str>,
    ) -> StoreResult<Page> {
        self.run(OpKind::Query, table, self.inner.query_partition(table, pk, range, limit, continuation)).await
    }
    async fn query_partitions(
        &self,
        table: &str,
        range: &PartitionRange,
        limit: usize,
        continuation: Option<&str>,
    ) -> StoreResult<Page> {
        self.run(OpKind::QueryPartitions, table, self.inner.query_partitions(table, range, limit, continuation)).await
    }
    async fn scan(&self, table: &str, limit: usize, continuation: Option<&str>) -> StoreResult<Page> {
        self.run(OpKind::Scan, table, self.inner.scan(table, limit, continuation)).await
    }
    async fn count_range(
        &self,
        table: &str,
        pk: &str,
        range: &RowRange,
        cap: u64,
    ) -> StoreResult<(u64, Option<String>)> {
        self.run(OpKind::Query, table, self.inner.count_range(table, pk, range, cap)).await
    }
    async fn batch(&self, table: &str, pk: &str, ops: &[BatchOp]) -> StoreResult<Vec<Option<ETag>>> {
        let entries = ops.iter().any(|op| matches!(op, BatchOp::Insert(e) if (self.is_entry)(e)));
        self.run_on(OpKind::Batch, table, Some(pk), entries, async {
            let r = self.inner.batch(table, pk, ops).await;
            if r.is_ok() {
                self.record(
                    table,
                    ops.iter().filter_map(|op| if let BatchOp::Insert(e) = op { Some(e.clone()) } else { None }),
                );
            }
            r
        })
        .await
    }
}

#[async_trait]
impl QueueStore for FaultStore {
    async fn create_queue(&self, queue: &str) -> StoreResult<()> {
        self.run(OpKind::CreateQueue, queue, self.inner.create_queue(queue)).await
    }
    async fn delete_queue(&self, queue: &str) -> StoreResult<()> {
        self.run(OpKind::DeleteQueue, queue, self.inner.delete_queue(queue)).await
    }
    async fn put_message(&self, queue: &str, text: &str, visible_after: Duration) -> StoreResult<String> {
        self.run(OpKind::PutMessage, queue, self.inner.put_message(queue, text, visible_after)).await
    }
    async fn receive_messages(
        &self,
        queue: &str,
        max: usize,
        visibility: Duration,
    ) -> StoreResult<Vec<ReceivedMessage>> {
        self.run(OpKind::Receive, queue, self.inner.receive_messages(queue, max, visibility)).await
    }
    async fn delete_message(&self, queue: &str, id: &str, pop_receipt: &str) -> StoreResult<()> {
        self.run(OpKind::DeleteMessage, queue, self.inner.delete_message(queue, id, pop_receipt)).await
    }
    async fn release_message(
        &self,
        queue: &str,
        id: &str,
        pop_receipt: &str,
        text: &str,
        visible_after: Duration,
    ) -> StoreResult<String> {
        self.run(OpKind::ReleaseMessage, queue, self.inner.release_message(queue, id, pop_receipt, text, visible_after))
            .await
    }
    async fn approximate_count(&self, queue: &str) -> StoreResult<u64> {
        self.run(OpKind::Count, queue, self.inner.approximate_count(queue)).await
    }
}
