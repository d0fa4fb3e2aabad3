//! Request counting: [`CountingStore`] counts every storage call by operation ([`OpKind`])
//! and outcome ([`Outcome`]), so that the storage requests a write costs can be read off a
//! running process (`status`, field `requests`) and compared between versions and with the
//! Python reference.
//!
//! What one count is:
//! - one call of a [`TableStore`](super::table::TableStore) / [`QueueStore`](super::queue::QueueStore)
//!   method. On Azure that is one REST request, except that the Azure backend retries
//!   transient failures inside one call (`src/store/azure/retry.rs`, up to 4 attempts) and
//!   `count_range` pages 1,000 keys per request: both count once here;
//! - an entity group transaction counts as **one** request: it is one REST call, a
//!   `POST /$batch` carrying up to 100 operations on one partition
//!   (learn.microsoft.com/rest/api/storageservices/performing-entity-group-transactions); the
//!   entities in it are counted separately, in [`RequestSnapshot::batch_entities`];
//! - a point read that finds nothing is `ok` (the traits return absence as `Ok(None)`).
//!
//! Cost: two relaxed atomic increments per call (one for a non-batch call); no lock.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::Serialize;

use super::error::{StoreError, StoreResult};
use super::layer::{Call, Layer, LayeredStore, Returned};
use super::op::OpKind;
use super::queue::Store;

/// How a storage call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Success.
    Ok,
    /// HTTP 404: entity, table, queue or message absent ([`StoreError::NotFound`]).
    NotFound,
    /// HTTP 409 EntityAlreadyExists ([`StoreError::AlreadyExists`]).
    Conflict,
    /// HTTP 412 (ETag) or a stale pop receipt ([`StoreError::PreconditionFailed`]).
    Precondition,
    /// Throttled or unavailable: HTTP 503 ServerBusy, 500 OperationTimedOut, 408, 429,
    /// connection failures ([`StoreError::Unavailable`]).
    Unavailable,
    /// Rejected as invalid (HTTP 400, or refused before I/O: [`StoreError::InvalidInput`]).
    Invalid,
    /// Anything else ([`StoreError::Other`]).
    Other,
}

impl Outcome {
    /// Every outcome, in declaration order (`ALL[o as usize] == o`).
    pub const ALL: [Outcome; 7] = [
        Outcome::Ok,
        Outcome::NotFound,
        Outcome::Conflict,
        Outcome::Precondition,
        Outcome::Unavailable,
        Outcome::Invalid,
        Outcome::Other,
    ];

    /// The outcome of a call's result: the one place errors are classified. A failed entity
    /// group transaction takes the outcome of the operation that failed it.
    pub fn of<T>(result: &StoreResult<T>) -> Outcome {
        match result {
            Ok(_) => Outcome::Ok,
            Err(e) => Outcome::of_error(e),
        }
    }

    fn of_error(e: &StoreError) -> Outcome {
        match e {
            StoreError::NotFound(_) => Outcome::NotFound,
            StoreError::AlreadyExists(_) => Outcome::Conflict,
            StoreError::PreconditionFailed(_) => Outcome::Precondition,
            StoreError::BatchFailed { source, .. } => Outcome::of_error(source),
            StoreError::InvalidInput(_) => Outcome::Invalid,
            StoreError::Unavailable(_) => Outcome::Unavailable,
            StoreError::Other(_) => Outcome::Other,
        }
    }
}

const OPS: usize = OpKind::ALL.len();
const OUTCOMES: usize = Outcome::ALL.len();

/// Live request counters, shared by a [`CountingStore`] and whoever reports them.
#[derive(Debug, Default)]
pub struct RequestCounts {
    counts: [[AtomicU64; OUTCOMES]; OPS],
    batch_entities: AtomicU64,
}

impl RequestCounts {
    /// Zeroed counters.
    pub fn new() -> RequestCounts {
        RequestCounts::default()
    }

    /// Counts one request of `op` that ended with `outcome` and carried `batch_entities`
    /// entities in an entity group transaction (0 for other calls).
    pub fn record(&self, op: OpKind, outcome: Outcome, batch_entities: usize) {
        self.counts[op.index()][outcome as usize].fetch_add(1, Ordering::Relaxed);
        if batch_entities > 0 {
            self.batch_entities.fetch_add(batch_entities as u64, Ordering::Relaxed);
        }
    }

    /// The counts now. Counters are read one by one while calls may go on, so a snapshot
    /// taken under load is consistent per counter, not across counters.
    pub fn snapshot(&self) -> RequestSnapshot {
        let mut s =
            RequestSnapshot { batch_entities: self.batch_entities.load(Ordering::Relaxed), ..Default::default() };
        for op in OpKind::ALL {
            for outcome in Outcome::ALL {
                let n = self.counts[op.index()][outcome as usize].load(Ordering::Relaxed);
                s.add(op, outcome, n);
            }
        }
        s
    }
}

/// Requests of one operation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct OpCounts {
    /// All requests of this operation.
    pub total: u64,
    /// Requests per outcome (outcomes with none are left out), e.g. `"ok": 9, "conflict": 1`.
    #[serde(flatten)]
    pub outcomes: BTreeMap<Outcome, u64>,
}

/// Request counts at one moment (serialised into `status` as `requests`).
///
/// JSON shape: `{"total": n, "table": n, "queue": n, "batch_entities": n,
/// "by_outcome": {"ok": n, "conflict": n, ...}, "by_op": {"insert": {"total": n, "ok": n, ...}, ...}}`;
/// operations and outcomes with no request are left out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RequestSnapshot {
    /// Every request.
    pub total: u64,
    /// Requests to the Table service.
    pub table: u64,
    /// Requests to the Queue service.
    pub queue: u64,
    /// Entities carried by entity group transactions (each transaction is one request).
    pub batch_entities: u64,
    /// Requests per outcome.
    pub by_outcome: BTreeMap<Outcome, u64>,
    /// Requests per operation, and per outcome within each.
    pub by_op: BTreeMap<OpKind, OpCounts>,
}

impl RequestSnapshot {
    fn add(&mut self, op: OpKind, outcome: Outcome, n: u64) {
        if n == 0 {
            return;
        }
        self.total += n;
        if op.is_queue() {
            self.queue += n;
        } else {
            self.table += n;
        }
        *self.by_outcome.entry(outcome).or_default() += n;
        let c = self.by_op.entry(op).or_default();
        c.total += n;
        *c.outcomes.entry(outcome).or_default() += n;
    }

    /// Requests of `op` (all outcomes).
    pub fn op(&self, op: OpKind) -> u64 {
        self.by_op.get(&op).map_or(0, |c| c.total)
    }

    /// Requests that ended with `outcome` (all operations).
    pub fn outcome(&self, outcome: Outcome) -> u64 {
        self.by_outcome.get(&outcome).copied().unwrap_or(0)
    }

    /// The requests made after `earlier` (a snapshot of the same counters taken before).
    pub fn since(&self, earlier: &RequestSnapshot) -> RequestSnapshot {
        let mut d = RequestSnapshot {
            batch_entities: self.batch_entities.saturating_sub(earlier.batch_entities),
            ..Default::default()
        };
        for (op, counts) in &self.by_op {
            for (outcome, n) in &counts.outcomes {
                let before = earlier.by_op.get(op).and_then(|c| c.outcomes.get(outcome)).copied().unwrap_or(0);
                d.add(*op, *outcome, n.saturating_sub(before));
            }
        }
        d
    }
}

impl Layer for RequestCounts {
    async fn run<'a, T, F, Fut>(&'a self, call: Call<'a>, mut attempt: F) -> StoreResult<T>
    where
        T: Returned + Send + 'a,
        F: FnMut() -> Fut + Send + 'a,
        Fut: Future<Output = StoreResult<T>> + Send + 'a,
    {
        let result = attempt().await;
        self.record(call.op, Outcome::of(&result), call.batch.len());
        result
    }
}

/// A store that counts every call of the store it wraps (see the module docs for what one
/// count is). The counters are shared: [`CountingStore::counts`] hands them to a reporter
/// such as [`crate::Catalog::with_request_counts`].
pub type CountingStore = LayeredStore<Arc<RequestCounts>>;

impl CountingStore {
    /// Wraps `inner` with fresh counters.
    pub fn new(inner: Arc<dyn Store>) -> CountingStore {
        LayeredStore::with_layer(inner, Arc::new(RequestCounts::new()))
    }

    /// The counters.
    pub fn counts(&self) -> &Arc<RequestCounts> {
        self.layer()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::local::LocalStore;
    use crate::store::queue::QueueStore;
    use crate::store::table::{BatchOp, IfMatch, TableStore};
    use crate::store::value::{Entity, Value};

    fn store() -> CountingStore {
        CountingStore::new(Arc::new(LocalStore::in_memory().unwrap()))
    }

    #[tokio::test]
    async fn counts_move_by_operation_and_outcome() {
        let s = store();
        s.create_table("things").await.unwrap();
        let e = Entity::new("p", "r").with("v", Value::Int32(1));
        s.insert("things", &e).await.unwrap();
        let dup = s.insert("things", &e).await.unwrap_err();
        assert!(matches!(dup, StoreError::AlreadyExists(_)));
        let stale = IfMatch::Etag(crate::store::value::ETag("W/\"stale\"".into()));
        assert!(matches!(s.replace("things", &e, &stale).await, Err(StoreError::PreconditionFailed(_))));
        assert!(matches!(s.delete("things", "p", "gone", &IfMatch::Any).await, Err(StoreError::NotFound(_))));
        assert!(s.get("things", "p", "absent").await.unwrap().is_none());

        let snap = s.counts().snapshot();
        assert_eq!(snap.op(OpKind::Insert), 2);
        let insert = &snap.by_op[&OpKind::Insert];
        assert_eq!((insert.outcomes[&Outcome::Ok], insert.outcomes[&Outcome::Conflict]), (1, 1));
        assert_eq!(snap.by_op[&OpKind::Replace].outcomes[&Outcome::Precondition], 1);
        assert_eq!(snap.by_op[&OpKind::Delete].outcomes[&Outcome::NotFound], 1);
        assert_eq!(snap.by_op[&OpKind::Get].outcomes[&Outcome::Ok], 1, "absence is a value, not an error");
        assert_eq!((snap.total, snap.table, snap.queue), (6, 6, 0));
        assert_eq!(snap.outcome(Outcome::Conflict), 1);
    }

    #[tokio::test]
    async fn a_batch_is_one_request_and_its_entities_are_counted_apart() {
        let s = store();
        s.create_table("things").await.unwrap();
        let ops: Vec<BatchOp> = (0..5).map(|i| BatchOp::Insert(Entity::new("p", format!("r{i}")))).collect();
        s.batch("things", "p", &ops).await.unwrap();
        // The same batch again: its first operation hits an existing entity, a 409.
        let err = s.batch("things", "p", &ops).await.unwrap_err();
        assert!(matches!(err, StoreError::BatchFailed { .. }));
        // Refused before I/O (101 operations): counted as invalid.
        let too_many: Vec<BatchOp> = (0..101).map(|i| BatchOp::Insert(Entity::new("p", format!("x{i}")))).collect();
        assert!(s.batch("things", "p", &too_many).await.is_err());

        let snap = s.counts().snapshot();
        let batch = &snap.by_op[&OpKind::Batch];
        assert_eq!(batch.total, 3);
        assert_eq!(
            (batch.outcomes[&Outcome::Ok], batch.outcomes[&Outcome::Conflict], batch.outcomes[&Outcome::Invalid]),
            (1, 1, 1)
        );
        assert_eq!(snap.batch_entities, 5 + 5 + 101);
    }

    #[tokio::test]
    async fn queue_calls_are_counted_apart_and_since_subtracts() {
        let s = store();
        s.create_queue("q-apply").await.unwrap();
        let before = s.counts().snapshot();
        s.put_message("q-apply", "m", std::time::Duration::ZERO).await.unwrap();
        let got = s.receive_messages("q-apply", 1, std::time::Duration::from_secs(30)).await.unwrap();
        assert!(matches!(
            s.delete_message("q-apply", &got[0].id, "wrong").await,
            Err(StoreError::PreconditionFailed(_))
        ));
        let delta = s.counts().snapshot().since(&before);
        assert_eq!((delta.total, delta.queue, delta.table), (3, 3, 0));
        assert_eq!(delta.op(OpKind::CreateQueue), 0, "made before the earlier snapshot");
        assert_eq!(delta.by_op[&OpKind::DeleteMessage].outcomes[&Outcome::Precondition], 1);
    }

    #[tokio::test]
    async fn status_reports_the_requests_of_a_catalog_opened_by_config() {
        let dir = tempfile::tempdir().unwrap();
        let config = crate::Config::new("counted").local_path(dir.path()).index_keys(["icao", "iata"]).row_key("name");
        let catalog = config.open().await.unwrap();
        let opened = catalog.status().await.unwrap().requests.expect("Config::open counts requests");
        assert!(opened.op(OpKind::CreateTable) >= 2, "{opened:?}");
        let record = serde_json::json!({"icao": "KJFK", "iata": "JFK", "name": "Kennedy"});
        let serde_json::Value::Object(record) = record else { unreachable!() };
        catalog.upsert(record, true).await.unwrap();
        let after = catalog.status().await.unwrap().requests.unwrap();
        let write = after.since(&opened);
        // The WAL entry, then two index rows, whatever else the write and the status read did.
        assert!(write.op(OpKind::Insert) >= 3, "{write:?}");
        assert_eq!(write.op(OpKind::PutMessage), 1, "one apply hint");
        let json = serde_json::to_value(catalog.status().await.unwrap()).unwrap();
        assert!(json["requests"]["by_op"]["put_message"]["ok"].as_u64() == Some(1), "{json}");
    }

    #[tokio::test]
    async fn status_leaves_requests_out_without_counters() {
        let store: Arc<dyn Store> = Arc::new(LocalStore::in_memory().unwrap());
        let names = crate::config::Names::new("plain", None, None).unwrap();
        let schema = crate::schema::Schema::new(vec!["icao".into()], "name").unwrap();
        let catalog = crate::Catalog::open(store, names, schema, Default::default()).await.unwrap();
        let status = catalog.status().await.unwrap();
        assert_eq!(status.requests, None);
        assert!(serde_json::to_value(status).unwrap().get("requests").is_none());
    }

    #[test]
    fn the_snapshot_serialises_flat_per_operation() {
        let counts = RequestCounts::new();
        counts.record(OpKind::Insert, Outcome::Ok, 0);
        counts.record(OpKind::Insert, Outcome::Conflict, 0);
        counts.record(OpKind::Batch, Outcome::Ok, 7);
        let json = serde_json::to_value(counts.snapshot()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "total": 3, "table": 3, "queue": 0, "batch_entities": 7,
                "by_outcome": {"ok": 2, "conflict": 1},
                "by_op": {"insert": {"total": 2, "ok": 1, "conflict": 1}, "batch": {"total": 1, "ok": 1}}
            })
        );
    }

    #[test]
    fn outcomes_follow_the_error_and_a_failed_batch_takes_its_operations() {
        let cases = [
            (StoreError::NotFound("x".into()), Outcome::NotFound),
            (StoreError::AlreadyExists("x".into()), Outcome::Conflict),
            (StoreError::PreconditionFailed("x".into()), Outcome::Precondition),
            (StoreError::Unavailable("503 ServerBusy".into()), Outcome::Unavailable),
            (StoreError::InvalidInput("x".into()), Outcome::Invalid),
            (StoreError::Other("x".into()), Outcome::Other),
            (
                StoreError::BatchFailed { index: 3, source: Box::new(StoreError::AlreadyExists("x".into())) },
                Outcome::Conflict,
            ),
        ];
        for (err, want) in cases {
            assert_eq!(Outcome::of::<()>(&Err(err.clone())), want, "{err:?}");
        }
        assert_eq!(Outcome::of(&Ok(())), Outcome::Ok);
    }
}
