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
//!
//! **A filter the projected row cannot decide** (issue 31). A write filter names only
//! indexed fields, and a projected payload holds every index field the schema listed when
//! it was written; the backfill of an index added since writes that field into the
//! record's other projected rows (`super::refresh`). A row that still lacks a filtered field
//! (written before the index was added and not refreshed yet, or by an older release)
//! cannot say whether its record matches. Such a row is decided by its fact row
//! ([`Applier::decide_by_fact_rows`]): the version current at this entry's id is what the
//! filter removes, and the fact row (the record's owner row, written first by every
//! version, `super::fanout`) holds the newest applied version:
//! - older than this entry: it is the version at this entry's id (every entry before it
//!   was applied, the barrier), matched against the filter as a whole record;
//! - this entry's own: its tombstone (a re-application: matched), or its replace's new
//!   record (the new identity, which the replace writes anyway);
//! - newer than this entry: a later entry was applied first, and whether the version
//!   before this entry matched is for the history to say ([`Match::LaterUnmatched`]);
//!   without history the later entry decides the rows (it replaces or tombstones them).

use futures::{StreamExt, TryStreamExt};

use super::applier::Applier;
use super::matched::Match;
use crate::error::Result;
use crate::projection::FACT_PARTITION;
use crate::query::Filter;
use crate::record::{self, Record, RowMeta};
use crate::wal::WalId;

/// A live projected row, older than the filter entry, whose payload lacks a filtered field:
/// decided by its fact row (module docs).
pub(super) struct Undecided {
    pub(super) partition: String,
    pub(super) row_key: String,
    /// The record's fact-row PartitionKey (the payload's [`FACT_PARTITION`]).
    pub(super) fact: String,
}

/// The fact-row PartitionKey of a projected `payload` that lacks a value for some field of
/// `filter`; `None` for a whole record, or a payload that holds every filtered field (the
/// filter is decided on it: its values are its version's).
pub(super) fn undecidable(filter: &Filter, payload: &Record) -> Option<String> {
    let fact = payload.get(FACT_PARTITION)?.as_str()?;
    filter
        .fields
        .iter()
        .any(|(field, _)| crate::schema::Schema::index_value(payload, field).is_none())
        .then(|| fact.to_string())
}

impl Applier {
    /// Decides each of `rows` (projected rows a page of filter entry `id` could not decide)
    /// by its fact row, one point read each, at most `apply_concurrency` at once (module
    /// docs). Errors: storage failures.
    pub(super) async fn decide_by_fact_rows(
        &self,
        filter: &Filter,
        id: &WalId,
        rows: Vec<Undecided>,
    ) -> Result<Vec<Match>> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let schema = self.schema();
        let schema = &schema;
        let history = self.history.is_some();
        let reads = rows.into_iter().map(|u| async move {
            let fact = self.store.get(&self.catalog_table, &u.fact, &u.row_key).await?;
            let Some(fact) = fact else { return Ok::<_, crate::Error>(None) };
            let meta = RowMeta::of(&fact);
            let decided = match meta.wal_id.as_str().cmp(id.as_str()) {
                std::cmp::Ordering::Greater => history.then(|| Match::LaterUnmatched { row_key: u.row_key.clone() }),
                std::cmp::Ordering::Equal if !meta.deleted => None,
                std::cmp::Ordering::Less if meta.deleted => None,
                order => {
                    let whole = record::payload(&fact, &meta);
                    (order.is_eq() || filter.matches(schema, &whole)).then(|| Match::Live {
                        partition: u.partition.clone(),
                        row_key: u.row_key.clone(),
                        record: whole,
                        later: false,
                        wal_id: meta.wal_id.clone(),
                    })
                }
            };
            Ok(decided)
        });
        let decided: Vec<Option<Match>> =
            futures::stream::iter(reads).buffer_unordered(self.opts.apply_concurrency.max(1)).try_collect().await?;
        Ok(decided.into_iter().flatten().collect())
    }

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
