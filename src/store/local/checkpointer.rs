//! Checkpoints of a file-backed store, off the writer thread.
//!
//! In WAL journal mode a commit appends pages to the `-wal` file; a checkpoint copies them
//! back into the database file and fsyncs it. SQLite runs one by default inside the commit
//! that takes the log past 1,000 pages, on the committing connection: here the writer
//! thread, which then holds every queued write for the copy and the database fsync (under
//! load about a fifth of the writer's time, and most of its slow commits).
//!
//! This thread does that work instead, on a connection of its own: after commits it runs a
//! `PASSIVE` checkpoint, which copies what no reader still needs without blocking the writer
//! or any reader. The writer keeps SQLite's automatic checkpoint only as a backstop at
//! [`BACKSTOP_PAGES`]: a passive checkpoint under a continuous stream of commits is never
//! quite complete, and SQLite starts the log over only after a complete one, so the writer's
//! own checkpoint (of the few pages this thread has not copied yet) bounds the log.
//!
//! Durability is unchanged: a commit is durable once its pages are in the fsynced log, before
//! any checkpoint; a checkpoint copies committed pages only, with the same `synchronous`
//! setting, and a crash during one is recovered from the log. Source: SQLite documentation,
//! "Write-Ahead Logging", sections "Checkpointing" and "Automatic Checkpoint"
//! (sqlite.org/wal.html), and "sqlite3_wal_checkpoint_v2" (sqlite.org/c3ref/wal_checkpoint_v2.html).

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use rusqlite::Connection;

use super::super::error::{StoreError, StoreResult};
use super::sql::db_err;

/// Log size, in pages, at which the writer checkpoints itself (SQLite's
/// `wal_autocheckpoint`; its default is 1,000). With 4 KiB pages the log stays below about
/// 40 MiB.
pub(super) const BACKSTOP_PAGES: u32 = 10_000;

/// Pause after a checkpoint before the next, so that one checkpoint copies many commits
/// (pages rewritten by several commits are copied once) and an idle store wakes nobody.
const PAUSE: Duration = Duration::from_millis(20);

/// Handle the writer nudges after each commit; the thread ends when it is dropped.
pub(super) struct Nudge(mpsc::SyncSender<()>);

impl Nudge {
    /// Tells the thread that a commit added to the log. Never blocks.
    pub(super) fn committed(&self) {
        // Full: a nudge is already pending; disconnected: the thread is gone (its
        // checkpoints then fall to the writer's backstop).
        let _ = self.0.try_send(());
    }
}

/// Starts the checkpoint thread on its own connection to the database at `path`, with the
/// writer's `synchronous` setting (`sync`, e.g. `"FULL"`).
pub(super) fn start(path: &Path, sync: &str) -> StoreResult<Nudge> {
    let conn = Connection::open(path).map_err(db_err)?;
    super::sql::configure(&conn)?;
    conn.execute_batch(&format!("PRAGMA synchronous={sync};")).map_err(db_err)?;
    let (tx, rx) = mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("tc-sqlite-ckpt".into())
        .spawn(move || run(&conn, &rx))
        .map_err(|e| StoreError::Other(format!("embedded store: cannot start the checkpoint thread: {e}")))?;
    Ok(Nudge(tx))
}

fn run(conn: &Connection, nudges: &mpsc::Receiver<()>) {
    while nudges.recv().is_ok() {
        std::thread::sleep(PAUSE);
        let _ = nudges.try_recv(); // commits during the pause are covered by this checkpoint
                                   // Errors are not fatal: a busy or failed checkpoint is retried after the next commit,
                                   // and the writer's backstop bounds the log meanwhile.
        if let Err(e) = checkpoint(conn) {
            tracing::debug!(error = %e, "embedded store: background checkpoint failed");
        }
    }
}

/// One passive checkpoint: `(log pages, pages copied so far)`.
pub(super) fn checkpoint(conn: &Connection) -> StoreResult<(i64, i64)> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| Ok((r.get::<_, i64>(1)?, r.get::<_, i64>(2)?)))
        .map_err(db_err)
}
