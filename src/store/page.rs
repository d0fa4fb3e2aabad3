//! What a query reads and returns: RowKey and PartitionKey ranges, one [`Page`] of
//! entities with its continuation token, and [`follow`], which follows the tokens.

use futures::stream::BoxStream;
use futures::StreamExt;

use super::error::StoreResult;
use super::key_rules;
use super::value::Entity;

/// Most entities one query page returns (Azure: 1,000 per response).
pub const MAX_PAGE: usize = 1000;

/// A RowKey range of a partition query. `None` bounds are open.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RowRange {
    /// Inclusive lower bound (`RowKey ge`).
    pub from: Option<String>,
    /// Exclusive lower bound (`RowKey gt`); used to resume after a known RowKey.
    pub after: Option<String>,
    /// Exclusive upper bound (`RowKey lt`).
    pub before: Option<String>,
    /// Inclusive upper bound (`RowKey le`).
    pub to: Option<String>,
}

impl RowRange {
    /// True when `row_key` lies inside every bound, comparing UTF-16 code units as the
    /// service does (see [`PartitionRange`]).
    pub fn contains(&self, row_key: &str) -> bool {
        use key_rules::cmp_utf16;
        self.from.as_deref().is_none_or(|f| cmp_utf16(row_key, f).is_ge())
            && self.after.as_deref().is_none_or(|a| cmp_utf16(row_key, a).is_gt())
            && self.before.as_deref().is_none_or(|b| cmp_utf16(row_key, b).is_lt())
            && self.to.as_deref().is_none_or(|t| cmp_utf16(row_key, t).is_le())
    }
}

/// A PartitionKey range of a cross-partition query ([`TableStore::query_partitions`](super::TableStore::query_partitions)).
/// `None` bounds are open. Keys compare by UTF-16 code units, as the service does
/// (Azurite compares with JavaScript's `<`, i.e. UTF-16 code units; the embedded store
/// registers the same order), so `'\u{ffff}'` sorts above every other BMP character and
/// every astral character (a surrogate pair, `0xD800..0xDFFF`) sorts below U+E000.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartitionRange {
    /// Exclusive lower bound (`PartitionKey gt`).
    pub after: Option<String>,
    /// Exclusive upper bound (`PartitionKey lt`).
    pub before: Option<String>,
    /// Inclusive upper bound (`PartitionKey le`).
    pub to: Option<String>,
}

impl PartitionRange {
    /// True when `partition_key` lies inside every bound (UTF-16 code-unit order).
    pub fn contains(&self, partition_key: &str) -> bool {
        use key_rules::cmp_utf16;
        self.after.as_deref().is_none_or(|a| cmp_utf16(partition_key, a).is_gt())
            && self.before.as_deref().is_none_or(|b| cmp_utf16(partition_key, b).is_lt())
            && self.to.as_deref().is_none_or(|t| cmp_utf16(partition_key, t).is_le())
    }
}

/// One page of a query: entities in (PartitionKey, RowKey) order and, if the query may have
/// more, the opaque token to fetch the next page with.
#[derive(Debug, Clone, Default)]
pub struct Page {
    /// Entities of this page (at most the requested page size, at most [`MAX_PAGE`]).
    pub entities: Vec<Entity>,
    /// `Some` when more results may follow. A page can be short or empty and still have one.
    pub continuation: Option<String>,
}

/// Pages from `fetch` (given the continuation token, `None` first) until one has no token.
pub fn follow<'a, F, Fut>(fetch: F) -> BoxStream<'a, StoreResult<Page>>
where
    F: Fn(Option<String>) -> Fut + Send + 'a,
    Fut: std::future::Future<Output = StoreResult<Page>> + Send + 'a,
{
    // State: `Some(token)` while there is a page to fetch (`Some(None)` = the first).
    futures::stream::try_unfold((fetch, Some(None::<String>)), |(fetch, state)| async move {
        let Some(token) = state else { return Ok(None) };
        let page = fetch(token).await?;
        let next = page.continuation.clone().map(Some);
        Ok(Some((page, (fetch, next))))
    })
    .boxed()
}

/// Counts entities over the pages `fetch` returns (it gets the continuation token, `None`
/// first), asking for no page once the count reached `cap`: `(count, first RowKey)`.
pub(crate) async fn count_pages<F, Fut>(cap: u64, fetch: F) -> StoreResult<(u64, Option<String>)>
where
    F: Fn(Option<String>) -> Fut + Send,
    Fut: std::future::Future<Output = StoreResult<Page>> + Send,
{
    use futures::TryStreamExt;
    let mut pages = follow(fetch);
    let (mut count, mut first) = (0u64, None);
    while count < cap {
        let Some(page) = pages.try_next().await? else { break };
        first = first.or_else(|| page.entities.first().map(|e| e.row_key.clone()));
        count += page.entities.len() as u64;
    }
    Ok((count, first))
}

#[cfg(test)]
mod tests {
    use super::RowRange;

    #[test]
    fn row_range_compares_utf16_code_units() {
        // By code points (Rust's `str` order) U+E000 < U+1F600; by UTF-16 code units the
        // emoji's high surrogate U+D83D sorts first, as the service orders keys.
        let below_e000 = RowRange { before: Some("\u{e000}".into()), ..RowRange::default() };
        assert!(below_e000.contains("😀"));
        let above_emoji = RowRange { after: Some("😀".into()), to: Some("\u{ffff}".into()), ..RowRange::default() };
        assert!(above_emoji.contains("\u{e000}") && !above_emoji.contains("😀") && !above_emoji.contains("z"));
    }
}
