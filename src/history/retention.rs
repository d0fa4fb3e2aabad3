//! History retention, applied at write time to the records whose history was just written
//! (so it never has to find history partitions: the applier knows them).
//!
//! - `TABLE_CATALOG_HISTORY_DAYS` = D: after writing a record's history rows, one query of
//!   the partition's tail, `RowKey ge '{i64::MAX - (now - D days):019}'`: because the RowKey
//!   starts with the inverted time, exactly the rows older than D days are there, at the end
//!   of the partition, and the answer is empty until one expires. Every row returned is
//!   deleted (one entity group transaction per 100).
//! - `TABLE_CATALOG_HISTORY_MAX` = M: one keys-only count of the partition
//!   ([`crate::store::TableStore::count_range`]); when it holds more than M + M/10 rows (at
//!   least M + 1), the partition is read newest first and every row after the M-th is
//!   deleted. The slack makes the read and the deletes happen once per M/10 changes of a
//!   record instead of on every change once it is full; a record therefore holds at most
//!   M + M/10 rows, M after a trim.
//!
//! Cost per record identity per apply group: none when neither is set, one query with D, one
//! count with M (plus, with M, one read of M + M/10 rows and one delete per 100 rows every
//! M/10 changes). A row trimmed while a stale applier still re-applies its entry can be
//! written again; the next change of that record trims it again.

use futures::TryStreamExt;

use super::change::{inverted_time, HistoryOptions};
use crate::error::Result;
use crate::store::{bulk_delete, pager, RowRange, TableStore, MAX_PAGE};
use crate::wal::id::now_micros;

/// Microseconds in a day.
const DAY_US: i64 = 86_400_000_000;

/// Rows over the count limit that trigger a trim: M/10, at least 1.
pub fn slack(max: u32) -> u64 {
    u64::from(max / 10).max(1)
}

/// Applies the retention limits of `opts` to the history of `identity`; returns the rows
/// removed.
pub async fn trim<S: TableStore + ?Sized>(
    store: &S,
    table: &str,
    identity: &str,
    opts: &HistoryOptions,
) -> Result<usize> {
    let mut removed = 0;
    if let Some(days) = opts.keep_days {
        let cutoff = now_micros() - i64::from(days) * DAY_US;
        let range = RowRange { from: Some(inverted_time(cutoff)), ..RowRange::default() };
        let old: Vec<String> =
            pager::entities(store, table, identity, &range, MAX_PAGE).map_ok(|e| e.row_key).try_collect().await?;
        bulk_delete::delete_rows(store, table, identity, &old).await?;
        removed += old.len();
    }
    if let Some(max) = opts.max_per_record {
        let all = RowRange::default();
        let (count, _) = store.count_range(table, identity, &all, u64::MAX).await?;
        if count > u64::from(max) + slack(max) {
            let page = (max as usize + 1).min(MAX_PAGE);
            let over: Vec<String> = pager::entities(store, table, identity, &all, page)
                .map_ok(|e| e.row_key)
                .try_collect::<Vec<_>>()
                .await?
                .into_iter()
                .skip(max as usize)
                .collect();
            bulk_delete::delete_rows(store, table, identity, &over).await?;
            removed += over.len();
        }
    }
    Ok(removed)
}
