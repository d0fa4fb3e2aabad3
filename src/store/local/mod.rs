//! Embedded backend: one SQLite file (bundled build) holding tables and queues with Azure's
//! semantics: ETags and conditional writes, RowKey-ordered pages of at most 1,000 entities
//! with continuation tokens, atomic entity group transactions, queue visibility timeouts,
//! dequeue counts and pop receipts.
//!
//! Writes (queue operations included) go to one writer thread that commits them in groups
//! (`writer.rs`): concurrent writes share one transaction and one fsync, each in its own
//! savepoint so one failing write never affects another, and each is acknowledged only after
//! its group's commit returned. Reads of a file-backed store run on separate read
//! connections (`readers.rs`) and never wait for the writer; an in-memory store has a single
//! connection, so its reads go through the writer too.
//!
//! Checkpoints (copying the log back into the database file) of a file-backed store run on a
//! thread of their own (`checkpointer.rs`), not inside the writer's commits.
//!
//! Durability: SQLite in WAL journal mode. With [`Durability::Full`] (the default) every
//! commit is fsynced (`synchronous=FULL`), so an acknowledged write survives a power loss;
//! with [`Durability::Process`] (`synchronous=NORMAL`) it survives a killed process but not
//! an OS crash. Source: SQLite documentation, "PRAGMA synchronous" and "Write-Ahead Logging"
//! (sqlite.org/pragma.html#pragma_synchronous, sqlite.org/wal.html).
//!
//! Keys compare in UTF-16 code-unit order (the order Azurite uses; SQLite's own would be
//! code-point order), through a registered collation.

mod checkpointer;
mod codec;
mod readers;
mod sql;
#[cfg(test)]
mod tests;
mod writer;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::Connection;

use super::error::StoreResult;
use super::page::{Page, PartitionRange, RowRange, MAX_PAGE};
use super::queue::{validate_message, validate_receive, QueueStore, ReceivedMessage};
use super::table::{validate_batch, BatchOp, IfMatch, TableStore};
use super::value::{ETag, Entity};
use codec::{decode_token, utf16_cmp};
use readers::Readers;
use sql::{db_err, Encoded};
use writer::Writer;

pub use writer::WriteStats;

/// How hard commits are pushed to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// fsync on every commit (`synchronous=FULL`): survives power loss. Concurrent writes
    /// share a commit, so they share its fsync.
    #[default]
    Full,
    /// fsync at checkpoints only (`synchronous=NORMAL`): survives a killed process.
    Process,
}

/// The embedded store. Cheap to clone; clones share the writer thread and the read
/// connections. The writer thread stops when the last clone is dropped.
#[derive(Clone)]
pub struct LocalStore {
    writer: Arc<Writer>,
    /// `None` for an in-memory store: reads then go through the writer's connection.
    readers: Option<Arc<Readers>>,
}

impl std::fmt::Debug for LocalStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LocalStore")
    }
}

impl LocalStore {
    /// Opens (creating if needed) the store in folder `dir` (file `catalog.sqlite3`).
    /// Errors: the folder or file cannot be created or opened, the writer thread cannot be
    /// started.
    pub fn open(dir: &Path, durability: Durability) -> StoreResult<LocalStore> {
        std::fs::create_dir_all(dir).map_err(|e| {
            super::error::StoreError::Other(format!("embedded store: cannot create {}: {e}", dir.display()))
        })?;
        let path = dir.join("catalog.sqlite3");
        let conn = Connection::open(&path).map_err(db_err)?;
        let sync = Self::prepare(&conn, durability)?;
        // The writer checkpoints itself only past the backstop; the checkpoint thread does
        // it before (see `checkpointer`).
        conn.pragma_update(None, "wal_autocheckpoint", checkpointer::BACKSTOP_PAGES).map_err(db_err)?;
        let checkpoints = checkpointer::start(&path, sync)?;
        let writer = Arc::new(Writer::start(conn, Some(checkpoints))?);
        Ok(LocalStore { writer, readers: Some(Arc::new(Readers::new(path))) })
    }

    /// A private in-memory store (tests, benchmarks).
    pub fn in_memory() -> StoreResult<LocalStore> {
        let conn = Connection::open_in_memory().map_err(db_err)?;
        Self::prepare(&conn, Durability::Process)?;
        Ok(LocalStore { writer: Arc::new(Writer::start(conn, None)?), readers: None })
    }

    /// Configures the writer's connection (journal mode, `synchronous`, schema); returns
    /// the `synchronous` setting, which the checkpoint connection shares.
    fn prepare(conn: &Connection, durability: Durability) -> StoreResult<&'static str> {
        sql::configure(conn)?;
        let sync = match durability {
            Durability::Full => "FULL",
            Durability::Process => "NORMAL",
        };
        conn.execute_batch(&format!("PRAGMA journal_mode=WAL; PRAGMA synchronous={sync};")).map_err(db_err)?;
        conn.execute_batch(sql::SCHEMA).map_err(db_err)?;
        Ok(sync)
    }

    /// Counts of the writer thread's work since the store was opened (shared by clones):
    /// `requests / commits` is the mean number of requests per transaction (and fsync).
    pub fn write_stats(&self) -> WriteStats {
        self.writer.stats()
    }

    /// Runs `work` in the writer's next group transaction (see [`writer`]).
    async fn write<T, F>(&self, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        self.writer.call(work).await
    }

    /// Runs `read` on a read connection, or through the writer for an in-memory store.
    async fn read<T, F>(&self, read: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        match &self.readers {
            Some(readers) => readers.call(read).await,
            None => self.writer.call(read).await,
        }
    }
}

#[async_trait]
impl TableStore for LocalStore {
    async fn create_table(&self, table: &str) -> StoreResult<()> {
        super::table::check_table_name(table)?;
        let t = table.to_lowercase();
        self.write(move |c| sql::create_table(c, &t)).await
    }

    async fn delete_table(&self, table: &str) -> StoreResult<()> {
        let t = table.to_lowercase();
        self.write(move |c| sql::delete_table(c, &t)).await
    }

    async fn list_tables(&self) -> StoreResult<Option<Vec<String>>> {
        self.read(sql::table_names).await.map(Some)
    }

    async fn get(&self, table: &str, partition_key: &str, row_key: &str) -> StoreResult<Option<Entity>> {
        let (t, pk, rk) = (table.to_lowercase(), partition_key.to_string(), row_key.to_string());
        self.read(move |c| sql::get(c, &t, &pk, &rk)).await
    }

    async fn insert(&self, table: &str, entity: &Entity) -> StoreResult<ETag> {
        let (t, e) = (table.to_lowercase(), Encoded::new(entity)?);
        self.write(move |c| {
            sql::require_table(c, &t)?;
            sql::insert(c, &t, &e)
        })
        .await
    }

    async fn upsert(&self, table: &str, entity: &Entity) -> StoreResult<ETag> {
        let (t, e) = (table.to_lowercase(), Encoded::new(entity)?);
        self.write(move |c| {
            sql::require_table(c, &t)?;
            sql::upsert(c, &t, &e)
        })
        .await
    }

    async fn replace(&self, table: &str, entity: &Entity, if_match: &IfMatch) -> StoreResult<ETag> {
        let (t, e, m) = (table.to_lowercase(), Encoded::new(entity)?, if_match.clone());
        self.write(move |c| {
            sql::require_table(c, &t)?;
            sql::replace(c, &t, &e, &m)
        })
        .await
    }

    async fn delete(&self, table: &str, partition_key: &str, row_key: &str, if_match: &IfMatch) -> StoreResult<()> {
        let (t, pk, rk, m) = (table.to_lowercase(), partition_key.to_string(), row_key.to_string(), if_match.clone());
        self.write(move |c| {
            sql::require_table(c, &t)?;
            sql::delete(c, &t, &pk, &rk, &m)
        })
        .await
    }

    async fn query_partition(
        &self,
        table: &str,
        partition_key: &str,
        range: &RowRange,
        limit: usize,
        continuation: Option<&str>,
    ) -> StoreResult<Page> {
        let limit = limit.clamp(1, MAX_PAGE);
        let mut range = range.clone();
        if let Some(token) = continuation {
            let (_, after) = decode_token(token)?;
            if range.after.as_ref().is_none_or(|a| utf16_cmp(&after, a).is_gt()) {
                range.after = Some(after);
            }
        }
        let (t, pk) = (table.to_lowercase(), partition_key.to_string());
        self.read(move |c| sql::query_partition(c, &t, &pk, &range, limit)).await
    }

    async fn count_range(
        &self,
        table: &str,
        partition_key: &str,
        range: &RowRange,
        cap: u64,
    ) -> StoreResult<(u64, Option<String>)> {
        let (t, pk, range) = (table.to_lowercase(), partition_key.to_string(), range.clone());
        self.read(move |c| sql::count_range(c, &t, &pk, &range, cap)).await
    }

    async fn query_partitions(
        &self,
        table: &str,
        range: &PartitionRange,
        limit: usize,
        continuation: Option<&str>,
    ) -> StoreResult<Page> {
        let limit = limit.clamp(1, MAX_PAGE);
        let after = continuation.map(decode_token).transpose()?;
        let (t, range) = (table.to_lowercase(), range.clone());
        self.read(move |c| sql::query_partitions(c, &t, &range, limit, after)).await
    }

    async fn scan(&self, table: &str, limit: usize, continuation: Option<&str>) -> StoreResult<Page> {
        let limit = limit.clamp(1, MAX_PAGE);
        let after = continuation.map(decode_token).transpose()?;
        let t = table.to_lowercase();
        self.read(move |c| sql::scan(c, &t, limit, after)).await
    }

    async fn batch(&self, table: &str, partition_key: &str, ops: &[BatchOp]) -> StoreResult<Vec<Option<ETag>>> {
        validate_batch(partition_key, ops)?;
        let ops = ops.iter().map(sql::Op::new).collect::<StoreResult<Vec<_>>>()?;
        let (t, pk) = (table.to_lowercase(), partition_key.to_string());
        // The request's savepoint makes the batch atomic: a failing operation rolls back
        // the operations before it.
        self.write(move |c| sql::batch(c, &t, &pk, &ops)).await
    }
}

#[async_trait]
impl QueueStore for LocalStore {
    async fn create_queue(&self, queue: &str) -> StoreResult<()> {
        super::queue::check_queue_name(queue)?;
        let q = queue.to_string();
        self.write(move |c| sql::create_queue(c, &q)).await
    }

    async fn delete_queue(&self, queue: &str) -> StoreResult<()> {
        let q = queue.to_string();
        self.write(move |c| sql::delete_queue(c, &q)).await
    }

    async fn put_message(&self, queue: &str, text: &str, visible_after: Duration) -> StoreResult<String> {
        validate_message(text, visible_after)?;
        let (q, text) = (queue.to_string(), text.to_string());
        self.write(move |c| sql::put_message(c, &q, &text, visible_after)).await
    }

    async fn receive_messages(
        &self,
        queue: &str,
        max: usize,
        visibility: Duration,
    ) -> StoreResult<Vec<ReceivedMessage>> {
        validate_receive(max, visibility)?;
        let q = queue.to_string();
        // A write: it hides what it returns, in the same transaction that read it, so no
        // other caller receives the same messages until their visibility timeout ends.
        self.write(move |c| sql::receive_messages(c, &q, max, visibility)).await
    }

    async fn delete_message(&self, queue: &str, id: &str, pop_receipt: &str) -> StoreResult<()> {
        let (q, id, r) = (queue.to_string(), id.to_string(), pop_receipt.to_string());
        self.write(move |c| sql::delete_message(c, &q, &id, &r)).await
    }

    async fn release_message(
        &self,
        queue: &str,
        id: &str,
        pop_receipt: &str,
        text: &str,
        visible_after: Duration,
    ) -> StoreResult<String> {
        validate_message(text, visible_after)?;
        let (q, id, r, text) = (queue.to_string(), id.to_string(), pop_receipt.to_string(), text.to_string());
        self.write(move |c| sql::release_message(c, &q, &id, &r, &text, visible_after)).await
    }

    async fn approximate_count(&self, queue: &str) -> StoreResult<u64> {
        let q = queue.to_string();
        self.read(move |c| sql::approximate_count(c, &q)).await
    }
}
