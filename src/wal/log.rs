//! The write-ahead log of one catalog ([`Wal`]): the handle every part of the WAL works
//! through (its store, table, options, shard count and appender), its reads of the pending
//! partitions and the backlog, and appending (group commit: `super::append`).

use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::Arc;

use super::entry::{Op, WalEntry};
use super::id::WalId;
use super::layout::{intent_marker_key, PENDING_BEFORE};
use super::options::WalOptions;
use super::shard::ShardId;
use super::{append, clock, max_row, shard};
use crate::error::{Error, Result};
use crate::faults;
use crate::store::{BatchOp, Entity, RowRange, Store, StoreError, Value};

/// Pending and dead entries are counted up to this many per shard ([`Wal::pending_stats`],
/// [`Wal::dead_count`]): at most 11 keys-only requests per shard on Azure, so a status or
/// metrics scrape stays cheap under a backlog of any size. Counts at or above it are lower
/// bounds (`pending_capped` in the status).
pub const COUNT_CAP: u64 = 10_000;

/// The pending entries of one shard ([`Wal::backlog`]).
#[derive(Debug, Clone)]
pub struct ShardBacklog {
    /// The shard.
    pub shard: ShardId,
    /// Entries logged and not yet applied, counted up to [`COUNT_CAP`].
    pub pending: u64,
    /// The count reached [`COUNT_CAP`]: `pending` is a lower bound.
    pub capped: bool,
    /// The smallest pending id, if any.
    pub oldest: Option<WalId>,
}

/// The oldest pending id over shards, if any.
pub fn oldest_of(backlog: &[ShardBacklog]) -> Option<WalId> {
    backlog.iter().filter_map(|b| b.oldest.clone()).min()
}

/// The WAL of one catalog: shards, append, leases, checkpoints.
pub struct Wal {
    pub(crate) store: Arc<dyn Store>,
    /// WAL table name.
    pub(crate) table: String,
    pub(crate) opts: WalOptions,
    /// Lease owner id of this process.
    pub(crate) owner: String,
    /// Group-commit appender and id clock of this process.
    pub(crate) appender: append::Appender,
    /// Shards new entries are routed over (the stored count when this process opened).
    shards: AtomicU16,
    /// The schema version in force in this process (set by the applier; written into the
    /// lease rows this process takes, see [`lease`]).
    schema_version: AtomicU64,
    /// What this process last saw of the checkpoint and seal rows ([`max_row::Known`]).
    pub(crate) known: max_row::Known,
    /// The legacy checkpoint row of each shard as this process read it once
    /// (`crate::wal::checkpoint`): only processes of older versions write those rows, and
    /// they stop before new ones apply.
    pub(crate) legacy_checkpoints: std::sync::Mutex<std::collections::HashMap<ShardId, Option<String>>>,
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal").field("table", &self.table).field("shards", &self.shard_count()).finish()
    }
}

fn pending_range() -> RowRange {
    RowRange { before: Some(PENDING_BEFORE.into()), ..RowRange::default() }
}
impl Wal {
    /// A WAL in `table`. Call [`Wal::init`] before use.
    pub fn new(store: Arc<dyn Store>, table: String, opts: WalOptions) -> Wal {
        let owner = crate::env::uuid().to_string();
        let clock = clock::Clock::new(&owner, opts.clock_skew_us);
        let appender = append::Appender::new(store.clone(), table.clone(), clock, opts.max_queued_writes);
        let shards = AtomicU16::new(opts.shards.clamp(1, shard::MAX_SHARDS));
        Wal {
            store,
            table,
            opts,
            owner,
            appender,
            shards,
            schema_version: AtomicU64::new(0),
            known: max_row::Known::default(),
            legacy_checkpoints: std::sync::Mutex::default(),
        }
    }

    /// Creates the WAL table, raises the stored shard count to the configured one
    /// ([`shard::raise_count`]; new entries are then routed over the count in force) and
    /// reads the clock's high row (creating it when missing, [`clock`]).
    pub async fn init(&self) -> Result<()> {
        shard::check_count("wal.shards (TABLE_CATALOG_WAL_SHARDS, --wal-shards)", self.opts.shards)?;
        self.store.create_table(&self.table).await?;
        let count = shard::raise_count(self.store.as_ref(), &self.table, self.opts.shards).await?;
        self.shards.store(count, Ordering::Relaxed);
        // The clock's high row, read once here (and created for a catalog from before it,
        // `clock`): the process's first append round then starts from its ETag, and no write
        // waits for the row's creation.
        self.appender.clock.read(self.store.as_ref(), &self.table).await?;
        Ok(())
    }

    /// The schema version in force in this process.
    pub fn schema_version(&self) -> u64 {
        self.schema_version.load(Ordering::Relaxed)
    }

    /// Records that this process now uses schema `version` (never goes back).
    pub(crate) fn note_schema_version(&self, version: u64) {
        self.schema_version.fetch_max(version, Ordering::Relaxed);
    }

    /// The storage backend.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The WAL table name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Shards new entries are routed over.
    pub fn shard_count(&self) -> u16 {
        self.shards.load(Ordering::Relaxed)
    }

    /// The stored shard count, read now: every shard that may hold entries is below it
    /// (another process may have raised it since this one opened). Also raises this
    /// process's routing count to it.
    pub async fn current_shard_count(&self) -> Result<u16> {
        let n = shard::stored_count(self.store.as_ref(), &self.table).await?.max(self.shard_count());
        self.shards.fetch_max(n, Ordering::Relaxed);
        Ok(n)
    }

    /// Up to `limit` (1..=1,000) pending entries of `shard` (raw entities) in id order. Pages
    /// that come back short or empty with a continuation token are followed (the one pager),
    /// so an empty result means nothing is pending. One request unless the service splits
    /// the answer.
    pub async fn pending_page(&self, shard: ShardId, limit: usize) -> Result<Vec<Entity>> {
        self.pending_in(shard, &pending_range(), limit).await
    }

    /// Up to `limit` pending ids of `shard` below `bound`, in id order (see
    /// [`Wal::pending_page`]).
    pub async fn pending_before(&self, shard: ShardId, bound: &WalId, limit: usize) -> Result<Vec<WalId>> {
        let range = RowRange { before: Some(bound.as_str().min(PENDING_BEFORE).to_string()), ..RowRange::default() };
        let found = self.pending_in(shard, &range, limit).await?;
        Ok(found.into_iter().map(|e| WalId::from_stored(e.row_key)).collect())
    }

    async fn pending_in(&self, shard: ShardId, range: &RowRange, limit: usize) -> Result<Vec<Entity>> {
        use futures::{StreamExt, TryStreamExt};
        let partition = shard.partition();
        let limit = limit.clamp(1, crate::store::MAX_PAGE);
        let entities = crate::store::pager::entities(self.store.as_ref(), &self.table, &partition, range, limit);
        Ok(entities.take(limit).try_collect().await?)
    }

    /// Makes the id clock's high-water mark at least `micros` (see
    /// [`clock::Clock::publish_at_least`]: free when this process saw it there already).
    pub(crate) async fn publish_at_least(&self, micros: i64) -> Result<()> {
        self.appender.clock.publish_at_least(self.store.as_ref(), &self.table, micros).await
    }

    /// The id clock's high-water mark, in µs: every id published by any process (every
    /// acknowledged write's id) is at or below it. One request ([`clock::Clock::high_water`]).
    pub async fn high_water(&self) -> Result<i64> {
        self.appender.clock.high_water(self.store.as_ref(), &self.table).await
    }

    /// The catalog's schema version as the clock partition holds it now (one query of at
    /// most two entities, [`clock::Clock::read`]).
    pub async fn current_schema_version(&self) -> Result<u64> {
        Ok(self.appender.clock.read(self.store.as_ref(), &self.table).await?.schema_version)
    }

    /// This process's share of the catalog's writes, as its clock publications over the
    /// catalog's ([`clock::WriteShare`]).
    pub fn write_share(&self) -> clock::WriteShare {
        self.appender.clock.write_share()
    }

    /// The oldest pending id of `shard`, if any (one request).
    pub async fn oldest_pending(&self, shard: ShardId) -> Result<Option<WalId>> {
        Ok(self.pending_page(shard, 1).await?.first().map(|e| WalId::from_stored(e.row_key.clone())))
    }

    /// Number of pending entries of `shard`, counted up to [`COUNT_CAP`] (a count at or
    /// above it is a lower bound), and its oldest pending id. Reads keys only (see
    /// [`crate::store::TableStore::count_range`]): one request per 1,000 entries on Azure, so
    /// at most 11 per shard however large the backlog (status, metrics and the sweeper's
    /// report read it, and a backlog is when storage is busiest).
    pub async fn pending_stats(&self, shard: ShardId) -> Result<(u64, Option<WalId>)> {
        let (count, first) =
            self.store.count_range(&self.table, &shard.partition(), &pending_range(), COUNT_CAP).await?;
        Ok((count, first.map(WalId::from_stored)))
    }

    /// Pending entries of every shard of the current count ([`Wal::current_shard_count`]),
    /// in shard order, read concurrently: one [`Wal::pending_stats`] per shard.
    pub async fn backlog(&self) -> Result<Vec<ShardBacklog>> {
        self.backlog_over(self.current_shard_count().await?).await
    }

    /// [`Wal::backlog`] of shards `0..count`, for a caller that read the count already.
    pub async fn backlog_over(&self, count: u16) -> Result<Vec<ShardBacklog>> {
        futures::future::try_join_all(ShardId::all(count).map(|shard| async move {
            let (pending, oldest) = self.pending_stats(shard).await?;
            Ok(ShardBacklog { shard, pending, capped: pending >= COUNT_CAP, oldest })
        }))
        .await
    }

    /// True while the entry is pending in `shard` (logged and not yet applied).
    pub async fn is_pending(&self, shard: ShardId, id: &WalId) -> Result<bool> {
        Ok(self.store.get(&self.table, &shard.partition(), id.as_str()).await?.is_some())
    }

    /// The shard where entry `id` is pending, if it is pending anywhere (one read per shard,
    /// concurrently).
    pub async fn find_pending(&self, id: &WalId) -> Result<Option<ShardId>> {
        let count = self.current_shard_count().await?;
        let found = futures::future::try_join_all(
            ShardId::all(count)
                .map(|s| async move { Ok::<_, crate::Error>(self.is_pending(s, id).await?.then_some(s)) }),
        )
        .await?;
        Ok(found.into_iter().flatten().next())
    }
}

impl Wal {
    /// Logs operations durably, each in the shard it is routed to, and returns their ids,
    /// in order. Concurrent callers share rounds (see the module docs); when this returns
    /// `Ok`, every entry is durable and the ids are published, so any operation issued
    /// afterwards, in any process, gets a larger id. On `Err` some entries may have been
    /// written; they will be applied.
    pub async fn append(&self, ops: Vec<(ShardId, Op)>) -> Result<Vec<WalId>> {
        self.append_under(ops, self.schema_version()).await
    }

    /// [`Wal::append`] of operations validated under schema version `schema_version`:
    /// [`Error::SchemaChanged`] (nothing written) when the catalog's schema is newer by the
    /// clock read of the round (see the module docs).
    pub async fn append_under(&self, ops: Vec<(ShardId, Op)>, schema_version: u64) -> Result<Vec<WalId>> {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        let ids = self.appender.append(ops, schema_version).await?;
        faults::point("after_wal_write")?;
        Ok(ids)
    }

    /// Logs an operation that arrived as queue message `message_id`, once: a redelivered
    /// message returns the id it was first logged under. The entry and its marker are
    /// written in one entity group transaction, in shard 0 (so a redelivery finds the
    /// marker whatever the shard count is by then).
    pub async fn append_intent(&self, op: Op, message_id: &str, schema_version: u64) -> Result<WalId> {
        let marker_key = intent_marker_key(message_id);
        if let Some(id) = self.intent_logged(&marker_key).await? {
            return Ok(id);
        }
        let current = self.appender.clock.read(self.store.as_ref(), &self.table).await?;
        if schema_version < current.schema_version {
            return Err(Error::SchemaChanged(current.schema_version));
        }
        let (mut ids, last) = self.appender.ids_above(current.high, 1);
        let id = ids.remove(0);
        let shard = ShardId::ZERO.partition();
        let entry = WalEntry { id: id.clone(), op, schema_version, at: None, resume: None }.to_entity(&shard);
        let marker = Entity::new(shard.as_str(), marker_key.as_str())
            .with("id", Value::String(id.to_string()))
            .with("at", Value::Int64(super::id::now_micros()));
        let write = async {
            match self.store.batch(&self.table, &shard, &[BatchOp::Insert(entry), BatchOp::Insert(marker)]).await {
                Ok(_) => Ok(id.clone()),
                Err(StoreError::BatchFailed { .. }) => {
                    // Logged meanwhile by another delivery of the same message (or by a retried
                    // request of ours that committed).
                    self.intent_logged(&marker_key).await?.ok_or_else(|| {
                        Error::Store(StoreError::Other("intent batch failed but no marker was written".into()))
                    })
                }
                Err(e) => Err(e.into()),
            }
        };
        let publish = self.appender.clock.publish(self.store.as_ref(), &self.table, last);
        let (logged, published) = tokio::join!(write, publish);
        published?;
        logged
    }

    async fn intent_logged(&self, marker_key: &str) -> Result<Option<WalId>> {
        Ok(self
            .store
            .get(&self.table, super::layout::SHARD, marker_key)
            .await?
            .and_then(|m| m.str("id").map(|s| WalId::from_stored(s.to_string()))))
    }
}
