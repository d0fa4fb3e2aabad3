//! Online index changes in the randomized checker (issue 13): a schema operator adds and
//! drops indexes on the records' non-identity fields while the clients write, a reader looks
//! records up by those fields through every instance, and the model says which answers each
//! lookup may get.
//!
//! **The records.** Every record the clients write carries `country`, `tz` and `subd`, drawn
//! from small value sets by its random `v` ([`set_values`]), so upserts and replaces move
//! records between values and many records share one.
//!
//! **The operator** ([`operate`]) makes `TC_CHECKER_INDEX_CHANGES` changes ([`changes`]),
//! spread over the run by the clients' progress: it adds a field that is not an index,
//! or drops an added index it saw active (a seeded choice), and half the time waits until the
//! change is done (active, or gone) before the next one; so an add may overlap a drop, as in
//! "add A, wait, add B, drop A, wait". It changes the schema through an instance of its own
//! (its store has no injected faults, see the note below); the clients' three instances hold
//! the old schema until they learn of the change from the clock, an entry or a lease. It
//! polls `indexes::list` and keeps, per field, when each state could have been observed
//! ([`Epoch`]).
//!
//! **Projections** (issue 31, [`projection`]): `country` is added `keys` (its lookups follow
//! each row to the record's fact row), `subd` `include:tz`, `tz` whole (`all`); so the
//! chaos and lookup checks run against a keys-projected index.
//!
//! **The reader** ([`read_indexes`]) looks records up by a random added field and value,
//! through a random client instance: a plain lookup, one with `allow_partial`, or a
//! consistent one (`query_consistent`). Each answer must be allowed by the state the index
//! could have had during the lookup, widened by the schema copy's age: a process may answer
//! from a copy read up to [`indexes::LOOKUP_SCHEMA_AGE`] before the lookup began
//! ([`STALE`] adds a margin for the read itself):
//! - `index_not_ready`: the index was backfilling at some point (never with `allow_partial`);
//! - `Invalid`: it was not an index, or was dropping;
//! - an answer: it was active (or backfilling, with `allow_partial`).
//!
//! A consistent lookup made while the index was surely active (the whole widened window lies
//! between the poll that first saw it active and the drop) is checked exactly: every record
//! it returns has the value, and the lookup becomes a read of every identity for the
//! per-record linearizability check ([`super::linearizable`]: a returned record must be the
//! identity's state at some instant of the lookup, an identity not returned absent or without
//! the value then).
//!
//! **Writes by added fields.** The clients also delete and replace by `field = value` of an
//! index they believe active ([`Timeline::active_fields`], [`added_filter`]); an instance
//! that does not know the index (yet, or any more) refuses the write with `index_not_ready`
//! or `Invalid`, having written nothing.
//!
//! **At quiescence** ([`check_final`]): no index is backfilling or dropping, `verify` with the
//! final schema reports nothing (the caller asserts it; `moved_row` included), every active
//! added index finds, in pages of 7, exactly the live records with each value, and no row of
//! a field that is not an index is left in the table.
//!
//! Note: the operator's instance has no injected faults because an `index add` that fails
//! after its schema row is written (a 503 after commit, or a failure while raising the
//! clock's version or logging the entry) leaves the index `backfilling` with no job, and a
//! retry is refused as "already an index": see
//! `tests/suite/indexes.rs`, `an_add_that_failed_after_its_schema_row_was_written_can_be_completed`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use table_catalog::testing::CatalogInternals;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use table_catalog::catalog::Catalog;
use table_catalog::indexes;
use table_catalog::query::Filter;
use table_catalog::record::Record;
use table_catalog::store::PartitionRange;
use table_catalog::testing::schema::IndexState;
use table_catalog::Error;

use super::linearizable::Filter as FieldFilter;
use super::{Op, Universe};

/// The fields the operator adds and drops, with the values the clients give them (an empty
/// value: no row of that index).
pub const FIELDS: [(&str, &[&str]); 3] = [
    ("country", &["US", "CA", "MX", ""]),
    ("tz", &["UTC", "Europe/Paris", "America/Chicago"]),
    ("subd", &["Texas", "Ontario", ""]),
];

/// The projection the operator adds `field` with (see the module docs).
pub fn projection(field: &str) -> indexes::Projection {
    match field {
        "country" => indexes::Projection::Keys,
        "subd" => indexes::Projection::Include(vec!["tz".into()]),
        _ => indexes::Projection::All,
    }
}

/// How much older than the lookup the schema copy it answers from may be: the lookup
/// re-reads a copy older than [`indexes::LOOKUP_SCHEMA_AGE`], plus 1 s for the read itself.
pub const STALE: Duration = Duration::from_secs(indexes::LOOKUP_SCHEMA_AGE.as_secs() + 1);

/// A filter on `field` (an added one) with one of its non-empty values.
pub fn added_filter(rng: &mut StdRng, field: &str) -> (String, String) {
    let values: Vec<&str> = FIELDS
        .iter()
        .find(|(f, _)| *f == field)
        .map_or(Vec::new(), |(_, v)| v.iter().copied().filter(|v| !v.is_empty()).collect());
    (field.to_string(), values[rng.gen_range(0..values.len())].to_string())
}

/// Sets the added-index fields of `r` from its `v` (so the clients' random streams stay
/// those of the checker without indexes).
pub fn set_values(r: &mut Record) {
    let mut v = r["v"].as_u64().unwrap_or_default();
    for (field, values) in FIELDS {
        r.insert(field.into(), json!(values[(v % values.len() as u64) as usize]));
        v /= values.len() as u64;
    }
}

/// The index changes to make in a run with `shards` WAL shards: `TC_CHECKER_INDEX_CHANGES`
/// (0 disables), by default 2 with several shards and none with one (there the schema entry
/// waits behind the whole backlog of shard 0, which the faults make long: the bounded run
/// would take half as long again).
pub fn changes(shards: u16) -> usize {
    super::env_u64("TC_CHECKER_INDEX_CHANGES").map_or(if shards > 1 { 2 } else { 0 }, |n| n as usize)
}

/// One life of an added index, as the operator saw it (all times by the test's clock).
#[derive(Debug, Clone)]
pub struct Epoch {
    added_issued: Instant,
    added_ended: Instant,
    /// The start of the last poll that saw it backfilling (it turned active after).
    backfilling_polled: Option<Instant>,
    /// The end of the first poll that saw it active.
    active_seen: Option<Instant>,
    dropped_issued: Option<Instant>,
    dropped_ended: Option<Instant>,
    /// The end of the first poll that saw it gone.
    gone_seen: Option<Instant>,
    /// The end of the first poll that saw its backfill job (started once the fence passed).
    backfill_seen: Option<Instant>,
    /// The backfill job's work items done, as last seen.
    steps: u64,
}

/// Per field, its epochs in order, and when the run started.
#[derive(Debug)]
pub struct Timeline {
    start: Instant,
    epochs: Mutex<BTreeMap<String, Vec<Epoch>>>,
}

/// What a lookup's answer says about the index's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    NotReady,
    Invalid,
    Answered,
}

impl Timeline {
    pub fn new() -> Timeline {
        Timeline { start: Instant::now(), epochs: Mutex::new(BTreeMap::new()) }
    }

    /// `field`'s index as the operator left it so far: how many times it was added, and
    /// whether the latest was dropped since (`(0, false)` for a field never added).
    pub fn phase(&self, field: &str) -> (usize, bool) {
        let all = self.epochs.lock().unwrap();
        let epochs = all.get(field).map_or(&[][..], Vec::as_slice);
        (epochs.len(), epochs.last().is_some_and(|e| e.dropped_issued.is_some()))
    }

    /// Each epoch's times, in seconds since the start: `country +1.2 active 3.4 -5.6 gone 7.8`.
    pub fn describe(&self) -> String {
        let at = |t: Instant| format!("{:.1}", t.saturating_duration_since(self.start).as_secs_f64());
        let opt = |t: Option<Instant>| t.map_or("-".to_string(), at);
        let all = self.epochs.lock().unwrap();
        let mut out = Vec::new();
        for (field, epochs) in all.iter() {
            for e in epochs {
                out.push(format!(
                    "{field} +{} job {} ({} steps) active {} -{} gone {}",
                    at(e.added_issued),
                    opt(e.backfill_seen),
                    e.steps,
                    opt(e.active_seen),
                    opt(e.dropped_issued),
                    opt(e.gone_seen)
                ));
            }
        }
        out.join("; ")
    }

    /// The fields whose index the operator saw active and has not begun to drop: where the
    /// clients' writes by added fields go (an instance may still refuse them).
    pub fn active_fields(&self) -> Vec<&'static str> {
        let all = self.epochs.lock().unwrap();
        FIELDS
            .iter()
            .map(|(f, _)| *f)
            .filter(|f| {
                all.get(*f)
                    .and_then(|e| e.last())
                    .is_some_and(|e| e.active_seen.is_some() && e.dropped_issued.is_none())
            })
            .collect()
    }

    fn epochs(&self, field: &str) -> Vec<Epoch> {
        self.epochs.lock().unwrap().get(field).cloned().unwrap_or_default()
    }

    /// Whether a lookup whose schema copy was read in `[from, to]` may see `seen`.
    fn allows(&self, field: &str, seen: Seen, partial: bool, from: Instant, to: Instant) -> bool {
        let overlaps = |a: Instant, b: Option<Instant>| a <= to && b.is_none_or(|b| b >= from);
        let epochs = self.epochs(field);
        let backfilling = epochs.iter().any(|e| overlaps(e.added_issued, e.active_seen));
        let active = epochs.iter().any(|e| {
            e.active_seen.is_some() && overlaps(e.backfilling_polled.unwrap_or(e.added_issued), e.dropped_ended)
        });
        // Not an index (before the first add, after a drop) or dropping.
        let mut absent_from = Some(self.start);
        let mut invalid = false;
        for e in &epochs {
            if let Some(a) = absent_from {
                invalid |= overlaps(a, Some(e.added_ended));
            }
            absent_from = e.dropped_issued;
        }
        if let Some(a) = absent_from {
            invalid |= overlaps(a, None);
        }
        match seen {
            Seen::NotReady => backfilling && !partial,
            Seen::Invalid => invalid,
            Seen::Answered => active || (partial && backfilling),
        }
    }

    /// True when the index was surely active (queryable, backfilled) from `from` to `to`.
    fn surely_active(&self, field: &str, from: Instant, to: Instant) -> bool {
        self.epochs(field)
            .iter()
            .any(|e| e.active_seen.is_some_and(|a| a < from) && e.dropped_issued.is_none_or(|d| d > to))
    }
}

/// The state of every added index, from the operator's instance (re-reads the schema).
async fn states(c: &Catalog) -> BTreeMap<String, IndexState> {
    infos(c).await.into_iter().map(|i| (i.field, i.state)).collect()
}

async fn infos(c: &Catalog) -> Vec<indexes::IndexInfo> {
    let list = indexes::list(c).await.unwrap_or_else(|e| panic!("index list: {e}"));
    list.into_iter().filter(|i| !i.identity).collect()
}

/// Polls the operator's instance every `poll` until `stop`, recording in `timeline` what each
/// poll saw (see [`Epoch`]).
async fn poll_states(c: Arc<Catalog>, timeline: Arc<Timeline>, poll: Duration, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        let polled = Instant::now();
        let infos = infos(&c).await;
        let now: BTreeMap<&str, IndexState> = infos.iter().map(|i| (i.field.as_str(), i.state)).collect();
        let seen = Instant::now();
        {
            let mut all = timeline.epochs.lock().unwrap();
            for (field, epochs) in all.iter_mut() {
                let Some(e) = epochs.last_mut() else { continue };
                match now.get(field.as_str()) {
                    Some(IndexState::Backfilling) => {
                        e.backfilling_polled = Some(polled);
                        if let Some(job) = infos.iter().find(|i| i.field == *field).and_then(|i| i.progress.as_ref()) {
                            e.backfill_seen.get_or_insert(seen);
                            e.steps = job.steps_done;
                        }
                    }
                    Some(IndexState::Active) => {
                        e.active_seen.get_or_insert(seen);
                    }
                    Some(IndexState::Dropping) => {}
                    None if e.dropped_issued.is_some_and(|d| d < polled) => {
                        e.gone_seen.get_or_insert(seen);
                    }
                    None => {}
                }
            }
        }
        tokio::time::sleep(poll).await;
    }
}

/// Waits until no index is backfilling or dropping by the timeline (`all`), or until one
/// is not (`!all`). A backfill starts once every write acknowledged before its change is
/// applied, so in long runs it waits behind a backlog of thousands of entries: the wait is
/// judged by progress, as quiescing is, not by a deadline. It panics when for
/// [`NO_PROGRESS`] neither the timeline nor the WAL (pending count, checkpoint) moved.
async fn settled(c: &Catalog, timeline: &Timeline, poll: Duration, all: bool) {
    let mut reported = Instant::now();
    let mut checked = Instant::now();
    let mut progress_at = Instant::now();
    let mut last: Option<Progress> = None;
    loop {
        if reported.elapsed() > Duration::from_secs(60) {
            // The pending count of the last progress check (at most 5 s old).
            let backlog = last
                .as_ref()
                .and_then(|(_, wal)| wal.as_ref())
                .map(|(pending, _)| format!("{pending} pending"))
                .unwrap_or_default();
            eprintln!(
                "checker: waiting for index changes ({backlog}; s since the run started): {}",
                timeline.describe()
            );
            reported = Instant::now();
        }
        let busy: Vec<bool> = {
            let epochs = timeline.epochs.lock().unwrap();
            epochs
                .values()
                .filter_map(|e| e.last())
                .map(|e| e.active_seen.is_none() || (e.dropped_issued.is_some() && e.gone_seen.is_none()))
                .collect()
        };
        if if all { !busy.contains(&true) } else { busy.contains(&false) || busy.len() < FIELDS.len() } {
            return;
        }
        if checked.elapsed() > Duration::from_secs(5) {
            checked = Instant::now();
            // Per shard: the total is capped (10,000 per shard) and the largest checkpoint
            // hides a shard that lags behind the others, so a shard working through a backlog
            // over the cap looked stalled (Azurite, seed 21, 20,000 operations).
            let now = (
                timeline.describe(),
                c.status().await.ok().map(|s| {
                    let shards: Vec<_> = s.shards.iter().map(|x| (x.pending, x.checkpoint.clone())).collect();
                    (s.pending, format!("{shards:?}"))
                }),
            );
            if last.as_ref() != Some(&now) {
                last = Some(now);
                progress_at = Instant::now();
            } else if progress_at.elapsed() > NO_PROGRESS {
                eprintln!("{}", stall_state(c).await);
                panic!("index changes made no progress for {NO_PROGRESS:?} (nor did the WAL): {}", now.0);
            }
        }
        tokio::time::sleep(poll).await;
    }
}

/// The WAL's state when nothing moves, for the report of a stall: per shard its pending count,
/// checkpoint, lease row and first pending entries (WAL id, schema version, op kind, and the
/// stamp of a late entry), and the schema version this process knows.
async fn stall_state(c: &Catalog) -> String {
    let mut out = format!("checker: stall state (this process's schema version {}):", c.schema().version());
    let status = c.status().await;
    let shards = status.as_ref().map(|s| s.shards.len()).unwrap_or(1);
    for i in 0..shards {
        let Some(shard) = table_catalog::testing::wal::ShardId::new(i as u16) else { continue };
        let counts = status
            .as_ref()
            .ok()
            .and_then(|s| s.shards.get(i))
            .map(|x| format!("{} pending, checkpoint {:?}", x.pending, x.checkpoint));
        let lease = c.wal().lease_row(shard).await.map(|l| format!("{l:?}")).unwrap_or_else(|e| e.to_string());
        out.push_str(&format!("\n  shard {i}: {}; lease {lease}", counts.unwrap_or_default()));
        match c.wal().pending_page(shard, 3).await {
            Ok(head) => {
                for e in head {
                    let line = match table_catalog::testing::wal::WalEntry::from_entity(&e) {
                        Ok(w) => format!("{} schema {} {} at {:?}", w.id, w.schema_version, w.op.name(), w.at),
                        Err(bad) => format!("{} unreadable: {}", e.row_key, bad.reason),
                    };
                    out.push_str(&format!("\n    pending {line}"));
                }
            }
            Err(e) => out.push_str(&format!("\n    pending: {e}")),
        }
    }
    out
}

/// What [`settled`] watches for progress: the timeline's description, and the WAL's pending
/// count with each shard's pending count and checkpoint (when the status could be read).
type Progress = (String, Option<(u64, String)>);

/// How long [`settled`] waits without any progress before it fails the run.
const NO_PROGRESS: Duration = Duration::from_secs(180);

/// What the operator did.
#[derive(Debug, Default)]
pub struct Operated {
    pub adds: u64,
    pub drops: u64,
    /// Changes made while the clients were still writing.
    pub during_writes: u64,
}

/// The schema operator (see the module docs): `changes` changes through `c`, change `k`
/// once the clients issued `k / (changes + 1)` of their `ops` (`done` counts them), then
/// waits until every change is done.
#[allow(clippy::too_many_arguments)]
pub async fn operate(
    c: Arc<Catalog>,
    timeline: Arc<Timeline>,
    changes: usize,
    seed: u64,
    shards: u16,
    ops: usize,
    done: Arc<Mutex<Vec<Op>>>,
    clients_done: Arc<AtomicBool>,
    poll: Duration,
) -> Operated {
    let stop = Arc::new(AtomicBool::new(false));
    let poller = tokio::spawn(poll_states(c.clone(), timeline.clone(), poll, stop.clone()));
    let mut rng = StdRng::seed_from_u64(seed ^ 0x1DE5_C4A7 ^ (shards as u64).wrapping_mul(0x9E37_79B9));
    let mut out = Operated::default();
    for k in 0..changes {
        let due = (k + 1) * ops / (changes + 1);
        while done.lock().unwrap().len() < due && !clients_done.load(Ordering::Relaxed) {
            tokio::time::sleep(poll).await;
        }
        // What can change now: add a field with no epoch in progress, drop one seen active.
        let (can_add, can_drop) = loop {
            let (mut can_add, mut can_drop) = (Vec::new(), Vec::new());
            {
                let all = timeline.epochs.lock().unwrap();
                for (field, _) in FIELDS {
                    match all.get(field).and_then(|e| e.last()) {
                        None => can_add.push(field),
                        Some(e) if e.gone_seen.is_some() => can_add.push(field),
                        Some(e) if e.active_seen.is_some() && e.dropped_issued.is_none() => can_drop.push(field),
                        Some(_) => {}
                    }
                }
            }
            if !can_add.is_empty() || !can_drop.is_empty() {
                break (can_add, can_drop);
            }
            // Everything is backfilling or dropping: wait for one to finish.
            settled(&c, &timeline, poll, false).await;
        };
        let drop = !can_drop.is_empty() && (can_add.is_empty() || rng.gen_bool(0.5));
        let issued = Instant::now();
        if drop {
            let field = can_drop[rng.gen_range(0..can_drop.len())];
            timeline.epochs.lock().unwrap().get_mut(field).unwrap().last_mut().unwrap().dropped_issued = Some(issued);
            indexes::drop(&c, field).await.unwrap_or_else(|e| panic!("seed {seed}: index drop {field}: {e}"));
            let ended = Instant::now();
            timeline.epochs.lock().unwrap().get_mut(field).unwrap().last_mut().unwrap().dropped_ended = Some(ended);
            out.drops += 1;
            eprintln!("checker seed {seed}: index change {}: drop {field}", k + 1);
        } else {
            let field = can_add[rng.gen_range(0..can_add.len())];
            let epoch = Epoch {
                added_issued: issued,
                added_ended: issued,
                backfilling_polled: None,
                active_seen: None,
                dropped_issued: None,
                dropped_ended: None,
                gone_seen: None,
                backfill_seen: None,
                steps: 0,
            };
            timeline.epochs.lock().unwrap().entry(field.to_string()).or_default().push(epoch);
            let change = indexes::add_projected(&c, field, projection(field))
                .await
                .unwrap_or_else(|e| panic!("seed {seed}: index add {field}: {e}"));
            assert_eq!(change.index.state, IndexState::Backfilling, "seed {seed}: add {field}");
            let ended = Instant::now();
            timeline.epochs.lock().unwrap().get_mut(field).unwrap().last_mut().unwrap().added_ended = ended;
            out.adds += 1;
            eprintln!(
                "checker seed {seed}: index change {}: add {field} ({}; due {due}, {} done)",
                k + 1,
                projection(field),
                done.lock().unwrap().len()
            );
        }
        out.during_writes += u64::from(!clients_done.load(Ordering::Relaxed));
        // Half the time, wait until this change (and any other) is done.
        if rng.gen_bool(0.5) {
            settled(&c, &timeline, poll, true).await;
        }
    }
    settled(&c, &timeline, poll, true).await;
    stop.store(true, Ordering::Relaxed);
    poller.await.unwrap();
    eprintln!("checker seed {seed}: index changes (s since the run started): {}", timeline.describe());
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Plain,
    Partial,
    Consistent,
}

#[derive(Debug, Clone)]
enum Answer {
    Seen(Seen),
    /// The records found (RowKey, record), for a consistent lookup; empty for the others.
    Found(Vec<(String, Record)>),
}

/// One lookup by an added field.
#[derive(Debug, Clone)]
pub struct Lookup {
    field: &'static str,
    value: &'static str,
    mode: Mode,
    instance: usize,
    /// Logical times (the clients' clock), for the per-record check.
    issued: u64,
    ended: u64,
    at: Instant,
    until: Instant,
    answer: Answer,
}

/// Pages of a lookup (at most 100 records each) until the last; `Err` with the first error.
async fn lookup_pages(c: &Catalog, filter: &Filter, consistent: bool) -> table_catalog::Result<Vec<(String, Record)>> {
    let (mut out, mut token) = (Vec::new(), None::<String>);
    loop {
        let page = if consistent {
            c.query_consistent(filter, 100, token.as_deref()).await?
        } else {
            c.query(filter, 100, token.as_deref()).await?
        };
        out.extend(page.records.into_iter().map(|f| (f.row_key, f.record)));
        token = page.continuation;
        if token.is_none() {
            return Ok(out);
        }
    }
}

/// Looks records up by the added fields (see the module docs) until `stop`, through random
/// instances of `catalogs`, every `period`.
pub async fn read_indexes(
    catalogs: Vec<Arc<Catalog>>,
    timeline: Arc<Timeline>,
    clock: Arc<AtomicU64>,
    seed: u64,
    period: Duration,
    stop: Arc<AtomicBool>,
) -> Vec<Lookup> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x100C_0F5E);
    let mut out = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        // Mostly fields that were added (the others only ever answer `Invalid`).
        let added: Vec<usize> = {
            let epochs = timeline.epochs.lock().unwrap();
            (0..FIELDS.len()).filter(|i| epochs.contains_key(FIELDS[*i].0)).collect()
        };
        let (field, values) = match added.is_empty() || rng.gen_bool(0.2) {
            true => FIELDS[rng.gen_range(0..FIELDS.len())],
            false => FIELDS[added[rng.gen_range(0..added.len())]],
        };
        let value = values[rng.gen_range(0..values.len())];
        if value.is_empty() {
            continue;
        }
        let mode = match rng.gen_range(0..10) {
            0..=3 => Mode::Plain,
            4 => Mode::Partial,
            _ => Mode::Consistent,
        };
        let instance = rng.gen_range(0..catalogs.len());
        let c = &catalogs[instance];
        let filter = Filter::new(vec![(field.to_string(), value.to_string())]).allow_partial(mode == Mode::Partial);
        let at = Instant::now();
        let issued = clock.fetch_add(1, Ordering::SeqCst);
        let result = lookup_pages(c, &filter, mode == Mode::Consistent).await;
        let ended = clock.fetch_add(1, Ordering::SeqCst);
        let until = Instant::now();
        let answer = match result {
            Ok(found) if mode == Mode::Consistent => Some(Answer::Found(found)),
            Ok(_) => Some(Answer::Seen(Seen::Answered)),
            Err(Error::IndexNotReady(_)) => Some(Answer::Seen(Seen::NotReady)),
            Err(Error::Invalid(_)) => Some(Answer::Seen(Seen::Invalid)),
            // Refused as busy (a backlog, frozen appliers) or a transient failure: nothing to check.
            Err(Error::Busy { .. }) => None,
            Err(e) if e.is_transient() => None,
            Err(e) => panic!("seed {seed}: lookup {field}={value} ({mode:?}): {e}"),
        };
        if let Some(answer) = answer {
            out.push(Lookup { field, value, mode, instance, issued, ended, at, until, answer });
        }
        tokio::time::sleep(period).await;
    }
    out
}

/// Counts of the lookups checked.
#[derive(Debug, Default)]
pub struct LookupCounts {
    pub not_ready: u64,
    pub invalid: u64,
    pub answered: u64,
    /// Consistent lookups checked exactly (reads of every identity for the per-record
    /// linearizability check), and the records they returned.
    pub exact: u64,
    pub exact_records: u64,
}

fn has_value(r: &Record, field: &str, value: &str) -> bool {
    r.get(field).and_then(|v| v.as_str()).is_some_and(|v| !v.is_empty() && v.to_lowercase() == value.to_lowercase())
}

/// A consistent lookup made while its index was surely active: what the per-record check
/// reads from it.
#[derive(Debug, Clone)]
pub struct ExactLookup {
    pub filter: FieldFilter,
    /// Logical times (the clients' clock).
    pub issued: u64,
    pub ended: u64,
    /// The records it returned, by RowKey.
    pub found: BTreeMap<String, Record>,
    /// How reports name it.
    pub what: String,
}

/// Checks every lookup against the timeline and, for consistent lookups while the index was
/// surely active, that each record returned is one of `identities` (RowKey: a record of it)
/// with the value, once. Returns the violations, and those exact lookups for the per-record
/// check.
pub fn check_lookups(
    u: &Universe,
    lookups: &[Lookup],
    timeline: &Timeline,
    identities: &BTreeMap<String, Record>,
    counts: &mut LookupCounts,
) -> (Vec<String>, Vec<ExactLookup>) {
    let mut out = Vec::new();
    let mut exact = Vec::new();
    for l in lookups {
        let from = l.at.checked_sub(STALE).unwrap_or(timeline.start);
        let partial = l.mode == Mode::Partial;
        let at = |t: Instant| t.saturating_duration_since(timeline.start).as_secs_f64();
        let what = format!(
            "{:?} lookup {}={} through instance {} ({:.3} s to {:.3} s, logical {}-{})",
            l.mode,
            l.field,
            l.value,
            l.instance,
            at(l.at),
            at(l.until),
            l.issued,
            l.ended
        );
        let seen = match &l.answer {
            Answer::Seen(s) => *s,
            Answer::Found(_) => Seen::Answered,
        };
        match seen {
            Seen::NotReady => counts.not_ready += 1,
            Seen::Invalid => counts.invalid += 1,
            Seen::Answered => counts.answered += 1,
        }
        if !timeline.allows(l.field, seen, partial, from, l.until) {
            out.push(format!(
                "{what}: {seen:?}, which no state of the index then allows: {:?}",
                timeline.epochs(l.field)
            ));
            continue;
        }
        let Answer::Found(found) = &l.answer else { continue };
        if !timeline.surely_active(l.field, from, l.until) {
            continue;
        }
        counts.exact += 1;
        counts.exact_records += found.len() as u64;
        let mut got: BTreeMap<String, Record> = BTreeMap::new();
        for (rk, r) in found {
            if got.insert(rk.clone(), r.clone()).is_some() {
                out.push(format!("{what}: returned {rk} twice"));
            }
            if u.row_key(r) != *rk || !has_value(r, l.field, l.value) {
                out.push(format!("{what}: returned {rk} without that value: {r:?}"));
            }
            if !identities.contains_key(rk) {
                out.push(format!("{what}: returned {rk}, which nobody wrote"));
            }
        }
        let filter = vec![(l.field.to_string(), l.value.to_string())];
        exact.push(ExactLookup { filter, issued: l.issued, ended: l.ended, found: got, what });
    }
    (out, exact)
}

/// The checks at quiescence (see the module docs); `live` is the final state (already
/// checked per record). Returns the violations and a summary.
pub async fn check_final(c: &Catalog, live: &BTreeMap<String, Record>) -> (Vec<String>, String) {
    let mut out = Vec::new();
    let now = states(c).await;
    let mut summary = Vec::new();
    for (field, values) in FIELDS {
        match now.get(field) {
            Some(IndexState::Active) => {
                let mut found = 0;
                for value in values.iter().filter(|v| !v.is_empty()) {
                    let want: BTreeSet<&str> =
                        live.iter().filter(|(_, r)| has_value(r, field, value)).map(|(rk, _)| rk.as_str()).collect();
                    let (mut got, mut pages, mut token) = (BTreeSet::new(), 0, None::<String>);
                    let filter = Filter::new(vec![(field.to_string(), value.to_string())]);
                    loop {
                        let page = c.query(&filter, 7, token.as_deref()).await.unwrap();
                        pages += 1;
                        for f in page.records {
                            if !got.insert(f.row_key.clone()) {
                                out.push(format!("final lookup {field}={value}: {} twice", f.row_key));
                            }
                        }
                        token = page.continuation;
                        if token.is_none() {
                            break;
                        }
                    }
                    let got: BTreeSet<&str> = got.iter().map(String::as_str).collect();
                    if got != want {
                        out.push(format!(
                            "final lookup {field}={value}: found {} records, the final state has {}: missing {:?}, extra {:?}",
                            got.len(),
                            want.len(),
                            want.difference(&got).collect::<Vec<_>>(),
                            got.difference(&want).collect::<Vec<_>>()
                        ));
                    }
                    if pages < want.len().div_ceil(7) {
                        out.push(format!("final lookup {field}={value}: {} records in {pages} pages of 7", want.len()));
                    }
                    found += got.len();
                }
                summary.push(format!("{field} active ({found} records found)"));
            }
            Some(other) => out.push(format!("index {field} still {} at quiescence", other.name())),
            None => {
                let prefix = table_catalog::testing::jobs::index::partition_prefix(field);
                let range =
                    PartitionRange { after: Some(prefix.clone()), before: None, to: Some(format!("{prefix}\u{ffff}")) };
                let left = c.store().query_partitions(&c.names().table, &range, 1000, None).await.unwrap();
                if !left.entities.is_empty() {
                    out.push(format!("{} rows of {field}, not an index, are left", left.entities.len()));
                }
                summary.push(format!("{field} not an index (0 rows left: {})", left.entities.is_empty()));
            }
        }
    }
    (out, summary.join(", "))
}
