//! The fan-out: writing catalog rows, fenced by WAL id.
//!
//! Every catalog row carries the id of the entry that last wrote it
//! ([`crate::record::RowMeta`]), and a row is only replaced by a larger id (ETag-conditional).
//! So applying any entry again, in any order, concurrently with a stale lease holder or with
//! the applier of another shard, cannot bring back an older payload or resurrect a deleted
//! record: the outcome is that of applying the entries once, in id order.

use std::collections::BTreeMap;

use futures::{StreamExt, TryStreamExt};

use super::Applier;
use crate::error::{Error, Result};
use crate::faults;
use crate::history::{Change, ChangeOp};
use crate::record::{self, Record, RowMeta};
use crate::store::{Entity, IfMatch, StoreError};
use crate::wal::id::now_micros;
use crate::wal::{Op, WalEntry, WalId};

/// A row to write: a live record or a tombstone of one.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RowWrite<'a> {
    Live(&'a Record),
    Tombstone(&'a Record),
}

impl Applier {
    /// A run of upserts: the last write of each row wins, rows written concurrently.
    /// Each upsert of the run then gets its own history row (not only the last of each
    /// record), so the history shows every change.
    pub(crate) async fn apply_upserts(&self, group: &[WalEntry]) -> Result<()> {
        let mut rows: BTreeMap<(String, String), (&WalId, &Record)> = BTreeMap::new();
        let mut changes = Vec::with_capacity(group.len());
        let schema = self.schema();
        for entry in group {
            let Op::Upsert { record } = &entry.op else { continue };
            let keys = schema.record_keys(record)?;
            for (_, pk) in keys.partitions {
                rows.insert((pk, keys.row_key.clone()), (&entry.id, record));
            }
            changes.push(Change {
                identity: keys.row_key,
                op: ChangeOp::Upsert,
                wal_id: &entry.id,
                record: Some(record),
            });
        }
        let stale = if schema.has_added_indexes() { self.stale_rows(&schema, group).await? } else { Vec::new() };
        if !stale.is_empty() {
            let keys: Vec<(String, String)> = stale.iter().map(|(pk, rk, _, _)| (pk.clone(), rk.clone())).collect();
            // Registered per entry id, like a delete's, so the sweeper finds them.
            for (key, (_, _, id, _)) in keys.iter().zip(&stale) {
                self.index_tombstones(id, std::iter::once(key)).await?;
            }
        }
        let mut writes: Vec<(String, String, &WalId, RowWrite<'_>)> =
            rows.into_iter().map(|((pk, rk), (id, rec))| (pk, rk, id, RowWrite::Live(rec))).collect();
        writes.extend(stale.iter().map(|(pk, rk, id, rec)| (pk.clone(), rk.clone(), *id, RowWrite::Tombstone(rec))));
        self.write_rows(writes).await?;
        self.record_history(changes).await
    }

    /// The rows of added indexes that a run of upserts moves away from: an added index does
    /// not feed the RowKey, so a record whose value of it changes keeps its identity and its
    /// row of the old value must go. For each record of the run, the candidates are the
    /// values of its stored version (one read of its owner row, the row of its first
    /// identity field with a value) and of the run's earlier upserts of it (written by a pass
    /// that crashed half way); each candidate row that is not a row of the record's final
    /// version gets a tombstone carrying the final record and the final entry's id (fenced,
    /// so it never replaces a newer row; carrying the final record, it is not a row of that
    /// record for `verify`, which ignores such tombstones).
    async fn stale_rows<'a>(
        &self,
        schema: &crate::schema::Schema,
        group: &'a [WalEntry],
    ) -> Result<Vec<(String, String, &'a WalId, &'a Record)>> {
        let mut by_identity: BTreeMap<String, Vec<(&'a WalId, &'a Record)>> = BTreeMap::new();
        for entry in group {
            if let Op::Upsert { record } = &entry.op {
                let keys = schema.record_keys(record)?;
                by_identity.entry(keys.row_key).or_default().push((&entry.id, record));
            }
        }
        // Collected first, so the stream holds the futures themselves, not a closure over
        // borrowed data (which keeps the apply future `Send`).
        let reads: Vec<_> =
            by_identity.into_iter().map(|(rk, versions)| self.stale_rows_of(schema, rk, versions)).collect();
        let found: Vec<Vec<_>> =
            futures::stream::iter(reads).buffer_unordered(self.opts.apply_concurrency.max(1)).try_collect().await?;
        Ok(found.into_iter().flatten().collect())
    }

    /// [`Applier::stale_rows`] of one record: `versions` are its upserts in the run, in
    /// order.
    async fn stale_rows_of<'a>(
        &self,
        schema: &crate::schema::Schema,
        rk: String,
        versions: Vec<(&'a WalId, &'a Record)>,
    ) -> Result<Vec<(String, String, &'a WalId, &'a Record)>> {
        let Some(&(final_id, final_rec)) = versions.last() else { return Ok(Vec::new()) };
        let final_keys = schema.record_keys(final_rec)?;
        let identity = schema.identity_keys();
        let owner = final_keys.partitions.iter().find(|(f, _)| identity.contains(f)).map(|(_, pk)| pk.clone());
        let stored = match owner {
            Some(pk) => self.store.get(&self.catalog_table, &pk, &rk).await?,
            None => None,
        };
        let stored = stored.map(|e| {
            let meta = RowMeta::of(&e);
            record::payload(&e, &meta)
        });
        let mut out: Vec<(String, String, &'a WalId, &'a Record)> = Vec::new();
        let earlier = versions[..versions.len() - 1].iter().map(|(_, r)| *r);
        for candidate in stored.iter().chain(earlier) {
            for field in &schema.index_keys[identity.len()..] {
                let Some(value) = crate::schema::Schema::index_value(candidate, field) else { continue };
                let Ok(pk) = schema.partition_key(field, &value) else { continue };
                let live = final_keys.partitions.iter().any(|(f, p)| f == field && *p == pk);
                if !live && !out.iter().any(|(p, _, _, _)| *p == pk) {
                    out.push((pk, rk.clone(), final_id, final_rec));
                }
            }
        }
        Ok(out)
    }

    pub(crate) async fn write_rows(&self, rows: Vec<(String, String, &WalId, RowWrite<'_>)>) -> Result<()> {
        // Build owned entities first: the futures then borrow only `self`.
        let futures: Vec<_> = rows
            .into_iter()
            .map(|(pk, rk, id, write)| {
                let properties = match write {
                    RowWrite::Live(r) => record::to_properties(r, id.as_str()),
                    RowWrite::Tombstone(r) => record::tombstone_properties(r, id.as_str(), now_micros()),
                };
                self.put_row(Entity { partition_key: pk, row_key: rk, etag: None, properties }, id.to_string())
            })
            .collect();
        futures::stream::iter(futures)
            .buffer_unordered(self.opts.apply_concurrency.max(1))
            .try_collect::<Vec<()>>()
            .await
            .map(|_| ())
    }

    /// Writes one catalog row unless it already carries entry `id` or a larger one.
    async fn put_row(&self, entity: Entity, id: String) -> Result<()> {
        self.put_row_fenced(&entity, &id).await?;
        faults::point("after_fanout_row")
    }

    /// The fenced write. A row this process saw before costs one conditional replace (see
    /// [`super::row_cache`]). A row it has not seen costs, when recent unseen rows were mostly
    /// new, one insert if it is new (insert, 409, read, replace if it is not); when they
    /// mostly existed, one read and one replace (or insert) ([`super::row_cache::Existence`]).
    /// So a new row costs 1 request and a changed row 2 in a steady workload of either kind.
    async fn put_row_fenced(&self, entity: &Entity, id: &str) -> Result<()> {
        let table = &self.catalog_table;
        let (pk, rk) = (&entity.partition_key, &entity.row_key);
        if let Some((tag, seen)) = self.rows.get(pk, rk) {
            if seen.as_str() >= id {
                return Ok(()); // written by this entry already, or by a newer one
            }
            match self.store.replace(table, entity, &IfMatch::Etag(tag)).await {
                Ok(tag) => {
                    self.rows.put(pk, rk, tag, id);
                    return Ok(());
                }
                Err(StoreError::PreconditionFailed(_) | StoreError::NotFound(_)) => self.rows.forget(pk, rk),
                Err(e) => return Err(e.into()),
            }
        }
        let read_first = self.existence.likely();
        if !read_first {
            match self.store.insert(table, entity).await {
                Ok(tag) => {
                    self.existence.note(false);
                    self.rows.put(pk, rk, tag, id);
                    return Ok(());
                }
                Err(StoreError::AlreadyExists(_)) => self.existence.note(true),
                Err(e) => return Err(e.into()),
            }
        }
        // Noted once per unseen row: by the insert above, or by the first read below.
        let mut first = read_first;
        loop {
            let found = self.store.get(table, pk, rk).await?;
            if std::mem::replace(&mut first, false) {
                self.existence.note(found.is_some());
            }
            let Some(current) = found else {
                match self.store.insert(table, entity).await {
                    Ok(tag) => {
                        self.rows.put(pk, rk, tag, id);
                        return Ok(());
                    }
                    Err(StoreError::AlreadyExists(_)) => continue,
                    Err(e) => return Err(e.into()),
                }
            };
            let tag = current
                .etag
                .clone()
                .ok_or_else(|| Error::Store(StoreError::Other("row read without an ETag".into())))?;
            let current_id = RowMeta::of(&current).wal_id;
            if current_id.as_str() >= id {
                self.rows.put(pk, rk, tag, &current_id);
                return Ok(()); // written by this entry already, or by a newer one
            }
            match self.store.replace(table, entity, &IfMatch::Etag(tag)).await {
                Ok(tag) => {
                    self.rows.put(pk, rk, tag, id);
                    return Ok(());
                }
                Err(StoreError::PreconditionFailed(_) | StoreError::NotFound(_)) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}
