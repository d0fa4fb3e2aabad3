//! WAL id allocation without a single-row sequencer.
//!
//! The order invariant: an operation acknowledged before another one is issued gets the
//! smaller WAL id, across processes and whatever their clocks say.
//!
//! Each process publishes the highest id timestamp it has handed out in a row of its own,
//! `metadata/clock-{owner}` in the WAL table, and nobody else writes that row, so publishing
//! never conflicts. Allocating ids is one round:
//! 1. read every clock row (one partition query of `metadata`, RowKeys `clock-*`; one page per
//!    1,000 rows) and take the largest `last`: the high-water mark `h`;
//! 2. hand out timestamps from `max(now + skew, h + 1, own last + 1)` on, one microsecond
//!    apart;
//! 3. publish the new `last` in this process's row (an unconditional upsert, serialised in
//!    the process so the row never goes back). The caller writes its WAL entries at the same
//!    time and acknowledges only when both are done.
//!
//! Why the order holds: write A is acknowledged only after its process published a `last` at
//! or above A's id. Write B, issued after that acknowledgement, reads the clock rows after
//! the publication completed (the Table service is strongly consistent), so `h >= id(A)` and
//! every id of B is larger. Within a process, `own last + 1` keeps ids increasing even when
//! two rounds overlap.
//!
//! Cost: one query and one upsert per round, whatever the number of ids, and rounds of one
//! process are coalesced by [`super::append`] (group commit), so under load a write pays a
//! small fraction of a request for its id. Processes never contend: the previous design
//! (one compare-and-swap row behind a process-wide mutex) collapsed when several processes
//! wrote at once, since each one's swap invalidated the others' cached ETags.
//!
//! The legacy row `metadata/clock-wal` of catalogs created before this design lies in the
//! same RowKey range and is read like any other, so ids keep increasing across the upgrade.
//! (A process of the old version still running reads only that row: stop old processes
//! before new ones write, which a deployment does anyway.)
//!
//! Rows of processes that are gone stay until the sweeper prunes them ([`Clock::prune`]): a
//! row is removed when it was last published more than [`STALE_AFTER`] ago and some other
//! row holds a larger `last`, so the high-water mark never goes down.

use std::time::Duration;

use futures::TryStreamExt;

use super::id::now_micros;
use super::METADATA;
use crate::error::Result;
use crate::store::{pager, Entity, IfMatch, RowRange, Store, StoreError, Value};

/// RowKey prefix of clock rows.
pub const CLOCK_PREFIX: &str = "clock-";
/// A clock row not published for this long may be pruned (when it is not the maximum).
pub const STALE_AFTER: Duration = Duration::from_secs(3600);

/// The RowKey range holding every clock row (`clock-` ≤ RowKey < `clock.`).
fn clock_range() -> RowRange {
    RowRange { from: Some(CLOCK_PREFIX.into()), before: Some("clock.".into()), ..RowRange::default() }
}

fn last_of(e: &Entity) -> i64 {
    match e.properties.get("last") {
        Some(Value::Int64(v)) => *v,
        _ => 0,
    }
}

/// One process's id clock (see the module docs).
#[derive(Debug)]
pub struct Clock {
    /// RowKey of this process's row: `clock-{owner}`.
    row: String,
    /// Offset added to the local clock, in µs (tests skew writers with it).
    skew_us: i64,
    /// Highest timestamp handed out by this process.
    own_last: std::sync::Mutex<i64>,
    /// Highest value published in this process's row; held across the upsert so
    /// publications of one process are ordered.
    published: tokio::sync::Mutex<i64>,
}

impl Clock {
    /// The clock of the process whose lease owner id is `owner`.
    pub fn new(owner: &str, skew_us: i64) -> Clock {
        Clock {
            row: format!("{CLOCK_PREFIX}{owner}"),
            skew_us,
            own_last: std::sync::Mutex::new(0),
            published: tokio::sync::Mutex::new(0),
        }
    }

    /// The high-water mark: the largest `last` over every clock row of the WAL table
    /// (0 when there is none). One query request per 1,000 clock rows.
    pub async fn high_water(&self, store: &dyn Store, table: &str) -> Result<i64> {
        let range = clock_range();
        let rows = pager::entities(store, table, METADATA, &range, crate::store::MAX_PAGE);
        Ok(rows.try_fold(0i64, |m, e| async move { Ok(m.max(last_of(&e))) }).await?)
    }

    /// Reserves `n` (≥ 1) consecutive timestamps above `high` and above everything this
    /// process handed out: returns the first; the last is `first + n - 1`.
    pub fn reserve(&self, high: i64, n: usize) -> i64 {
        let now = now_micros() + self.skew_us;
        let mut own = self.own_last.lock().unwrap_or_else(|p| p.into_inner());
        let start = now.max(high + 1).max(*own + 1);
        *own = start + n as i64 - 1;
        start
    }

    /// Publishes `last` in this process's row (unless a larger value already was). When this
    /// returns `Ok`, every later [`Clock::high_water`] in any process is at least `last`.
    pub async fn publish(&self, store: &dyn Store, table: &str, last: i64) -> Result<()> {
        let mut published = self.published.lock().await;
        if *published >= last {
            return Ok(());
        }
        crate::faults::point("before_clock_publish")?;
        let row = Entity::new(METADATA, self.row.as_str())
            .with("last", Value::Int64(last))
            .with("at", Value::Int64(now_micros()));
        store.upsert(table, &row).await?;
        *published = last;
        Ok(())
    }

    /// Removes clock rows of other processes that were not published for [`STALE_AFTER`]
    /// and hold less than the high-water mark. Returns how many were removed. A row
    /// republished meanwhile is kept (its ETag changed).
    pub async fn prune(&self, store: &dyn Store, table: &str) -> Result<usize> {
        let range = clock_range();
        let rows: Vec<Entity> =
            pager::entities(store, table, METADATA, &range, crate::store::MAX_PAGE).try_collect().await?;
        let high = rows.iter().map(last_of).max().unwrap_or(0);
        let cutoff = now_micros() - STALE_AFTER.as_micros() as i64;
        let mut removed = 0;
        for e in rows {
            let at = match e.properties.get("at") {
                Some(Value::Int64(v)) => *v,
                _ => 0,
            };
            // The legacy row has no `at`; it is pruned like any other once it is not the max.
            if e.row_key == self.row || last_of(&e) >= high || at >= cutoff {
                continue;
            }
            let tag = e.etag.clone().map_or(IfMatch::Any, IfMatch::Etag);
            match store.delete(table, METADATA, &e.row_key, &tag).await {
                Ok(()) => removed += 1,
                Err(StoreError::NotFound(_) | StoreError::PreconditionFailed(_)) => {}
                Err(err) => return Err(err.into()),
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_goes_above_the_high_water_mark_and_never_back() {
        let c = Clock::new("p", 0);
        let far = now_micros() + 10_000_000_000; // far in the future: another process's clock
        let a = c.reserve(far, 3);
        assert_eq!(a, far + 1);
        // The high-water mark read later may be stale (smaller): ids still increase.
        let b = c.reserve(0, 1);
        assert_eq!(b, far + 4);
        // A skewed-back clock does not matter either.
        let slow = Clock::new("q", -3_600_000_000);
        let s = slow.reserve(b, 1);
        assert_eq!(s, b + 1);
    }
}
