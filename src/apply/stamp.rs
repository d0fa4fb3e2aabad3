//! Stamping entries logged late: after each page of pending entries, the applier reads its
//! shard's seal ([`crate::wal::seal`]) and stamps every entry of the page below it that has
//! no stamp yet, before applying anything.
//!
//! The seal is read after the page, never before: an entry the page holds was durable when
//! the page was read, so a seal raised before that read is seen, and one raised after it
//! is followed by the barrier's second check, which then still finds the entry pending and
//! waits for it (docs/ARCHITECTURE.md, "Order").
//!
//! The stamp is written into the entry under the ETag it was read with, so of two appliers
//! (a stale lease holder and the current one) exactly one stamps it and both apply it with
//! that stamp; an entry gone meanwhile was applied by another applier and is skipped.

use super::applier::Applier;
use crate::error::Result;
use crate::store::{Entity, IfMatch, StoreError, Value};
use crate::wal::entry::AT;
use crate::wal::{ShardId, WalEntry, WalId};

impl Applier {
    /// The page's entries, those below the shard's seal stamped (one read of the seal when
    /// some entry is not stamped yet; one conditional write per entry stamped). Entries
    /// found gone are left out.
    pub(crate) async fn stamp_late(&self, shard: ShardId, page: Vec<(WalEntry, &Entity)>) -> Result<Vec<WalEntry>> {
        if page.iter().all(|(e, _)| e.at.is_some()) {
            return Ok(page.into_iter().map(|(e, _)| e).collect());
        }
        let Some(seal) = self.wal.seal(shard).await? else {
            return Ok(page.into_iter().map(|(e, _)| e).collect());
        };
        let mut out = Vec::with_capacity(page.len());
        for (mut entry, stored) in page {
            if entry.at.is_none() && entry.id < seal {
                match self.stamp(&mut entry, stored, &seal).await? {
                    true => out.push(entry),
                    false => tracing::debug!(wal_id = %entry.id, "entry applied elsewhere while being stamped"),
                }
            } else {
                out.push(entry);
            }
        }
        Ok(out)
    }

    /// Stamps `entry` (read as `stored`) with `{seal}+{id}`. Returns false when the entry is
    /// gone (applied by another applier). When another applier stamped it first, takes its
    /// stamp.
    async fn stamp(&self, entry: &mut WalEntry, stored: &Entity, seal: &WalId) -> Result<bool> {
        let table = self.wal.table();
        let mut current = stored.clone();
        loop {
            if let Some(at) = current.str(AT) {
                entry.at = Some(WalId::from_stored(at.to_string()));
                return Ok(true);
            }
            let at = WalId::stamped(seal, &entry.id);
            let mut stamped = current.clone();
            stamped.properties.insert(AT.into(), Value::String(at.to_string()));
            let if_match = current.etag.clone().map_or(IfMatch::Any, IfMatch::Etag);
            match self.store.replace(table, &stamped, &if_match).await {
                Ok(_) => {
                    tracing::info!(wal_id = %entry.id, at = %at, "entry logged late: takes effect after the seal");
                    entry.at = Some(at);
                    return Ok(true);
                }
                Err(StoreError::NotFound(_)) => return Ok(false),
                Err(StoreError::PreconditionFailed(_)) => {
                    match self.store.get(table, &current.partition_key, &current.row_key).await? {
                        Some(e) => current = e,
                        None => return Ok(false),
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}
