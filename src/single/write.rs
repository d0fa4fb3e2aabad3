//! Single-partition writes: each is one entity group transaction (EGT) on the tenant's
//! partition, conditional on the owner row of every record it changes.
//!
//! A write reads the owner rows of the records it changes (the owner row holds the record,
//! whose index values name its index rows), builds one EGT that writes the new rows and
//! deletes the rows the record no longer has, and makes it conditional: `Replace` of an
//! existing owner row under its ETag, `Insert` of a new one (409 if it appeared meanwhile),
//! `Delete` of a removed one under its ETag. A concurrent change of the same record fails
//! the EGT as a whole (412/409/404); the write then reads again and retries, with the
//! engine's one backoff policy (`crate::env::backoff`). So every write takes effect at its
//! EGT's commit (linearizable), and a write that fails leaves nothing behind.

use std::collections::BTreeSet;
use std::time::Duration;

use backon::Retryable as _;

use crate::error::{Error, Result};
use crate::query::Filter;
use crate::record::{self, Record};
use crate::schema::Schema;
use crate::store::{BatchOp, ETag, Entity, IfMatch, StoreError};

use super::{egt, layout, SinglePartition, ATTEMPTS};

/// The backoff between a write's attempts under contention.
const BACKOFF_MIN: Duration = Duration::from_millis(2);
const BACKOFF_MAX: Duration = Duration::from_millis(250);

/// A record's rows as one write stores them: the owner row first, then one row per index
/// value (each a full copy of the record, so a lookup returns it from the index row).
pub(crate) struct Rows {
    /// The record's identity (its WAL-mode RowKey).
    pub identity: String,
    /// The owner row.
    pub owner: Entity,
    /// The index rows.
    pub index: Vec<Entity>,
}

/// A record's current owner row: its record and ETag.
pub(super) struct Current {
    record: Record,
    etag: ETag,
}

/// True for the failures a concurrent change of the same record causes: the EGT's
/// precondition (412), an insert of an owner row that appeared (409), or a row that vanished
/// (404). The write re-reads and tries again.
fn is_race(e: &Error) -> bool {
    let store_race = |s: &StoreError| {
        matches!(s, StoreError::PreconditionFailed(_) | StoreError::AlreadyExists(_) | StoreError::NotFound(_))
    };
    match e {
        Error::Store(StoreError::BatchFailed { source, .. }) => store_race(source),
        Error::Store(s) => store_race(s),
        _ => false,
    }
}

impl SinglePartition {
    /// The rows of `record` (validated, redacted) under the schema, written by `write_id`.
    pub(crate) fn rows(&self, record: &Record, write_id: &str) -> Result<Rows> {
        let keys = self.schema.record_keys(record)?;
        let identity = keys.row_key;
        let props = record::to_properties(record, write_id);
        let owner_rk = layout::owner_row(&identity);
        layout::check_row_key(&owner_rk, &self.schema.row_key)?;
        let owner = Entity { partition_key: self.partition.clone(), row_key: owner_rk, etag: None, properties: props };
        let mut index = Vec::with_capacity(keys.partitions.len());
        for (field, pk) in &keys.partitions {
            let rk = layout::index_row(pk, &identity);
            layout::check_row_key(&rk, field)?;
            index.push(Entity { row_key: rk, ..owner.clone() });
        }
        Ok(Rows { identity, owner, index })
    }

    /// The RowKeys of `record`'s index rows (as stored under the schema).
    fn index_row_keys(&self, identity: &str, record: &Record) -> BTreeSet<String> {
        match self.schema.record_keys(record) {
            Ok(keys) => keys.partitions.iter().map(|(_, pk)| layout::index_row(pk, identity)).collect(),
            // A stored record always had keys; without them there are no index rows to find.
            Err(_) => BTreeSet::new(),
        }
    }

    /// The owner row of `identity`, if the record exists.
    pub(super) async fn current(&self, identity: &str) -> Result<Option<Current>> {
        let Some(row) = self.store.get(&self.table, &self.partition, &layout::owner_row(identity)).await? else {
            return Ok(None);
        };
        let etag = row.etag.clone().ok_or_else(|| {
            Error::Store(StoreError::Other("single-partition: an owner row was read without an ETag".into()))
        })?;
        Ok(record::from_entity(&row).map(|record| Current { record, etag }))
    }

    /// The operations that store `rows` over the record's current state: the owner row
    /// inserted (absent) or replaced under its ETag, the index rows upserted, and the index
    /// rows of the current record that the new one does not have deleted.
    pub(super) fn store_ops(&self, rows: &Rows, current: Option<&Current>) -> Vec<BatchOp> {
        let mut ops = Vec::with_capacity(rows.index.len() + 1);
        let new_keys: BTreeSet<&str> = rows.index.iter().map(|e| e.row_key.as_str()).collect();
        match current {
            Some(cur) => {
                ops.push(BatchOp::Replace(rows.owner.clone(), IfMatch::Etag(cur.etag.clone())));
                for rk in self.index_row_keys(&rows.identity, &cur.record) {
                    if !new_keys.contains(rk.as_str()) {
                        ops.push(BatchOp::Delete { row_key: rk, if_match: IfMatch::Any });
                    }
                }
            }
            None => ops.push(BatchOp::Insert(rows.owner.clone())),
        }
        ops.extend(rows.index.iter().cloned().map(BatchOp::Upsert));
        ops
    }

    /// The operations that delete record `identity` in state `current`: its owner row under
    /// its ETag and every index row.
    fn delete_ops(&self, identity: &str, current: &Current) -> Vec<BatchOp> {
        let mut ops = vec![BatchOp::Delete {
            row_key: layout::owner_row(identity),
            if_match: IfMatch::Etag(current.etag.clone()),
        }];
        ops.extend(
            self.index_row_keys(identity, &current.record)
                .into_iter()
                .map(|row_key| BatchOp::Delete { row_key, if_match: IfMatch::Any }),
        );
        ops
    }

    /// Runs `attempt` (read, build, one EGT) until it commits, retrying the races of
    /// [`is_race`] with backoff. Out of attempts: [`Error::Busy`] (HTTP 503, `Retry-After`).
    pub(super) async fn retrying<T, F, Fut>(&self, what: &str, attempt: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let backoff = crate::env::backoff(BACKOFF_MIN, BACKOFF_MAX, ATTEMPTS - 1);
        match attempt.retry(backoff).sleep(crate::env::sleep).when(is_race).await {
            Err(e) if is_race(&e) => Err(Error::Busy {
                message: format!(
                    "{what}: the record changed {ATTEMPTS} times while this write was being made; nothing was \
                     written, retry"
                ),
                retry_after_secs: 1,
            }),
            other => other,
        }
    }

    /// Stores `record` (validated and redacted by the caller) in one EGT; with `insert_only`,
    /// [`Error::Conflict`] when a record with its identity exists. Returns the record's
    /// identity.
    pub(crate) async fn put(&self, record: &Record, insert_only: bool, write_id: &str) -> Result<String> {
        let rows = self.rows(record, write_id)?;
        // The rows alone must fit before anything is read.
        egt::check(&self.store_ops(&rows, None), "this write")?;
        self.retrying("upsert", || async {
            let current = self.current(&rows.identity).await?;
            if insert_only && current.is_some() {
                return Err(Error::Conflict(format!(
                    "a record with RowKey '{}' already exists; use upsert to overwrite it",
                    rows.identity
                )));
            }
            let ops = self.store_ops(&rows, current.as_ref());
            egt::check(&ops, "this write")?;
            self.store.batch(&self.table, &self.partition, &ops).await?;
            Ok(())
        })
        .await?;
        Ok(rows.identity)
    }

    /// Deletes record `identity` in one EGT if it still matches `filter`; true when it did.
    pub(crate) async fn remove(&self, identity: &str, filter: &Filter) -> Result<bool> {
        self.retrying("delete", || async {
            let Some(current) = self.current(identity).await? else { return Ok(false) };
            if !still_matches(&self.schema, filter, identity, &current.record) {
                return Ok(false);
            }
            let ops = self.delete_ops(identity, &current);
            egt::check(&ops, "this delete")?;
            self.store.batch(&self.table, &self.partition, &ops).await?;
            Ok(true)
        })
        .await
    }

    /// Deletes record `old` and stores `record` in one EGT, if `old` still matches `filter`;
    /// `Ok(None)` without writing anything when it no longer does (gone, or changed so that it
    /// does not match): the caller resolves the filter again. Returns the new record's
    /// identity.
    pub(crate) async fn swap(
        &self,
        old: &str,
        filter: &Filter,
        record: &Record,
        write_id: &str,
    ) -> Result<Option<String>> {
        let rows = self.rows(record, write_id)?;
        if rows.identity == old {
            // The same record: replacing it in place is an upsert.
            return self.put(record, false, write_id).await.map(Some);
        }
        egt::check(&self.store_ops(&rows, None), "this replace")?;
        let swapped = self
            .retrying("replace", || async {
                let removed = match self.current(old).await? {
                    Some(cur) if still_matches(&self.schema, filter, old, &cur.record) => cur,
                    _ => return Ok(false),
                };
                let current = self.current(&rows.identity).await?;
                let mut ops = self.delete_ops(old, &removed);
                ops.extend(self.store_ops(&rows, current.as_ref()));
                egt::check(&ops, "this replace")?;
                self.store.batch(&self.table, &self.partition, &ops).await?;
                Ok(true)
            })
            .await?;
        Ok(swapped.then_some(rows.identity))
    }
}

/// True when the record stored as `identity` still answers `filter` (values and sort range).
fn still_matches(schema: &Schema, filter: &Filter, identity: &str, record: &Record) -> bool {
    filter.admits_row_key(identity) && filter.matches(schema, record)
}
