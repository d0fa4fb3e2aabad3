//! Read connections of a file-backed store, so reads never queue behind the writer's group
//! transaction. SQLite in WAL journal mode lets readers run while a writer writes; a read
//! sees every transaction committed before it started, so it sees every acknowledged write
//! (the writer answers after its commit returns).
//!
//! At most [`MAX_READERS`] reads run at once, each on a blocking thread with a pooled
//! connection; further reads wait for a slot without a thread. Without the bound, a
//! whole-table verify job with 8 workers (up to 8 × 16 rows checked at once, each reading up
//! to one row per index field) ran every read on a thread of its own (517 threads, Tokio's
//! blocking pool at its limit of 512) and opened a connection for each read beyond the pool,
//! which it closed afterwards: CPU spent opening connections, and a resident set that grew
//! during the run (docs/BENCHMARKS.md, "Whole-table scan: verify and export").

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OpenFlags};
use tokio::sync::Semaphore;

use super::super::error::{StoreError, StoreResult};
use super::sql::db_err;

/// Most reads running at once, and so most read connections open and blocking threads
/// reading: more would not read faster (SQLite reads are CPU work on this process's cores),
/// and each costs a thread and a connection with its own page cache (2 MiB by default).
pub(super) const MAX_READERS: usize = 16;

/// A pool of read-only connections on one database file.
pub(super) struct Readers {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
    /// One permit per read running ([`MAX_READERS`]).
    slots: Arc<Semaphore>,
    /// Connections opened so far (tests).
    opened: AtomicUsize,
}

impl Readers {
    /// A pool on `path` (the database must exist, with its schema).
    pub(super) fn new(path: PathBuf) -> Readers {
        Readers {
            path,
            idle: Mutex::new(Vec::new()),
            slots: Arc::new(Semaphore::new(MAX_READERS)),
            opened: AtomicUsize::new(0),
        }
    }

    /// Connections opened since the pool was made.
    #[cfg(test)]
    pub(super) fn opened(&self) -> usize {
        self.opened.load(Ordering::Relaxed)
    }

    fn open(&self) -> StoreResult<Connection> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI;
        let conn = Connection::open_with_flags(&self.path, flags).map_err(db_err)?;
        self.opened.fetch_add(1, Ordering::Relaxed);
        super::sql::configure(&conn)?;
        // Reads only: a bug here cannot write around the writer's group commit.
        conn.execute_batch("PRAGMA query_only = 1").map_err(db_err)?;
        Ok(conn)
    }

    fn take(&self) -> StoreResult<Connection> {
        let pooled = self.idle.lock().map_err(|_| poisoned())?.pop();
        match pooled {
            Some(conn) => Ok(conn),
            None => self.open(),
        }
    }

    fn give_back(&self, conn: Connection) {
        if let Ok(mut idle) = self.idle.lock() {
            if idle.len() < MAX_READERS {
                idle.push(conn);
            }
        }
    }

    /// Runs `read` in one read transaction (a consistent snapshot) on a pooled connection,
    /// off the async runtime, once one of the [`MAX_READERS`] slots is free.
    pub(super) async fn call<T, F>(self: &Arc<Self>, read: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        let slot = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| StoreError::Other("embedded store: read pool closed".into()))?;
        let pool = self.clone();
        tokio::task::spawn_blocking(move || {
            // Held until the read is done, even if the caller stops waiting for it.
            let _slot = slot;
            let conn = pool.take()?;
            let result = conn.unchecked_transaction().map_err(db_err).and_then(|tx| read(&tx));
            pool.give_back(conn);
            result
        })
        .await
        .map_err(|e| StoreError::Other(format!("embedded store: read task failed: {e}")))?
    }
}

fn poisoned() -> StoreError {
    StoreError::Other("embedded store: read pool poisoned by an earlier panic".into())
}
