//! Replace and delete by filter: resolving the filter against live rows, the tombstone
//! index, and the tombstones themselves.
//!
//! A filter entry is applied only after the low-watermark barrier ([`super::barrier`]) has
//! passed its id, so it sees every write acknowledged before it was issued, in every shard.

use std::collections::{BTreeMap, BTreeSet};

use futures::{StreamExt, TryStreamExt};

use super::fanout::RowWrite;
use super::Applier;
use crate::error::Result;
use crate::history::{Change, ChangeOp};
use crate::query::Filter;
use crate::record::{self, Record, RowMeta};
use crate::schema::IndexState;
use crate::store::{pager, BatchOp, Entity, Value, MAX_BATCH_OPS, MAX_PAGE};
use crate::wal::{Op, WalEntry, WalId, TOMBSTONES};

/// A row of the filter's partition that the filter addresses.
pub(super) enum Match {
    /// A live row whose record matches (or this entry's own tombstone). `later`: a later
    /// entry wrote it (applied before this one; fencing keeps this entry off it).
    Live { partition: String, row_key: String, record: Record, later: bool },
    /// A tombstone a later entry wrote when it moved the record to another value of an
    /// added index. Only with history: whether this entry removed the version before it is
    /// for the history to say ([`Applier::version_before`]).
    HiddenByLater { row_key: String },
}

impl Match {
    pub(super) fn row_key(&self) -> &str {
        match self {
            Match::Live { row_key, .. } | Match::HiddenByLater { row_key } => row_key,
        }
    }
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
    /// the new record.
    pub(crate) async fn apply_filtered(&self, entry: &WalEntry) -> Result<()> {
        let (filter, new_record) = match &entry.op {
            Op::Replace { filter, record } => (filter, Some(record)),
            Op::Delete { filter } => (filter, None),
            Op::Upsert { .. } => return self.apply_upserts(std::slice::from_ref(entry)).await,
            Op::Schema { version } => return self.apply_schema_change(entry, *version).await,
            Op::RemoveRow { partition_key, row_key, etag } => {
                return self.remove_stray_row(entry, partition_key, row_key, etag).await
            }
        };
        let op = if new_record.is_some() { ChangeOp::Replace } else { ChangeOp::Delete };
        // Resolved with the schema this process holds. Where another applier already wrote a
        // row of the record under a newer schema (an index added since, adopted before the
        // change's own entry was logged), the fenced writes below meet that row and the
        // group is applied again with the newer schema (`Error::SchemaChanged`; simulator
        // seeds 277, 5215; docs/ARCHITECTURE.md, "Order", step 10).
        let current = self.schema();
        let schema = current.with_dropping_maintained().map_or(current, std::sync::Arc::new);
        // Validated against an active index when logged. An index being dropped keeps its rows
        // until the drop's job runs, which starts only once the drop's entry is applied, and
        // every entry before it in shard 0 is applied first: resolve through it.
        let usable = |f: &str| schema.is_index(f) || schema.index_state(f) == Some(IndexState::Dropping);
        let gone = filter.fields.iter().find(|(f, _)| !usable(f)).map(|(f, _)| f.clone());
        let new_keys = new_record.map(|r| schema.record_keys(r)).transpose()?;
        let new_identity = new_keys.as_ref().map(|k| &k.row_key);
        let new_rows: BTreeSet<(String, String)> =
            new_keys.iter().flat_map(|k| k.partitions.iter().map(|(_, pk)| (pk.clone(), k.row_key.clone()))).collect();
        let target = Target { entry, filter, op, schema: &schema, new_rows: &new_rows, new_identity };
        let mut handled: BTreeSet<String> = BTreeSet::new();
        if gone.is_none() {
            let pk = filter.partition_key(&schema)?;
            let ranges = filter.row_ranges(); // pruned on the server, like a lookup
            let mut pages = futures::stream::iter(ranges.iter())
                .flat_map(|range| pager::pages(self.store.as_ref(), &self.catalog_table, &pk, range, MAX_PAGE));
            while let Some(page) = pages.try_next().await? {
                tracing::debug!(wal_id = %entry.id, rows = page.entities.len(), partition = %pk, "filter page");
                let found = self.matches(filter, entry.effective(), &page.entities);
                handled.extend(found.iter().map(|m| m.row_key().to_string()));
                self.remove_matched(&target, found).await?;
            }
        }
        // Whatever an earlier attempt of this entry decided to remove, and its partition no
        // longer shows (`super::earlier`): one range query, empty on a first attempt.
        {
            let earlier = self.matched_earlier(filter, entry.effective(), &handled).await?;
            if let (Some(field), true) = (&gone, earlier.is_empty()) {
                // Validated against an active index when logged. An index gone altogether
                // can only meet an entry logged late after the drop, which was never
                // acknowledged (the writer re-reads the schema version once its entry is
                // durable, `Catalog::log`): it takes no effect, like any unacknowledged
                // write may, unless an earlier attempt already took effect (then completed).
                tracing::warn!(wal_id = %entry.id, %field, "filter on an index dropped before this entry was applied: no effect");
                return Ok(());
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
        Ok(())
    }

    /// Tombstones every row of the records in `found` (except rows the new record keeps)
    /// and records one history row per identity removed.
    async fn remove_matched(&self, t: &Target<'_>, found: Vec<Match>) -> Result<()> {
        let id = t.entry.effective();
        let mut doomed: BTreeMap<(String, String), Record> = BTreeMap::new();
        // Identities whose matched row a later entry wrote (applied before this one).
        let mut newer: BTreeSet<String> = BTreeSet::new();
        // Identities whose row here a later entry turned into a tombstone (it moved the
        // record to another value of an added index): this entry may still have removed
        // the version before it, which only the history can tell.
        let mut hidden: BTreeSet<String> = BTreeSet::new();
        for m in found {
            let (partition, row_key, rec) = match m {
                Match::Live { partition, row_key, record, later } => {
                    if later {
                        newer.insert(row_key.clone());
                    }
                    (partition, row_key, record)
                }
                Match::HiddenByLater { row_key } => {
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
        let mut changes = Vec::with_capacity(removed.len());
        for rk in removed {
            if !(newer.contains(&rk) || hidden.contains(&rk)) {
                changes.push(Change { identity: rk, op: t.op, wal_id: id, record: None });
                continue;
            }
            let Some(before) = self.version_before(&rk, id, t.filter).await? else { continue };
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
    /// tombstones (a re-application after a crash), plus tombstones a later entry wrote
    /// (see [`Match::HiddenByLater`]).
    pub(super) fn matches(&self, filter: &Filter, id: &WalId, entities: &[Entity]) -> Vec<Match> {
        let mut out = Vec::new();
        for e in entities {
            let meta = RowMeta::of(e);
            if !filter.admits_row_key(&e.row_key) {
                continue;
            }
            if meta.deleted && meta.wal_id != id.as_str() {
                if meta.wal_id.as_str() > id.as_str() && self.history.is_some() {
                    out.push(Match::HiddenByLater { row_key: e.row_key.clone() });
                }
                continue;
            }
            let rec = record::payload(e, &meta);
            if filter.matches(&self.schema(), &rec) {
                out.push(Match::Live {
                    partition: e.partition_key.clone(),
                    row_key: e.row_key.clone(),
                    record: rec,
                    later: meta.wal_id.as_str() > id.as_str(),
                });
            }
        }
        out
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
