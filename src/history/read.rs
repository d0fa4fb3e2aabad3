//! Reading history: `FIELD=VALUE` → record identities (through the index partition, live
//! rows and tombstones) → their history partitions, merged newest first.

use base64::Engine as _;
use futures::{StreamExt, TryStreamExt};
use serde::Serialize;

use super::change::HistoryEntry;
use crate::error::{Error, Result};
use crate::store::{pager, RowRange, TableStore, MAX_PAGE};

/// Most record identities one history read merges (a `FIELD=VALUE` shared by more records
/// is refused with a message saying so).
pub const MAX_IDENTITIES: usize = 100;
/// History partitions queried at the same time.
const PARALLEL: usize = 8;

/// One page of history, newest first.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct HistoryPage {
    /// Changes, newest first (descending WAL id; changes of one entry to several records by
    /// identity).
    pub history: Vec<HistoryEntry>,
    /// Pass back to get the next page; `None` when there is nothing more.
    pub continuation: Option<String>,
}

/// The identities (RowKeys) of every row of index partition `partition_key`, live or
/// tombstone, in RowKey order. One request per 1,000 rows. A tombstone is there until the
/// sweeper removes it (docs/ARCHITECTURE.md, "Fencing"); after that a deleted record is no
/// longer found by its identifiers, and neither is its history.
pub async fn identities<S: TableStore + ?Sized>(store: &S, table: &str, partition_key: &str) -> Result<Vec<String>> {
    let all = RowRange::default();
    let keys: Vec<String> =
        pager::entities(store, table, partition_key, &all, MAX_PAGE).map_ok(|e| e.row_key).try_collect().await?;
    if keys.len() > MAX_IDENTITIES {
        return Err(Error::invalid(format!(
            "history: the filter matches {} records; a history read covers at most {MAX_IDENTITIES}",
            keys.len()
        )));
    }
    Ok(keys)
}

/// Where a page ended: the last (history RowKey, identity) returned.
fn encode(cursor: &(String, String)) -> String {
    let json = serde_json::to_string(&[&cursor.0, &cursor.1]).unwrap_or_default();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
}

fn decode(token: &str) -> Result<(String, String)> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()
        .and_then(|b| serde_json::from_slice::<(String, String)>(&b).ok())
        .ok_or_else(|| Error::invalid("continuation: not a token this catalog issued"))
}

/// The first `limit + 1` changes of one identity after `cursor` (one more than a page, to
/// know whether more follow).
async fn read_identity<S: TableStore + ?Sized>(
    store: &S,
    table: &str,
    identity: &str,
    range: &RowRange,
    cursor: Option<&(String, String)>,
    limit: usize,
) -> Result<Vec<HistoryEntry>> {
    let mut rows = pager::entities(store, table, identity, range, (limit + 1).min(MAX_PAGE));
    let mut out = Vec::new();
    while let Some(e) = rows.try_next().await? {
        if super::change::is_marker(&e)
            || cursor.is_some_and(|(rk, id)| (e.row_key.as_str(), identity) <= (rk.as_str(), id.as_str()))
        {
            continue;
        }
        out.push(HistoryEntry::from_entity(&e)?);
        if out.len() > limit {
            break;
        }
    }
    Ok(out)
}

/// Up to `limit` (1..=1,000) changes of `identities`, newest first, after `continuation`.
/// Cost: one query per identity per page (concurrently, `PARALLEL` at a time).
pub async fn page<S: TableStore + ?Sized>(
    store: &S,
    table: &str,
    identities: &[String],
    limit: usize,
    continuation: Option<&str>,
) -> Result<HistoryPage> {
    if limit == 0 || limit > MAX_PAGE {
        return Err(Error::invalid(format!("limit: {limit} is out of range 1..={MAX_PAGE}")));
    }
    let cursor = continuation.map(decode).transpose()?;
    let range = RowRange { from: cursor.as_ref().map(|c| c.0.clone()), ..RowRange::default() };
    // Futures built first, so the stream borrows no closure (axum handlers must be `Send`).
    let reads: Vec<_> = identities
        .iter()
        .map(|identity| read_identity(store, table, identity, &range, cursor.as_ref(), limit))
        .collect();
    let per_identity: Vec<Vec<HistoryEntry>> = futures::stream::iter(reads).buffered(PARALLEL).try_collect().await?;
    let mut merged: Vec<HistoryEntry> = per_identity.into_iter().flatten().collect();
    merged.sort_by(|a, b| (&a.row_key, &a.identity).cmp(&(&b.row_key, &b.identity)));
    let more = merged.len() > limit;
    merged.truncate(limit);
    let continuation = match (more, merged.last()) {
        (true, Some(last)) => Some(encode(&(last.row_key.clone(), last.identity.clone()))),
        _ => None,
    };
    Ok(HistoryPage { history: merged, continuation })
}
