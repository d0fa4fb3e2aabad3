//! Checkpoints: the last applied WAL id of each shard (`metadata/checkpoint` for shard 0, as
//! the reference; `metadata/checkpoint-{partition}` for the others), property `datetime`.
//!
//! The applier advances a shard's checkpoint before it removes the applied entries, so an
//! entry that is no longer pending is always at or below its shard's checkpoint: that is
//! how `wal_state` tells applied from unknown.

use std::time::Duration;

use super::{ShardId, Wal, WalId, METADATA};
use crate::error::Result;
use crate::store::{ETag, Entity, IfMatch, StoreError, Value};

fn is_conflict(e: &StoreError) -> bool {
    matches!(e, StoreError::AlreadyExists(_) | StoreError::PreconditionFailed(_) | StoreError::NotFound(_))
}

impl Wal {
    /// The last applied id recorded in `shard`'s checkpoint row.
    pub async fn checkpoint(&self, shard: ShardId) -> Result<Option<WalId>> {
        Ok(self
            .store
            .get(&self.table, METADATA, &shard.checkpoint_row())
            .await?
            .and_then(|e| e.str("datetime").map(|s| WalId::from_stored(s.to_string()))))
    }

    /// The largest checkpoint over every shard (reads one row per shard, concurrently).
    pub async fn latest_checkpoint(&self) -> Result<Option<WalId>> {
        let count = self.current_shard_count().await?;
        let all = futures::future::try_join_all(ShardId::all(count).map(|s| self.checkpoint(s))).await?;
        Ok(all.into_iter().flatten().max())
    }

    /// Moves `shard`'s checkpoint forward to `id` (never backwards): read, then replace under
    /// the ETag. A concurrent applier's move makes the swap fail with 412; it is retried with
    /// capped exponential backoff and jitter (10 attempts, 2 ms to 200 ms), and a checkpoint
    /// found at or past `id` ends it.
    pub async fn advance_checkpoint(&self, shard: ShardId, id: &WalId) -> Result<()> {
        use backon::{ExponentialBuilder, Retryable};
        let row = shard.checkpoint_row();
        let attempt = || async {
            let cur = self.store.get(&self.table, METADATA, &row).await?;
            let e = Entity::new(METADATA, row.as_str()).with("datetime", Value::String(id.to_string()));
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
}
