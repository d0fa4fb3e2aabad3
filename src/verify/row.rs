//! The check of one row, without global state, so that any number of workers can check the
//! rows of a scan step each (the distributed verify of issue 12).
//!
//! A row belongs to the record its payload describes: the payload's keys must give the
//! row's RowKey (the record identity) and include its PartitionKey. A record's rows are
//! expected in the partitions of its index values, in schema order; the first is its
//! **owner** row. Exactly one row reports each record: the first existing row in schema
//! order (the owner, unless it is missing). So:
//! - a live row that does not belong is reported by itself ([`FindingKind::StrayRow`] when
//!   its payload keys to its RowKey but not to its partition, which `repair` removes;
//!   [`FindingKind::Unreadable`] otherwise) and counts as missing for its record (a tombstone that does not belong is dead and
//!   ignored: deleting a row another client wrote leaves one);
//! - a row at schema position `i` reads the rows before it (point gets, in order) and stops
//!   at the first one that exists: that one reports. The owner reads none; a non-owner
//!   usually reads one (the owner);
//! - the reporting row reads the rows after it (point gets, concurrently), compares WAL id
//!   (`_tc.w`), payload and tombstone flag, and reports the record's findings once.
//!
//! Each row costs at most one get per index field, concurrently or stopping early; memory is
//! one record's rows. Rows are read while others may change them: run it on a drained WAL
//! (nothing pending), as `table-catalog verify` warns.

use futures::future::try_join_all;

use super::finding::{Finding, FindingKind, RowState, SeenRow};
use crate::error::Result;
use crate::query::Filter;
use crate::record::{self, Record, RowMeta};
use crate::schema::{IndexState, RecordKeys, Schema};
use crate::store::{Entity, TableStore};

/// What re-logging a record's latest state means (`repair`).
#[derive(Debug, Clone, PartialEq)]
pub enum Fix {
    /// Upsert this payload (the record's newest live row): restores missing rows, replaces
    /// stale rows and tombstones older than it.
    Upsert(Record),
    /// Delete exactly this identity (a filter on its index values and its RowKey, first
    /// field on a partition that holds a live row, so the delete finds it).
    Delete(Filter),
    /// Remove this stray row ([`FindingKind::StrayRow`]) if it is still the one the scan
    /// saw (ETag `etag`): [`crate::wal::Op::RemoveRow`].
    RemoveRow {
        /// The row's PartitionKey.
        partition_key: String,
        /// The row's RowKey.
        row_key: String,
        /// The row's ETag when it was checked.
        etag: String,
    },
}

/// The verdict on a record, produced by the one row that reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordCheck {
    /// True when the record has live rows (it counts as a record).
    pub live: bool,
    /// What `repair` logs; `None` when the record is consistent.
    pub fix: Option<Fix>,
}

/// The result of checking one row.
#[derive(Debug, Clone, PartialEq)]
pub struct RowCheck {
    /// The row is a tombstone.
    pub tombstone: bool,
    /// `Some` on the row that reports its record.
    pub record: Option<RecordCheck>,
    /// Findings this row reports: its own `unreadable`, or its record's (when it reports it).
    pub findings: Vec<Finding>,
}

/// One expected row of a record: its partition and, if it exists and belongs, the row.
struct Slot {
    pk: String,
    row: Option<(Entity, RowMeta)>,
}

impl Slot {
    fn seen(&self) -> SeenRow {
        let (state, wal_id) = match &self.row {
            None => (RowState::Missing, None),
            Some((_, m)) if m.deleted => (RowState::Tombstone, Some(m.wal_id.clone())),
            Some((_, m)) => (RowState::Live, Some(m.wal_id.clone())),
        };
        SeenRow { pk: self.pk.clone(), state, wal_id }
    }

    fn live(&self) -> bool {
        self.row.as_ref().is_some_and(|(_, m)| !m.deleted)
    }
}

/// Why a row does not belong where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Misplaced {
    /// It cannot be checked: its payload cannot be keyed by the schema, or its keys give
    /// another RowKey (the reason says which).
    Unreadable(String),
    /// Its payload keys to its RowKey, but its record's index values do not include its
    /// partition: a copy of the record's row under another PartitionKey.
    Stray,
}

/// The record keys of a row and its position among them, or why it does not belong.
pub(crate) fn belongs(
    schema: &Schema,
    entity: &Entity,
    meta: &RowMeta,
) -> std::result::Result<(RecordKeys, usize), Misplaced> {
    let keys = schema
        .record_keys(&record::payload(entity, meta))
        .map_err(|e| Misplaced::Unreadable(format!("its record cannot be keyed by the schema: {e}")))?;
    if keys.row_key != entity.row_key {
        return Err(Misplaced::Unreadable(format!("its record's keys give RowKey '{}'", keys.row_key)));
    }
    match keys.partitions.iter().position(|(_, pk)| *pk == entity.partition_key) {
        Some(i) => Ok((keys, i)),
        None => Err(Misplaced::Stray),
    }
}

/// Reads the row `(pk, row_key)`; `None` when it is absent or does not belong.
async fn read(store: &dyn TableStore, table: &str, schema: &Schema, pk: &str, row_key: &str) -> Result<Slot> {
    let row = store.get(table, pk, row_key).await?.and_then(|e| {
        let meta = RowMeta::of(&e);
        belongs(schema, &e, &meta).is_ok().then_some((e, meta))
    });
    Ok(Slot { pk: pk.to_string(), row })
}

/// Checks one row of catalog table `table` (see the module docs). Errors: storage failures
/// of the point reads.
pub async fn check_row(store: &dyn TableStore, table: &str, schema: &Schema, entity: Entity) -> Result<RowCheck> {
    let meta = RowMeta::of(&entity);
    let tombstone = meta.deleted;
    // A row of an index being dropped: its job removes it; nothing to judge.
    if schema.state_of_partition(&entity.partition_key) == Some(IndexState::Dropping) {
        return Ok(RowCheck { tombstone, record: None, findings: Vec::new() });
    }
    let (keys, position) = match belongs(schema, &entity, &meta) {
        Ok(b) => b,
        // A delete of a row another client wrote, which the schema cannot key, leaves a
        // tombstone of that row where it was: dead, not a disagreement.
        Err(_) if tombstone => return Ok(RowCheck { tombstone, record: None, findings: Vec::new() }),
        Err(misplaced) => {
            let pk = entity.partition_key.clone();
            let (kind, record) = match misplaced {
                Misplaced::Unreadable(reason) => (FindingKind::Unreadable { pk: pk.clone(), reason }, None),
                Misplaced::Stray => {
                    let fix = entity.etag.as_ref().map(|etag| Fix::RemoveRow {
                        partition_key: pk.clone(),
                        row_key: entity.row_key.clone(),
                        etag: etag.0.clone(),
                    });
                    (FindingKind::StrayRow { pk: pk.clone() }, Some(RecordCheck { live: false, fix }))
                }
            };
            let rows = vec![Slot { pk, row: Some((entity.clone(), meta)) }.seen()];
            let finding = Finding { kind, row_key: entity.row_key, rows };
            return Ok(RowCheck { tombstone, record, findings: vec![finding] });
        }
    };
    let row_key = &keys.row_key;
    let mut slots = Vec::with_capacity(keys.partitions.len());
    for (_, pk) in &keys.partitions[..position] {
        let slot = read(store, table, schema, pk, row_key).await?;
        if let Some((earlier, earlier_meta)) = &slot.row {
            // An earlier row exists: it reports the record. It does not know this row if
            // this row is a value of an added index that a newer version of the record no
            // longer has (the record moved away from it): that is reported here.
            let mut findings = Vec::new();
            if !tombstone && earlier_meta.wal_id > meta.wal_id {
                let newer = schema.record_keys(&record::payload(earlier, earlier_meta));
                if newer.is_ok_and(|k| !k.partitions.iter().any(|(_, p)| *p == entity.partition_key)) {
                    let kind =
                        FindingKind::MovedRow { pk: entity.partition_key.clone(), newest: earlier_meta.wal_id.clone() };
                    let rows = vec![
                        slot.seen(),
                        Slot { pk: entity.partition_key.clone(), row: Some((entity.clone(), meta.clone())) }.seen(),
                    ];
                    findings.push(Finding { kind, row_key: entity.row_key.clone(), rows });
                }
            }
            return Ok(RowCheck { tombstone, record: None, findings });
        }
        slots.push(slot);
    }
    slots.push(Slot { pk: entity.partition_key.clone(), row: Some((entity, meta)) });
    let later = keys.partitions[position + 1..].iter().map(|(_, pk)| read(store, table, schema, pk, row_key));
    slots.extend(try_join_all(later).await?);
    let (record, findings) = judge(schema, &keys, &slots);
    Ok(RowCheck { tombstone, record: Some(record), findings })
}

/// The verdict on a record from all its expected rows, in schema order.
fn judge(schema: &Schema, keys: &RecordKeys, slots: &[Slot]) -> (RecordCheck, Vec<Finding>) {
    let live: Vec<&Slot> = slots.iter().filter(|s| s.live()).collect();
    if live.is_empty() {
        // A deleted record: tombstones only (some may have been swept).
        return (RecordCheck { live: false, fix: None }, Vec::new());
    }
    let rows: Vec<SeenRow> = slots.iter().map(Slot::seen).collect();
    let finding = |kind| Finding { kind, row_key: keys.row_key.clone(), rows: rows.clone() };
    // The newest row: the highest WAL id, the first in schema order on a tie.
    let mut newest: Option<&(Entity, RowMeta)> = None;
    for row in slots.iter().filter_map(|s| s.row.as_ref()) {
        if newest.is_none_or(|(_, m)| row.1.wal_id > m.wal_id) {
            newest = Some(row);
        }
    }
    let Some((newest_row, newest_meta)) = newest else {
        return (RecordCheck { live: true, fix: None }, Vec::new());
    };
    let newest_payload = record::payload(newest_row, newest_meta);
    let upsert = || Some(Fix::Upsert(newest_payload.clone()));
    let delete = || Some(Fix::Delete(identity_filter(schema, keys, &live, &newest_payload)));

    let any_tombstone = slots.iter().any(|s| s.row.as_ref().is_some_and(|(_, m)| m.deleted));
    if any_tombstone {
        let fix = if newest_meta.deleted { delete() } else { upsert() };
        return (RecordCheck { live: true, fix }, vec![finding(FindingKind::SplitState)]);
    }
    if slots[0].row.is_none() && live.len() == 1 {
        let kind = FindingKind::OrphanRow { pk: live[0].pk.clone() };
        return (RecordCheck { live: true, fix: delete() }, vec![finding(kind)]);
    }
    // A backfilling index's row may be missing until its job has passed the record.
    let mut findings: Vec<Finding> = slots
        .iter()
        .filter(|s| s.row.is_none() && schema.state_of_partition(&s.pk) != Some(IndexState::Backfilling))
        .map(|s| finding(FindingKind::MissingRow { pk: s.pk.clone() }))
        .collect();
    // A projected index's row holds the projection of the record (`crate::projection`),
    // pointing to its fact row: the record's first identity row.
    let fact_pk = schema.owner_partition(keys).map(String::as_str);
    let expected = |pk: &str| match keys.partitions.iter().find(|(_, p)| p == pk) {
        Some((index, _)) => schema.row_payload(index, &newest_payload, fact_pk.unwrap_or_default()),
        None => std::borrow::Cow::Borrowed(&newest_payload),
    };
    for slot in &live {
        let Some((e, m)) = &slot.row else { continue };
        if m.wal_id != newest_meta.wal_id || !fits(&record::payload(e, m), &expected(&slot.pk), &newest_payload) {
            findings.push(finding(FindingKind::Stale {
                pk: slot.pk.clone(),
                wal_id: m.wal_id.clone(),
                newest: newest_meta.wal_id.clone(),
            }));
        }
    }
    let fix = if findings.is_empty() { None } else { upsert() };
    (RecordCheck { live: true, fix }, findings)
}

/// True when a row's payload `row` is what its index holds of the newest version `newest`,
/// `expected`: equal; or, for a projected row (`crate::projection`), its fact partition the
/// expected one and every other field it holds equal to the newest version's: a row written
/// before an index was added lacks that index's field until the backfill rewrites it, and
/// one written before an index was dropped keeps its field.
fn fits(row: &Record, expected: &Record, newest: &Record) -> bool {
    let fact = crate::projection::FACT_PARTITION;
    row == expected
        || (row.get(fact).is_some_and(|v| expected.get(fact) == Some(v))
            && row.iter().all(|(k, v)| k == fact || newest.get(k) == Some(v)))
}

/// A filter that names exactly the identity `keys.row_key` and reads a partition where the
/// record has a live row (a delete finds it there, then removes every row of it): the
/// first live row of a single-field index (of a composite one when it is the only live row).
/// It names the RowKey and every single-field index value of the record, the one of that
/// partition first (the first field's partition is read). With composite indexes in the
/// schema it names only that partition's index's fields: a filter naming exactly a
/// composite index's fields reads that index (`crate::index_choice`), whose row may be the
/// missing one; the RowKey pins the record.
fn identity_filter(schema: &Schema, keys: &RecordKeys, live: &[&Slot], payload: &Record) -> Filter {
    let index_of = |pk: &str| keys.partitions.iter().find(|(_, p)| p == pk).map(|(f, _)| f.as_str());
    let first_pk = live
        .iter()
        .map(|s| s.pk.as_str())
        .find(|pk| index_of(pk).is_some_and(|f| !crate::composite::is_composite(f)))
        .or_else(|| live.first().map(|s| s.pk.as_str()))
        .unwrap_or_default();
    if schema.composites().next().is_some() {
        let fields = index_of(first_pk)
            .map(crate::composite::fields_of)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|f| Schema::index_value(payload, f).map(|v| (f.to_string(), v)))
            .collect();
        return Filter::new(fields).identity(keys.row_key.clone());
    }
    let mut fields: Vec<(String, String)> = Vec::with_capacity(keys.partitions.len());
    for (field, pk) in &keys.partitions {
        if let Some(value) = Schema::index_value(payload, field) {
            let pair = (field.clone(), value);
            if pk == first_pk {
                fields.insert(0, pair);
            } else {
                fields.push(pair);
            }
        }
    }
    Filter::new(fields).identity(keys.row_key.clone())
}
