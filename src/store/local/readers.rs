//! Read connections of a file-backed store, so reads never queue behind the writer's group
//! transaction. SQLite in WAL journal mode lets readers run while a writer writes; a read
//! sees every transaction committed before it started, so it sees every acknowledged write
//! (the writer answers after its commit returns).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OpenFlags};

use super::super::{StoreError, StoreResult};
use super::sql::db_err;

/// Most idle read connections kept open; more are opened while more reads run at once.
const MAX_IDLE: usize = 16;

/// A pool of read-only connections on one database file.
pub(super) struct Readers {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

impl Readers {
    /// A pool on `path` (the database must exist, with its schema).
    pub(super) fn new(path: PathBuf) -> Readers {
        Readers { path, idle: Mutex::new(Vec::new()) }
    }

    fn open(&self) -> StoreResult<Connection> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI;
        let conn = Connection::open_with_flags(&self.path, flags).map_err(db_err)?;
        super::configure(&conn)?;
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
            if idle.len() < MAX_IDLE {
                idle.push(conn);
            }
        }
    }

    /// Runs `read` in one read transaction (a consistent snapshot) on a pooled connection,
    /// off the async runtime.
    pub(super) async fn call<T, F>(self: &Arc<Self>, read: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        let pool = self.clone();
        tokio::task::spawn_blocking(move || {
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
