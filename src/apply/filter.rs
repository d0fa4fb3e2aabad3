//! Replace and delete by filter: resolving the filter against live rows, the tombstone
//! index, and the tombstones themselves.
//!
//! A filter entry is applied only after the low-watermark barrier ([`super::barrier`]) has
//! passed its id, so it sees every write acknowledged before it was issued, in every shard.
//!
//! **Deadlines and progress.** A filter can match more records than one apply pass has time
//! for (a pass ends at its deadline, e.g. within the queue function's timeout). Past the
//! deadline, an attempt stops before its next page of the filter's partition, once it has
//! handled at least one non-empty page, and records how far it got in the entry
//! ([`WalEntry::resume`]: the RowKey of the last row handled; conditional writes that only
//! raise it). The next attempt reads the partition after that RowKey, and treats the
//! identities at or below it as handled when it completes earlier attempts' removals
//! (`super::earlier`). So every attempt moves the resume point forward by a page, and a
//! filter of any size completes in passes of bounded length.
//!
//! Why a record at or below the resume point needs nothing more: the point is recorded
//! only after every page up to it was handled to the end (tombstones indexed, every row of
//! each matched record tombstoned, history rows written), by the attempt that records it,
//! and after that attempt completed the earlier attempts' removals up to it (`super::earlier`:
//! a record an earlier attempt removed may no longer show on its page, where a superseded
//! older version shadowed itself below this entry's id; found by the simulator, seed 712).
//! Rows written there since are writes of later entries (this entry passed its barrier, and
//! an entry logged late takes effect after it, [`crate::wal::seal`]), which a full re-read
//! would leave alone too (fenced, and their history decided by the version before them,
//! which this entry already recorded).

use std::collections::{BTreeMap, BTreeSet};

use futures::{StreamExt, TryStreamExt};

use super::applier::Applier;
use super::fanout::RowWrite;
use super::matched::Match;
use crate::env::Instant;
use crate::error::Result;
use crate::history::{Change, ChangeOp};
use crate::index_choice::Purpose;
use crate::query::Filter;
use crate::record::{self, Record, RowMeta};
use crate::store::{pager, BatchOp, Entity, IfMatch, RowRange, StoreError, Value, MAX_BATCH_OPS, MAX_PAGE};
use crate::wal::entry::RESUME;
use crate::wal::{Op, ShardId, WalEntry, WalId, TOMBSTONES};

/// How an attempt of a filter entry ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Filtered {
    /// The entry took its whole effect.
    Done,
    /// Stopped at the deadline between two pages, its progress recorded in the entry
    /// ([`WalEntry::resume`]); the entry stays pending.
    Stopped,
}

/// `range` without the rows at or below `resume` (the service's UTF-16 RowKey order).
fn after_resume(mut range: RowRange, resume: Option<&str>) -> RowRange {
    if let Some(r) = resume {
        if range.after.as_deref().is_none_or(|a| crate::keys::cmp_utf16(r, a).is_gt()) {
            range.after = Some(r.to_string());
        }
    }
    range
}

/// Whether RowKey `row_key` is at or below `resume` (handled by an earlier attempt).
pub(super) fn resumed_past(row_key: &str, resume: Option<&str>) -> bool {
    resume.is_some_and(|r| crate::keys::cmp_utf16(row_key, r).is_le())
}

/// What [`Applier::remove_matched`] needs of the filter entry being applied.
struct Target<'a> {
    entry: &'a WalEntry,
    filter: &'a Filter,
    op: ChangeOp,
    /// The schema the entry is applied with (dropping indexes maintained).
    schema: &'a crate::schema::Schema,
    /// Rows the new record (a replace) writes: not tombstoned.
    new_rows: &'a BTreeSet<(String, String)>,
    new_identity: Option<&'a String>,
}

impl Applier {
    /// Replace or delete: resolve the filter page by page, tombstoning what each page
    /// matched (so memory stays bounded by a page, whatever the filter matches), then write
    /// the new record. With `stop` (the entry's shard and a deadline), an attempt past the
    /// deadline stops between pages and records its progress (module docs).
    pub(crate) async fn apply_filtered(&self, entry: &WalEntry, stop: Option<(ShardId, Instant)>) -> Result<Filtered> {
        let (filter, new_record) = match &entry.op {
            Op::Replace { filter, record } => (filter, Some(record)),
            Op::Delete { filter } => (filter, None),
            Op::Upsert { .. } => return self.apply_upserts(std::slice::from_ref(entry)).await.map(|()| Filtered::Done),
            Op::Schema { version } => return self.apply_schema_change(entry, *version).await.map(|()| Filtered::Done),
            Op::RemoveRow { partition_key, row_key, etag } => {
                return self.remove_stray_row(entry, partition_key, row_key, etag).await.map(|()| Filtered::Done)
            }
        };
        let op = if new_record.is_some() { ChangeOp::Replace } else { ChangeOp::Delete };
        // Resolved with the schema this process holds. Where another applier already wrote a
        // row of the record under a newer schema (an index added since, adopted before the
        // change's own entry was logged), the fenced writes below meet that row and the
        // group is applied again with the newer schema (`Error::SchemaChanged`; simulator
        // seeds 277, 5215; docs/ARCHITECTURE.md, "Order", step 10).
        let current = self.schema();
        let stored = current.clone();
        let schema = current.with_dropping_maintained().map_or(current, std::sync::Arc::new);
        // Validated against an active index when logged. An index being dropped keeps its rows
        // until the drop's job runs, which starts only once the drop's entry is applied, and
        // every entry before it in shard 0 is applied first: resolve through it. Which index
        // (a composite one for exactly its fields, else the first field's): `crate::index_choice`.
        // (With the states as stored: `with_dropping_maintained` shows a dropping index as
        // active, and a dropping composite index must not be preferred.)
        let index = filter.choose_index(&stored, Purpose::Apply);
        let gone = match &index {
            Some(_) => None,
            None => Some(filter.fields.iter().map(|(f, _)| f.as_str()).collect::<Vec<_>>().join("&")),
        };
        let new_keys = new_record.map(|r| schema.record_keys(r)).transpose()?;
        let new_identity = new_keys.as_ref().map(|k| &k.row_key);
        let new_rows: BTreeSet<(String, String)> =
            new_keys.iter().flat_map(|k| k.partitions.iter().map(|(_, pk)| (pk.clone(), k.row_key.clone()))).collect();
        let target = Target { entry, filter, op, schema: &schema, new_rows: &new_rows, new_identity };
        let mut handled: BTreeSet<String> = BTreeSet::new();
        let resume = entry.resume.as_deref();
        if let Some(index) = &index {
            let pk = filter.partition_of(&schema, index)?;
            // Pruned on the server, like a lookup; after the rows earlier attempts handled.
            let ranges: Vec<RowRange> = filter.row_ranges().into_iter().map(|r| after_resume(r, resume)).collect();
            let page_size = self.opts.filter_page.clamp(1, MAX_PAGE);
            let mut pages = futures::stream::iter(ranges.iter())
                .flat_map(|range| pager::pages(self.store.as_ref(), &self.catalog_table, &pk, range, page_size));
            // The last row this attempt handled (its pages are handled to the end in order).
            let mut last_done: Option<String> = None;
            while let Some(page) = pages.try_next().await? {
                if let (Some((shard, deadline)), Some(last)) = (stop, &last_done) {
                    if crate::env::now() >= deadline {
                        tracing::debug!(wal_id = %entry.id, resume = %last, "filter stopped at its deadline");
                        // The rows up to `last` are about to count as handled to the end, and
                        // the next attempts' completion of earlier attempts' removals skips
                        // them: complete those here first. (An earlier attempt's removal that
                        // this attempt's pages no longer show: the superseded older version
                        // of the record shadowed itself there below this entry's id. Found by
                        // the simulator, seed 712.)
                        let earlier = self.matched_earlier(filter, entry.effective(), &handled, resume).await?;
                        let upto = earlier.into_iter().filter(|m| resumed_past(m.row_key(), Some(last))).collect();
                        self.remove_matched(&target, upto).await?;
                        self.record_resume(shard, entry, last).await?;
                        return Ok(Filtered::Stopped);
                    }
                }
                tracing::debug!(wal_id = %entry.id, rows = page.entities.len(), partition = %pk, "filter page");
                let found = self.matches(filter, entry.effective(), &page.entities).await?;
                handled.extend(found.iter().map(|m| m.row_key().to_string()));
                self.remove_matched(&target, found).await?;
                if let Some(last) = page.entities.last() {
                    last_done = Some(last.row_key.clone());
                }
            }
        }
        // Whatever an earlier attempt of this entry decided to remove, and its partition no
        // longer shows (`super::earlier`): one range query, empty on a first attempt.
        {
            let earlier = self.matched_earlier(filter, entry.effective(), &handled, resume).await?;
            if let (Some(field), true) = (&gone, earlier.is_empty()) {
                // Validated against an active index when logged. An index gone altogether
                // can only meet an entry logged late after the drop, which was never
                // acknowledged (the writer re-reads the schema version once its entry is
                // durable, `Catalog::log`): it takes no effect, like any unacknowledged
                // write may, unless an earlier attempt already took effect (then completed).
                tracing::warn!(wal_id = %entry.id, %field, "filter on an index dropped before this entry was applied: no effect");
                return Ok(Filtered::Done);
            }
            if !earlier.is_empty() {
                tracing::debug!(wal_id = %entry.id, records = earlier.len(), "filter completes an earlier attempt's removals");
            }
            self.remove_matched(&target, earlier).await?;
        }
        if let (Some(record), Some(identity)) = (new_record, new_identity) {
            if schema.has_added_indexes() {
                // Owner row first: the record may exist unmatched with other values of an
                // added index, or a newer entry of it may have been applied already.
                self.write_record(&schema, identity.clone(), vec![(entry.effective(), record)]).await?;
            } else {
                let writes = new_rows
                    .iter()
                    .map(|(pk, rk)| (pk.clone(), rk.clone(), entry.effective(), RowWrite::Live(record)))
                    .collect();
                self.write_rows(writes, schema.version()).await?;
            }
            let change = Change { identity: identity.clone(), op, wal_id: entry.effective(), record: Some(record) };
            self.record_history(vec![change]).await?;
        }
        self.settle_dropping().await?;
        Ok(Filtered::Done)
    }

    /// Records in the stored `entry` (in `shard`'s partition) that every row of its filter's
    /// partition up to `last` is handled ([`WalEntry::resume`]): a conditional write that only
    /// raises the stored point (another attempt, a stale lease holder's, may have gone
    /// further). Nothing when the entry is gone (applied by another applier).
    async fn record_resume(&self, shard: ShardId, entry: &WalEntry, last: &str) -> Result<()> {
        let table = self.wal.table();
        let partition = shard.partition();
        loop {
            let Some(mut stored) = self.store.get(table, &partition, entry.id.as_str()).await? else { return Ok(()) };
            if resumed_past(last, stored.str(RESUME)) {
                return Ok(());
            }
            let tag = stored.etag.clone().map_or(IfMatch::Any, IfMatch::Etag);
            stored.properties.insert(RESUME.into(), Value::String(last.to_string()));
            match self.store.replace(table, &stored, &tag).await {
                Ok(_) => return Ok(()),
                Err(StoreError::PreconditionFailed(_)) => continue, // changed meanwhile: read again
                Err(StoreError::NotFound(_)) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Tombstones every row of the records in `found` (except rows the new record keeps)
    /// and records one history row per identity removed.
    async fn remove_matched(&self, t: &Target<'_>, mut found: Vec<Match>) -> Result<()> {
        let id = t.entry.effective();
        // A projected row's payload may lack the field of an index added after it was
        // written: its version's whole record, from the fact row (`super::fact`).
        self.complete_projected(&mut found).await?;
        let mut doomed: BTreeMap<(String, String), Record> = BTreeMap::new();
        // Identities whose matched row a later entry wrote (applied before this one).
        let mut newer: BTreeSet<String> = BTreeSet::new();
        // Identities whose row here a later entry turned into a tombstone (it moved the
        // record to another value of an added index): this entry may still have removed
        // the version before it, which only the history can tell.
        let mut hidden: BTreeSet<String> = BTreeSet::new();
        for m in found {
            let (partition, row_key, rec) = match m {
                Match::Live { partition, row_key, record, later, .. } => {
                    if later {
                        newer.insert(row_key.clone());
                    }
                    (partition, row_key, record)
                }
                Match::LaterUnmatched { row_key } => {
                    hidden.insert(row_key);
                    continue;
                }
            };
            let rows = match t.schema.record_keys(&rec) {
                Ok(k) => k.partitions.into_iter().map(|(_, pk)| (pk, k.row_key.clone())).collect(),
                // A row another client wrote that our schema cannot key: remove the row found.
                Err(_) => vec![(partition, row_key)],
            };
            for row in rows {
                if !t.new_rows.contains(&row) {
                    doomed.insert(row, rec.clone());
                }
            }
        }
        // One history row per identity removed (the new record's own identity, when the
        // filter matched it, gets the row below instead). A row a later entry wrote (or hid)
        // was removed by this one only if the version before this entry in effective-id
        // order matched (else the later entry created it, or the record never had the value
        // then). When it did, that version's rows are tombstoned too (fenced: rows the later
        // entry already wrote stay): the later entry may not have reached them yet, and a
        // filter after this one would find the version live there and record a second
        // removal of a record this one removed (found by the simulator, seed 809).
        let removed: BTreeSet<String> = doomed
            .keys()
            .map(|(_, rk)| rk.clone())
            .chain(hidden.iter().cloned())
            .filter(|rk| Some(rk) != t.new_identity)
            .collect();
        // The versions before this entry, read concurrently (one query each): with a backlog
        // in shard 0, most identities a filter entry matches were written since by upserts of
        // other shards, and reading them one after another made each filter entry slower the
        // further shard 0 fell behind (docs/RELIABILITY.md, "The shard-0 backlog that fed itself").
        let reads: Vec<_> = removed
            .iter()
            .filter(|rk| newer.contains(*rk) || hidden.contains(*rk))
            .map(|rk| {
                let rk = rk.clone();
                async move {
                    let version = self.version_before(&rk, id, t.filter).await?;
                    Ok::<_, crate::Error>((rk, version))
                }
            })
            .collect();
        let mut before: BTreeMap<String, Option<Record>> =
            futures::stream::iter(reads).buffer_unordered(self.opts.apply_concurrency.max(1)).try_collect().await?;
        let mut changes = Vec::with_capacity(removed.len());
        for rk in removed {
            if !(newer.contains(&rk) || hidden.contains(&rk)) {
                changes.push(Change { identity: rk, op: t.op, wal_id: id, record: None });
                continue;
            }
            let Some(before) = before.remove(&rk).flatten() else { continue };
            if let Ok(keys) = t.schema.record_keys(&before) {
                for (_, pk) in keys.partitions {
                    let row = (pk, keys.row_key.clone());
                    if !t.new_rows.contains(&row) {
                        doomed.entry(row).or_insert_with(|| before.clone());
                    }
                }
            }
            changes.push(Change { identity: rk, op: t.op, wal_id: id, record: None });
        }
        if !doomed.is_empty() {
            self.index_tombstones(id, doomed.keys()).await?;
            let writes =
                doomed.iter().map(|((pk, rk), rec)| (pk.clone(), rk.clone(), id, RowWrite::Tombstone(rec))).collect();
            self.write_rows(writes, t.schema.version()).await?;
        }
        self.record_history(changes).await
    }

    /// The records of one page of the filter's partition that the filter addresses for
    /// entry `id`: live matching rows, plus rows this same entry already turned into
    /// tombstones (a re-application after a crash), plus rows a later entry wrote that do
    /// not match (see [`Match::LaterUnmatched`]).
    /// A projected row whose payload lacks a filtered field is decided by its record's fact
    /// row (`super::fact`): one point read per such row.
    pub(super) async fn matches(&self, filter: &Filter, id: &WalId, entities: &[Entity]) -> Result<Vec<Match>> {
        let mut out = Vec::new();
        let mut undecided = Vec::new();
        for e in entities {
            let meta = RowMeta::of(e);
            if !filter.admits_row_key(&e.row_key) {
                continue;
            }
            if meta.deleted && meta.wal_id != id.as_str() {
                if meta.wal_id.as_str() > id.as_str() && self.history.is_some() {
                    out.push(Match::LaterUnmatched { row_key: e.row_key.clone() });
                }
                continue;
            }
            let rec = record::payload(e, &meta);
            let later = meta.wal_id.as_str() > id.as_str();
            let matched = match super::fact::undecidable(filter, &rec) {
                None => filter.matches(&self.schema(), &rec),
                // This entry's own tombstone: it decided the record matched.
                Some(_) if meta.deleted => true,
                // A later version: whether the version before this entry matched is the
                // history's to say (below).
                Some(_) if later => false,
                Some(fact) => {
                    let (partition, row_key) = (e.partition_key.clone(), e.row_key.clone());
                    undecided.push(super::fact::Undecided { partition, row_key, fact });
                    continue;
                }
            };
            if matched {
                out.push(Match::Live {
                    partition: e.partition_key.clone(),
                    row_key: e.row_key.clone(),
                    record: rec,
                    later,
                    wal_id: meta.wal_id.clone(),
                });
            } else if later && self.history.is_some() {
                // The later version changed a filtered field that this partition does not
                // read; the version before this entry may have matched (simulator seeds 172,
                // 884, 1136: the removal was missing from the history).
                out.push(Match::LaterUnmatched { row_key: e.row_key.clone() });
            }
        }
        out.extend(self.decide_by_fact_rows(filter, id, undecided).await?);
        Ok(out)
    }

    /// Records the tombstones entry `id` is about to write, so the sweeper can find them.
    pub(crate) async fn index_tombstones<'a>(
        &self,
        id: &WalId,
        rows: impl Iterator<Item = &'a (String, String)>,
    ) -> Result<()> {
        let entities: Vec<Entity> = rows
            .map(|(pk, rk)| {
                let hash = crate::keys::fingerprint([format!("{pk}\u{1}{rk}").as_str()]);
                Entity::new(TOMBSTONES, format!("{id}_{hash}_{}", rk.len()))
                    .with("pk", Value::String(pk.clone()))
                    .with("rk", Value::String(rk.clone()))
            })
            .collect();
        let mut by_key: BTreeMap<String, Entity> = BTreeMap::new();
        for e in entities {
            by_key.insert(e.row_key.clone(), e);
        }
        let all: Vec<Entity> = by_key.into_values().collect();
        for chunk in all.chunks(MAX_BATCH_OPS) {
            let ops: Vec<BatchOp> = chunk.iter().cloned().map(BatchOp::Upsert).collect();
            self.store.batch(self.wal.table(), TOMBSTONES, &ops).await?;
        }
        Ok(())
    }
}
