//! Checkpoints: the last applied WAL id of each shard (`metadata/checkpoint` for shard 0, as
//! the reference; `metadata/checkpoint-{partition}` for the others), property `datetime`.
//!
//! The applier advances a shard's checkpoint before it removes the applied entries, so an
//! entry that is no longer pending is always at or below its shard's checkpoint: that is
//! how `wal_state` tells applied from unknown.

use super::{ShardId, Wal, WalId, METADATA};
use crate::error::Result;

impl Wal {
    /// The last applied id recorded in `shard`'s checkpoint row.
    pub async fn checkpoint(&self, shard: ShardId) -> Result<Option<WalId>> {
        let stored =
            super::max_row::read(self.store.as_ref(), &self.table, METADATA, &shard.checkpoint_row(), "datetime")
                .await?;
        Ok(stored.map(WalId::from_stored))
    }

    /// The largest checkpoint over every shard (reads one row per shard, concurrently).
    pub async fn latest_checkpoint(&self) -> Result<Option<WalId>> {
        let count = self.current_shard_count().await?;
        let all = futures::future::try_join_all(ShardId::all(count).map(|s| self.checkpoint(s))).await?;
        Ok(all.into_iter().flatten().max())
    }

    /// Moves `shard`'s checkpoint forward to `id` (never backwards; a concurrent applier's
    /// move is retried: [`super::max_row::raise`]).
    pub async fn advance_checkpoint(&self, shard: ShardId, id: &WalId) -> Result<()> {
        super::max_row::raise(
            self.store.as_ref(),
            &self.known,
            &self.table,
            METADATA,
            &shard.checkpoint_row(),
            "datetime",
            id.as_str(),
        )
        .await
    }
}
