//! The write-ahead log: how a write becomes durable before its multi-partition fan-out, and
//! how the fan-out is applied exactly once in effect, whatever crashes or duplicates happen.
//!
//! Layout of the WAL table (PartitionKey / RowKey):
//! - `wal` / [`WalId`]: pending entries ([`entry`]). An entry is removed once applied.
//! - `wal` / `intent:{message}`: marks a queue intent as logged (see [`Wal::append_intent`]).
//! - `metadata` / `checkpoint`: the last applied WAL id, property `datetime` (as the reference).
//! - `metadata` / `clock-{owner}`: the highest id timestamp each process handed out ([`clock`]).
//! - `metadata` / `lease-wal`: the applier lease ([`lease`]).
//! - `metadata` / `schema`: the catalog schema, stored on first use.
//! - `tombstones` / `{WalId}_{hash}`: tombstones written by deletes, for the sweeper.
//! - `dead` / [`WalId`]: entries that can never be applied, with the reason, so they never
//!   block the entries behind them.
//!
//! The protocol (apply order, fencing, recovery) is in [`apply`]; periodic maintenance in
//! [`sweep`].

pub mod append;
pub mod apply;
pub mod clock;
pub mod entry;
pub mod id;
pub mod lease;
pub mod row_cache;
pub mod shard;
pub mod sweep;

pub use entry::{Op, WalEntry};
pub use id::WalId;

use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::schema::Schema;
use crate::store::{ETag, Entity, IfMatch, RowRange, Store, StoreError, Value};

/// The single shard's PartitionKey. (The layout allows `wal-00`.. shards later.)
pub const SHARD: &str = "wal";
/// PartitionKey of metadata rows.
pub const METADATA: &str = "metadata";
/// PartitionKey of the tombstone index.
pub const TOMBSTONES: &str = "tombstones";
/// PartitionKey of entries that cannot be applied.
pub const DEAD: &str = "dead";
/// RowKeys of pending entries sort below this bound (ids start with a digit).
pub const PENDING_BEFORE: &str = ":";
/// RowKey prefix of intent markers in the shard partition.
pub const INTENT_PREFIX: &str = "intent:";

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
    /// Longest an apply pass keeps going before it stops at a page boundary (so one queue
    /// invocation stays well inside the Functions timeout; the rest is picked up by the next
    /// message or the sweeper).
    pub apply_budget: Duration,
    /// Offset added to this process's clock when allocating WAL ids, in microseconds (0 in
    /// production; the reliability tests skew writers' clocks with it).
    pub clock_skew_us: i64,
    /// WAL shards new entries are spread over (1..=[`shard::MAX_SHARDS`]): each has its own
    /// WAL partition, lease and checkpoint, and its own applier. A catalog remembers the
    /// largest count it was ever opened with, and appliers, the sweeper and `status` cover
    /// that many.
    pub shards: u16,
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
        }
    }
}

/// The WAL of one catalog: append, apply, sweep.
pub struct Wal {
    pub(crate) store: Arc<dyn Store>,
    /// WAL table name.
    pub(crate) table: String,
    /// Catalog table name.
    pub(crate) catalog_table: String,
    pub(crate) schema: Schema,
    pub(crate) opts: WalOptions,
    /// Lease owner id of this process.
    pub(crate) owner: String,
    /// One applier per process at a time.
    pub(crate) apply_lock: tokio::sync::Mutex<()>,
    /// Group-commit appender and id clock of this process.
    pub(crate) appender: append::Appender,
    /// Catalog rows this process last wrote or read (ETag, WAL id), for one-request updates.
    pub(crate) rows: row_cache::RowCache,
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal").field("table", &self.table).field("catalog_table", &self.catalog_table).finish()
    }
}

fn is_conflict(e: &StoreError) -> bool {
    matches!(e, StoreError::AlreadyExists(_) | StoreError::PreconditionFailed(_) | StoreError::NotFound(_))
}

impl Wal {
    /// A WAL over `table` for the catalog table `catalog_table`. Call [`Wal::init`] before use.
    pub fn new(store: Arc<dyn Store>, table: String, catalog_table: String, schema: Schema, opts: WalOptions) -> Wal {
        let owner = uuid::Uuid::new_v4().to_string();
        let clock = clock::Clock::new(&owner, opts.clock_skew_us);
        let appender = append::Appender::new(store.clone(), table.clone(), clock);
        Wal {
            store,
            table,
            catalog_table,
            schema,
            opts,
            owner,
            apply_lock: tokio::sync::Mutex::new(()),
            appender,
            rows: row_cache::RowCache::default(),
        }
    }

    /// Creates both tables and stores or checks the schema: a catalog opened with another
    /// schema than the one it was created with fails with [`Error::SchemaMismatch`].
    pub async fn init(&self) -> Result<()> {
        self.store.create_table(&self.table).await?;
        self.store.create_table(&self.catalog_table).await?;
        let want = Entity::new(METADATA, "schema")
            .with("index_keys", Value::String(self.schema.index_keys.join(",")))
            .with("row_key", Value::String(self.schema.row_key.clone()))
            .with("v", Value::Int32(entry::FORMAT_VERSION));
        let stored = match self.store.insert(&self.table, &want).await {
            Ok(_) => return Ok(()),
            Err(StoreError::AlreadyExists(_)) => self.store.get(&self.table, METADATA, "schema").await?,
            Err(e) => return Err(e.into()),
        };
        let stored = stored.ok_or_else(|| Error::SchemaMismatch("schema row vanished while opening".into()))?;
        let keys = stored.str("index_keys").unwrap_or_default();
        let row_key = stored.str("row_key").unwrap_or_default();
        if Schema::parse_list(keys) != self.schema.index_keys || row_key != self.schema.row_key {
            return Err(Error::SchemaMismatch(format!(
                "catalog '{}' was created with index keys [{keys}] and row key '{row_key}', but this process is configured with index keys [{}] and row key '{}'; use the original schema or another catalog name",
                self.catalog_table,
                self.schema.index_keys.join(","),
                self.schema.row_key
            )));
        }
        Ok(())
    }

    /// Up to `limit` pending entries (raw entities) in id order.
    pub async fn pending_page(&self, limit: usize) -> Result<Vec<Entity>> {
        let range = RowRange { before: Some(PENDING_BEFORE.into()), ..RowRange::default() };
        Ok(self.store.query_partition(&self.table, SHARD, &range, limit, None).await?.entities)
    }

    /// Number of pending entries and the oldest pending id. Reads keys only (see
    /// [`crate::store::TableStore::count_range`]): one request per 1,000 entries on Azure.
    pub async fn pending_stats(&self) -> Result<(u64, Option<WalId>)> {
        let range = RowRange { before: Some(PENDING_BEFORE.into()), ..RowRange::default() };
        let (count, first) = self.store.count_range(&self.table, SHARD, &range).await?;
        Ok((count, first.map(WalId::from_stored)))
    }

    /// True while the entry is pending (logged and not yet applied).
    pub async fn is_pending(&self, id: &WalId) -> Result<bool> {
        Ok(self.store.get(&self.table, SHARD, id.as_str()).await?.is_some())
    }

    /// The last applied id recorded in the checkpoint row.
    pub async fn checkpoint(&self) -> Result<Option<WalId>> {
        Ok(self
            .store
            .get(&self.table, METADATA, "checkpoint")
            .await?
            .and_then(|e| e.str("datetime").map(|s| WalId::from_stored(s.to_string()))))
    }

    /// Moves the checkpoint forward to `id` (never backwards): read, then replace under the
    /// ETag. A concurrent applier's move makes the swap fail with 412; it is retried with
    /// capped exponential backoff and jitter (10 attempts, 2 ms to 200 ms), and a checkpoint
    /// found at or past `id` ends it.
    pub async fn advance_checkpoint(&self, id: &WalId) -> Result<()> {
        use backon::{ExponentialBuilder, Retryable};
        let attempt = || async {
            let cur = self.store.get(&self.table, METADATA, "checkpoint").await?;
            let e = Entity::new(METADATA, "checkpoint").with("datetime", Value::String(id.to_string()));
            let r = match &cur {
                Some(c) if c.str("datetime").is_some_and(|d| d >= id.as_str()) => return Ok(()),
                Some(c) => {
                    let tag = c.etag.clone().unwrap_or(ETag(String::new()));
                    self.store.replace(&self.table, &e, &IfMatch::Etag(tag)).await
                }
                None => self.store.insert(&self.table, &e).await,
            };
            r.map(|_| ())
        };
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(2))
            .with_max_delay(Duration::from_millis(200))
            .with_max_times(10)
            .with_jitter();
        Ok(attempt.retry(backoff).when(is_conflict).await?)
    }

    /// Why entry `id` was moved to the dead partition, if it was.
    pub async fn dead_reason(&self, id: &WalId) -> Result<Option<String>> {
        Ok(self
            .store
            .get(&self.table, DEAD, id.as_str())
            .await?
            .map(|e| e.str("reason").unwrap_or_default().to_string()))
    }

    /// Entries moved aside because they can never be applied (keys only: see
    /// [`crate::store::TableStore::count_range`]).
    pub async fn dead_count(&self) -> Result<u64> {
        Ok(self.store.count_range(&self.table, DEAD, &RowRange::default()).await?.0)
    }
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
