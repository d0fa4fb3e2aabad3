//! The dead partition: entries that can never be applied, as they are listed and counted.

use super::id::WalId;
use super::layout::{DEAD, DEAD_AT, DEAD_FROM, DEAD_REASON};
use super::log::{Wal, COUNT_CAP};
use crate::error::Result;
use crate::store::{Entity, RowRange};

impl Wal {
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
