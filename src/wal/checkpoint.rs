//! Checkpoints: the last applied WAL id of each shard, property `datetime`. Shard 0's row is
//! `metadata/checkpoint`, as the reference; every other shard's is `checkpoint` in its own
//! partition ([`ShardId::checkpoint_home`]), so checkpoint traffic spreads with the shards.
//!
//! The applier advances a shard's checkpoint before it removes the applied entries, so an
//! entry that is no longer pending is always at or below its shard's checkpoint: that is
//! how `wal_state` tells applied from unknown.
//!
//! **Catalogs from before the move** keep shard k's checkpoint in
//! `metadata/checkpoint-wal-{k:02}` ([`ShardId::legacy_checkpoint_row`]). Reading falls back
//! to that row while the shard's own row does not exist, and every advance raises the own row to
//! at least the legacy value (so the new row starts at the larger of the two, and later
//! raises to it change nothing), so a checkpoint never reads lower across the upgrade and "no
//! longer pending means at or below the checkpoint" keeps holding. The legacy row is left in
//! place (one small row per shard), and each process reads it once per shard.

use super::max_row;
use super::{ShardId, Wal, WalId, METADATA};
use crate::error::Result;

impl Wal {
    /// The last applied id recorded in `shard`'s checkpoint row (its legacy row in
    /// `metadata` when the shard's own row does not exist yet). One read, two for a catalog
    /// from before the move whose shard has not advanced since.
    pub async fn checkpoint(&self, shard: ShardId) -> Result<Option<WalId>> {
        let (pk, rk) = shard.checkpoint_home();
        let stored = match max_row::read(self.store.as_ref(), &self.table, &pk, &rk, "datetime").await? {
            Some(v) => Some(v),
            None => self.legacy_checkpoint(shard).await?,
        };
        Ok(stored.map(WalId::from_stored))
    }

    /// The legacy checkpoint of `shard`: read once per process, then remembered (only a
    /// process of an older version writes that row, and those stop before new ones apply),
    /// so a catalog created after the move pays one read per shard and process, not one per
    /// checkpoint read.
    async fn legacy_checkpoint(&self, shard: ShardId) -> Result<Option<String>> {
        let Some(rk) = shard.legacy_checkpoint_row() else { return Ok(None) };
        let cached = |wal: &Wal| wal.legacy_checkpoints.lock().unwrap_or_else(|p| p.into_inner()).get(&shard).cloned();
        if let Some(seen) = cached(self) {
            return Ok(seen);
        }
        let read = max_row::read(self.store.as_ref(), &self.table, METADATA, &rk, "datetime").await?;
        self.legacy_checkpoints.lock().unwrap_or_else(|p| p.into_inner()).insert(shard, read.clone());
        Ok(read)
    }

    /// The largest checkpoint over every shard (reads one row per shard, concurrently).
    pub async fn latest_checkpoint(&self) -> Result<Option<WalId>> {
        let count = self.current_shard_count().await?;
        let all = futures::future::try_join_all(ShardId::all(count).map(|s| self.checkpoint(s))).await?;
        Ok(all.into_iter().flatten().max())
    }

    /// Moves `shard`'s checkpoint forward to `id` (never backwards; a concurrent applier's
    /// move is retried: [`max_row::raise`]), and at least to the shard's legacy checkpoint, so
    /// a catalog from before the move starts the own row at the larger value (see the module
    /// docs).
    pub async fn advance_checkpoint(&self, shard: ShardId, id: &WalId) -> Result<()> {
        let (pk, rk) = shard.checkpoint_home();
        let mut value = id.as_str().to_string();
        // Raising to the legacy value too is a no-op once the own row exists (it started at
        // least there), and the legacy row is read once per process.
        if let Some(legacy) = self.legacy_checkpoint(shard).await? {
            value = value.max(legacy);
        }
        max_row::raise(self.store.as_ref(), &self.known, &self.table, &pk, &rk, "datetime", &value).await
    }
}
