//! The storage abstraction: exactly the Azure Table and Queue operations the engine needs.
//!
//! Two backends implement it: [`local`] (embedded SQLite, the default) and [`azure`]
//! (Azure Storage through `azure_data_tables` / `azure_storage_queues`). Both must behave
//! identically; the conformance suite in [`conformance`] is the judge, and any difference it
//! finds is a bug in `local`. A third, [`mem`] (in memory, deterministic), serves the
//! simulator and fast tests and passes the same suite.
//!
//! Semantics follow the Azure Table service REST API
//! (learn.microsoft.com/rest/api/storageservices/, "Understanding the Table service data model",
//! "Query timeout and pagination", "Performing entity group transactions"):
//! - entities are addressed by (PartitionKey, RowKey); keys are validated by `crate::keys`
//!   before they reach a backend, so backends may assume valid keys;
//! - every write returns a new opaque [`ETag`]; conditional writes compare it;
//! - partition queries return at most [`MAX_PAGE`] entities in RowKey order plus a continuation
//!   token; a page may be short (even empty) and still carry a token;
//! - an entity group transaction (EGT) holds at most [`MAX_BATCH_OPS`] operations on one
//!   partition and is atomic.

pub mod azure;
pub mod bulk_delete;
#[cfg(any(test, feature = "testing"))]
pub mod conformance;
pub mod counting;
#[cfg(any(test, feature = "testing"))]
pub mod fault;
pub(crate) mod key_rules;
pub mod layer;
pub mod local;
pub mod mem;
pub mod op;
pub mod pager;
#[cfg(any(test, feature = "testing", feature = "bench"))]
pub mod sim;
pub mod value;

pub use op::OpKind;
pub use value::{Entity, Properties, Value};

use std::time::Duration;

use async_trait::async_trait;

/// Most entities one query page returns (Azure: 1,000 per response).
pub const MAX_PAGE: usize = 1000;
/// Most operations in one entity group transaction (Azure: 100).
pub const MAX_BATCH_OPS: usize = 100;
/// Largest request body of one entity group transaction, in bytes (Azure: 4 MiB).
pub const MAX_BATCH_BYTES: usize = 4 * 1024 * 1024;
/// Most messages one queue receive returns (Azure: 32).
pub const MAX_RECEIVE: usize = 32;
/// Largest queue message text, in bytes of UTF-8 (Azure: 64 KiB).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// An opaque entity version. Compare only for equality; never parse.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ETag(pub String);

/// The precondition of a conditional write (`If-Match`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IfMatch {
    /// `If-Match: *`: the entity must exist ([`StoreError::NotFound`] otherwise).
    Any,
    /// The entity must exist and still carry this ETag ([`StoreError::PreconditionFailed`] if
    /// it changed, [`StoreError::NotFound`] if it is gone).
    Etag(ETag),
}

/// Errors of a storage backend, reduced to what callers branch on. Backend details are in
/// the message, which never contains credentials.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreError {
    /// The entity, table, queue or message does not exist (HTTP 404).
    #[error("not found: {0}")]
    NotFound(String),
    /// An insert found the entity already there (HTTP 409 EntityAlreadyExists).
    #[error("already exists: {0}")]
    AlreadyExists(String),
    /// An `If-Match` ETag or a pop receipt no longer matches (HTTP 412 / 400 PopReceiptMismatch).
    #[error("precondition failed: {0}")]
    PreconditionFailed(String),
    /// One operation of an entity group transaction failed; nothing of the batch was written.
    #[error("batch operation {index} failed: {source}")]
    BatchFailed {
        /// Zero-based index of the failing operation.
        index: usize,
        /// What that operation hit.
        source: Box<StoreError>,
    },
    /// The request broke a service rule (bad key, too many properties, too large, ...).
    #[error("invalid request: {0}")]
    InvalidInput(String),
    /// A transient failure (HTTP 408/429/500/503, timeout, connection reset). Retrying may
    /// succeed; a write that failed this way may or may not have been committed.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// Anything else (authentication, unexpected responses).
    #[error("storage error: {0}")]
    Other(String),
}

impl StoreError {
    /// True when retrying the same call may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Unavailable(_) => true,
            StoreError::BatchFailed { source, .. } => source.is_transient(),
            _ => false,
        }
    }

    /// True when the request itself broke a service rule (HTTP 400), so sending it again
    /// can never succeed; see [`crate::Error::is_input_fault`].
    pub fn is_input_fault(&self) -> bool {
        match self {
            StoreError::InvalidInput(_) => true,
            StoreError::BatchFailed { source, .. } => source.is_input_fault(),
            _ => false,
        }
    }
}

/// Result of a storage call.
pub type StoreResult<T> = Result<T, StoreError>;

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

/// A RowKey range of a partition query. `None` bounds are open.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RowRange {
    /// Inclusive lower bound (`RowKey ge`).
    pub from: Option<String>,
    /// Exclusive lower bound (`RowKey gt`); used to resume after a known RowKey.
    pub after: Option<String>,
    /// Exclusive upper bound (`RowKey lt`).
    pub before: Option<String>,
    /// Inclusive upper bound (`RowKey le`).
    pub to: Option<String>,
}

impl RowRange {
    /// True when `row_key` lies inside every bound, comparing UTF-16 code units as the
    /// service does (see [`PartitionRange`]).
    pub fn contains(&self, row_key: &str) -> bool {
        use key_rules::cmp_utf16;
        self.from.as_deref().is_none_or(|f| cmp_utf16(row_key, f).is_ge())
            && self.after.as_deref().is_none_or(|a| cmp_utf16(row_key, a).is_gt())
            && self.before.as_deref().is_none_or(|b| cmp_utf16(row_key, b).is_lt())
            && self.to.as_deref().is_none_or(|t| cmp_utf16(row_key, t).is_le())
    }
}

/// A PartitionKey range of a cross-partition query ([`TableStore::query_partitions`]).
/// `None` bounds are open. Keys compare by UTF-16 code units, as the service does
/// (Azurite compares with JavaScript's `<`, i.e. UTF-16 code units; the embedded store
/// registers the same order), so `'\u{ffff}'` sorts above every other BMP character and
/// every astral character (a surrogate pair, `0xD800..0xDFFF`) sorts below U+E000.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartitionRange {
    /// Exclusive lower bound (`PartitionKey gt`).
    pub after: Option<String>,
    /// Exclusive upper bound (`PartitionKey lt`).
    pub before: Option<String>,
    /// Inclusive upper bound (`PartitionKey le`).
    pub to: Option<String>,
}

impl PartitionRange {
    /// True when `partition_key` lies inside every bound (UTF-16 code-unit order).
    pub fn contains(&self, partition_key: &str) -> bool {
        use key_rules::cmp_utf16;
        self.after.as_deref().is_none_or(|a| cmp_utf16(partition_key, a).is_gt())
            && self.before.as_deref().is_none_or(|b| cmp_utf16(partition_key, b).is_lt())
            && self.to.as_deref().is_none_or(|t| cmp_utf16(partition_key, t).is_le())
    }
}

/// One page of a query: entities in (PartitionKey, RowKey) order and, if the query may have
/// more, the opaque token to fetch the next page with.
#[derive(Debug, Clone, Default)]
pub struct Page {
    /// Entities of this page (at most the requested page size, at most [`MAX_PAGE`]).
    pub entities: Vec<Entity>,
    /// `Some` when more results may follow. A page can be short or empty and still have one.
    pub continuation: Option<String>,
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
    /// counted as a storage request by [`counting`], not subject to fault layers.
    async fn list_tables(&self) -> StoreResult<Option<Vec<String>>> {
        Ok(None)
    }

    /// Runs an entity group transaction on one partition: all operations or none.
    /// Rejected with `InvalidInput` before any I/O if it holds more than [`MAX_BATCH_OPS`]
    /// operations, mixes partitions or repeats a RowKey. Returns one ETag per operation
    /// (`None` for deletes). A failing operation yields `BatchFailed { index, .. }`.
    async fn batch(&self, table: &str, partition_key: &str, ops: &[BatchOp]) -> StoreResult<Vec<Option<ETag>>>;
}

/// A message received from a queue, invisible to others until its visibility timeout ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedMessage {
    /// Service-assigned message id (stable across redeliveries).
    pub id: String,
    /// Receipt required to delete or update this delivery; replaced by every receive/update.
    pub pop_receipt: String,
    /// How many times the message has been received, this delivery included (1 on first).
    pub dequeue_count: u32,
    /// The message text as stored (callers choose the encoding, e.g. Base64).
    pub text: String,
}

/// Queue operations. Queue names are lowercase letters, digits and single dashes, 3-63
/// characters.
#[async_trait]
pub trait QueueStore: Send + Sync {
    /// Creates the queue if it does not exist (idempotent).
    async fn create_queue(&self, queue: &str) -> StoreResult<()>;

    /// Deletes the queue; a missing queue is not an error.
    async fn delete_queue(&self, queue: &str) -> StoreResult<()>;

    /// Appends a message that becomes visible after `visible_after` (0 s to 7 days). The
    /// text must be at most [`MAX_MESSAGE_BYTES`]; returns the message id.
    async fn put_message(&self, queue: &str, text: &str, visible_after: Duration) -> StoreResult<String>;

    /// Receives up to `max` (1..=32) visible messages and hides them for `visibility`
    /// (1 s to 7 days), incrementing their dequeue count. No ordering is guaranteed.
    async fn receive_messages(
        &self,
        queue: &str,
        max: usize,
        visibility: Duration,
    ) -> StoreResult<Vec<ReceivedMessage>>;

    /// Deletes a received message; `PreconditionFailed` for a stale pop receipt, `NotFound`
    /// when it is already gone.
    async fn delete_message(&self, queue: &str, id: &str, pop_receipt: &str) -> StoreResult<()>;

    /// Makes a received message visible again after `visible_after`, keeping its text.
    /// Returns the new pop receipt.
    async fn release_message(
        &self,
        queue: &str,
        id: &str,
        pop_receipt: &str,
        text: &str,
        visible_after: Duration,
    ) -> StoreResult<String>;

    /// Approximate number of messages (visible or not).
    async fn approximate_count(&self, queue: &str) -> StoreResult<u64>;
}

/// A backend providing both tables and queues.
pub trait Store: TableStore + QueueStore {}
impl<T: TableStore + QueueStore> Store for T {}

/// Counts entities over the pages `fetch` returns (it gets the continuation token, `None`
/// first), asking for no page once the count reached `cap`: `(count, first RowKey)`.
pub(crate) async fn count_pages<F, Fut>(cap: u64, fetch: F) -> StoreResult<(u64, Option<String>)>
where
    F: Fn(Option<String>) -> Fut + Send,
    Fut: std::future::Future<Output = StoreResult<Page>> + Send,
{
    use futures::TryStreamExt;
    let mut pages = pager::follow(fetch);
    let (mut count, mut first) = (0u64, None);
    while count < cap {
        let Some(page) = pages.try_next().await? else { break };
        first = first.or_else(|| page.entities.first().map(|e| e.row_key.clone()));
        count += page.entities.len() as u64;
    }
    Ok((count, first))
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

/// Checks a pop receipt against the message's current one: `PreconditionFailed` when the
/// receipt is stale.
pub(crate) fn check_pop_receipt(current: &str, pop_receipt: &str) -> StoreResult<()> {
    if current == pop_receipt {
        Ok(())
    } else {
        Err(StoreError::PreconditionFailed("pop receipt does not match (PopReceiptMismatch)".into()))
    }
}

/// The error for a message that is gone (deleted, or never there: MessageNotFound).
pub(crate) fn message_not_found(id: &str) -> StoreError {
    StoreError::NotFound(format!("message {id} not found (MessageNotFound)"))
}

/// The error for an operation on a table that does not exist (TableNotFound).
pub(crate) fn table_not_found(table: &str) -> StoreError {
    StoreError::NotFound(format!("table '{table}' does not exist (TableNotFound)"))
}

/// The error for an operation on a queue that does not exist (QueueNotFound).
pub(crate) fn queue_not_found(queue: &str) -> StoreError {
    StoreError::NotFound(format!("queue '{queue}' does not exist (QueueNotFound)"))
}

/// The error for an insert that found the entity already there (EntityAlreadyExists).
pub(crate) fn already_exists() -> StoreError {
    StoreError::AlreadyExists("insert: the entity already exists (EntityAlreadyExists)".into())
}

/// Checks queue-message rules before I/O.
pub fn validate_message(text: &str, visible_after: Duration) -> StoreResult<()> {
    if text.len() > MAX_MESSAGE_BYTES {
        return Err(StoreError::InvalidInput(format!(
            "queue message: {} bytes, the limit is {MAX_MESSAGE_BYTES}",
            text.len()
        )));
    }
    if visible_after > Duration::from_secs(7 * 24 * 3600) {
        return Err(StoreError::InvalidInput("queue message: visibility delay over 7 days".into()));
    }
    Ok(())
}

/// Checks receive parameters before I/O (Azure: 1..=32 messages, visibility 1 s..7 days).
pub fn validate_receive(max: usize, visibility: Duration) -> StoreResult<()> {
    if max == 0 || max > MAX_RECEIVE {
        return Err(StoreError::InvalidInput(format!("receive: {max} messages requested, allowed 1..={MAX_RECEIVE}")));
    }
    if visibility < Duration::from_secs(1) || visibility > Duration::from_secs(7 * 24 * 3600) {
        return Err(StoreError::InvalidInput(
            "receive: visibility timeout must be 1 s to 7 days (whole seconds)".into(),
        ));
    }
    Ok(())
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

/// Checks a queue name before I/O: 3-63 lowercase letters, digits and single dashes,
/// starting and ending with a letter or digit.
pub fn check_queue_name(queue: &str) -> StoreResult<()> {
    let ok = (3..=63).contains(&queue.len())
        && queue.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !queue.starts_with('-')
        && !queue.ends_with('-')
        && !queue.contains("--");
    if ok {
        Ok(())
    } else {
        Err(StoreError::InvalidInput(format!(
            "queue name {queue:?} is invalid: 3-63 lowercase letters, digits and single dashes"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::RowRange;

    #[test]
    fn row_range_compares_utf16_code_units() {
        // By code points (Rust's `str` order) U+E000 < U+1F600; by UTF-16 code units the
        // emoji's high surrogate U+D83D sorts first, as the service orders keys.
        let below_e000 = RowRange { before: Some("\u{e000}".into()), ..RowRange::default() };
        assert!(below_e000.contains("😀"));
        let above_emoji = RowRange { after: Some("😀".into()), to: Some("\u{ffff}".into()), ..RowRange::default() };
        assert!(above_emoji.contains("\u{e000}") && !above_emoji.contains("😀") && !above_emoji.contains("z"));
    }
}
