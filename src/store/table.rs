//! Table operations: the [`TableStore`] trait, its batches and conditional writes, and the
//! checks every backend makes before I/O.

use async_trait::async_trait;

use super::error::{StoreError, StoreResult};
use super::page::{count_pages, Page, PartitionRange, RowRange, MAX_PAGE};
use super::value::{ETag, Entity};

/// Most operations in one entity group transaction (Azure: 100).
pub const MAX_BATCH_OPS: usize = 100;
/// Largest request body of one entity group transaction, in bytes (Azure: 4 MiB).
pub const MAX_BATCH_BYTES: usize = 4 * 1024 * 1024;

/// The precondition of a conditional write (`If-Match`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IfMatch {
    /// `If-Match: *`: the entity must exist ([`StoreError::NotFound`] otherwise).
    Any,
    /// The entity must exist and still carry this ETag ([`StoreError::PreconditionFailed`] if
    /// it changed, [`StoreError::NotFound`] if it is gone).
    Etag(ETag),
}

/// One operation of an entity group transaction. All entities of a batch share one
/// PartitionKey, and each RowKey appears at most once.
#[derive(Debug, Clone)]
pub enum BatchOp {
    /// Insert; fails the batch with `AlreadyExists` if present.
    Insert(Entity),
    /// Insert or replace, unconditionally.
    Upsert(Entity),
    /// Replace an existing entity under a precondition.
    Replace(Entity, IfMatch),
    /// Delete an existing entity under a precondition.
    Delete {
        /// RowKey of the entity to delete.
        row_key: String,
        /// Precondition.
        if_match: IfMatch,
    },
}

impl BatchOp {
    /// The RowKey this operation touches.
    pub fn row_key(&self) -> &str {
        match self {
            BatchOp::Insert(e) | BatchOp::Upsert(e) | BatchOp::Replace(e, _) => &e.row_key,
            BatchOp::Delete { row_key, .. } => row_key,
        }
    }
}

/// Table operations. Table names are alphanumeric, 3-63 characters, starting with a letter.
#[async_trait]
pub trait TableStore: Send + Sync {
    /// Creates the table if it does not exist (idempotent).
    async fn create_table(&self, table: &str) -> StoreResult<()>;

    /// Deletes the table and everything in it; a missing table is not an error.
    async fn delete_table(&self, table: &str) -> StoreResult<()>;

    /// Point read. `Ok(None)` when the entity does not exist.
    async fn get(&self, table: &str, partition_key: &str, row_key: &str) -> StoreResult<Option<Entity>>;

    /// Inserts a new entity; `AlreadyExists` when one with the same keys exists.
    async fn insert(&self, table: &str, entity: &Entity) -> StoreResult<ETag>;

    /// Inserts or replaces the entity unconditionally (`InsertOrReplace`).
    async fn upsert(&self, table: &str, entity: &Entity) -> StoreResult<ETag>;

    /// Replaces an existing entity (all properties) under `if_match`.
    async fn replace(&self, table: &str, entity: &Entity, if_match: &IfMatch) -> StoreResult<ETag>;

    /// Deletes an existing entity under `if_match`; `NotFound` when it is absent.
    async fn delete(&self, table: &str, partition_key: &str, row_key: &str, if_match: &IfMatch) -> StoreResult<()>;

    /// Queries one partition in RowKey order, at most `limit` (capped at [`MAX_PAGE`])
    /// entities per page, resuming from `continuation` (a token from a previous page of the
    /// same query).
    async fn query_partition(
        &self,
        table: &str,
        partition_key: &str,
        range: &RowRange,
        limit: usize,
        continuation: Option<&str>,
    ) -> StoreResult<Page>;

    /// Queries the entities whose PartitionKey lies in `range`, across partitions, in
    /// (PartitionKey, RowKey) order (UTF-16 code units), at most `limit` (capped at
    /// [`MAX_PAGE`]) entities per page, resuming from `continuation` (a token from a previous
    /// page of the same query). A missing table is `NotFound`; an empty range is an empty
    /// page without a token. A page may be short, or empty, and still carry a token (Azure
    /// stops a cross-partition query at partition-server boundaries and after 5 s: "Query
    /// timeout and pagination"); follow tokens until a page has none. Cost on Azure: one
    /// request per page, `$filter` on PartitionKey only (the prefix scanner, `crate::scan`,
    /// builds on it: seed 004).
    async fn query_partitions(
        &self,
        table: &str,
        range: &PartitionRange,
        limit: usize,
        continuation: Option<&str>,
    ) -> StoreResult<Page>;

    /// Scans the whole table in (PartitionKey, RowKey) order, one page at a time.
    async fn scan(&self, table: &str, limit: usize, continuation: Option<&str>) -> StoreResult<Page>;

    /// Counts the entities of a partition range, up to `cap`: `(count, first RowKey in
    /// order)`. The count is exact when below `cap`; once it reaches `cap` the backend stops
    /// (a paged backend at the end of the page that reached it, so the count may exceed `cap`
    /// by less than a page): a count at or above `cap` is a lower bound. `u64::MAX` counts
    /// everything. Backends read keys only where they can (Azure: `$select=PartitionKey,RowKey`,
    /// so a backlog of 64 KiB WAL entries is not downloaded to be counted; embedded: SQL
    /// `COUNT` over at most `cap` rows). The default pages through
    /// [`TableStore::query_partition`]. Cost on Azure: one request per 1,000 entities counted,
    /// so at most `cap / 1,000 + 1`.
    async fn count_range(
        &self,
        table: &str,
        partition_key: &str,
        range: &RowRange,
        cap: u64,
    ) -> StoreResult<(u64, Option<String>)> {
        count_pages(cap, |token| async move {
            self.query_partition(table, partition_key, range, MAX_PAGE, token.as_deref()).await
        })
        .await
    }

    /// The names of the tables that exist (lowercase on the embedded store), for
    /// diagnostics such as naming the catalogs a mistyped `--name` could have meant.
    /// `Ok(None)` where the backend does not list tables (the default; Azure here). Not
    /// counted as a storage request by [`counting`](super::CountingStore), not subject to fault layers.
    async fn list_tables(&self) -> StoreResult<Option<Vec<String>>> {
        Ok(None)
    }

    /// Runs an entity group transaction on one partition: all operations or none.
    /// Rejected with `InvalidInput` before any I/O if it holds more than [`MAX_BATCH_OPS`]
    /// operations, mixes partitions or repeats a RowKey. Returns one ETag per operation
    /// (`None` for deletes). A failing operation yields `BatchFailed { index, .. }`.
    async fn batch(&self, table: &str, partition_key: &str, ops: &[BatchOp]) -> StoreResult<Vec<Option<ETag>>>;
}

/// Checks the rules every backend enforces before I/O on a batch: size, single partition,
/// unique RowKeys.
pub fn validate_batch(partition_key: &str, ops: &[BatchOp]) -> StoreResult<()> {
    if ops.is_empty() {
        return Err(StoreError::InvalidInput("batch: an entity group transaction needs at least one operation".into()));
    }
    if ops.len() > MAX_BATCH_OPS {
        return Err(StoreError::InvalidInput(format!(
            "batch: {} operations, the limit is {MAX_BATCH_OPS} per entity group transaction",
            ops.len()
        )));
    }
    let mut seen = std::collections::HashSet::new();
    for (i, op) in ops.iter().enumerate() {
        if let BatchOp::Insert(e) | BatchOp::Upsert(e) | BatchOp::Replace(e, _) = op {
            if e.partition_key != partition_key {
                return Err(StoreError::InvalidInput(format!(
                    "batch: operation {i} targets another PartitionKey; an entity group transaction covers one partition"
                )));
            }
        }
        if !seen.insert(op.row_key()) {
            return Err(StoreError::InvalidInput(format!(
                "batch: operation {i} repeats a RowKey; each entity may appear once per transaction (InvalidDuplicateRow)"
            )));
        }
    }
    Ok(())
}

/// Checks a conditional write's precondition against the entity's current ETag (`None`:
/// the entity is absent): `NotFound` when absent, `PreconditionFailed` when `if_match` names
/// another ETag. `what` names the operation in the message.
pub(crate) fn check_if_match(current: Option<&str>, if_match: &IfMatch, what: &str) -> StoreResult<()> {
    match (current, if_match) {
        (None, _) => Err(StoreError::NotFound(format!("{what}: entity not found (ResourceNotFound)"))),
        (Some(cur), IfMatch::Etag(ETag(want))) if cur != want => {
            Err(StoreError::PreconditionFailed(format!("{what}: ETag changed (UpdateConditionNotSatisfied)")))
        }
        _ => Ok(()),
    }
}

/// Checks a table name before I/O: 3-63 letters and digits, starting with a letter (the
/// service answers an invalid name with a 400 without an error code).
pub fn check_table_name(table: &str) -> StoreResult<()> {
    let ok = (3..=63).contains(&table.len())
        && table.starts_with(|c: char| c.is_ascii_alphabetic())
        && table.chars().all(|c| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(StoreError::InvalidInput(format!(
            "table name {table:?} is invalid: 3-63 letters and digits, starting with a letter"
        )))
    }
}
