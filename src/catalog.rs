//! The public catalog API: validated writes through the WAL, reads by any identifier, and
//! the entry points the queue worker, the sweeper and the Functions handler call.
//!
//! Every write is validated first (schema, key lengths, property limits); bad input gets
//! [`Error::Invalid`] or [`Error::TooLarge`] naming the field and the limit, and nothing is
//! written. A write is acknowledged once its WAL entry is durable; it is then applied
//! asynchronously (a hint on the apply queue, the sweeper as a backstop), or before the call
//! returns when `wait` is set. A catalog in single-partition mode (`crate::single`) hands
//! writes and lookups to that engine instead: one entity group transaction per write, no WAL.

use std::sync::Arc;
use std::time::Duration;

use crate::env::Instant;

use serde::Serialize;

use crate::apply::catch_up::CaughtUp;
use crate::apply::sweep::age_ms;
use crate::apply::Applier;
use crate::error::{Error, Result};
use crate::hinter::Hinter;
use crate::history::read::HistoryPage;
use crate::history::HistoryOptions;
use crate::messages::{self, Message};
use crate::names::Names;
use crate::query::{self, Filter, ResultPage};
use crate::record::{self, Record};
use crate::schema::{RecordKeys, Schema};
use crate::schema_manager::SchemaManager;
use crate::store::counting::RequestCounts;
use crate::store::{Store, MAX_PAGE};
use crate::wal::{Op, Wal};

// The internal types that the catalog's own signatures carry: the ids a write returns and
// `wait_applied` takes, the WAL tunables of `CatalogOptions`, what `recover`, `sweep` and
// `dead` return. Re-exported here so that the `wal` and `apply` modules stay private.
pub use crate::apply::sweep::SweepReport;
pub use crate::apply::DrainOutcome;
pub use crate::status::{ShardStatus, Status};
pub use crate::wal::{DeadEntry, DeadPage, ShardId, WalId, WalOptions};

pub use crate::single::Mode;
use crate::single::SinglePartition;

/// Tunables of a catalog.
#[derive(Debug, Clone)]
pub struct CatalogOptions {
    /// WAL tunables (shards, lease, fan-out concurrency, tombstone grace).
    pub wal: WalOptions,
    /// Longest a `wait` write blocks before [`Error::Timeout`] (the write stays durable).
    pub wait_timeout: Duration,
    /// The sweeper applies entries pending longer than this.
    pub sweep_apply_after: Duration,
    /// Longest a consistent read ([`Catalog::query_consistent`]) applies pending entries
    /// before it gives up with [`Error::Busy`].
    pub consistent_timeout: Duration,
    /// Record history: on or off, retention ([`crate::history`]).
    pub history: HistoryOptions,
}

impl Default for CatalogOptions {
    fn default() -> Self {
        CatalogOptions {
            wal: WalOptions::default(),
            wait_timeout: Duration::from_secs(30),
            sweep_apply_after: Duration::from_secs(30),
            consistent_timeout: Duration::from_secs(2),
            history: HistoryOptions { enabled: crate::history::DEFAULT_ENABLED, ..HistoryOptions::default() },
        }
    }
}

/// An acknowledged write.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Written {
    /// Its WAL id (single-partition mode: a fresh id of the write, recorded in the rows it
    /// wrote; there is no WAL entry).
    pub id: String,
    /// The WAL shard it was logged in (not serialised).
    #[serde(skip)]
    pub shard: Option<ShardId>,
    /// The record as stored (insert, upsert, replace).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub record: Option<Record>,
    /// True when the write was applied before returning (`wait`).
    pub applied: bool,
}

/// Where a WAL entry is, as far as the WAL can tell ([`Catalog::wal_state`]). The applier
/// removes an entry once applied and keeps no list of applied ids; what it keeps is, per
/// shard, the checkpoint: the id of the last entry that shard applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WalState {
    /// Logged, not yet applied: in its shard's pending partition.
    Pending,
    /// Applied, known: the id is a shard's checkpoint, the last entry that shard applied.
    Applied,
    /// Moved to the WAL's `dead` partition: it can never be applied (the reason is in
    /// `crate::wal::Wal::dead_reason`).
    Dead,
    /// Not pending, not dead, below a shard's checkpoint: applied if it was ever logged. An id
    /// that was never logged reads the same, so this is not a proof that it exists. For an
    /// id a write returned, it means applied.
    Unknown,
}

impl WalState {
    /// One sentence on what the state means and how it was inferred.
    pub fn detail(self) -> &'static str {
        match self {
            WalState::Pending => "logged, not applied yet: it is in its shard's pending partition",
            WalState::Applied => "applied: it is the checkpoint of its shard (the last entry that shard applied)",
            WalState::Dead => "can never be applied: it is in the dead partition (see `dead`, GET /api/wal/dead)",
            WalState::Unknown => {
                "not pending, not dead, and below the checkpoint: applied if it was ever logged (the WAL removes \
                 entries once applied and keeps no list of them, so an id that was never logged reads the same; \
                 for an id a write returned, this means applied)"
            }
        }
    }
}

/// A WAL entry's state as `GET /api/wal/{id}` and `table-catalog wal show ID` print it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WalEntryState {
    /// The id asked about.
    pub id: String,
    /// Where it is.
    pub state: WalState,
    /// What the state means and how it was inferred ([`WalState::detail`]).
    pub detail: &'static str,
}

/// What handling one apply-queue message did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageOutcome {
    /// The message's work is done (or being done by the lease holder).
    Applied {
        /// The WAL id of a logged intent.
        id: Option<String>,
    },
    /// The message can never succeed (the dispatcher puts it on the poison queue with this
    /// reason; see `crate::dispatch`).
    Rejected {
        /// Why.
        reason: String,
    },
}

/// A multi-index catalog.
///
/// In single-partition mode ([`Mode::SinglePartition`], [`Catalog::open_with_mode`]) the same
/// methods behave as documented with these differences: every write is one entity group
/// transaction, applied before it returns (`wait` changes nothing, [`Written::applied`] is
/// always true, its id is a fresh UUID, not a WAL id); a filter over several records removes
/// each in its own transaction; `query_consistent` is `query`; `status` reports nothing
/// pending, `recover` and `sweep` do nothing; `history`, the WAL's reads (`wal_state`,
/// `dead`, `redrive`) and index changes fail with [`Error::NotSupported`]. Limits: at most 99
/// index values per record and about 4 MiB of row copies per write ([`Error::Invalid`]
/// naming `record` and the limit). docs/ARCHITECTURE.md, "Single-partition mode".
pub struct Catalog {
    store: Arc<dyn Store>,
    /// The schema in force and its changes; holds the WAL and the apply engine.
    schemas: SchemaManager,
    names: Names,
    opts: CatalogOptions,
    /// Wakes an in-process queue worker when this process's hinter put a hint on the queue.
    work: Arc<tokio::sync::Notify>,
    /// Sends apply-queue hints after the acknowledgement.
    hints: Hinter,
    /// Counters of the store's requests, reported by `status`.
    requests: Option<Arc<RequestCounts>>,
    /// Apply counters of this catalog, rendered by [`Catalog::metrics_text`].
    apply_metrics: crate::metrics::ApplyMetrics,
    /// The single-partition engine, in that mode ([`Mode::SinglePartition`]); `None` in WAL
    /// mode. In that mode the WAL, apply engine and schema manager above are built but never
    /// used: no table or queue of theirs is created.
    single: Option<Arc<SinglePartition>>,
}

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalog").field("names", &self.names).field("schema", &self.applier().schema()).finish()
    }
}

impl Catalog {
    /// Opens a catalog: creates its tables and queues if needed and stores or checks the
    /// schema ([`Error::SchemaMismatch`] if it was created with another one).
    pub async fn open(store: Arc<dyn Store>, names: Names, schema: Schema, opts: CatalogOptions) -> Result<Catalog> {
        let wal = Arc::new(Wal::new(store.clone(), names.wal_table.clone(), opts.wal.clone()));
        wal.init().await?;
        let jobs = SchemaManager::jobs(store.clone(), names.wal_table.clone(), names.scan_queue.clone());
        let mut applier = Applier::new(wal.clone(), names.table.clone(), schema).with_jobs(jobs.clone());
        if opts.history.enabled {
            opts.history.validate()?;
            names.check_history_table()?;
            applier = applier.with_history(names.history_table.clone(), opts.history.clone());
        }
        applier.init().await?;
        store.create_queue(&names.queue).await?;
        store.create_queue(&names.poison_queue).await?;
        store.create_queue(&names.scan_queue).await?;
        store.create_queue(&names.scan_poison_queue).await?;
        Ok(Catalog::assemble(store, names, opts, wal, jobs, applier, None))
    }

    /// The catalog around its WAL, jobs and apply engine (and, in single-partition mode,
    /// its engine): the hinter and the schema manager, nothing created in storage.
    fn assemble(
        store: Arc<dyn Store>,
        names: Names,
        opts: CatalogOptions,
        wal: Arc<Wal>,
        jobs: Arc<crate::job_core::Jobs>,
        applier: Applier,
        single: Option<Arc<SinglePartition>>,
    ) -> Catalog {
        let work = Arc::new(tokio::sync::Notify::new());
        let hints = Hinter::new(store.clone(), names.queue.clone(), work.clone(), wal.write_share());
        let schemas = SchemaManager::new(store.clone(), wal, applier, jobs, hints.clone());
        Catalog { store, schemas, names, opts, work, hints, requests: None, apply_metrics: Default::default(), single }
    }

    /// Opens a catalog in `mode` ([`Mode`], chosen when the catalog is created and stored
    /// with it). WAL mode: as [`Catalog::open`] (a `schema` is required), after checking that
    /// the catalog table is not a single-partition one (one more read). Single-partition
    /// mode: checks or stores the tenant's mode row in the catalog table (its schema: the
    /// stored one when `schema` is `None`) and creates nothing else (no WAL table, no queue).
    /// Errors: the catalog was created in the other mode or with another schema
    /// ([`Error::SchemaMismatch`]), no schema given or stored ([`Error::Config`]), hashed
    /// fields in single-partition mode ([`Error::NotSupported`]), storage failures.
    pub async fn open_with_mode(
        store: Arc<dyn Store>,
        names: Names,
        schema: Option<Schema>,
        opts: CatalogOptions,
        mode: &Mode,
    ) -> Result<Catalog> {
        match mode {
            Mode::Wal => {
                let schema = schema.ok_or_else(|| {
                    Error::Config(format!(
                        "catalog '{}': no schema given ({}, {})",
                        names.table,
                        crate::settings::INDEX_KEYS,
                        crate::settings::ROW_KEY
                    ))
                })?;
                crate::single::meta::refuse_if_single(store.as_ref(), &names).await?;
                Catalog::open(store, names, schema, opts).await
            }
            Mode::SinglePartition { tenant } => {
                let engine = SinglePartition::open(store.clone(), &names, tenant, schema).await?;
                let schema = (*engine.schema()).clone();
                // Built for the methods' shared plumbing only; nothing of theirs is created.
                let wal = Arc::new(Wal::new(store.clone(), names.wal_table.clone(), opts.wal.clone()));
                let jobs = SchemaManager::jobs(store.clone(), names.wal_table.clone(), names.scan_queue.clone());
                let applier = Applier::new(wal.clone(), names.table.clone(), schema).with_jobs(jobs.clone());
                Ok(Catalog::assemble(store, names, opts, wal, jobs, applier, Some(Arc::new(engine))))
            }
        }
    }

    /// The mode the catalog was opened in (and created with).
    pub fn mode(&self) -> Mode {
        match &self.single {
            None => Mode::Wal,
            Some(s) => Mode::SinglePartition { tenant: s.tenant().to_string() },
        }
    }

    /// [`Error::NotSupported`] in single-partition mode, naming `what` and why.
    pub(crate) fn wal_mode_only(&self, what: &str) -> Result<()> {
        match &self.single {
            None => Ok(()),
            Some(s) => Err(Error::NotSupported(format!(
                "{what} is not supported in single-partition mode (catalog '{}', tenant '{}'): it has no WAL, \
                 queue or jobs table; use a WAL-mode catalog (docs/ARCHITECTURE.md, \"Single-partition mode\")",
                self.names.table,
                s.tenant()
            ))),
        }
    }

    /// In single-partition mode, every record once (from its owner row), `segment` rows per
    /// request: the export of that mode. `None` in WAL mode (`crate::export` reads the table).
    pub(crate) fn single_records(&self, segment: usize) -> Option<futures::stream::BoxStream<'static, Result<Record>>> {
        self.single.as_ref().map(|sp| sp.clone().records(segment))
    }

    /// A single-partition write's acknowledgement (write `id`): applied when it returns.
    fn single_written(id: String, record: Option<Record>) -> Written {
        Written { id, shard: None, record, applied: true }
    }

    /// Reports `counts` in [`Catalog::status`] (builder style). Pass the counters of the
    /// [`crate::store::CountingStore`] this catalog's store is (or wraps).
    pub fn with_request_counts(mut self, counts: Arc<RequestCounts>) -> Catalog {
        self.requests = Some(counts);
        self
    }

    /// The schema in force in this process (re-read when a newer version shows up: see
    /// [`crate::indexes`]).
    pub fn schema(&self) -> Arc<Schema> {
        self.applier().schema()
    }

    /// Table and queue names.
    pub fn names(&self) -> &Names {
        &self.names
    }

    /// The storage backend.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The WAL (for operators and tests: `testing::CatalogInternals`).
    pub(crate) fn wal(&self) -> &Wal {
        self.schemas.wal()
    }

    /// The apply engine (for operators and tests: `testing::CatalogInternals`).
    pub(crate) fn applier(&self) -> &Applier {
        self.schemas.applier()
    }

    /// The schema manager: index changes and the schema in force ([`crate::indexes`]).
    pub(crate) fn schemas(&self) -> &SchemaManager {
        &self.schemas
    }

    /// Validates a record and keys it under `schema`; an upsert of it goes to the shard of
    /// its RowKey. Returns the record as it is logged and stored: redacted fields hold their
    /// HMAC ([`Schema::redact`]), so neither the WAL entry nor a row holds their plaintext.
    fn check_record(&self, schema: &Schema, record: Record) -> Result<(Record, RecordKeys, ShardId)> {
        let record = schema.redact(record);
        record::validate(&record)?;
        let keys = schema.record_keys(&record)?;
        let shard = self.applier().shard_of(&keys.row_key);
        Ok((record, keys, shard))
    }

    /// Validates a filter of a write under `schema` (every field an active index: a write
    /// resolves its filter against the index, which must be complete); returns it as it is
    /// logged, hashed fields' values in redacted form ([`Schema::blind_filter`]). Any active
    /// index field may be named, also through a projected index: a projected row that
    /// lacks a filtered field is decided by its fact row when the entry is applied
    /// (`crate::apply`, docs/ARCHITECTURE.md, "Projections").
    fn check_filter(&self, schema: &Schema, filter: Filter) -> Result<Filter> {
        filter.clone().allow_partial(false).validate(schema)?;
        Ok(schema.blind_filter(filter.allow_partial(false)))
    }

    /// Adds a record. Fails with [`Error::Conflict`] when a record with the same identity
    /// (sort value and indexed values) is already visible; use [`Catalog::upsert`] to
    /// overwrite. The check is made when the write is logged: two concurrent inserts of the
    /// same identity both succeed and the later one wins.
    pub async fn insert(&self, record: Record, wait: bool) -> Result<Written> {
        if let Some(sp) = &self.single {
            let id = crate::env::uuid().to_string();
            let record = sp.upsert(record, true, &id).await?;
            return Ok(Catalog::single_written(id, Some(record)));
        }
        self.schemas
            .under_schema(|schema| {
                let record = record.clone();
                async move {
                    let (record, keys, shard) = self.check_record(&schema, record)?;
                    if let Some((_, pk)) = keys.partitions.first() {
                        if let Some(row) = self.store.get(&self.names.table, pk, &keys.row_key).await? {
                            if record::from_entity(&row).is_some() {
                                return Err(Error::Conflict(format!(
                                    "a record with RowKey '{}' already exists; use upsert to overwrite it",
                                    keys.row_key
                                )));
                            }
                        }
                    }
                    self.log(&schema, shard, Op::Upsert { record }, wait).await
                }
            })
            .await
    }

    /// Stores a record in every index, replacing one with the same identity.
    pub async fn upsert(&self, record: Record, wait: bool) -> Result<Written> {
        if let Some(sp) = &self.single {
            let id = crate::env::uuid().to_string();
            let record = sp.upsert(record, false, &id).await?;
            return Ok(Catalog::single_written(id, Some(record)));
        }
        self.schemas
            .under_schema(|schema| {
                let record = record.clone();
                async move {
                    let (record, _, shard) = self.check_record(&schema, record)?;
                    self.log(&schema, shard, Op::Upsert { record }, wait).await
                }
            })
            .await
    }

    /// Deletes the records matching `filter` (when applied) and stores `record`. Use it to
    /// change a record's indexed values.
    pub async fn replace(&self, filter: Filter, record: Record, wait: bool) -> Result<Written> {
        if let Some(sp) = &self.single {
            let id = crate::env::uuid().to_string();
            let record = sp.replace(filter, record, &id).await?;
            return Ok(Catalog::single_written(id, Some(record)));
        }
        self.schemas
            .under_schema(|schema| {
                let (filter, record) = (filter.clone(), record.clone());
                async move {
                    let filter = self.check_filter(&schema, filter)?;
                    let (record, _, _) = self.check_record(&schema, record)?;
                    self.log(&schema, ShardId::ZERO, Op::Replace { filter, record }, wait).await
                }
            })
            .await
    }

    /// Deletes the records matching `filter` from every index. The filter is resolved when
    /// the entry is applied, so it also deletes matching writes logged before it.
    pub async fn delete(&self, filter: Filter, wait: bool) -> Result<Written> {
        if let Some(sp) = &self.single {
            sp.delete(filter).await?;
            return Ok(Catalog::single_written(crate::env::uuid().to_string(), None));
        }
        self.schemas
            .under_schema(|schema| {
                let filter = filter.clone();
                async move {
                    let filter = self.check_filter(&schema, filter)?;
                    self.log(&schema, ShardId::ZERO, Op::Delete { filter }, wait).await
                }
            })
            .await
    }

    /// Logs the removal of one stray catalog row (`repair`, for a `stray_row` finding): the
    /// row (`partition_key`, `row_key`) is removed when applied if its ETag is still `etag`
    /// and it still belongs to no record there ([`Op::RemoveRow`]). Errors: an empty key or
    /// ETag (invalid input, nothing logged), storage failures.
    pub(crate) async fn remove_stray_row(&self, partition_key: &str, row_key: &str, etag: &str) -> Result<Written> {
        self.wal_mode_only("removing a stray row (repair)")?;
        for (field, value) in [("partition_key", partition_key), ("row_key", row_key), ("etag", etag)] {
            if value.is_empty() {
                return Err(Error::invalid(format!("remove_row: {field} is empty")));
            }
        }
        self.schemas
            .under_schema(|schema| async move {
                let op = Op::RemoveRow {
                    partition_key: partition_key.to_string(),
                    row_key: row_key.to_string(),
                    etag: etag.to_string(),
                };
                self.log(&schema, ShardId::ZERO, op, false).await
            })
            .await
    }

    /// Logs `op` (validated under `schema`) in `shard` (the one [`Applier::route`] gives it).
    async fn log(&self, schema: &Schema, shard: ShardId, op: Op, wait: bool) -> Result<Written> {
        let record = match &op {
            Op::Upsert { record } | Op::Replace { record, .. } => Some(record.clone()),
            Op::Delete { .. } | Op::Schema { .. } | Op::RemoveRow { .. } => None,
        };
        let on_added = match &op {
            Op::Replace { filter, .. } | Op::Delete { filter } => {
                filter.fields.iter().any(|(f, _)| !schema.identity_keys().contains(f))
            }
            Op::Upsert { .. } | Op::Schema { .. } | Op::RemoveRow { .. } => false,
        };
        let id = self.wal().append_under(vec![(shard, op)], schema.version()).await?.remove(0);
        self.hint(shard, &id);
        if on_added && self.wal().current_schema_version().await? > schema.version() {
            // A filter on an added index, durable only after an index change was made: if the
            // change drops the index, the entry may be applied after the drop and then takes
            // no effect. Not acknowledged: it may or may not take effect.
            return Err(Error::Store(crate::store::StoreError::Unavailable(format!(
                "the catalog's indexes changed while this write was being logged (write {id}); it may or may not take effect: retry it"
            ))));
        }
        let applied = if wait { self.wait_applied(shard, &id).await? } else { false };
        Ok(Written { id: id.to_string(), shard: Some(shard), record, applied })
    }

    /// Upserts many records through one WAL append (one entity group transaction per shard
    /// and 100 entries). Returns one result per input, in order: the WAL id, or the reason the
    /// record was rejected. Valid records are logged even when others are rejected.
    pub async fn upsert_many(&self, records: Vec<Record>, wait: bool) -> Result<Vec<Result<String>>> {
        if let Some(sp) = &self.single {
            // Each record is its own EGT, applied when this returns (`wait` changes nothing).
            return Ok(sp.upsert_many(records).await);
        }
        let (mut results, ids, slots, shards) = self
            .schemas
            .under_schema(|schema| {
                let records = records.clone();
                async move {
                    let mut results: Vec<Result<String>> = Vec::with_capacity(records.len());
                    let mut ops = Vec::new();
                    let mut slots = Vec::new();
                    for (i, record) in records.into_iter().enumerate() {
                        match self.check_record(&schema, record) {
                            Ok((record, _, shard)) => {
                                ops.push((shard, Op::Upsert { record }));
                                slots.push(i);
                                results.push(Ok(String::new()));
                            }
                            Err(e) => results.push(Err(e)),
                        }
                    }
                    let shards: Vec<ShardId> = ops.iter().map(|(s, _)| *s).collect();
                    let ids = self.wal().append_under(ops, schema.version()).await?;
                    Ok((results, ids, slots, shards))
                }
            })
            .await?;
        let mut last: std::collections::BTreeMap<ShardId, &WalId> = std::collections::BTreeMap::new();
        for ((slot, id), shard) in slots.into_iter().zip(&ids).zip(shards) {
            results[slot] = Ok(id.to_string());
            last.insert(shard, id);
        }
        for (shard, id) in &last {
            self.hint(*shard, id);
        }
        if wait {
            for (shard, id) in last {
                self.wait_applied(shard, id).await?;
            }
        }
        Ok(results)
    }

    /// Asks for an apply hint for an entry (sent in the background, coalesced; see
    /// [`crate::hinter`]; the hinter wakes this process's queue worker once the hint is on
    /// the queue). A lost hint only delays the entry until the sweeper applies it.
    pub(crate) fn hint(&self, shard: ShardId, id: &WalId) {
        self.hints.hint(shard, id);
    }

    /// Waits until every apply hint this catalog asked for was sent (hints go after the
    /// acknowledgement, in the background; see `crate::hinter`).
    pub async fn hints_settled(&self) {
        self.hints.settled().await
    }

    /// Notified when this process put apply hints on the queue (lets an in-process worker
    /// receive at once instead of waiting for its next poll).
    pub fn work_signal(&self) -> &tokio::sync::Notify {
        &self.work
    }

    /// Blocks until entry `id` of `shard` is applied, applying the shard here when no other
    /// applier holds it. [`Error::Timeout`] after [`CatalogOptions::wait_timeout`]: an apply pass run
    /// here stops at its first group boundary past the deadline, so the wait ends within the
    /// timeout plus the time to apply one group (`crate::apply::Applier::apply_shard_by`).
    pub async fn wait_applied(&self, shard: ShardId, id: &WalId) -> Result<bool> {
        if self.single.is_some() {
            // Every single-partition write is applied when it is acknowledged.
            return Ok(true);
        }
        let deadline = crate::env::now() + self.opts.wait_timeout;
        let mut delays = crate::env::poll_delays(Duration::from_millis(5), Duration::from_millis(200));
        loop {
            let started = crate::env::now();
            let outcome = self
                .applier()
                .apply_shard_by(shard, deadline.min(crate::env::now() + self.opts.wal.apply_budget))
                .await?;
            self.record_apply(&shard.partition(), &outcome, started);
            if !self.wal().is_pending(shard, id).await? {
                return match self.wal().dead_reason(id).await? {
                    None => Ok(true),
                    Some(reason) => {
                        Err(Error::Invalid(format!("write {id} was logged but cannot be applied: {reason}")))
                    }
                };
            }
            if crate::env::now() >= deadline {
                return Err(Error::Timeout(format!(
                    "write {id} is durable but was not applied within {:?}; it will be applied",
                    self.opts.wait_timeout
                )));
            }
            let left = deadline.saturating_duration_since(crate::env::now());
            crate::env::sleep(delays.next().unwrap_or(left).min(left)).await;
        }
    }

    /// One page of records matching `filter`, at most `limit` (1..=1000), resuming after
    /// `continuation`.
    pub async fn query(&self, filter: &Filter, limit: usize, continuation: Option<&str>) -> Result<ResultPage> {
        let schema = self.lookup_schema(filter).await?;
        self.query_under(&schema, filter, limit, continuation).await
    }

    /// [`Catalog::query`] under `schema`, which the filter was checked against.
    async fn query_under(
        &self,
        schema: &Schema,
        filter: &Filter,
        limit: usize,
        continuation: Option<&str>,
    ) -> Result<ResultPage> {
        if limit == 0 || limit > MAX_PAGE {
            return Err(Error::invalid(format!("limit: {limit} is out of range 1..={MAX_PAGE}")));
        }
        let mut page = match &self.single {
            Some(sp) => sp.query_page(filter, limit, continuation).await?,
            None => {
                check_returning(schema, filter)?;
                query::query_page(self.store.as_ref(), &self.names.table, schema, filter, limit, continuation).await?
            }
        };
        if let Some(fields) = &filter.returning {
            for found in &mut page.records {
                found.record.retain(|k, _| fields.contains(k));
            }
        }
        Ok(page)
    }

    /// The schema to run lookup `filter` under, after checking the filter against it (see
    /// [`crate::indexes::lookup_schema`]).
    async fn lookup_schema(&self, filter: &Filter) -> Result<Arc<Schema>> {
        if let Some(sp) = &self.single {
            // The schema never changes in this mode: no re-read.
            let schema = sp.schema();
            filter.validate(&schema)?;
            return Ok(schema);
        }
        self.schemas.lookup_schema(filter).await
    }

    /// Read-your-writes: [`Catalog::query`], after every write acknowledged before this call
    /// (through any process) was applied; see `crate::apply::catch_up` for the argument.
    /// With nothing pending it costs one request per WAL shard (concurrently) before the
    /// query, and, through an index added online, one schema read after it (an index dropped
    /// while the lookup ran gives the error a fresh lookup gets, never a partial answer).
    /// [`Error::Busy`] (HTTP 503 with `Retry-After`) when more than
    /// `crate::apply::catch_up::MAX_CATCH_UP` entries are pending, or when they are not
    /// applied within [`CatalogOptions::consistent_timeout`]; it never answers from a catalog
    /// that has not caught up.
    pub async fn query_consistent(
        &self,
        filter: &Filter,
        limit: usize,
        continuation: Option<&str>,
    ) -> Result<ResultPage> {
        let schema = self.lookup_schema(filter).await?;
        if self.single.is_some() {
            // Every acknowledged write was committed by its own EGT: nothing to catch up on.
            return self.query_under(&schema, filter, limit, continuation).await;
        }
        let deadline = crate::env::now() + self.opts.consistent_timeout;
        match self.applier().catch_up(deadline).await? {
            CaughtUp::Yes => {
                let page = self.query_under(&schema, filter, limit, continuation).await?;
                self.still_served(filter, &page.index).await?;
                Ok(page)
            }
            CaughtUp::Backlog { pending } => Err(Error::Busy {
                message: format!(
                    "consistent: {pending} WAL entries are still to be applied (at most {} are applied for a consistent read); retry later, or read without consistent=true",
                    crate::apply::catch_up::MAX_CATCH_UP
                ),
                retry_after_secs: (pending / 500).clamp(1, 60),
            }),
            CaughtUp::NotYet => Err(Error::Busy {
                message: format!(
                    "consistent: the writes acknowledged before this read were not all applied within {:?}; retry later",
                    self.opts.consistent_timeout
                ),
                retry_after_secs: 1,
            }),
        }
    }

    /// After a consistent lookup read `index`: when it is an index added online, the schema
    /// is read again, and the answer stands only if that index would still serve the filter.
    /// The lookup's schema copy may be up to [`crate::indexes::LOOKUP_SCHEMA_AGE`] old, and an index
    /// dropped meanwhile may have lost rows before the read; a drop's job removes rows only
    /// after the index is marked `dropping` in the schema row, so an index still active (and
    /// still the one chosen) after the read was complete during it. Otherwise the error a
    /// fresh lookup gets (`Invalid` for a dropping or dropped index, `IndexNotReady` for one
    /// added again and backfilling), never a partial answer (simulator seeds 459 and 591,
    /// `region` and `country` lookups through dropped indexes). Identity indexes are never
    /// dropped: no read.
    async fn still_served(&self, filter: &Filter, index: &str) -> Result<()> {
        let schema = self.applier().schema();
        if schema.identity_keys().iter().any(|f| f == index) {
            return Ok(());
        }
        self.applier().reload_schema().await?;
        let fresh = self.applier().schema();
        filter.validate(&fresh)?;
        match filter.choose_index(&fresh, crate::index_choice::Purpose::Lookup) {
            Some(now) if now == index => Ok(()),
            now => Err(Error::Busy {
                message: format!(
                    "consistent: the index '{index}' this lookup read changed while it ran (now {}); retry",
                    now.as_deref().unwrap_or("none")
                ),
                retry_after_secs: 1,
            }),
        }
    }

    /// The history of the records with `field` = `value`, newest first: at most `limit`
    /// (1..=1,000) changes after `continuation` ([`crate::history::HistoryPage`]). The value is
    /// resolved to record identities through the index partition, live rows and tombstones,
    /// so a deleted record's history is found while its tombstone exists (the sweeper
    /// removes it after the grace period; from then on the deleted record, and its history,
    /// are no longer found by its identifiers). Errors: history off ([`Error::NotFound`]),
    /// `field` not an index field or an empty value ([`Error::Invalid`]), more than
    /// [`crate::history::MAX_IDENTITIES`] records with that value.
    pub async fn history(
        &self,
        field: &str,
        value: &str,
        limit: usize,
        continuation: Option<&str>,
    ) -> Result<HistoryPage> {
        self.wal_mode_only("history")?;
        let Some(table) = self.applier().history_table() else {
            return Err(Error::NotFound(format!(
                "catalog '{}' keeps no history; set {}=on (CLI: --history on)",
                self.names.table,
                crate::settings::HISTORY
            )));
        };
        let filter = Filter::new(vec![(field.to_string(), value.to_string())]);
        let schema = self.lookup_schema(&filter).await?;
        let pk = filter.partition_key(&schema)?;
        let identities = crate::history::read::identities(self.store.as_ref(), &self.names.table, &pk).await?;
        crate::history::read::page(self.store.as_ref(), table, &identities, limit, continuation).await
    }

    /// Every record matching `filter`.
    pub async fn query_all(&self, filter: &Filter) -> Result<Vec<Record>> {
        let schema = self.lookup_schema(filter).await?;
        if self.single.is_some() {
            let mut all = Vec::new();
            let mut token: Option<String> = None;
            loop {
                let page = self.query_under(&schema, filter, MAX_PAGE, token.as_deref()).await?;
                all.extend(page.records.into_iter().map(|f| f.record));
                match page.continuation {
                    Some(next) => token = Some(next),
                    None => return Ok(all),
                }
            }
        }
        Ok(query::query_all(self.store.as_ref(), &self.names.table, &schema, filter)
            .await?
            .into_iter()
            .map(|f| f.record)
            .collect())
    }

    /// Where a WAL entry is ([`WalState`]): pending (in any shard), dead, applied (it is a
    /// shard's checkpoint) or unknown (below a checkpoint: applied if it was ever logged). The
    /// applier advances a shard's checkpoint before it removes applied entries, so an entry
    /// that is no longer pending is always at or below its shard's checkpoint.
    /// [`Error::Invalid`] for a malformed id; [`Error::NotFound`] for an id that is not
    /// pending, not dead and above every checkpoint (never logged, or its write has not been
    /// acknowledged yet). One read per shard for the pending check and one for the checkpoints,
    /// plus one for the dead partition.
    pub async fn wal_state(&self, id: &str) -> Result<WalState> {
        self.wal_mode_only("the WAL's entry states")?;
        let id = WalId::parse(id).ok_or_else(|| Error::invalid(format!("id: '{id}' is not a WAL id")))?;
        if self.wal().find_pending(&id).await?.is_some() {
            return Ok(WalState::Pending);
        }
        if self.wal().dead_reason(&id).await?.is_some() {
            return Ok(WalState::Dead);
        }
        let count = self.wal().current_shard_count().await?;
        let checkpoints = futures::future::try_join_all(ShardId::all(count).map(|s| self.wal().checkpoint(s))).await?;
        let checkpoints: Vec<WalId> = checkpoints.into_iter().flatten().collect();
        if checkpoints.iter().any(|cp| crate::wal::id::entry_of(cp.as_str()) == id.as_str()) {
            return Ok(WalState::Applied);
        }
        match checkpoints.iter().max() {
            Some(cp) if id <= *cp => Ok(WalState::Unknown),
            _ => Err(Error::NotFound(format!("WAL entry {id} is not pending and was never applied"))),
        }
    }

    /// [`Catalog::wal_state`] with the id and the state's explanation, as the HTTP API and the
    /// CLI print it.
    pub async fn wal_entry_state(&self, id: &str) -> Result<WalEntryState> {
        let state = self.wal_state(id).await?;
        Ok(WalEntryState { id: id.to_string(), state, detail: state.detail() })
    }

    /// One page of the WAL's dead entries (entries that can never be applied), with the
    /// reason each died: at most `limit` (1-1,000), from a continuation token of the previous
    /// page. See `crate::apply::dead`.
    pub async fn dead(&self, limit: usize, continuation: Option<&str>) -> Result<DeadPage> {
        self.wal_mode_only("the WAL's dead entries")?;
        self.wal().dead_page(limit, continuation).await
    }

    /// Every dead entry, in id order (a page of 1,000 per request).
    pub fn dead_entries(&self) -> futures::stream::BoxStream<'_, Result<DeadEntry>> {
        self.wal().dead_entries()
    }

    /// Moves dead entry `id` (or every dead entry, when `None`) back to pending, in the shard
    /// it came from, and hints those shards; the entries then apply like any other, fenced by
    /// their ids (see `crate::apply::dead`). Returns the ids moved. Errors: `id` not a WAL
    /// id ([`Error::Invalid`]) or not dead ([`Error::NotFound`]).
    pub async fn redrive(&self, id: Option<&str>) -> Result<Vec<String>> {
        self.wal_mode_only("redriving dead WAL entries")?;
        let id = match id {
            Some(s) => Some(WalId::parse(s).ok_or_else(|| Error::invalid(format!("id: '{s}' is not a WAL id")))?),
            None => None,
        };
        let moved = self.applier().redrive(id.as_ref()).await?;
        let mut newest: std::collections::BTreeMap<ShardId, &WalId> = std::collections::BTreeMap::new();
        for (id, shard) in &moved {
            newest.insert(*shard, id);
        }
        for (shard, id) in newest {
            self.hint(shard, id);
        }
        Ok(moved.into_iter().map(|(id, _)| id.to_string()).collect())
    }

    /// Applies every pending entry of every shard now (the `recover` of the product
    /// description).
    pub async fn recover(&self) -> Result<DrainOutcome> {
        if self.single.is_some() {
            // No WAL: every acknowledged write is already applied.
            return Ok(DrainOutcome::Drained { applied: 0 });
        }
        let started = crate::env::now();
        let outcome = self.applier().apply_all().await?;
        self.record_apply("all", &outcome, started);
        Ok(outcome)
    }

    /// Counts and logs one apply pass that started at `started` (a `Busy` pass applied
    /// nothing here and is not counted).
    fn record_apply(&self, shard: &str, outcome: &DrainOutcome, started: Instant) {
        let (applied, what) = match outcome {
            DrainOutcome::Drained { applied } => (*applied, "drained"),
            DrainOutcome::Partial { applied } => (*applied, "partial"),
            DrainOutcome::Busy => return,
        };
        self.apply_metrics.record_pass(shard, applied, started.elapsed(), what);
    }

    /// The operator metrics in the Prometheus text format (see `crate::metrics` for the
    /// names, and for what one call costs in storage requests: it reads [`Catalog::status`]).
    pub async fn metrics_text(&self) -> Result<String> {
        let status = self.status().await?;
        crate::metrics::render(&status, &self.apply_metrics)
            .map_err(|e| Error::Invalid(format!("metrics: rendering failed: {e}")))
    }

    /// Pending entries, oldest pending age, checkpoint, poison and dead counts, and the
    /// request counts when the catalog has them.
    pub async fn status(&self) -> Result<Status> {
        if let Some(sp) = &self.single {
            // No WAL, no queue: nothing pending, nothing dead, no checkpoint.
            return Ok(Status {
                mode: "single-partition",
                tenant: Some(sp.tenant().to_string()),
                pending: 0,
                pending_capped: false,
                oldest_pending_age_ms: None,
                checkpoint: None,
                shards: Vec::new(),
                poison: 0,
                dead: 0,
                requests: self.requests.as_ref().map(|c| c.snapshot()),
            });
        }
        let backlog = self.wal().backlog().await?;
        let checkpoints = futures::future::try_join_all(backlog.iter().map(|b| self.wal().checkpoint(b.shard))).await?;
        Ok(Status {
            mode: "wal",
            tenant: None,
            pending: backlog.iter().map(|b| b.pending).sum(),
            pending_capped: backlog.iter().any(|b| b.capped),
            oldest_pending_age_ms: crate::wal::oldest_of(&backlog).as_ref().and_then(age_ms),
            checkpoint: checkpoints.iter().flatten().max().map(|c| c.to_string()),
            shards: backlog
                .into_iter()
                .zip(checkpoints)
                .map(|(b, checkpoint)| ShardStatus {
                    shard: b.shard.partition(),
                    pending: b.pending,
                    pending_capped: b.capped,
                    oldest_pending_age_ms: b.oldest.as_ref().and_then(age_ms),
                    checkpoint: checkpoint.map(|c| c.to_string()),
                })
                .collect(),
            poison: self.store.approximate_count(&self.names.poison_queue).await?,
            dead: self.wal().dead_count().await?,
            requests: self.requests.as_ref().map(|c| c.snapshot()),
        })
    }

    /// One sweep (see `crate::apply::sweep`).
    pub async fn sweep(&self) -> Result<SweepReport> {
        if self.single.is_some() {
            // No WAL and no tombstones: a sweep has nothing to do (the Functions timer may
            // still call it).
            return Ok(SweepReport::default());
        }
        self.applier().sweep(self.opts.sweep_apply_after).await
    }

    /// Handles one apply-queue message (decoded text, i.e. after Base64). Hints apply the
    /// shard they name; intents are logged once per `message_id` (in shard 0) and applied. A
    /// message that can never succeed is reported as [`MessageOutcome::Rejected`] with its
    /// reason, having written nothing; a transient failure is an `Err` (retry the message).
    /// Queue transport (decoding, poisoning, retries) is `crate::dispatch`'s.
    pub async fn process_message(&self, text: &str, message_id: &str) -> Result<MessageOutcome> {
        let result = self.handle_message(text, message_id).await;
        match &result {
            Ok(MessageOutcome::Rejected { .. }) => self.apply_metrics.poisoned(),
            Err(_) => self.apply_metrics.retried(),
            Ok(MessageOutcome::Applied { .. }) => {}
        }
        result
    }

    async fn handle_message(&self, text: &str, message_id: &str) -> Result<MessageOutcome> {
        if let Err(e) = self.wal_mode_only("the apply queue") {
            return Ok(MessageOutcome::Rejected { reason: e.to_string() });
        }
        let message = match messages::parse(text) {
            Ok(m) => m,
            Err(e) => return Ok(MessageOutcome::Rejected { reason: e.to_string() }),
        };
        let (shard, id) = match message {
            Message::Hint(h) => match ShardId::from_partition(&h.shard) {
                Some(shard) => (shard, None),
                None => {
                    let reason = format!("hint: '{}' is not a WAL shard (wal, wal-01..)", h.shard);
                    return Ok(MessageOutcome::Rejected { reason });
                }
            },
            Message::Intent(i) => {
                let op = match i.to_op() {
                    Ok(op) => op,
                    Err(e) => return Ok(MessageOutcome::Rejected { reason: e.to_string() }),
                };
                let logged = self
                    .schemas
                    .under_schema(|schema| {
                        let op = op.clone();
                        async move {
                            // Logged as a direct write would be: redacted record, blinded filter.
                            let op = match self.check_intent(&schema, op) {
                                Ok(op) => op,
                                Err(e) => return Ok(Err(e.to_string())),
                            };
                            Ok(Ok(self.wal().append_intent(op, message_id, schema.version()).await?))
                        }
                    })
                    .await?;
                match logged {
                    Ok(id) => (ShardId::ZERO, Some(id.to_string())),
                    Err(reason) => return Ok(MessageOutcome::Rejected { reason }),
                }
            }
        };
        let started = crate::env::now();
        let outcome = self.applier().apply_shard(shard).await?;
        self.record_apply(&shard.partition(), &outcome, started);
        if let DrainOutcome::Partial { .. } = outcome {
            // Out of time with entries still pending: hand the rest to the next invocation.
            if let Some(oldest) = self.wal().oldest_pending(shard).await? {
                self.hint(shard, &oldest);
            }
        }
        Ok(MessageOutcome::Applied { id })
    }

    /// A queue intent's operation as it is logged (validated under `schema`, redacted,
    /// blinded), or why it can never be logged.
    fn check_intent(&self, schema: &Schema, op: Op) -> Result<Op> {
        Ok(match op {
            Op::Upsert { record } => Op::Upsert { record: self.check_record(schema, record)?.0 },
            Op::Replace { filter, record } => {
                Op::Replace { filter: self.check_filter(schema, filter)?, record: self.check_record(schema, record)?.0 }
            }
            Op::Delete { filter } => Op::Delete { filter: self.check_filter(schema, filter)? },
            Op::Schema { .. } => return Err(Error::invalid("intent: schema changes cannot be queued")),
            Op::RemoveRow { .. } => return Err(Error::invalid("intent: row removals cannot be queued")),
        })
    }

    /// Options in force.
    pub fn options(&self) -> &CatalogOptions {
        &self.opts
    }
}

/// A catalog's WAL and apply engine, for the binary's operator commands and the tests
/// (re-exported by the hidden `cli_support` and `testing` modules; not part of the API).
#[cfg(any(feature = "cli", feature = "testing"))]
pub(crate) mod internals {
    use futures::stream::BoxStream;

    use super::Catalog;
    use crate::apply::Applier;
    use crate::error::Result;
    use crate::record::Record;
    use crate::wal::Wal;

    /// The internals of a [`Catalog`]: `use table_catalog::testing::CatalogInternals` and
    /// call `catalog.wal()`, `catalog.applier()`.
    pub trait CatalogInternals {
        /// The WAL.
        fn wal(&self) -> &Wal;
        /// The apply engine.
        fn applier(&self) -> &Applier;
        /// In single-partition mode, every record once, `segment` owner rows per request
        /// (the export of that mode); `None` in WAL mode.
        fn single_records(&self, segment: usize) -> Option<BoxStream<'static, Result<Record>>>;
    }

    impl CatalogInternals for Catalog {
        fn wal(&self) -> &Wal {
            Catalog::wal(self)
        }
        fn applier(&self) -> &Applier {
            Catalog::applier(self)
        }
        fn single_records(&self, segment: usize) -> Option<BoxStream<'static, Result<Record>>> {
            Catalog::single_records(self, segment)
        }
    }
}

/// Checks [`Filter::returning`] against the index the lookup reads: 1 to
/// [`query::MAX_RETURNED_FIELDS`] valid field names, each one the index's rows hold
/// (`crate::projection`; every field for an `all` index). Errors name the field and the
/// limit or the index.
fn check_returning(schema: &Schema, filter: &Filter) -> Result<()> {
    let Some(fields) = &filter.returning else { return Ok(()) };
    if fields.is_empty() || fields.len() > query::MAX_RETURNED_FIELDS {
        return Err(Error::invalid(format!(
            "fields: {} fields; name 1 to {} (fields=a,b)",
            fields.len(),
            query::MAX_RETURNED_FIELDS
        )));
    }
    let (index, _) = filter.index_read(schema)?;
    let projection = schema.projection_of(&index);
    for field in fields {
        crate::record::validate_field_name(field).map_err(|e| Error::invalid(format!("fields: {e}")))?;
        if !schema.holds(projection, field) {
            return Err(Error::invalid(format!(
                "fields: '{field}' is not held by the rows of index '{index}' (projection {projection}); name only fields they hold (its identity, indexed and included fields), or leave fields out to get whole records"
            )));
        }
    }
    Ok(())
}
