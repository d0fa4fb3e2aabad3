//! Group commit: one thread owns the write connection and runs every write request it has
//! queued in one SQLite transaction, so concurrent writes share one commit (one fsync under
//! [`super::Durability::Full`]).
//!
//! The thread takes the first request from its channel, opens `BEGIN IMMEDIATE`, and keeps
//! taking requests as long as some are queued, up to [`MAX_GROUP`]; it never waits for more
//! (batching comes from concurrency, not from a delay). Each request runs in its own
//! `SAVEPOINT`, so a failing request (a 409, a 412, a failed entity group transaction)
//! rolls back only itself. After `COMMIT` returns, every request of the group is answered:
//! an acknowledged write is durable. If the transaction fails as a whole (the commit, or
//! SQLite rolling it back after an I/O error), every request that had succeeded gets that
//! error instead, and nothing of the group is written.
//!
//! If the thread is gone (it cannot be started, or it died), calls fail with
//! [`StoreError::Other`] naming the writer; they never hang. A request that panics is
//! rolled back and answered with an error; the thread goes on with the next one.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::super::error::{StoreError, StoreResult};
use super::checkpointer::Nudge;
use super::sql::db_err;

/// Most requests one transaction holds. Bounds the time a request waits for the commit of a
/// long group and the size of that transaction.
pub const MAX_GROUP: usize = 512;

/// A request the writer thread runs inside the group transaction and answers after it.
trait Request: Send {
    /// Runs the request on the connection (inside its savepoint). True when it succeeded and
    /// its changes are to be kept.
    fn run(&mut self, conn: &Connection) -> bool;
    /// Answers the caller once the group's outcome is known: `Ok` when the group committed,
    /// else the group's error.
    fn answer(self: Box<Self>, group: Result<(), &StoreError>);
}

/// A caller's work `F` producing `T`, its result, and where the answer goes.
struct Call<T, F> {
    work: Option<F>,
    result: Option<StoreResult<T>>,
    reply: oneshot::Sender<StoreResult<T>>,
}

impl<T, F> Request for Call<T, F>
where
    T: Send,
    F: FnOnce(&Connection) -> StoreResult<T> + Send,
{
    fn run(&mut self, conn: &Connection) -> bool {
        let Some(work) = self.work.take() else { return false };
        let result = work(conn);
        let ok = result.is_ok();
        self.result = Some(result);
        ok
    }

    fn answer(self: Box<Self>, group: Result<(), &StoreError>) {
        let reply = match (self.result, group) {
            // A failed request wrote nothing, whatever happened to the group.
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(v)), Ok(())) => Ok(v),
            (Some(Ok(_)) | None, Err(e)) => Err(e.clone()),
            (None, Ok(())) => Err(StoreError::Other(
                "embedded store: the request failed inside the writer thread (panic); nothing of it was written".into(),
            )),
        };
        // The caller may have gone away (its future dropped); nothing to do then.
        let _ = self.reply.send(reply);
    }
}

enum Msg {
    Request(Box<dyn Request>),
    /// Stops the thread as if it had died (tests of the error path).
    #[cfg(test)]
    Die,
}

impl Msg {
    /// The request; `None` when the thread is to stop.
    fn request(self) -> Option<Box<dyn Request>> {
        match self {
            Msg::Request(r) => Some(r),
            #[cfg(test)]
            Msg::Die => None,
        }
    }
}

/// Handle to the writer thread; the thread ends when the last handle is dropped.
pub(super) struct Writer {
    tx: mpsc::Sender<Msg>,
    stats: Arc<Counters>,
}

/// What the writer thread did so far.
#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    commits: AtomicU64,
}

/// Counts of the writer's work since the store was opened: `requests / commits` is the
/// mean group size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriteStats {
    /// Requests run (writes, queue operations, and the reads of an in-memory store).
    pub requests: u64,
    /// Transactions committed.
    pub commits: u64,
}

fn writer_gone() -> StoreError {
    StoreError::Other("embedded store: the writer thread has stopped; reopen the store".into())
}

impl Writer {
    /// Starts the thread, which owns `conn` from now on. `checkpoints` is told of every
    /// commit (a file-backed store's checkpoint thread, see [`super::checkpointer`]).
    pub(super) fn start(conn: Connection, checkpoints: Option<Nudge>) -> StoreResult<Writer> {
        let (tx, rx) = mpsc::channel();
        let stats = Arc::new(Counters::default());
        let counters = stats.clone();
        std::thread::Builder::new()
            .name("tc-sqlite-writer".into())
            .spawn(move || run(conn, rx, &Observers { stats: &counters, checkpoints: checkpoints.as_ref() }))
            .map_err(|e| StoreError::Other(format!("embedded store: cannot start the writer thread: {e}")))?;
        Ok(Writer { tx, stats })
    }

    /// Counts of the work done so far.
    pub(super) fn stats(&self) -> WriteStats {
        WriteStats {
            requests: self.stats.requests.load(Ordering::Relaxed),
            commits: self.stats.commits.load(Ordering::Relaxed),
        }
    }

    /// Runs `work` in the next group transaction and returns its result once the group is
    /// committed (or the group's error if it is not). `work` must not open a transaction.
    pub(super) async fn call<T, F>(&self, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let call = Call { work: Some(work), result: None, reply };
        self.tx.send(Msg::Request(Box::new(call))).map_err(|_| writer_gone())?;
        answer.await.map_err(|_| writer_gone())?
    }

    /// Makes the thread exit as if it had died.
    #[cfg(test)]
    pub(super) fn kill(&self) {
        let _ = self.tx.send(Msg::Die);
    }
}

/// Who hears of each group: the counters, and the checkpoint thread if any.
struct Observers<'a> {
    stats: &'a Counters,
    checkpoints: Option<&'a Nudge>,
}

/// The thread: one group per turn until every handle is dropped.
fn run(conn: Connection, rx: mpsc::Receiver<Msg>, obs: &Observers<'_>) {
    while let Some(first) = rx.recv().ok().and_then(Msg::request) {
        if !group(&conn, &rx, first, obs) {
            return;
        }
    }
}

/// Runs one group: `first` and whatever else is queued, up to [`MAX_GROUP`]. False when
/// the thread is to stop.
fn group(conn: &Connection, rx: &mpsc::Receiver<Msg>, first: Box<dyn Request>, obs: &Observers<'_>) -> bool {
    if let Err(e) = statement(conn, "BEGIN IMMEDIATE") {
        first.answer(Err(&e));
        return true;
    }
    let mut done: Vec<Box<dyn Request>> = Vec::new();
    let mut next = Some(first);
    while let Some(mut request) = next.take() {
        let ran = run_one(conn, request.as_mut());
        done.push(request);
        if let Err(e) = ran {
            finish(conn, done, Err(e), obs);
            return true;
        }
        if done.len() >= MAX_GROUP {
            break;
        }
        next = match rx.try_recv().map(Msg::request) {
            Ok(Some(r)) => Some(r),
            Ok(None) => {
                finish(conn, done, Ok(()), obs);
                return false;
            }
            Err(_) => None,
        };
    }
    finish(conn, done, Ok(()), obs);
    true
}

/// Commits the group (unless `so_far` is already an error), rolls it back on failure, and
/// answers every request of it.
fn finish(conn: &Connection, done: Vec<Box<dyn Request>>, so_far: StoreResult<()>, obs: &Observers<'_>) {
    let outcome = so_far.and_then(|()| statement(conn, "COMMIT"));
    obs.stats.requests.fetch_add(done.len() as u64, Ordering::Relaxed);
    if outcome.is_ok() {
        obs.stats.commits.fetch_add(1, Ordering::Relaxed);
        if let Some(checkpoints) = obs.checkpoints {
            checkpoints.committed();
        }
    }
    if outcome.is_err() && !conn.is_autocommit() {
        // Best effort: the error answered below is what matters.
        let _ = conn.execute_batch("ROLLBACK");
    }
    let outcome = outcome.map_err(|e| {
        let what = format!("transaction failed, nothing of this group was written: {e}");
        match e {
            StoreError::Unavailable(_) => StoreError::Unavailable(what),
            _ => StoreError::Other(format!("embedded store: {what}")),
        }
    });
    for request in done {
        request.answer(outcome.as_ref().map(|_| ()));
    }
}

/// Runs one request in its own savepoint. `Err` when the group transaction itself is no
/// longer usable (a savepoint statement failed, or SQLite rolled the transaction back).
fn run_one(conn: &Connection, request: &mut dyn Request) -> StoreResult<()> {
    statement(conn, "SAVEPOINT request")?;
    let ok = catch_unwind(AssertUnwindSafe(|| request.run(conn))).unwrap_or(false);
    if conn.is_autocommit() {
        return Err(StoreError::Other("embedded store: SQLite rolled the transaction back".into()));
    }
    if !ok {
        statement(conn, "ROLLBACK TO request")?;
    }
    statement(conn, "RELEASE request")
}

/// Runs a transaction-control statement through the statement cache.
fn statement(conn: &Connection, sql: &str) -> StoreResult<()> {
    conn.prepare_cached(sql).and_then(|mut s| s.execute([])).map(|_| ()).map_err(db_err)
}
