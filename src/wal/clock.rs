//! WAL id allocation without a single-row sequencer, at a cost that does not grow with the
//! number of processes.
//!
//! The order invariant: an operation acknowledged before another one is issued gets the
//! smaller WAL id, across processes and whatever their clocks say.
//!
//! Each process publishes the highest id timestamp it has handed out as a row of the WAL
//! table's partition [`CLOCK`] whose RowKey is that timestamp inverted ([`row_key`]:
//! `{i64::MAX - last:019}-{owner}`), so the partition's first row holds the largest
//! timestamp anybody published. Rows are keyed by value and owner, so publishing never
//! conflicts. Allocating ids is one round:
//! 1. read the first row of [`CLOCK`] (one query, `$top=1`, one entity whatever the number
//!    of processes): the high-water mark `h`. The answer must come in one response
//!    (`store::pager::head`): a first page cut short is read again from the start, not followed,
//!    because the row it would resume at may be replaced meanwhile by one sorting before it;
//! 2. hand out timestamps from `max(now + skew, h + 1, own last + 1)` on, one microsecond
//!    apart;
//! 3. publish the new `last`: one entity group transaction that upserts the new row and
//!    deletes this process's previous one (so the partition holds about one row per live
//!    process). The caller writes its WAL entries at the same time and acknowledges only when
//!    both are done.
//!
//! Why the order holds: write A is acknowledged only after its process published a row with
//! `last` at or above A's id. Write B, issued after that acknowledgement, reads the
//! partition after the publication completed (the Table service is strongly consistent, and
//! a query returns a partition's rows in RowKey order), so its first row holds `h >= id(A)`
//! and every id of B is larger. A row is only ever deleted when a row with a larger `last`
//! exists (its owner's next row, in the same transaction, or any larger row for
//! [`Clock::prune`]), so the first row never goes back. Within a process, `own last + 1`
//! keeps ids increasing even when two rounds overlap.
//!
//! Cost: per round one query returning one entity and one transaction of two entities, on a
//! partition of its own, whatever the number of ids and processes; rounds of one process are
//! coalesced by [`super::append`] (group commit). The previous design (a row per process in
//! `metadata`, every row read by every round) read N entities per round with N processes,
//! and at 8 instances the reads alone held the `metadata` partition at Azure's 2,000
//! entities/s target (docs/BENCHMARKS.md, "WAL shards on simulated Azure").
//!
//! Catalogs from before this design keep their clock rows in `metadata` (RowKeys `clock-*`,
//! among them `clock-wal` of the first design). A process reads them once, before its first
//! round, as a floor, so ids keep increasing across the upgrade; the sweeper deletes them
//! once [`CLOCK`] holds a larger `last`. (A process of an old version still running reads
//! only those rows: stop old processes before new ones write, which a deployment does.)
//!
//! **The schema version** ([`crate::indexes`]) rides on the same read: the row
//! [`SCHEMA_ROW`] (`!schema`, which sorts before every timestamp row) holds the catalog's
//! schema version, raised by each index change. A round reads the partition's first two
//! rows (still one query): the schema version and the high-water mark. A writer that
//! validated its operations under an older version learns it there, before it writes
//! anything ([`super::append`]).
//!
//! Rows of processes that are gone stay until the sweeper prunes them ([`Clock::prune`]): a
//! row is removed when it was last published more than [`STALE_AFTER`] ago and is not the
//! first row.

use std::time::Duration;

use futures::TryStreamExt;

use super::id::now_micros;
use super::layout::METADATA;
use crate::error::Result;
use crate::store::{pager, BatchOp, Entity, IfMatch, RowRange, Store, StoreError, Value, MAX_PAGE};

/// PartitionKey of the clock rows in the WAL table.
pub const CLOCK: &str = "clock";
/// RowKey prefix of the clock rows of earlier versions, in the `metadata` partition.
pub const LEGACY_PREFIX: &str = "clock-";
/// RowKey of the schema-version row in [`CLOCK`] (property `version`, Int64). `!` sorts
/// before the digits every timestamp row starts with.
pub const SCHEMA_ROW: &str = "!schema";
/// A clock row not published for this long may be pruned (unless it is the first row).
pub const STALE_AFTER: Duration = Duration::from_secs(3600);

/// RowKey of the clock row publishing `last` for `owner`: the inverted timestamp, 19 digits,
/// so a larger `last` sorts first, then the owner (rows never collide across processes).
pub fn row_key(last: i64, owner: &str) -> String {
    format!("{:019}-{owner}", i64::MAX - last.max(0))
}

/// The owner of the clock row with RowKey `key` (the part after the first `-`; the
/// timestamp part is digits only), as [`row_key`] wrote it.
fn row_owner(key: &str) -> Option<&str> {
    key.split_once('-').map(|(_, owner)| owner)
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

/// A process's share of the catalog's writes, estimated for free from the clock reads:
/// each [`Clock::read`] sees whose publication is on top (the latest round of any process),
/// and the share is the moving average (over about [`WriteShare::WINDOW`] reads) of how
/// often it was this process's own. One process alone: 1; N processes writing at the same
/// rate: about 1/N. Starts at 1. The hinter (`crate::hinter`) spaces its hints by it, so
/// the hints of all processes together stay at one per shard per gap however many
/// processes write, and the appender bounds its rounds in flight by it
/// ([`super::append::rounds_for`]), so the catalog's rounds in flight stay about those of
/// one process. Only a rate: nothing about ids or order depends on it.
#[derive(Debug, Clone)]
pub struct WriteShare(std::sync::Arc<std::sync::atomic::AtomicU64>);

impl Default for WriteShare {
    fn default() -> WriteShare {
        WriteShare(std::sync::Arc::new(std::sync::atomic::AtomicU64::new(1f64.to_bits())))
    }
}

impl WriteShare {
    /// Reads the average spans (the weight of each new observation is `1 / WINDOW`).
    pub const WINDOW: f64 = 16.0;

    /// The current estimate, in (0, 1].
    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Notes one read: `mine` when the top publication was this process's own. Concurrent
    /// reads may lose an update to each other; an estimate needs no more.
    pub fn observe(&self, mine: bool) {
        let x = if mine { 1.0 } else { 0.0 };
        let old = self.get();
        let new = (old + (x - old) / Self::WINDOW).clamp(f64::MIN_POSITIVE, 1.0);
        self.0.store(new.to_bits(), std::sync::atomic::Ordering::Relaxed);
    }
}

fn at_of(e: &Entity) -> i64 {
    match e.properties.get("at") {
        Some(Value::Int64(v)) => *v,
        _ => 0, // the first design's row has no `at`
    }
}

/// What this process last published, and its publication in flight.
#[derive(Debug, Default)]
struct Published {
    /// Largest `last` published.
    last: i64,
    /// RowKey of the row that published it (deleted with the next publication).
    row: Option<String>,
    /// When the latest publication began, while it runs; `None` when none runs.
    started: Option<crate::env::Instant>,
}

/// A publication that has run this long no longer holds the others back: the next caller
/// starts one beside it ([`Clock::publish`]). A publication is one entity group transaction
/// of two entities, normally one round trip; one that takes a second is in the store's
/// retries (throttling, a lost connection), which can last minutes.
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
    /// Lease owner id of this process; the tail of its rows' RowKeys.
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
    /// The largest `last` of the legacy rows, read once before the first round.
    legacy: tokio::sync::OnceCell<i64>,
    /// This process's share of the publications, as the reads see it.
    share: WriteShare,
    /// The largest high-water mark this process saw read or published itself: a lower bound
    /// of the stored one, which never goes back ([`Clock::publish_at_least`]).
    known_high: std::sync::atomic::AtomicI64,
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
            legacy: tokio::sync::OnceCell::new(),
            share: WriteShare::default(),
            known_high: std::sync::atomic::AtomicI64::new(0),
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

    /// This process's share of the catalog's append rounds, kept up to date by every
    /// [`Clock::read`] (see [`WriteShare`]).
    pub fn write_share(&self) -> WriteShare {
        self.share.clone()
    }

    /// The current estimate of [`Clock::write_share`], in (0, 1].
    pub fn share(&self) -> f64 {
        self.share.get()
    }

    /// The high-water mark: the largest `last` any process published (0 when none did).
    /// One query of at most two entities; the first call of a process also reads the legacy
    /// rows.
    pub async fn high_water(&self, store: &dyn Store, table: &str) -> Result<i64> {
        Ok(self.read(store, table).await?.high)
    }

    /// The high-water mark and the schema version, in one query of at most two entities
    /// (the first call of a process also reads the legacy rows).
    pub async fn read(&self, store: &dyn Store, table: &str) -> Result<ClockRead> {
        let all = RowRange::default();
        // One response, not a followed token: a publication replaces its owner's row by one
        // that sorts before it, so a read resumed behind the old row could miss both.
        let first = pager::head(store, table, CLOCK, &all, 2).await?;
        let floor = *self.legacy.get_or_try_init(|| legacy_high(store, table)).await?;
        let schema_version = first.iter().find(|e| e.row_key == SCHEMA_ROW).map_or(0, version_of);
        let top = first.iter().find(|e| e.row_key != SCHEMA_ROW);
        self.share.observe(top.is_none_or(|e| row_owner(&e.row_key) == Some(self.owner.as_str())));
        let high = top.map_or(0, last_of).max(floor);
        self.known_high.fetch_max(high, std::sync::atomic::Ordering::SeqCst);
        Ok(ClockRead { high, schema_version })
    }

    /// Raises the schema version every later [`Clock::read`] sees to at least `version`
    /// (compare-and-swap, so versions never go back). Returns the version now stored.
    pub async fn raise_schema_version(store: &dyn Store, table: &str, version: u64) -> Result<u64> {
        loop {
            let current = store.get(table, CLOCK, SCHEMA_ROW).await.or_else(|e| match e {
                StoreError::NotFound(_) => Ok(None),
                e => Err(e),
            })?;
            let row = Entity::new(CLOCK, SCHEMA_ROW).with("version", Value::Int64(version as i64));
            let written = match current {
                Some(c) if version_of(&c) >= version => return Ok(version_of(&c)),
                Some(c) => {
                    let tag = c.etag.clone().map_or(IfMatch::Any, IfMatch::Etag);
                    store.replace(table, &row, &tag).await.map(|_| ())
                }
                None => store.insert(table, &row).await.map(|_| ()),
            };
            match written {
                Ok(()) => return Ok(version),
                Err(StoreError::AlreadyExists(_) | StoreError::PreconditionFailed(_) | StoreError::NotFound(_)) => {
                    continue
                }
                Err(e) => return Err(e.into()),
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

    /// Publishes `last` (unless a larger value already was): upserts its row and deletes
    /// this process's previous row in one entity group transaction. When this returns `Ok`,
    /// every later [`Clock::high_water`] in any process is at least `last`.
    ///
    /// Group commit: one publication runs at a time; callers that come while it runs wait
    /// for it and are served by the next one, which publishes the largest `last` of them all
    /// (a larger published value only raises later ids). A publication that has run for
    /// [`STUCK_AFTER`] (in the store's retries) no longer holds the others: the next one
    /// starts beside it, and a caller returns as soon as any publication covers its `last`,
    /// its own included. So one stuck request delays the acknowledgements of about a second,
    /// not every acknowledgement of the process for as long as the retries last.
    ///
    /// Why publications beside each other keep the order argument: each transaction deletes
    /// only a row this process published before it began, whose `last` is smaller than the
    /// one it upserts, so a row still goes only when a larger one exists. A publication that
    /// ends after a larger one leaves its row behind, not first: [`Clock::prune`] removes it.
    pub async fn publish(&self, store: &dyn Store, table: &str, last: i64) -> Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        self.wanted.fetch_max(last, SeqCst);
        let (target, previous, started) = loop {
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
                        break (self.wanted.load(SeqCst).max(last), p.row.clone(), now);
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
        let write = self.write_row(store, table, target, previous);
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
                    let key = written?;
                    let mut p = self.lock_published();
                    if target > p.last {
                        p.last = target;
                        p.row = Some(key);
                    }
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

    /// The storage writes of one publication of `last`: its row, and the delete of
    /// `previous` (this process's row of an earlier publication) in the same transaction.
    /// Returns the new row's RowKey.
    async fn write_row(&self, store: &dyn Store, table: &str, last: i64, previous: Option<String>) -> Result<String> {
        crate::faults::point("before_clock_publish")?;
        let key = row_key(last, &self.owner);
        let row =
            Entity::new(CLOCK, key.as_str()).with("last", Value::Int64(last)).with("at", Value::Int64(now_micros()));
        match previous {
            Some(previous) => {
                let ops = [BatchOp::Upsert(row.clone()), BatchOp::Delete { row_key: previous, if_match: IfMatch::Any }];
                match store.batch(table, CLOCK, &ops).await {
                    Ok(_) => {}
                    // The previous row is gone (pruned, deleted by a publication beside this
                    // one, or an earlier transaction committed though its response was lost):
                    // the upsert alone publishes.
                    Err(StoreError::BatchFailed { .. }) => {
                        store.upsert(table, &row).await?;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            None => {
                store.upsert(table, &row).await?;
            }
        }
        Ok(key)
    }

    /// Removes clock rows not published for [`STALE_AFTER`] (rows of processes that are
    /// gone, or left over by a publication whose response was lost), except the first row;
    /// and legacy rows in `metadata` whose `last` the first row covers. Returns how many were
    /// removed. A row republished meanwhile is kept (its ETag changed).
    pub async fn prune(&self, store: &dyn Store, table: &str) -> Result<usize> {
        let all = RowRange::default();
        let rows: Vec<Entity> = pager::entities(store, table, CLOCK, &all, MAX_PAGE)
            .try_filter(|e| futures::future::ready(e.row_key != SCHEMA_ROW))
            .try_collect()
            .await?;
        let high = rows.first().map_or(0, last_of);
        let cutoff = now_micros() - STALE_AFTER.as_micros() as i64;
        let mut removed = 0;
        for e in rows.iter().skip(1).filter(|e| at_of(e) < cutoff) {
            removed += delete_if_unchanged(store, table, e).await? as usize;
        }
        let range = legacy_range();
        let legacy: Vec<Entity> = pager::entities(store, table, METADATA, &range, MAX_PAGE).try_collect().await?;
        for e in legacy.iter().filter(|e| last_of(e) <= high) {
            removed += delete_if_unchanged(store, table, e).await? as usize;
        }
        Ok(removed)
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
            let publication = call.partition_key == Some(CLOCK) && matches!(call.op, OpKind::Batch | OpKind::Upsert);
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

    /// The order argument with publications beside each other: a transaction deletes only
    /// the row this process published before the transaction began, smaller than the one it
    /// writes. So a stuck transaction that commits after a larger publication (its caller
    /// served by that one and gone, its request already sent) never lowers the first row;
    /// its row stays behind, not first, until [`Clock::prune`].
    #[tokio::test(start_paused = true)]
    async fn a_publication_committed_after_a_larger_one_never_lowers_the_high_water_mark() {
        let _sim = crate::env::simulate(2, 1_798_761_600_000_000);
        let store: Arc<dyn Store> = Arc::new(crate::store::mem::MemStore::new());
        store.create_table(T).await.unwrap();
        let clock = Clock::new("p", 0);
        let reader = Clock::new("q", 0);
        clock.publish(store.as_ref(), T, 5).await.unwrap();
        // The stuck transaction of 30 began now: it deletes 5's row.
        let stuck = clock.lock_published().row.clone();
        assert_eq!(stuck, Some(row_key(5, "p")));
        clock.publish(store.as_ref(), T, 40).await.unwrap(); // beside it, and done first
        clock.write_row(store.as_ref(), T, 30, stuck).await.unwrap(); // its commit, late
        assert_eq!(reader.high_water(store.as_ref(), T).await.unwrap(), 40);
        let lasts = || async {
            let all = RowRange::default();
            let rows: Vec<Entity> =
                pager::entities(store.as_ref(), T, CLOCK, &all, MAX_PAGE).try_collect().await.unwrap();
            rows.iter().map(last_of).collect::<Vec<_>>()
        };
        assert_eq!(lasts().await, vec![40, 30]);
        clock.publish(store.as_ref(), T, 50).await.unwrap(); // deletes 40's row (its previous)
        assert_eq!(lasts().await, vec![50, 30]);
        crate::env::sleep(STALE_AFTER + Duration::from_secs(1)).await;
        assert_eq!(clock.prune(store.as_ref(), T).await.unwrap(), 1);
        assert_eq!(lasts().await, vec![50]);
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
    fn the_write_share_starts_at_one_and_follows_the_observations() {
        let share = WriteShare::default();
        assert_eq!(share.get(), 1.0);
        for _ in 0..200 {
            share.observe(false);
        }
        assert!(share.get() > 0.0 && share.get() < 0.01, "{}", share.get());
        // Every third read finds its own publication on top: about a third.
        for i in 0..600 {
            share.observe(i % 3 == 0);
        }
        assert!((share.get() - 1.0 / 3.0).abs() < 0.1, "{}", share.get());
    }

    #[test]
    fn a_larger_last_sorts_first() {
        let now = now_micros();
        let keys = [row_key(now + 1, "b"), row_key(now, "a"), row_key(now, "b"), row_key(1, "a"), row_key(0, "z")];
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(sorted, keys);
        assert_eq!(row_key(0, "x").len(), 19 + 2);
        assert_eq!(row_owner(&row_key(now, "p-1")), Some("p-1"));
    }
}
