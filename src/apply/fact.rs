//! The apply's reads of fact rows (docs/ARCHITECTURE.md, "Projections"). A filter entry
//! that matches a projected row tombstones the record's rows as keyed by the row's payload;
//! a projected payload holds the fields of the indexes the schema listed when it was
//! written, so it lacks the field of an index added since, until that index's backfill
//! refreshes it (`super::refresh`), and the tombstone of that index's row would be missed:
//! the backfill, having read the record live just before, then wrote that row, which
//! outlived the record (simulator seed 810). So a matched projected row is replaced by its
//! version's whole record, read from the record's fact row when that row still holds the
//! same version (same WAL id). When it holds another version (a newer entry, or a
//! tombstone), the projected payload is kept: the newer entry's apply tombstones the rows
//! the older version has and it does not, keyed by the whole stored version (the fan-out's
//! step 2).

use futures::{StreamExt, TryStreamExt};

use super::applier::Applier;
use super::filter::Match;
use crate::error::Result;
use crate::projection::FACT_PARTITION;
use crate::record::{self, RowMeta};

impl Applier {
    /// Replaces the record of each [`Match::Live`] read from a projected row by the whole
    /// record of the same version, read from its fact row (one point read each, at most
    /// `apply_concurrency` at once); see the module docs. Errors: storage failures.
    pub(super) async fn complete_projected(&self, found: &mut [Match]) -> Result<()> {
        let reads: Vec<_> = found
            .iter()
            .enumerate()
            .filter_map(|(i, m)| match m {
                Match::Live { record, row_key, wal_id, .. } => {
                    let fact = record.get(FACT_PARTITION)?.as_str()?.to_string();
                    Some((i, fact, row_key.clone(), wal_id.clone()))
                }
                Match::LaterUnmatched { .. } => None,
            })
            .map(|(i, fact, row_key, wal_id)| async move {
                let row = self.store.get(&self.catalog_table, &fact, &row_key).await?;
                let whole = row.and_then(|e| {
                    let meta = RowMeta::of(&e);
                    (!meta.deleted && meta.wal_id == wal_id).then(|| record::payload(&e, &meta))
                });
                Ok::<_, crate::Error>((i, whole))
            })
            .collect();
        if reads.is_empty() {
            return Ok(());
        }
        let read: Vec<_> =
            futures::stream::iter(reads).buffer_unordered(self.opts.apply_concurrency.max(1)).try_collect().await?;
        for (i, whole) in read {
            if let (Some(whole), Match::Live { record, .. }) = (whole, &mut found[i]) {
                *record = whole;
            }
        }
        Ok(())
    }
}
