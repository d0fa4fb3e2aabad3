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
        for entry in group {
            let Op::Upsert { record } = &entry.op else { continue };
            let keys = self.schema.record_keys(record)?;
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
        self.write_rows(rows.into_iter().map(|((pk, rk), (id, rec))| (pk, rk, id, RowWrite::Live(rec))).collect())
            .await?;
        self.record_history(changes).await
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
