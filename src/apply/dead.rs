//! Re-driving dead entries: moving entries of the WAL's `dead` partition back to pending.
//!
//! An entry goes to `dead` only when its own content can never apply
//! ([`crate::Error::is_input_fault`]: the record is no longer valid, or storage refused a row
//! as breaking a service rule). Faults of the environment (a missing catalog table, 403,
//! authentication) are retried instead, so acknowledged writes are not buried while an
//! operator fixes the account. Entries buried for a cause that has since gone away (one
//! buried by an older version for an environment fault, or a limit that was raised) come
//! back with `redrive`.
//!
//! A re-driven entry keeps its WAL id and goes back to the pending partition it came from
//! (or, for entries buried before that was recorded, the shard its operation is routed to).
//! It is then applied like any entry: in id order within its shard, fenced by id, filter
//! entries behind the barrier, so a write that was acknowledged after it still wins where
//! they overlap. Per entry, the pending copy is written before the dead one is removed: a
//! crash in between leaves it in both places, and the next `redrive` finishes the move
//! (applying it twice is harmless: applying is idempotent).

use futures::StreamExt;

use super::applier::Applier;
use crate::error::{Error, Result};
use crate::store::{pager, Entity, IfMatch, RowRange, StoreError};
use crate::wal::{ShardId, WalEntry, WalId, DEAD, DEAD_AT, DEAD_FROM, DEAD_REASON};

/// Dead entries read per request while re-driving them all.
const PAGE: usize = 100;

impl Applier {
    /// Moves dead entry `id` back to pending, or every dead entry when `id` is `None`.
    /// Returns the entries moved with their shard, in id order. [`Error::NotFound`] when
    /// `id` names no dead entry.
    pub async fn redrive(&self, id: Option<&WalId>) -> Result<Vec<(WalId, ShardId)>> {
        let table = self.wal.table();
        let mut moved = Vec::new();
        if let Some(id) = id {
            let Some(e) = self.store.get(table, DEAD, id.as_str()).await? else {
                return Err(Error::NotFound(format!("id: no dead WAL entry '{id}'")));
            };
            moved.push(self.revive(&e).await?);
            return Ok(moved);
        }
        let range = RowRange::default();
        // Each round reads the first entries of the partition afresh: the ones moved in the
        // previous round are gone, so no continuation token has to outlive the changes.
        loop {
            let batch: Vec<Entity> = pager::entities(self.store.as_ref(), table, DEAD, &range, PAGE)
                .take(PAGE)
                .collect::<Vec<_>>()
                .await
                .into_iter()
                .collect::<std::result::Result<_, _>>()?;
            if batch.is_empty() {
                break;
            }
            for e in &batch {
                moved.push(self.revive(e).await?);
            }
        }
        Ok(moved)
    }

    /// Moves one dead entity back to its pending partition.
    async fn revive(&self, dead: &Entity) -> Result<(WalId, ShardId)> {
        let shard = match dead.str(DEAD_FROM).and_then(ShardId::from_partition) {
            Some(s) => s,
            None => match WalEntry::from_entity(dead) {
                Ok(entry) => self.route(&entry.op).unwrap_or(ShardId::ZERO),
                Err(_) => ShardId::ZERO,
            },
        };
        let mut pending = dead.clone();
        pending.partition_key = shard.partition();
        pending.etag = None;
        for p in [DEAD_REASON, DEAD_FROM, DEAD_AT] {
            pending.properties.remove(p);
        }
        let table = self.wal.table();
        self.store.upsert(table, &pending).await?;
        match self.store.delete(table, DEAD, &dead.row_key, &IfMatch::Any).await {
            Ok(()) | Err(StoreError::NotFound(_)) => {}
            Err(e) => return Err(e.into()),
        }
        tracing::info!(wal_id = %dead.row_key, shard = %shard, "dead WAL entry moved back to pending");
        Ok((WalId::from_stored(dead.row_key.clone()), shard))
    }
}
