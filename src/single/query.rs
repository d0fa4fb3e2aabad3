//! Single-partition lookups: one index's rows of one value are one RowKey range of the
//! tenant's partition (`super::layout`), read in RowKey order, so paging, `row_from`/`row_to`
//! and continuation tokens mean what they mean in the WAL mode (`crate::query::query_page`):
//! the token is the last identity returned. Index rows are written in the same EGT as their
//! owner row, so a lookup never sees a partly written record, and `consistent=true` holds
//! without waiting.

use futures::stream::BoxStream;
use futures::{StreamExt as _, TryStreamExt};

use crate::error::{Error, Result};
use crate::query::{self, Filter, Found, ResultPage};
use crate::record::{self, Record};
use crate::store::{pager, RowRange, MAX_PAGE};

use super::{layout, SinglePartition};

impl SinglePartition {
    /// Up to `limit` records matching `filter` (checked against the schema by the caller),
    /// after `continuation`.
    pub(crate) async fn query_page(
        &self,
        filter: &Filter,
        limit: usize,
        continuation: Option<&str>,
    ) -> Result<ResultPage> {
        let (index, pk) = filter.index_read(&self.schema)?;
        let prefix = layout::index_prefix(&pk);
        let resume = continuation.map(query::decode_continuation).transpose()?;
        let ranges = filter.row_ranges();
        let limit = limit.max(1);
        let mut out = ResultPage { index, ..ResultPage::default() };
        for (n, range) in ranges.iter().enumerate() {
            if resume.as_deref().is_some_and(|rk| query::ends_at_or_before(range, rk)) {
                continue;
            }
            let range = layout::under_prefix(&prefix, &RowRange { after: resume.clone(), ..range.clone() });
            let later_ranges = n + 1 < ranges.len();
            let want = (limit - out.records.len()).min(MAX_PAGE);
            let mut pages = pager::pages(self.store.as_ref(), &self.table, &self.partition, &range, want);
            while let Some(page) = pages.try_next().await? {
                for (i, e) in page.entities.iter().enumerate() {
                    let Some(identity) = layout::identity_of(&prefix, &e.row_key) else { continue };
                    if !filter.admits_row_key(identity) {
                        continue;
                    }
                    let Some(record) = record::from_entity(e).filter(|r| filter.matches(&self.schema, r)) else {
                        continue;
                    };
                    out.records.push(Found { record, row_key: identity.to_string() });
                    if out.records.len() == limit {
                        let more = later_ranges || page.continuation.is_some() || i + 1 < page.entities.len();
                        out.continuation = more.then(|| query::encode_continuation(identity));
                        return Ok(out);
                    }
                }
            }
        }
        Ok(out)
    }

    /// The identities of every record matching `filter` (all pages).
    pub(crate) async fn matching(&self, filter: &Filter) -> Result<Vec<String>> {
        let mut all = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = self.query_page(filter, MAX_PAGE, token.as_deref()).await?;
            all.extend(page.records.into_iter().map(|f| f.row_key));
            match page.continuation {
                Some(next) => token = Some(next),
                None => return Ok(all),
            }
        }
    }

    /// Every record once, from the owner rows, `segment` (1..=1,000) rows per request: the
    /// export of this mode.
    pub(crate) fn records(self: std::sync::Arc<Self>, segment: usize) -> BoxStream<'static, Result<Record>> {
        let range = layout::under_prefix(&layout::owner_prefix(), &RowRange::default());
        futures::stream::try_unfold((Some(None::<String>), self), move |(token, sp)| {
            let range = range.clone();
            async move {
                let Some(token) = token else { return Ok::<_, Error>(None) };
                let page =
                    sp.store.query_partition(&sp.table, &sp.partition, &range, segment, token.as_deref()).await?;
                let records: Vec<Result<Record>> =
                    page.entities.iter().filter_map(record::from_entity).map(Ok).collect();
                let next = page.continuation.map(Some);
                Ok(Some((futures::stream::iter(records), (next, sp))))
            }
        })
        .try_flatten()
        .boxed()
    }
}
