//! Seals: how an entry logged late takes effect after the filter entries it was late for.
//!
//! A WAL id is taken before its entry is stored, so an entry U can become durable after a
//! filter entry F with a larger id already passed the barrier and resolved its filter
//! without it ("logged late"). U was then neither acknowledged before F was issued (it was
//! not yet durable when F's barrier looked) nor issued after F was acknowledged (its id
//! would be larger), so U and F are concurrent and either order is valid; applying U with
//! its own id would be neither (F's tombstones fence U out, and an owner row tombstoned by
//! F makes U look superseded: an acknowledged write lost).
//!
//! So every shard has a **seal**: row `seal` of the shard's own partition (outside the
//! pending range, property `id`), the largest effective id of a filter entry that passed
//! the barrier over that shard. Before a filter entry resolves, its barrier (see
//! [`crate::apply::barrier`]) checks that no shard holds a pending entry below it, raises
//! every shard's seal to it, and checks again. An applier reads its shard's seal after
//! each page of pending entries; an entry whose id is below the seal was durable only
//! after a check that did not see it, i.e. it is late for every filter entry at or below
//! the seal, and it is **stamped**: it takes effect at `{seal}+{id}` ([`WalId::stamped`]),
//! just after the seal and before every id allocated after the seal's filter entry was
//! published. The stamp is stored in the entry (property `at`, under the entry's ETag)
//! before anything is applied, so every applier and every retry applies it with the same
//! effective id; the entry keeps its RowKey (its place in the shard, `GET /api/wal/{id}`).
//!
//! The argument for every case is in docs/ARCHITECTURE.md, "Order".

use super::{ShardId, Wal, WalId};
use crate::error::Result;

/// RowKey of a shard's seal, in the shard's own partition (after the pending range, which
/// ends before `:`, and before `intent:` markers do not matter: they have their own range).
pub const SEAL_ROW: &str = "seal";
/// The seal's property: the effective id.
const SEAL_PROP: &str = "id";

impl Wal {
    /// The seal of `shard`: the largest effective id of a filter entry that passed the
    /// barrier over it (`None`: none did). One point read.
    pub(crate) async fn seal(&self, shard: ShardId) -> Result<Option<WalId>> {
        let stored =
            super::max_row::read(self.store.as_ref(), &self.table, &shard.partition(), SEAL_ROW, SEAL_PROP).await?;
        Ok(stored.map(WalId::from_stored))
    }

    /// Raises the seal of `shard` to `to` (never lowers it). One conditional write when this
    /// process raised it last, none when it already raised it at or past `to`; otherwise a
    /// read and at most one write, retried on a concurrent raise ([`super::max_row`]).
    pub(crate) async fn raise_seal(&self, shard: ShardId, to: &WalId) -> Result<()> {
        crate::faults::point("before_seal")?;
        super::max_row::raise(
            self.store.as_ref(),
            &self.known,
            &self.table,
            &shard.partition(),
            SEAL_ROW,
            SEAL_PROP,
            to.as_str(),
        )
        .await
    }
}
