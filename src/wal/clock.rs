//! WAL id allocation without a single-row sequencer of ids: one row holds the high-water mark,
//! read with one point read and raised with one conditional write per append round.
//!
//! The order invariant: an operation acknowledged before another one is issued gets the
//! smaller WAL id, across processes and whatever their clocks say.
//!
//! The row [`HIGH_ROW`] of the WAL table's partition [`CLOCK`] holds `last`, the largest id
//! timestamp any process published, and the catalog's schema version (below). Allocating ids
//! is one round:
//! 1. read the high row (one point read, one entity whatever the number of processes): the
//!    high-water mark `h` and the row's ETag;
//! 2. hand out timestamps from `max(now + skew, h + 1, own last + 1)` on, one microsecond
//!    apart;
//! 3. publish the new `last`: replace the high row conditional on the ETag read (Azure's
//!    optimistic concurrency, `If-Match`), keeping its other properties. On 412 (another
//!    process raised it meanwhile) the row is read again: when it already holds `last` or
//!    more, the publication is done (someone published a larger value, durably); else the
//!    replace is tried again on the new ETag. The caller writes its WAL entries at the same
//!    time and acknowledges only when both are done.
//!
//! Why the order holds: write A is acknowledged only after the high row durably held a
//! `last` at or above A's id (its own replace succeeded, or a read after a 412 saw a value at
//! or above it). Write B, issued after that acknowledgement, reads the row after that (the
//! Table service is strongly consistent), so `h >= id(A)` and every id of B is larger. The
//! row's `last` never goes back: every write of it is conditional on the ETag of a read that
//! showed a smaller value, and writes the larger one (a replace whose ETag is stale fails).
//! Within a process, `own last + 1` keeps ids increasing even when two rounds overlap.
//!
//! Each publication also raises the row's publication count `n` by one; two observations of
//! it give the catalog's rate of publications, by which `src/wal/pace.rs` spaces the rounds of
//! each process (and [`WriteShare`] is estimated). Nothing about order depends on `n`.
//!
//! Cost: per round one point read and one conditional replace, one entity each, on a
//! partition of its own, whatever the number of ids; rounds of one process are coalesced by
//! [`super::append`] (group commit), and a process reuses the ETag its last read or write
//! returned, so a process alone pays exactly those two requests. With several processes a
//! replace can meet 412: one more read, and a retry only when the other process published a
//! smaller value. The previous design (one row per process, keyed by the inverted timestamp,
//! so that the partition's first row held the maximum) needed a query for the read (Azure's
//! query latency, about 30 ms median on the simulated account against 5 ms for a point
//! read) and an entity group transaction of two entities for the publication.
//!
//! **The schema version** ([`crate::indexes`]) rides on the same read: the high row's
//! `version` holds the catalog's schema version, raised by each index change
//! ([`Clock::raise_schema_version`], conditional like a publication). A writer that
//! validated its operations under an older version learns it there, before it writes
//! anything ([`super::append`]).
//!
//! **Catalogs from before the high row** keep their clock rows in this partition (one per
//! process, RowKey [`row_key`], and the schema version in [`SCHEMA_ROW`]) and, older still, in
//! `metadata` (RowKeys `clock-*`). The first read that finds no high row creates it from
//! those (their largest `last`, the stored schema version; an insert, so two processes doing
//! it at once agree); the sweeper then deletes them ([`Clock::prune`]). A process of an
//! older version still running reads only those rows: stop old processes before new ones
//! write, which a deployment does.

use std::time::Duration;

use futures::TryStreamExt;

use super::id::now_micros;
use super::layout::METADATA;
use crate::error::Result;
use crate::store::{pager, Entity, IfMatch, RowRange, Store, StoreError, Value, MAX_PAGE};

/// PartitionKey of the clock rows in the WAL table.
pub const CLOCK: &str = "clock";
/// RowKey prefix of the clock rows of earlier versions, in the `metadata` partition.
pub const LEGACY_PREFIX: &str = "clock-";
/// RowKey of the high row in [`CLOCK`]: properties `last` (Int64, µs), `version` (Int64,
/// the schema version), `n` (Int64, how many publications raised `last`: the pace's rate,
/// `src/wal/pace.rs`), `owner` (the process that last raised `last`) and `at` (when, µs).
pub const HIGH_ROW: &str = "~high";
/// RowKey of the schema-version row of catalogs from before the high row (property
/// `version`, Int64), read once when the high row is created.
pub const SCHEMA_ROW: &str = "!schema";

/// RowKey of a clock row of the design before the high row, publishing `last` for `owner`:
/// the inverted timestamp, 19 digits, so a larger `last` sorts first, then the owner. Read
/// once when the high row is created ([`HIGH_ROW`]).
pub fn row_key(last: i64, owner: &str) -> String {
    format!("{:019}-{owner}", i64::MAX - last.max(0))
}

/// The RowKey range of the legacy clock rows (`clock-` ≤ RowKey < `clock.` in `metadata`).
fn legacy_range() -> RowRange {
    RowRange { from: Some(LEGACY_PREFIX.into()), before: Some("clock.".into()), ..RowRange::default() }
}

fn last_of(e: &Entity) -> i64 {
    match e.properties.get("last") {
        Some(Value::Int64(v)) => *v,
        _ => 0,
    }
}

/// The high row's publication count (property `n`; absent on a row of an older version: 0).
fn count_of(e: &Entity) -> i64 {
    match e.properties.get("n") {
        Some(Value::Int64(v)) => *v,
        _ => 0,
    }
}

fn version_of(e: &Entity) -> u64 {
    match e.properties.get("version") {
        Some(Value::Int64(v)) => (*v).max(0) as u64,
        _ => 0,
    }
}

/// What one clock read says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClockRead {
    /// The largest `last` any process published (0 when none did).
    pub high: i64,
    /// The schema version (0 when no index change ever happened).
    pub schema_version: u64,
}

/// A process's share of the catalog's writes, estimated for free from the clock's traffic:
/// its publications per second over the catalog's, both from `src/wal/pace.rs` (the high row
/// counts publications, so two reads give the catalog's rate exactly). One process alone:
/// 1; N processes writing at the same rate: about 1/N. Starts at 1. The hinter
/// (`crate::hinter`) spaces its hints by it, so the hints of all processes together stay at
/// one per shard per gap however many processes write. Only a rate: nothing about ids or
/// order depends on it.
#[derive(Debug, Clone)]
pub struct WriteShare(std::sync::Arc<std::sync::atomic::AtomicU64>);

impl Default for WriteShare {
    fn default() -> WriteShare {
        WriteShare(std::sync::Arc::new(std::sync::atomic::AtomicU64::new(1f64.to_bits())))
    }
}

impl WriteShare {
    /// The current estimate, in (0, 1].
    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Sets the estimate to `share`, kept within (0, 1] (not a number: 1).
    pub fn set(&self, share: f64) {
        let share = if share.is_nan() { 1.0 } else { share.clamp(f64::MIN_POSITIVE, 1.0) };
        self.0.store(share.to_bits(), std::sync::atomic::Ordering::Relaxed);
    }
}

/// What this process last published, and its publication in flight.
#[derive(Debug, Default)]
struct Published {
    /// Largest `last` published (by this process, or found published when it tried).
    last: i64,
    /// When the latest publication began, while it runs; `None` when none runs.
    started: Option<crate::env::Instant>,
}

/// A publication that has run this long no longer holds the others back: the next caller
/// starts one beside it ([`Clock::publish`]). A publication is normally one round trip; one
/// that takes a second is in the store's retries (throttling, a lost connection), which can
/// last minutes.
pub const STUCK_AFTER: Duration = Duration::from_secs(1);

/// Marks a publication ended (when dropped) and wakes the callers waiting for it.
struct Ending<'a> {
    clock: &'a Clock,
    started: crate::env::Instant,
}

impl Drop for Ending<'_> {
    fn drop(&mut self) {
        let mut p = self.clock.lock_published();
        if p.started == Some(self.started) {
            p.started = None;
        }
        drop(p);
        self.clock.ended.notify_waiters();
    }
}

/// One process's id clock (see the module docs).
#[derive(Debug)]
pub struct Clock {
    /// Lease owner id of this process; written as the high row's `owner` when it raises it.
    owner: String,
    /// Offset added to the local clock, in µs (tests skew writers with it).
    skew_us: i64,
    /// Highest timestamp handed out by this process.
    own_last: std::sync::Mutex<i64>,
    /// This process's publications (never held across a storage call).
    published: std::sync::Mutex<Published>,
    /// Told when a publication ends, either way.
    ended: tokio::sync::Notify,
    /// Largest `last` any caller of [`Clock::publish`] asked for: a publication covers the
    /// callers that waited for the one before it (group commit of publications).
    wanted: std::sync::atomic::AtomicI64,
    /// The high row as this process last read or wrote it (its ETag for the next
    /// conditional replace; a stale one costs a 412 and a read).
    seen: std::sync::Mutex<Option<Entity>>,
    /// This process's share of the publications, as the reads see it.
    share: WriteShare,
    /// The largest high-water mark this process saw read or published itself: a lower bound
    /// of the stored one, which never goes back ([`Clock::publish_at_least`]).
    known_high: std::sync::atomic::AtomicI64,
    /// The pace of this process's append rounds, fed by every observation of the high row.
    pace: super::pace::Pace,
}

impl Clock {
    /// The clock of the process whose lease owner id is `owner`.
    pub fn new(owner: &str, skew_us: i64) -> Clock {
        Clock {
            owner: owner.to_string(),
            skew_us,
            own_last: std::sync::Mutex::new(0),
            published: std::sync::Mutex::new(Published::default()),
            ended: tokio::sync::Notify::new(),
            wanted: std::sync::atomic::AtomicI64::new(0),
            seen: std::sync::Mutex::new(None),
            share: WriteShare::default(),
            known_high: std::sync::atomic::AtomicI64::new(0),
            pace: super::pace::Pace::default(),
        }
    }

    /// Makes the high-water mark at least `micros`: nothing when this process already saw it
    /// there, else one read ([`Clock::read`]) and, when the mark is below, a publication. An
    /// entry whose id was never published (its writer failed after the entry was stored) is
    /// applied only after this, so an operation issued after anyone observed its effect gets a
    /// larger id (found by the simulator, seed 9366: a consistent read saw such an upsert,
    /// and a delete issued after the read took a smaller id and was ordered before it).
    pub async fn publish_at_least(&self, store: &dyn Store, table: &str, micros: i64) -> Result<()> {
        if self.known_high.load(std::sync::atomic::Ordering::SeqCst) >= micros {
            return Ok(());
        }
        if self.read(store, table).await?.high >= micros {
            return Ok(());
        }
        self.publish(store, table, micros).await
    }

    /// This process's share of the catalog's clock publications, kept up to date by every
    /// observation of the high row (see [`WriteShare`]).
    pub fn write_share(&self) -> WriteShare {
        self.share.clone()
    }

    /// The pace of this process's append rounds (`src/wal/pace.rs`).
    pub(crate) fn pace(&self) -> &super::pace::Pace {
        &self.pace
    }

    /// The current estimate of [`Clock::write_share`], in (0, 1].
    pub fn share(&self) -> f64 {
        self.share.get()
    }

    /// The high-water mark: the largest `last` any process published (0 when none did).
    /// One point read (the first of a catalog from before the high row creates it).
    pub async fn high_water(&self, store: &dyn Store, table: &str) -> Result<i64> {
        Ok(self.read(store, table).await?.high)
    }

    /// The high-water mark and the schema version: one point read of the high row (the
    /// first of a catalog from before the high row creates it, [`high_row`]).
    pub async fn read(&self, store: &dyn Store, table: &str) -> Result<ClockRead> {
        self.pace.requested();
        let row = high_row(store, table).await?;
        let read = ClockRead { high: last_of(&row), schema_version: version_of(&row) };
        self.known_high.fetch_max(read.high, std::sync::atomic::Ordering::SeqCst);
        self.observe(&row);
        self.remember(row);
        Ok(read)
    }

    /// Feeds an observation of the high row (read or written now) to the pace, and the
    /// share it estimates to [`Clock::write_share`].
    fn observe(&self, row: &Entity) {
        self.pace.observe(crate::env::now(), count_of(row));
        if let Some(share) = self.pace.share() {
            self.share.set(share);
        }
    }

    /// Keeps `row` (read or written) as the high row this process knows, unless it knows a
    /// larger `last` already (a reply overtaken by a newer one).
    fn remember(&self, row: Entity) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.as_ref().is_none_or(|s| (last_of(s), version_of(s)) <= (last_of(&row), version_of(&row))) {
            *seen = Some(row);
        }
    }

    /// Raises the schema version every later [`Clock::read`] sees to at least `version`
    /// (a conditional replace of the high row, so versions never go back and `last` is kept).
    /// Returns the version now stored.
    pub async fn raise_schema_version(store: &dyn Store, table: &str, version: u64) -> Result<u64> {
        let mut row = high_row(store, table).await?;
        loop {
            if version_of(&row) >= version {
                return Ok(version_of(&row));
            }
            let raised = row.clone().with("version", Value::Int64(version as i64));
            match replace_if_unchanged(store, table, &row, raised).await? {
                Some(_) => return Ok(version),
                None => row = high_row(store, table).await?, // changed meanwhile: read again
            }
        }
    }

    /// Reserves `n` (≥ 1) consecutive timestamps above `high` and above everything this
    /// process handed out: returns the first; the last is `first + n - 1`.
    pub fn reserve(&self, high: i64, n: usize) -> i64 {
        let now = now_micros() + self.skew_us;
        let mut own = self.own_last.lock().unwrap_or_else(|p| p.into_inner());
        let start = now.max(high + 1).max(*own + 1);
        *own = start + n as i64 - 1;
        start
    }

    /// Publishes `last` (unless a larger value already was): raises the high row to it
    /// ([`Clock::raise_last`]). When this returns `Ok`, every later [`Clock::high_water`] in
    /// any process is at least `last`.
    ///
    /// Group commit: one publication runs at a time; callers that come while it runs wait
    /// for it and are served by the next one, which publishes the largest `last` of them all
    /// (a larger published value only raises later ids). A publication that has run for
    /// [`STUCK_AFTER`] (in the store's retries) no longer holds the others: the next one
    /// starts beside it, and a caller returns as soon as any publication covers its `last`,
    /// its own included. So one stuck request delays the acknowledgements of about a second,
    /// not every acknowledgement of the process for as long as the retries last.
    ///
    /// Why publications beside each other keep the order argument: each write of the high row
    /// is conditional on the ETag of a read showing a smaller `last`, so a stuck replace
    /// that reaches the service after a larger publication fails with 412 and never lowers
    /// the mark.
    pub async fn publish(&self, store: &dyn Store, table: &str, last: i64) -> Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        self.wanted.fetch_max(last, SeqCst);
        let (target, started) = loop {
            let ended = self.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            let stuck_at = {
                let mut p = self.lock_published();
                if p.last >= last {
                    return Ok(());
                }
                let now = crate::env::now();
                match p.started {
                    Some(t) if now < t + STUCK_AFTER => t + STUCK_AFTER,
                    Some(_) | None => {
                        if p.started.is_some() {
                            tracing::warn!(
                                after_ms = STUCK_AFTER.as_millis() as u64,
                                "a clock publication is still in the store's retries; starting another beside it"
                            );
                        }
                        p.started = Some(now);
                        break (self.wanted.load(SeqCst).max(last), now);
                    }
                }
            };
            tokio::select! {
                () = &mut ended => {}
                () = crate::env::sleep_until(stuck_at) => {}
            }
        };
        // Ends the publication in the bookkeeping whichever way it goes, dropped included
        // (a caller served by a later publication stops waiting for its own).
        let guard = Ending { clock: self, started };
        let write = self.raise_last(store, table, target);
        tokio::pin!(write);
        loop {
            let ended = self.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if self.lock_published().last >= last {
                return Ok(()); // covered by a publication beside this one; this one is dropped
            }
            tokio::select! {
                biased;
                written = &mut write => {
                    written?;
                    let mut p = self.lock_published();
                    p.last = p.last.max(target);
                    drop(p);
                    self.known_high.fetch_max(target, SeqCst);
                    drop(guard);
                    return Ok(());
                }
                () = &mut ended => {}
            }
        }
    }

    fn lock_published(&self) -> std::sync::MutexGuard<'_, Published> {
        self.published.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The storage writes of one publication of `last`: the high row replaced by one holding
    /// `last`, conditional on the ETag this process last saw (no read first when it is
    /// current); on 412 the row is read again, and the publication is done when it holds
    /// `last` or more already (module docs).
    async fn raise_last(&self, store: &dyn Store, table: &str, last: i64) -> Result<()> {
        crate::faults::point("before_clock_publish")?;
        let known = self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut row = match known {
            Some(row) => row,
            None => {
                self.pace.requested();
                high_row(store, table).await?
            }
        };
        loop {
            if last_of(&row) >= last {
                self.remember(row);
                return Ok(());
            }
            let raised = row
                .clone()
                .with("last", Value::Int64(last))
                .with("n", Value::Int64(count_of(&row) + 1))
                .with("owner", Value::String(self.owner.clone()))
                .with("at", Value::Int64(now_micros()));
            self.pace.requested();
            match replace_if_unchanged(store, table, &row, raised).await? {
                Some(written) => {
                    self.pace.published();
                    self.observe(&written);
                    self.remember(written);
                    return Ok(());
                }
                None => {
                    // raised meanwhile: read again
                    self.pace.requested();
                    row = high_row(store, table).await?;
                    self.observe(&row);
                }
            }
        }
    }

    /// Removes the clock rows of the design before the high row (module docs): the rows of
    /// this partition other than the high row, and the legacy rows in `metadata`, once the
    /// high row covers them (their `last` and schema version at or below its own). Nothing
    /// while there is no high row. Returns how many were removed. A row changed since it was
    /// read is kept.
    pub async fn prune(&self, store: &dyn Store, table: &str) -> Result<usize> {
        let all = RowRange::default();
        let mut older: Vec<Entity> = pager::entities(store, table, CLOCK, &all, MAX_PAGE).try_collect().await?;
        let Some(at) = older.iter().position(|e| e.row_key == HIGH_ROW) else { return Ok(0) };
        let high = older.remove(at);
        let range = legacy_range();
        let legacy: Vec<Entity> = pager::entities(store, table, METADATA, &range, MAX_PAGE).try_collect().await?;
        let covered = |e: &&Entity| last_of(e) <= last_of(&high) && version_of(e) <= version_of(&high);
        let mut removed = 0;
        for e in older.iter().chain(&legacy).filter(covered) {
            removed += delete_if_unchanged(store, table, e).await? as usize;
        }
        Ok(removed)
    }
}

/// The row `row_key` of [`CLOCK`], if any (a missing table reads as no row).
async fn get_row(store: &dyn Store, table: &str, row_key: &str) -> Result<Option<Entity>> {
    match store.get(table, CLOCK, row_key).await {
        Ok(row) => Ok(row),
        Err(StoreError::NotFound(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The high row, read (one point read). A catalog from before the high row has none: it is
/// created from the older clock rows (module docs), by an insert, so that two processes
/// doing this at once agree (the second reads the first's).
async fn high_row(store: &dyn Store, table: &str) -> Result<Entity> {
    loop {
        if let Some(row) = get_row(store, table, HIGH_ROW).await? {
            return Ok(row);
        }
        let (last, version) = older_rows(store, table).await?;
        let mut row = Entity::new(CLOCK, HIGH_ROW)
            .with("last", Value::Int64(last))
            .with("version", Value::Int64(version as i64))
            .with("at", Value::Int64(now_micros()));
        match store.insert(table, &row).await {
            Ok(tag) => {
                row.etag = Some(tag);
                return Ok(row);
            }
            Err(StoreError::AlreadyExists(_)) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// The largest `last` and the schema version the clock rows of the designs before the high
/// row hold: the first two rows of [`CLOCK`] ([`SCHEMA_ROW`] sorts first, then the largest
/// timestamp row; one response, not a followed token: a publication of that design replaced
/// its owner's row by one sorting before it) and the legacy rows in `metadata`.
async fn older_rows(store: &dyn Store, table: &str) -> Result<(i64, u64)> {
    let all = RowRange { before: Some(HIGH_ROW.to_string()), ..RowRange::default() };
    let first = pager::head(store, table, CLOCK, &all, 2).await?;
    let version = first.iter().find(|e| e.row_key == SCHEMA_ROW).map_or(0, version_of);
    let top = first.iter().find(|e| e.row_key != SCHEMA_ROW).map_or(0, last_of);
    Ok((top.max(legacy_high(store, table).await?), version))
}

/// Replaces `read` (as read, with its ETag) by `new`, conditional on that ETag: the row
/// written, with its new ETag, or `None` when the row changed or went meanwhile (412, 404).
async fn replace_if_unchanged(
    store: &dyn Store,
    table: &str,
    read: &Entity,
    mut new: Entity,
) -> Result<Option<Entity>> {
    let Some(tag) = read.etag.clone() else { return Ok(None) };
    match store.replace(table, &new, &IfMatch::Etag(tag)).await {
        Ok(tag) => {
            new.etag = Some(tag);
            Ok(Some(new))
        }
        Err(StoreError::PreconditionFailed(_) | StoreError::NotFound(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The largest `last` of the legacy clock rows (0 when there is none).
async fn legacy_high(store: &dyn Store, table: &str) -> Result<i64> {
    let range = legacy_range();
    let rows = pager::entities(store, table, METADATA, &range, MAX_PAGE);
    Ok(rows.try_fold(0i64, |m, e| async move { Ok(m.max(last_of(&e))) }).await?)
}

/// Deletes `e` unless it changed since it was read; `true` when this call removed it.
async fn delete_if_unchanged(store: &dyn Store, table: &str, e: &Entity) -> Result<bool> {
    let tag = e.etag.clone().map_or(IfMatch::Any, IfMatch::Etag);
    match store.delete(table, &e.partition_key, &e.row_key, &tag).await {
        Ok(()) => Ok(true),
        Err(StoreError::NotFound(_) | StoreError::PreconditionFailed(_)) => Ok(false),
        Err(err) => Err(err.into()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// Holds the first clock publication (a write to the `clock` partition) until released.
    struct HoldFirstPublication {
        held: std::sync::atomic::AtomicBool,
        release: tokio::sync::watch::Sender<bool>,
        reached: tokio::sync::Notify,
    }

    impl crate::store::layer::Layer for HoldFirstPublication {
        async fn run<'a, T, F, Fut>(
            &'a self,
            call: crate::store::layer::Call<'a>,
            mut attempt: F,
        ) -> crate::store::StoreResult<T>
        where
            T: crate::store::layer::Returned + Send + 'a,
            F: FnMut() -> Fut + Send + 'a,
            Fut: std::future::Future<Output = crate::store::StoreResult<T>> + Send + 'a,
        {
            use crate::store::OpKind;
            let publication = call.partition_key == Some(CLOCK) && call.op == OpKind::Replace;
            if publication && !self.held.swap(true, std::sync::atomic::Ordering::SeqCst) {
                self.reached.notify_one();
                let _ = self.release.subscribe().wait_for(|open| *open).await;
            }
            attempt().await
        }
    }

    fn holding() -> (Arc<HoldFirstPublication>, Arc<dyn Store>) {
        let layer = Arc::new(HoldFirstPublication {
            held: false.into(),
            release: tokio::sync::watch::Sender::new(false),
            reached: tokio::sync::Notify::new(),
        });
        let store =
            crate::store::layer::LayeredStore::with_layer(Arc::new(crate::store::mem::MemStore::new()), layer.clone());
        (layer, Arc::new(store))
    }

    const T: &str = "walclock";

    /// Issue 27 (operator costs): one publication in the store's retries held every later
    /// publication of the process, so every acknowledgement waited as long as those retries.
    #[tokio::test(start_paused = true)]
    async fn a_publication_stuck_in_retries_does_not_hold_the_acknowledgements_behind_it() {
        let _sim = crate::env::simulate(1, 1_798_761_600_000_000);
        let (layer, store) = holding();
        store.create_table(T).await.unwrap();
        let clock = Clock::new("p", 0);
        let began = crate::env::now();
        let (stuck, later) = tokio::time::timeout(Duration::from_secs(600), async {
            tokio::join!(clock.publish(store.as_ref(), T, 10), async {
                layer.reached.notified().await;
                clock.publish(store.as_ref(), T, 20).await
            })
        })
        .await
        .expect("a stuck publication held the next one");
        stuck.unwrap();
        later.unwrap();
        let waited = crate::env::now() - began;
        assert!(waited <= STUCK_AFTER + Duration::from_millis(10), "{waited:?}");
        assert_eq!(Clock::new("q", 0).high_water(store.as_ref(), T).await.unwrap(), 20);
    }

    /// The order argument with publications beside each other: every write of the high row
    /// is conditional on the ETag of the read it raises. So a stuck replace that reaches the
    /// service after a larger publication (its caller served by that one and gone, its
    /// request already sent) fails with 412 and never lowers the mark; and a process whose
    /// publication meets 412 reads the row again: done when it holds as much, else raised.
    #[tokio::test(start_paused = true)]
    async fn a_publication_committed_after_a_larger_one_never_lowers_the_high_water_mark() {
        let _sim = crate::env::simulate(2, 1_798_761_600_000_000);
        let store: Arc<dyn Store> = Arc::new(crate::store::mem::MemStore::new());
        store.create_table(T).await.unwrap();
        let clock = Clock::new("p", 0);
        let reader = Clock::new("q", 0);
        clock.publish(store.as_ref(), T, 5).await.unwrap();
        // The stuck replace of 30 was conditional on the row as read at 5.
        let at_5 = high_row(store.as_ref(), T).await.unwrap();
        clock.publish(store.as_ref(), T, 40).await.unwrap(); // beside it, and done first
        let late = at_5.clone().with("last", Value::Int64(30));
        assert!(replace_if_unchanged(store.as_ref(), T, &at_5, late).await.unwrap().is_none(), "412");
        assert_eq!(reader.high_water(store.as_ref(), T).await.unwrap(), 40);
        // Another process that read the row at 5: its publication of 30 meets 412, reads 40,
        // and is done; its publication of 50 is retried on the new ETag.
        let other = Clock::new("r", 0);
        other.remember(at_5);
        other.publish(store.as_ref(), T, 30).await.unwrap();
        assert_eq!(reader.high_water(store.as_ref(), T).await.unwrap(), 40);
        other.publish(store.as_ref(), T, 50).await.unwrap();
        assert_eq!(reader.high_water(store.as_ref(), T).await.unwrap(), 50);
        let rows: Vec<Entity> =
            pager::entities(store.as_ref(), T, CLOCK, &RowRange::default(), MAX_PAGE).try_collect().await.unwrap();
        assert_eq!(rows.iter().map(|e| e.row_key.as_str()).collect::<Vec<_>>(), vec![HIGH_ROW]);
    }

    /// A catalog from before the high row: the first read creates it from the older rows
    /// (the largest per-process row, the schema row, the legacy rows in `metadata`); the
    /// schema version is raised on it, keeping `last`; prune then removes the older rows.
    #[tokio::test(start_paused = true)]
    async fn the_high_row_starts_from_the_older_clock_rows_which_prune_then_removes() {
        let _sim = crate::env::simulate(3, 1_798_761_600_000_000);
        let store: Arc<dyn Store> = Arc::new(crate::store::mem::MemStore::new());
        store.create_table(T).await.unwrap();
        let older = [
            Entity::new(CLOCK, row_key(70, "a").as_str()).with("last", Value::Int64(70)),
            Entity::new(CLOCK, row_key(90, "b").as_str()).with("last", Value::Int64(90)),
            Entity::new(CLOCK, SCHEMA_ROW).with("version", Value::Int64(3)),
            Entity::new(METADATA, "clock-wal").with("last", Value::Int64(120)),
        ];
        for e in &older {
            store.upsert(T, e).await.unwrap();
        }
        let c = Clock::new("p", 0);
        assert_eq!(c.read(store.as_ref(), T).await.unwrap(), ClockRead { high: 120, schema_version: 3 });
        assert_eq!(Clock::raise_schema_version(store.as_ref(), T, 5).await.unwrap(), 5);
        assert_eq!(c.read(store.as_ref(), T).await.unwrap(), ClockRead { high: 120, schema_version: 5 });
        assert_eq!(c.prune(store.as_ref(), T).await.unwrap(), 4);
        for e in &older {
            assert!(store.get(T, &e.partition_key, &e.row_key).await.unwrap().is_none(), "{}", e.row_key);
        }
        c.publish(store.as_ref(), T, 130).await.unwrap();
        assert_eq!(
            Clock::new("q", 0).read(store.as_ref(), T).await.unwrap(),
            ClockRead { high: 130, schema_version: 5 }
        );
    }

    #[test]
    fn reserve_goes_above_the_high_water_mark_and_never_back() {
        let c = Clock::new("p", 0);
        let far = now_micros() + 10_000_000_000; // far in the future: another process's clock
        let a = c.reserve(far, 3);
        assert_eq!(a, far + 1);
        // The high-water mark read later may be stale (smaller): ids still increase.
        let b = c.reserve(0, 1);
        assert_eq!(b, far + 4);
        // A skewed-back clock does not matter either.
        let slow = Clock::new("q", -3_600_000_000);
        let s = slow.reserve(b, 1);
        assert_eq!(s, b + 1);
    }

    #[test]
    fn the_write_share_starts_at_one_and_stays_within_bounds() {
        let share = WriteShare::default();
        assert_eq!(share.get(), 1.0);
        share.set(0.25);
        assert_eq!(share.get(), 0.25);
        share.set(0.0);
        assert!(share.get() > 0.0);
        share.set(3.0);
        assert_eq!(share.get(), 1.0);
        share.set(f64::NAN);
        assert_eq!(share.get(), 1.0);
    }

    #[test]
    fn a_larger_last_sorts_first() {
        let now = now_micros();
        let keys = [row_key(now + 1, "b"), row_key(now, "a"), row_key(now, "b"), row_key(1, "a"), row_key(0, "z")];
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(sorted, keys);
        assert_eq!(row_key(0, "x").len(), 19 + 2);
    }
}
