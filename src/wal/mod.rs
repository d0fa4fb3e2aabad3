//! The write-ahead log: how a write becomes durable before its multi-partition fan-out.
//! Applying it (fan-out, fencing, tombstones, the barrier) is [`crate::apply`].
//!
//! Layout of the WAL table (PartitionKey / RowKey):
//! - `wal`, `wal-01`.. / [`WalId`]: pending entries ([`entry`]) of each shard ([`shard`]).
//!   An entry is removed once applied.
//! - `wal` / `intent:{message}`: marks a queue intent as logged (see [`Wal::append_intent`]).
//! - `metadata` / `checkpoint`, `checkpoint-wal-01`..: the last applied WAL id of each shard,
//!   property `datetime` (as the reference) ([`checkpoint`]).
//! - `clock` / `{inverted last}-{owner}`: the highest id timestamp each process published,
//!   largest first ([`clock`]). Catalogs from before keep `metadata` / `clock-*` rows, read
//!   once per process and pruned by the sweeper.
//! - `metadata` / `lease-wal`, `lease-wal-01`..: the applier lease of each shard ([`lease`]).
//! - `metadata` / `shards`: the shard count ([`shard`]).
//! - `metadata` / `schema`: the catalog schema, stored on first use.
//! - `tombstones` / `{WalId}_{hash}`: tombstones written by deletes, for the sweeper.
//! - `dead` / [`WalId`]: entries that can never be applied, with the reason, so they never
//!   block the entries behind them.

pub mod append;
pub mod checkpoint;
pub mod clock;
pub mod entry;
pub mod id;
pub mod lease;
pub(crate) mod max_row;
pub mod schema_row;
pub mod seal;
pub mod shard;

pub use entry::{Op, WalEntry};
pub use id::WalId;
pub use shard::ShardId;

use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;
use crate::store::{Entity, RowRange, Store};

/// The PartitionKey of shard 0 (the partition of catalogs from before shards).
pub const SHARD: &str = "wal";
/// PartitionKey of metadata rows.
pub const METADATA: &str = "metadata";
/// PartitionKey of the tombstone index.
pub const TOMBSTONES: &str = "tombstones";
/// PartitionKey of entries that cannot be applied.
pub const DEAD: &str = "dead";
/// Pending and dead entries are counted up to this many per shard ([`Wal::pending_stats`],
/// [`Wal::dead_count`]): at most 11 keys-only requests per shard on Azure, so a status or
/// metrics scrape stays cheap under a backlog of any size. Counts at or above it are lower
/// bounds (`pending_capped` in the status).
pub const COUNT_CAP: u64 = 10_000;
/// Property of a dead entry: why it can never be applied (at most 4,000 characters).
pub const DEAD_REASON: &str = "reason";
/// Property of a dead entry: the pending partition (shard) it was moved from. Absent on
/// entries buried before it existed.
pub const DEAD_FROM: &str = "from";
/// Property of a dead entry: when it was moved, in microseconds since the Unix epoch.
pub const DEAD_AT: &str = "died_at";
/// RowKeys of pending entries sort below this bound (ids start with a digit).
pub const PENDING_BEFORE: &str = ":";
/// RowKey prefix of intent markers in the shard partition.
pub const INTENT_PREFIX: &str = "intent:";

/// Whether `e` is a pending WAL entry: in a shard partition, below the markers (how the
/// tests' fault injector recognises entry writes: `crate::store::fault::FaultStore::with_entries`).
#[cfg(any(test, feature = "testing"))]
pub fn is_pending_entry(e: &Entity) -> bool {
    ShardId::from_partition(&e.partition_key).is_some() && e.row_key.as_str() < PENDING_BEFORE
}

/// Tunables of the WAL, with defaults suited to Azure.
#[derive(Debug, Clone)]
pub struct WalOptions {
    /// How long an applier lease lasts before others may take it over.
    pub lease_duration: Duration,
    /// Rows written concurrently during a fan-out.
    pub apply_concurrency: usize,
    /// How long a tombstone is kept after the delete that wrote it (must exceed the lease
    /// duration plus the longest storage request, so no stale applier can still write).
    pub tombstone_grace: Duration,
    /// How long an intent marker is kept (at least the queue message time-to-live: 7 days).
    pub intent_marker_ttl: Duration,
    /// Longest an apply pass keeps going before it stops at a group boundary (so one queue
    /// invocation stays well inside the Functions timeout; the rest is picked up by the next
    /// message or the sweeper).
    pub apply_budget: Duration,
    /// Offset added to this process's clock when allocating WAL ids, in microseconds (0 in
    /// production; the reliability tests skew writers' clocks with it).
    pub clock_skew_us: i64,
    /// WAL shards new entries are spread over (1..=`shard::MAX_SHARDS`): each has its own
    /// WAL partition, lease and checkpoint, and its own applier. A catalog remembers the
    /// largest count it was ever opened with, and appliers, the sweeper and `status` cover
    /// that many.
    pub shards: u16,
    /// Rows per page when a replace or delete reads its filter's partition (1..=1,000, the
    /// service's page limit; default 1,000). A filter entry past its pass's deadline stops
    /// between two such pages (`crate::apply::filter`); tests and the simulator make them
    /// small so filters span many pages.
    pub filter_page: usize,
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            lease_duration: Duration::from_secs(60),
            apply_concurrency: 32,
            tombstone_grace: Duration::from_secs(600),
            intent_marker_ttl: Duration::from_secs(8 * 24 * 3600),
            apply_budget: Duration::from_secs(60),
            clock_skew_us: 0,
            shards: shard::DEFAULT_SHARDS,
            filter_page: crate::store::MAX_PAGE,
        }
    }
}

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
        let appender = append::Appender::new(store.clone(), table.clone(), clock);
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
        }
    }

    /// Creates the WAL table and raises the stored shard count to the configured one
    /// ([`shard::raise_count`]); new entries are then routed over the count in force.
    pub async fn init(&self) -> Result<()> {
        shard::check_count("wal.shards (TABLE_CATALOG_WAL_SHARDS, --wal-shards)", self.opts.shards)?;
        self.store.create_table(&self.table).await?;
        let count = shard::raise_count(self.store.as_ref(), &self.table, self.opts.shards).await?;
        self.shards.store(count, Ordering::Relaxed);
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

    /// This process's share of the catalog's writes, as its clock reads see it
    /// ([`clock::WriteShare`]).
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

    /// Why entry `id` was moved to the dead partition, if it was.
    pub async fn dead_reason(&self, id: &WalId) -> Result<Option<String>> {
        Ok(self
            .store
            .get(&self.table, DEAD, id.as_str())
            .await?
            .map(|e| e.str(DEAD_REASON).unwrap_or_default().to_string()))
    }

    /// Every dead entry in id order, read a page of 1,000 at a time.
    pub fn dead_entries(&self) -> futures::stream::BoxStream<'_, Result<DeadEntry>> {
        use futures::StreamExt;
        crate::store::pager::entities(self.store.as_ref(), &self.table, DEAD, &DEAD_RANGE, 1000)
            .map(|e| e.map(|e| DeadEntry::of(&e)).map_err(Into::into))
            .boxed()
    }

    /// One page of dead entries in id order: at most `limit` (1-1,000), from `continuation`
    /// (the token of the previous page). One request.
    pub async fn dead_page(&self, limit: usize, continuation: Option<&str>) -> Result<DeadPage> {
        if !(1..=1000).contains(&limit) {
            return Err(crate::Error::invalid(format!("limit: {limit} is out of range (1..=1000)")));
        }
        let page = self.store.query_partition(&self.table, DEAD, &RowRange::default(), limit, continuation).await?;
        Ok(DeadPage { entries: page.entities.iter().map(DeadEntry::of).collect(), continuation: page.continuation })
    }

    /// Entries moved aside because they can never be applied, counted up to [`COUNT_CAP`]
    /// (keys only: see [`crate::store::TableStore::count_range`]).
    pub async fn dead_count(&self) -> Result<u64> {
        Ok(self.store.count_range(&self.table, DEAD, &RowRange::default(), COUNT_CAP).await?.0)
    }
}

/// The whole dead partition.
static DEAD_RANGE: RowRange = RowRange { from: None, after: None, before: None, to: None };

/// An entry of the dead partition, as `table-catalog dead` and `GET /api/wal/dead` list it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DeadEntry {
    /// Its WAL id.
    pub id: String,
    /// `upsert`, `replace` or `delete`; `None` when the entry is unreadable.
    pub op: Option<String>,
    /// The pending partition it was moved from (`wal`, `wal-03`, ...), when recorded.
    pub shard: Option<String>,
    /// Why it can never be applied.
    pub reason: String,
    /// When it was moved, in microseconds since the Unix epoch, when recorded.
    pub died_at_us: Option<i64>,
}

impl DeadEntry {
    /// The listing of a stored dead entity.
    pub fn of(e: &Entity) -> DeadEntry {
        DeadEntry {
            id: e.row_key.clone(),
            op: e.str("op").map(str::to_string),
            shard: e.str(DEAD_FROM).map(str::to_string),
            reason: e.str(DEAD_REASON).unwrap_or_default().to_string(),
            died_at_us: match e.properties.get(DEAD_AT) {
                Some(crate::store::Value::Int64(t)) => Some(*t),
                _ => None,
            },
        }
    }
}

/// One page of dead entries and the continuation token of the next, if any.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DeadPage {
    /// The entries, in id order.
    pub entries: Vec<DeadEntry>,
    /// `Some` when more may follow (pass it back to get the next page).
    pub continuation: Option<String>,
}

/// RowKey of the marker for queue message `message_id` (escaped; hashed when long).
pub fn intent_marker_key(message_id: &str) -> String {
    let escaped = crate::keys::escape_key(message_id);
    if escaped.encode_utf16().count() <= 200 {
        format!("{INTENT_PREFIX}{escaped}")
    } else {
        format!("{INTENT_PREFIX}md5-{}", crate::keys::fingerprint([message_id]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intent_marker_keys_are_bounded() {
        assert_eq!(intent_marker_key("abc-123"), "intent:abc-123");
        assert!(intent_marker_key(&"x/".repeat(300)).len() < 50);
        assert!(intent_marker_key("a").as_str() > PENDING_BEFORE);
    }
}
