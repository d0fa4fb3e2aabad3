//! Randomized, seeded, reproducible checker of the WAL invariants under faults.
//!
//! Concurrent clients issue upsert / insert / replace / delete (and queue intents, some
//! delivered twice) on a small key space drawn from the airports data, so identifiers
//! collide and records move between index values. Several catalog instances share one
//! storage account, each through its own fault injector (503s before or after commit,
//! latency, freezes longer than the lease) and with its own skewed clock; each runs a queue
//! worker and a sweeper, so several appliers race. After quiescence the whole table is
//! checked:
//! - convergence: every record's index rows agree ([`table_catalog::verify`]);
//! - durability and order: for every record identity, the final state is the effect of an
//!   operation that no acknowledged operation issued after it finished supersedes (an
//!   acknowledged write that nothing later touched must be there, with its payload);
//! - nothing pending, nothing dead, nothing poisoned, queue drained;
//! - history (every instance keeps it): per identity, one row per WAL id, newest first, a
//!   row for every acknowledged write and for every acknowledged filter that must have seen
//!   the record, and the newest row equal to the final state ([`check_history`]). With the
//!   history write of deletes skipped on purpose, the bounded run reports over a thousand
//!   violations (docs/RELIABILITY.md).
//!
//! Consistent reads (read-your-writes): after a share of its acknowledged upserts
//! (`TC_CHECKER_READS`, default 0.05) and after every frozen racing pair (below), a client
//! reads the record back with `query_consistent`; the answer must be a state that the
//! operations issued before the read ended allow, counting as acknowledged only those
//! acknowledged before it began. With the catch-up removed (`Applier::catch_up` answering at
//! once) seeds 1 and 2 fail (docs/RELIABILITY.md).
//!
//! Half of the racing pairs (`TC_CHECKER_FROZEN`, default 0.5) are frozen: the client holds the upsert's shard lease from before
//! the upsert until 300 ms after it, and logs the delete with `wait`, so the delete's instance
//! applies shard 0 while the upsert is surely pending; the consistent read that follows shows
//! a delete applied out of order even when a later write would hide it from the final state.
//!
//! While the run goes on, an auditor scans the catalog table over and over and checks that
//! no row's WAL id ever goes back (fencing: an applier whose lease expired while it was
//! frozen cannot overwrite a newer entry's write). A stale overwrite is usually repaired by
//! the next write of the same row, so the final state alone would rarely show it.
//!
//! Every run is repeated with 1, 4 and 16 WAL shards (`TC_CHECKER_SHARDS` picks others), the
//! operations split between them. Upserts land in the shard of their record's RowKey,
//! replace and delete by filter in shard 0 behind the low-watermark barrier; the key space
//! makes filters match records of several shards and replaces move records to another
//! shard, and each run prints how often that happened (and fails if it never did). To race
//! the barrier on purpose, clients also issue pairs (an upsert of a record of their own, then
//! at once a delete matching it, through another instance), and lease hogs hold the leases
//! of shards other than 0 for up to a second at a time, like frozen appliers, so that such
//! an upsert is often still pending when its delete reaches the head of shard 0. With the
//! barrier removed, the checker fails (docs/RELIABILITY.md).
//!
//! Online index changes (issue 13, [`index_changes`]): in runs with several shards a schema
//! operator adds and drops indexes on the records' non-identity fields (`country`, `tz`,
//! `subd`, which every write sets from small value sets, so records move between values)
//! while the clients write (`TC_CHECKER_INDEX_CHANGES` per run, default 2; 0 disables), scan
//! workers on two instances run the backfill and drop jobs, and a reader looks records up by
//! the added fields through every instance. Each lookup's answer (`index_not_ready`,
//! `Invalid`, records) must be one the index's states during the lookup allow, and a
//! consistent lookup while the index was surely active must return exactly the records the
//! model allows. At quiescence `verify` runs under the final schema (`moved_row` included),
//! every active added index finds exactly the live records of each value, and no row of a
//! dropped index is left.
//!
//! Bounded runs are part of `scripts/test.sh`; long runs: `scripts/checker_long.sh local`
//! (100,000 operations) and `scripts/checker_long.sh azurite` (20,000), or by hand:
//! `TC_CHECKER_OPS=100000 TC_CHECKER_SEED=7 TC_CHECKER_CLIENTS=8 TC_CHECKER_SHARDS=4 TC_CHECKER_BACKEND=local cargo test --release --features fault-injection --test checker -- --nocapture`.
#![cfg(feature = "fault-injection")]

mod common;
#[path = "checker/indexes.rs"]
mod index_changes;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use table_catalog::catalog::{Catalog, CatalogOptions};
use table_catalog::config::Names;
use table_catalog::dispatch::{QueuePolicy, WorkerOptions};
use table_catalog::history::{self as hist, HistoryEntry, HistoryOptions};
use table_catalog::import::{read_file, Format};
use table_catalog::messages;
use table_catalog::query::Filter;
use table_catalog::record::{Record, RowMeta};
use table_catalog::schema::Schema;
use table_catalog::server::{self, ServeOptions};
use table_catalog::store::fault::{unavailable, Fault, FaultStore, OpKind, Rule, Trigger};
use table_catalog::store::Store;
use table_catalog::verify;
use table_catalog::wal::id::{format_micros, now_micros};
use table_catalog::wal::ShardId;

const INDEX: [&str; 3] = ["icao", "iata", "lid"];

/// A consistent read of one record identity (by its ICAO code) and what it returned for it
/// (`Some(None)`: absent; `None`: refused as busy or failed, nothing to check).
#[derive(Debug, Clone)]
struct Read {
    rk: String,
    identity: Record,
    issued: u64,
    ended: u64,
    found: Option<Option<Record>>,
}

/// What an operation does to one record identity.
#[derive(Debug, Clone, PartialEq)]
enum Effect {
    Write(Record),
    Absent,
}

#[derive(Debug, Clone)]
enum Kind {
    Upsert(Record),
    Replace((String, String), Record),
    Delete((String, String)),
}

#[derive(Debug, Clone)]
struct Op {
    kind: Kind,
    issued: u64,
    /// Logical time the call returned; `u64::MAX` for queue intents (applied whenever
    /// consumed) and for failed calls (see [`Op::new`]).
    ended: u64,
    acked: bool,
    /// RowKey (identity) of the record an upsert or replace writes.
    rk: Option<String>,
    /// The WAL id the write was logged under, when the call returned one (for diagnostics).
    wal_id: Option<String>,
}

impl Op {
    /// An operation that failed is indeterminate: a transient error can come after its WAL
    /// entry was written (a 503 after commit, a timeout), and an id allocated but never
    /// published orders it after nothing (the order invariant covers acknowledged writes
    /// only). It may take effect at any time after it was issued, so nothing supersedes it
    /// (Jepsen's `:info` operations; docs/ARCHITECTURE.md, "Invariants").
    fn new(u: &Universe, kind: Kind, issued: u64, ended: u64, acked: bool, wal_id: Option<String>) -> Op {
        let ended = if acked { ended } else { u64::MAX };
        let rk = match &kind {
            Kind::Upsert(r) | Kind::Replace(_, r) => Some(u.row_key(r)),
            Kind::Delete(_) => None,
        };
        Op { kind, issued, ended, acked, rk, wal_id }
    }
}

/// Whether a write's result acknowledges it (a timeout does: the write is durable, just not
/// applied yet); any error but a transient one fails the run.
fn acknowledged<T>(result: &table_catalog::Result<T>, seed: u64, shards: u16) -> bool {
    match result {
        Ok(_) => true,
        Err(table_catalog::Error::Timeout(_)) => true,
        Err(e) => {
            assert!(e.is_transient(), "seed {seed} shards {shards}: unexpected error {e}");
            false
        }
    }
}

struct Universe {
    schema: Schema,
    airports: Vec<Record>,
    iata: Vec<String>,
    lid: Vec<String>,
}

impl Universe {
    fn new() -> Universe {
        let schema = common::airports_schema();
        let rows = read_file(&common::airports_csv(), Format::Csv, &schema).unwrap();
        let airports: Vec<Record> = rows
            .into_iter()
            .filter_map(|(_, r)| r.ok())
            .filter(|r| INDEX.iter().all(|f| r[*f].as_str().is_some_and(|v| !v.is_empty())))
            .step_by(997)
            .take(6)
            .collect();
        let iata = vec!["XXA".into(), "XXB".into(), airports[0]["iata"].as_str().unwrap().into(), String::new()];
        let lid = vec!["LLA".into(), airports[1]["lid"].as_str().unwrap().into(), String::new()];
        Universe { schema, airports, iata, lid }
    }

    fn record(&self, rng: &mut StdRng, client: usize) -> Record {
        let mut r = self.airports[rng.gen_range(0..self.airports.len())].clone();
        r.insert("iata".into(), json!(self.iata[rng.gen_range(0..self.iata.len())]));
        r.insert("lid".into(), json!(self.lid[rng.gen_range(0..self.lid.len())]));
        r.insert("v".into(), json!(rng.gen::<u32>()));
        r.insert("by".into(), json!(client));
        index_changes::set_values(&mut r);
        r
    }

    fn filter(&self, rng: &mut StdRng) -> (String, String) {
        match rng.gen_range(0..3) {
            0 => ("icao".into(), self.airports[rng.gen_range(0..self.airports.len())]["icao"].as_str().unwrap().into()),
            1 => ("iata".into(), self.iata[rng.gen_range(0..self.iata.len() - 1)].clone()),
            _ => ("lid".into(), self.lid[rng.gen_range(0..self.lid.len() - 1)].clone()),
        }
    }

    /// A record of the client's own (its name says so, and no other client writes it), with
    /// the identifiers of an airport and an IATA code from the shared values.
    fn paired_record(&self, rng: &mut StdRng, client: usize) -> Record {
        let mut r = self.airports[rng.gen_range(0..self.airports.len())].clone();
        r.insert("name".into(), json!(format!("Paired {client}")));
        r.insert("iata".into(), json!(self.iata[rng.gen_range(0..self.iata.len())]));
        r.insert("lid".into(), json!(""));
        r.insert("v".into(), json!(rng.gen::<u32>()));
        r.insert("by".into(), json!(client));
        index_changes::set_values(&mut r);
        r
    }

    /// A filter on one of the record's non-empty identifiers.
    fn filter_matching(&self, rng: &mut StdRng, r: &Record) -> (String, String) {
        let fields: Vec<&str> =
            INDEX.iter().copied().filter(|f| r[*f].as_str().is_some_and(|v| !v.is_empty())).collect();
        let field = fields[rng.gen_range(0..fields.len())];
        (field.to_string(), r[field].as_str().unwrap().to_string())
    }

    fn row_key(&self, r: &Record) -> String {
        self.schema.record_keys(r).unwrap().row_key
    }
}

fn matches(filter: &(String, String), identity: &Record) -> bool {
    identity[filter.0.as_str()].as_str().is_some_and(|v| !v.is_empty() && v.to_lowercase() == filter.1.to_lowercase())
}

fn effect(op: &Op, rk: &str, identity: &Record) -> Option<Effect> {
    match &op.kind {
        Kind::Upsert(r) => (op.rk.as_deref() == Some(rk)).then(|| Effect::Write(r.clone())),
        Kind::Replace(_, r) if op.rk.as_deref() == Some(rk) => Some(Effect::Write(r.clone())),
        Kind::Replace(f, _) | Kind::Delete(f) => matches(f, identity).then_some(Effect::Absent),
    }
}

/// How the workload crossed shards, counted on a replay of the acknowledged operations in
/// issue order (the appliers' real order may differ: an estimate of what they met).
#[derive(Debug, Default)]
struct Coverage {
    /// Replaces and deletes whose filter matched at least one record.
    filters_matching: u64,
    /// Replaces and deletes whose filter matched records of at least two shards.
    cross_shard_filters: u64,
    /// Replaces and deletes that matched a record last written by an upsert logged in
    /// another shard than the filter's (shard 0), acknowledged before the filter was issued:
    /// the order the barrier keeps.
    after_other_shard_upsert: u64,
    /// Replaces whose new record is in another shard than a record they removed (its
    /// identifiers changed, so its RowKey and usually its shard).
    moves: u64,
}

fn coverage(history: &[Op], shards: u16) -> Coverage {
    let shard = |rk: &str| ShardId::for_row_key(rk, shards);
    let mut ops: Vec<&Op> = history.iter().filter(|o| o.acked).collect();
    ops.sort_by_key(|o| o.issued);
    // RowKey -> (identity, the upsert that last wrote it, if it was not a replace).
    let mut live: BTreeMap<String, (Record, Option<&Op>)> = BTreeMap::new();
    let mut c = Coverage::default();
    for op in ops {
        match &op.kind {
            Kind::Upsert(r) => {
                live.insert(op.rk.clone().unwrap_or_default(), (r.clone(), Some(op)));
            }
            Kind::Replace(f, _) | Kind::Delete(f) => {
                let matched: Vec<String> =
                    live.iter().filter(|(_, (id, _))| matches(f, id)).map(|(rk, _)| rk.clone()).collect();
                let in_shards: BTreeSet<ShardId> = matched.iter().map(|rk| shard(rk)).collect();
                c.filters_matching += u64::from(!matched.is_empty());
                c.cross_shard_filters += u64::from(in_shards.len() > 1);
                let ordered = matched
                    .iter()
                    .any(|rk| live[rk].1.is_some_and(|w| w.ended < op.issued && shard(rk) != ShardId::ZERO));
                c.after_other_shard_upsert += u64::from(ordered);
                for rk in &matched {
                    live.remove(rk);
                }
                if let Kind::Replace(_, r) = &op.kind {
                    let rk = op.rk.clone().unwrap_or_default();
                    c.moves += u64::from(in_shards.iter().any(|s| *s != shard(&rk)));
                    live.insert(rk, (r.clone(), None));
                }
            }
        }
    }
    c
}

struct Run {
    seed: u64,
    ops: usize,
    clients: usize,
    instances: usize,
    /// WAL shards (`CatalogOptions.wal.shards`).
    shards: u16,
}

async fn open_instance(
    store: Arc<dyn Store>,
    names: &Names,
    schema: &Schema,
    skew_us: i64,
    shards: u16,
) -> Arc<Catalog> {
    let mut o = CatalogOptions::default();
    o.wal.shards = shards;
    o.wal.lease_duration = Duration::from_millis(1500);
    o.wal.tombstone_grace = Duration::from_secs(10);
    o.wal.clock_skew_us = skew_us;
    o.wait_timeout = Duration::from_secs(5);
    // Freezes and lease hogs hold shards for seconds: a consistent read waits them out.
    o.consistent_timeout = Duration::from_secs(8);
    o.sweep_apply_after = Duration::from_millis(300);
    o.history = HistoryOptions::on();
    Arc::new(Catalog::open(store, names.clone(), schema.clone(), o).await.unwrap())
}

fn add_faults(f: &FaultStore, catalog_table: &str) {
    let writes = [
        OpKind::Insert,
        OpKind::Upsert,
        OpKind::Replace,
        OpKind::Delete,
        OpKind::Batch,
        OpKind::PutMessage,
        OpKind::DeleteMessage,
        OpKind::ReleaseMessage,
    ];
    f.add(Rule::new(&[], Trigger::Probability(0.02), Fault::Fail(unavailable())));
    f.add(Rule::new(&writes, Trigger::Probability(0.02), Fault::CommitThenFail(unavailable())));
    f.add(Rule::new(&[], Trigger::Probability(0.05), Fault::Delay(Duration::from_millis(3))));
    // Freeze an applier mid fan-out; several freezes in a row outlast its lease.
    f.add(
        Rule::new(
            &[OpKind::Get, OpKind::Replace, OpKind::Insert],
            Trigger::Probability(0.02),
            Fault::Delay(Duration::from_millis(700)),
        )
        .on(catalog_table),
    );
    // A freeze longer than the lease (1.5 s): another applier takes the shard over while this
    // one still holds a fan-out write it will send when it wakes up.
    f.add(
        Rule::new(&[OpKind::Get, OpKind::Replace, OpKind::Insert], Trigger::Probability(0.004), Fault::Delay(FREEZE))
            .on(catalog_table),
    );
}

const FREEZE: Duration = Duration::from_millis(2000);

/// Takes the lease of a random shard other than 0 and holds it without applying, for 0.1 to
/// 1 s (under the 1.5 s lease), again and again until `stop`: an applier frozen (or just slow)
/// in the middle of its shard. That shard's pending upserts wait meanwhile (hints find it
/// busy; the sweeper applies them after the release), while shard 0 goes on: a replace or
/// delete logged after one of them must wait for it at the barrier. Returns how many times
/// it held a lease.
async fn hog_leases(c: Arc<Catalog>, shards: u16, seed: u64, stop: tokio::sync::watch::Receiver<bool>) -> u64 {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut held = 0;
    let pause = |d: Duration| {
        let mut stop = stop.clone();
        async move {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => {}
                _ = tokio::time::sleep(d) => {}
            }
        }
    };
    while !*stop.borrow() {
        let shard = ShardId::new(rng.gen_range(1..shards.max(2))).unwrap();
        let hold = Duration::from_millis(rng.gen_range(100..1000));
        // Storage faults apply here too: a failed take is just skipped.
        if let Ok(Some(lease)) = c.wal().acquire_lease(shard).await {
            held += 1;
            pause(hold).await;
            c.wal().release_lease(lease).await;
        }
        pause(Duration::from_millis(rng.gen_range(0..300))).await;
    }
    held
}

/// What the auditor saw: scans done, WAL-id regressions.
#[derive(Default)]
struct Audit {
    scans: u64,
    regressions: Vec<String>,
}

/// Scans the catalog table until `stop`, checking that every row's WAL id only grows.
async fn audit(
    store: Arc<dyn Store>,
    table: String,
    period: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Audit {
    let mut seen: HashMap<(String, String), (String, String)> = HashMap::new();
    let mut reported = BTreeSet::new();
    let mut out = Audit::default();
    while !*stop.borrow() {
        // Scan errors (a loaded emulator) just skip a round.
        if let Ok(rows) = verify::scan_all(store.as_ref(), &table).await {
            out.scans += 1;
            for e in rows {
                let id = RowMeta::of(&e).wal_id;
                let key = (e.partition_key.clone(), e.row_key.clone());
                let shown = || format!("seen {} {:?}", format_micros(now_micros()), e.properties);
                match seen.get(&key) {
                    Some((prev, was)) if id < *prev => {
                        if reported.insert((key.clone(), id.clone())) {
                            let now = shown();
                            out.regressions
                                .push(format!("row {key:?}: WAL id went back from {prev} ({was}) to {id} ({now})"))
                        }
                    }
                    Some((prev, _)) if id == *prev => {}
                    _ => {
                        seen.insert(key, (id, shown()));
                    }
                }
            }
        }
        tokio::select! {
            _ = stop.changed() => {}
            _ = tokio::time::sleep(period) => {}
        }
    }
    out
}

async fn check(backend: common::Backend, run: Run) {
    let Run { seed, ops, clients, instances, shards } = run;
    let started = Instant::now();
    let u = Arc::new(Universe::new());
    let inner = common::store(backend);
    let names = Names::new(&common::unique_name("chk"), None, None).unwrap();
    let skews = [0i64, -5_000_000, 3_000_000, -200_000];
    let mut faulty = Vec::new();
    let mut catalogs = Vec::new();
    for i in 0..instances {
        let f = Arc::new(FaultStore::new(inner.clone(), seed.wrapping_mul(31).wrapping_add(i as u64)));
        catalogs.push(open_instance(f.clone(), &names, &u.schema, skews[i % skews.len()], shards).await);
        add_faults(&f, &names.table);
        faulty.push(f);
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // A sweep counts the pending entries, and a long run ends with a backlog of thousands
    // (Azurite answers every query by scanning the whole table): three sweepers once a
    // second each, and the quiescence poll once a second on Azurite.
    let local = backend == common::Backend::Local;
    let sweep_every = Duration::from_secs(1);
    let poll_every = Duration::from_millis(if local { 100 } else { 1000 });
    let mut background = Vec::new();
    for c in &catalogs {
        // A message whose release or delete failed comes back after its lease:
        // 5 s (30 s by default) keeps quiescing short and redelivers slow messages to other
        // workers while the first still handles them (more duplicates).
        let opts = ServeOptions {
            worker: WorkerOptions { lease: Duration::from_secs(5), ..WorkerOptions::default() },
            policy: QueuePolicy {
                max_polling_interval: Duration::from_millis(50),
                max_dequeue_count: 1000, // no poison: every failure here is transient
                retry_delay: Duration::from_secs(1),
                ..QueuePolicy::host()
            },
            ..ServeOptions::default()
        };
        background.push(tokio::spawn(server::run_worker(c.clone(), opts, stop_rx.clone())));
        background.push(tokio::spawn(server::run_sweeper(c.clone(), sweep_every, stop_rx.clone())));
    }

    // Online index changes: jobs run on two of the faulty instances' scan workers; the
    // operator changes the schema through an instance of its own (see `index_changes`).
    let changes = index_changes::changes(shards);
    let operator_instance = match changes {
        0 => None,
        _ => Some(open_instance(inner.clone(), &names, &u.schema, 0, shards).await),
    };
    if changes > 0 {
        for c in catalogs.iter().take(2) {
            let opts = ServeOptions {
                scan_workers: 2,
                worker: WorkerOptions { lease: Duration::from_secs(5), ..WorkerOptions::default() },
                policy: QueuePolicy {
                    max_polling_interval: Duration::from_millis(if local { 50 } else { 250 }),
                    max_dequeue_count: 1000,
                    retry_delay: Duration::from_secs(1),
                    ..QueuePolicy::host()
                },
                ..ServeOptions::default()
            };
            background.push(tokio::spawn(server::run_scan_worker(c.clone(), opts, stop_rx.clone())));
        }
    }

    let audit_period = Duration::from_millis(if local { 10 } else { 100 });
    let auditor = tokio::spawn(audit(inner.clone(), names.table.clone(), audit_period, stop_rx.clone()));

    // Lease hogs while the clients write (see [`hog_leases`]): one per 3 shards, at least two
    // (none with one shard: 2 with 4 shards, 6 with 16).
    let (hogs_stop, hogs_rx) = tokio::sync::watch::channel(false);
    let hog_count = if shards > 1 { usize::from(shards.div_ceil(3)).max(2) } else { 0 };
    let hogs: Vec<_> = (0..hog_count)
        .map(|i| {
            let c = catalogs[i % catalogs.len()].clone();
            tokio::spawn(hog_leases(c, shards, seed.wrapping_add(1000 + i as u64), hogs_rx.clone()))
        })
        .collect();

    let clock = Arc::new(AtomicU64::new(1));
    let history: Arc<Mutex<Vec<Op>>> = Arc::new(Mutex::new(Vec::new()));
    let refused = Arc::new(AtomicU64::new(0));
    let reads: Arc<Mutex<Vec<Read>>> = Arc::new(Mutex::new(Vec::new()));
    let progress = {
        let history = history.clone();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let mut last = 0;
            loop {
                tokio::select! {
                    _ = stop.changed() => return,
                    _ = tokio::time::sleep(Duration::from_secs(30)) => {}
                }
                let done = history.lock().unwrap().len();
                if done != last {
                    eprintln!(
                        "checker {backend:?} seed {seed} shards {shards}: {done}/{ops} ops after {:.0} s",
                        started.elapsed().as_secs_f64()
                    );
                    last = done;
                }
            }
        })
    };
    let mut tasks = Vec::new();
    for client in 0..clients {
        let (u, clock, history, catalogs, refused, reads) =
            (u.clone(), clock.clone(), history.clone(), catalogs.clone(), refused.clone(), reads.clone());
        let n = ops / clients + usize::from(client < ops % clients);
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed ^ (client as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            // Reads draw from their own stream, so the operations of a seed stay the same.
            let read_share = std::env::var("TC_CHECKER_READS").ok().and_then(|v| v.parse().ok()).unwrap_or(0.05);
            let frozen_share = std::env::var("TC_CHECKER_FROZEN").ok().and_then(|v| v.parse().ok()).unwrap_or(0.5);
            let mut read_rng = StdRng::seed_from_u64(!seed ^ (client as u64 + 1).wrapping_mul(0x2545_F491_4F6C_DD1D));
            let mut left = n;
            while left > 0 {
                let c = &catalogs[rng.gen_range(0..catalogs.len())];
                if left >= 2 && rng.gen_bool(0.15) {
                    // A race only the barrier decides: an upsert of a record only this client
                    // writes (usually in a shard other than 0, whose lease a hog may be
                    // holding), then at once, through another instance, a delete by a filter
                    // matching it (shard 0). The delete was issued after the upsert was
                    // acknowledged, so it must wait for it, and the record must end deleted
                    // unless this client writes it again later.
                    let r = u.paired_record(&mut rng, client);
                    let f = u.filter_matching(&mut rng, &r);
                    let c2 = &catalogs[rng.gen_range(0..catalogs.len())];
                    // Half the time the client itself freezes the upsert's shard (holds its
                    // lease, like a frozen applier) from before the upsert until 300 ms after
                    // it, and the delete waits to be applied (`wait`): its instance applies
                    // shard 0 at once, while the upsert is surely still pending. An intact
                    // barrier waits for the upsert; a broken one applies the delete first.
                    let paired = r.clone();
                    let shard = c.applier().shard_of(&u.row_key(&r));
                    let mut frozen = match shard != ShardId::ZERO && rng.gen_bool(frozen_share) {
                        true => c.wal().acquire_lease(shard).await.ok().flatten(),
                        false => None,
                    };
                    let mut thaw = None;
                    for kind in [Kind::Upsert(r), Kind::Delete(f)] {
                        let issued = clock.fetch_add(1, Ordering::SeqCst);
                        let result = match &kind {
                            Kind::Upsert(r) => c.upsert(r.clone(), false).await,
                            Kind::Delete((k, v)) => {
                                c2.delete(Filter::new(vec![(k.clone(), v.clone())]), thaw.is_some()).await
                            }
                            Kind::Replace(..) => unreachable!(),
                        };
                        let ended = clock.fetch_add(1, Ordering::SeqCst);
                        let acked = acknowledged(&result, seed, shards);
                        let wal_id = result.ok().map(|w| w.id);
                        history.lock().unwrap().push(Op::new(&u, kind, issued, ended, acked, wal_id));
                        if let Some(lease) = frozen.take() {
                            let c = c.clone();
                            thaw = Some(tokio::spawn(async move {
                                tokio::time::sleep(Duration::from_millis(300)).await;
                                c.wal().release_lease(lease).await;
                            }));
                        }
                    }
                    if let Some(thaw) = thaw {
                        let _ = thaw.await;
                        // Read it back consistently: the delete was acknowledged after the
                        // upsert, so the record must be gone unless another client wrote it
                        // meanwhile (the model knows). A broken barrier shows here even when
                        // a later write hides it from the final state.
                        let read = read_back(&u, c2, paired, &clock, seed, shards).await;
                        reads.lock().unwrap().push(read);
                    }
                    left -= 2;
                    continue;
                }
                left -= 1;
                let wait = rng.gen_bool(0.1);
                let roll = rng.gen_range(0..100);
                let kind = match roll {
                    0..=54 => Kind::Upsert(u.record(&mut rng, client)),
                    55..=74 => {
                        let r = u.record(&mut rng, client);
                        let f = if rng.gen_bool(0.5) {
                            ("icao".to_string(), r["icao"].as_str().unwrap().to_string())
                        } else {
                            u.filter(&mut rng)
                        };
                        Kind::Replace(f, r)
                    }
                    _ => Kind::Delete(u.filter(&mut rng)),
                };
                let issued = clock.fetch_add(1, Ordering::SeqCst);
                let intent = rng.gen_bool(0.1);
                let result = if intent {
                    let msg = match &kind {
                        Kind::Upsert(r) => json!({"v": 1, "op": "upsert", "record": r}),
                        Kind::Replace((k, v), r) => json!({"v": 1, "op": "replace", "filter": {k: v}, "record": r}),
                        Kind::Delete((k, v)) => json!({"v": 1, "op": "delete", "filter": {k: v}}),
                    };
                    let text = msg.to_string();
                    if rng.gen_bool(0.3) {
                        // A message the host delivers twice: the same message id, logged once.
                        let id = format!("dup-{seed}-{client}-{issued}");
                        let a = c.process_message(&text, &id).await;
                        let b = catalogs[rng.gen_range(0..catalogs.len())].process_message(&text, &id).await;
                        a.and(b).map(|_| None)
                    } else {
                        c.store()
                            .put_message(&c.names().queue, &messages::encode(&text), Duration::ZERO)
                            .await
                            .map(|_| None)
                            .map_err(Into::into)
                    }
                } else {
                    let written = match &kind {
                        Kind::Upsert(r) if roll % 5 == 0 => match c.insert(r.clone(), wait).await {
                            Err(table_catalog::Error::Conflict(_)) => {
                                refused.fetch_add(1, Ordering::Relaxed); // rejected before logging
                                continue;
                            }
                            other => other,
                        },
                        Kind::Upsert(r) => c.upsert(r.clone(), wait).await,
                        Kind::Replace((k, v), r) => {
                            c.replace(Filter::new(vec![(k.clone(), v.clone())]), r.clone(), wait).await
                        }
                        Kind::Delete((k, v)) => c.delete(Filter::new(vec![(k.clone(), v.clone())]), wait).await,
                    };
                    written.map(|w| Some(w.id))
                };
                let ended = clock.fetch_add(1, Ordering::SeqCst);
                let acked = acknowledged(&result, seed, shards);
                // An intent that reached the queue is applied whenever it is consumed.
                let ended = if intent && acked { u64::MAX } else { ended };
                let wal_id = result.ok().flatten();
                let read_after = match (&kind, acked && !intent && read_rng.gen_bool(read_share)) {
                    (Kind::Upsert(r), true) => Some(r.clone()),
                    _ => None,
                };
                history.lock().unwrap().push(Op::new(&u, kind, issued, ended, acked, wal_id));
                if let Some(r) = read_after {
                    // A consistent read of the record just written, through any instance.
                    let c = &catalogs[read_rng.gen_range(0..catalogs.len())];
                    let read = read_back(&u, c, r, &clock, seed, shards).await;
                    reads.lock().unwrap().push(read);
                }
            }
        }));
    }
    let clients_done = Arc::new(AtomicBool::new(false));
    let timeline = Arc::new(index_changes::Timeline::new());
    let operator = operator_instance.clone().map(|c| {
        let poll = Duration::from_millis(if local { 50 } else { 300 });
        let (timeline, history, clients_done) = (timeline.clone(), history.clone(), clients_done.clone());
        tokio::spawn(index_changes::operate(c, timeline, changes, seed, shards, ops, history, clients_done, poll))
    });
    let reader = (changes > 0).then(|| {
        let period = Duration::from_millis(if local { 100 } else { 300 });
        let (catalogs, timeline, clock, stop) =
            (catalogs.clone(), timeline.clone(), clock.clone(), clients_done.clone());
        tokio::spawn(index_changes::read_indexes(catalogs, timeline, clock, seed, period, stop))
    });
    for t in tasks {
        t.await.unwrap();
    }
    let issued_secs = started.elapsed().as_secs_f64();
    // The reader stops with the clients.
    clients_done.store(true, Ordering::Relaxed);
    let lookups = match reader {
        Some(r) => r.await.unwrap(),
        None => Vec::new(),
    };
    let _ = hogs_stop.send(true);
    let mut hogged = 0;
    for h in hogs {
        hogged += h.await.unwrap();
    }

    // Quiesce: faults off, let workers drain the queue, then drain the WAL. The operator
    // first makes its remaining changes and waits until they are done (a backfill starts
    // once the backlog before its change is applied).
    for f in &faulty {
        f.clear();
    }
    let operated = match operator {
        Some(o) => o.await.unwrap(),
        None => index_changes::Operated::default(),
    };
    let c0 = &catalogs[0];
    // A long run ends with a backlog (the freezes slow appliers far more than writers), so
    // quiescing is judged by progress: the oldest pending entry or the queue must move at
    // least every 3 minutes.
    let mut progress_at = Instant::now();
    let mut last: (Option<String>, u64) = (None, u64::MAX);
    let mut reported = Instant::now();
    loop {
        c0.recover().await.unwrap();
        let queued = c0.store().approximate_count(&names.queue).await.unwrap();
        let st = c0.status().await.unwrap();
        if reported.elapsed() >= Duration::from_secs(30) {
            let behind: Vec<String> =
                st.shards.iter().filter(|s| s.pending > 0).map(|s| format!("{} {}", s.shard, s.pending)).collect();
            eprintln!(
                "checker {backend:?} seed {seed} shards {shards}: quiescing after {:.0} s: {} pending ({}), {queued} queued",
                started.elapsed().as_secs_f64(),
                st.pending,
                behind.join(", ")
            );
            reported = Instant::now();
        }
        let oldest = (st.pending > 0).then(|| format!("{} pending, checkpoint {:?}", st.pending, st.checkpoint));
        if queued == 0 && oldest.is_none() {
            break;
        }
        if oldest != last.0 || queued < last.1 {
            progress_at = Instant::now();
            last = (oldest, queued);
        } else if progress_at.elapsed() > Duration::from_secs(180) {
            panic!(
                "seed {seed} shards {shards}: no progress for 3 minutes: {:?}, {queued} queued",
                c0.status().await.unwrap()
            );
        }
        tokio::time::sleep(poll_every).await;
    }
    eprintln!(
        "checker {backend:?} seed {seed} shards {shards}: quiesced after {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let _ = stop_tx.send(true);
    for b in background {
        b.await.unwrap();
    }
    progress.await.unwrap();
    let audit = auditor.await.unwrap();
    c0.recover().await.unwrap();
    let status = c0.status().await.unwrap();
    assert_eq!((status.pending, status.dead, status.poison), (0, 0, 0), "seed {seed} shards {shards}: {status:?}");

    // Convergence, under the final schema (with the indexes added and not dropped).
    c0.applier().reload_schema().await.unwrap();
    let final_schema = c0.schema();
    let report = verify::verify(c0.store().as_ref(), &names.table, &final_schema).await.unwrap();
    assert!(
        report.ok(),
        "seed {seed} shards {shards}: {:?}: {:?}",
        report.findings,
        &report.violations[..report.violations.len().min(10)]
    );
    let rows = verify::scan_all(c0.store().as_ref(), &names.table).await.unwrap();
    let live = verify::live_records(&rows);

    // Durability and order, per record identity.
    let history = history.lock().unwrap().clone();
    let mut identities: BTreeMap<String, Record> = BTreeMap::new();
    for op in &history {
        if let (Kind::Upsert(r) | Kind::Replace(_, r), Some(rk)) = (&op.kind, &op.rk) {
            identities.entry(rk.clone()).or_insert_with(|| r.clone());
        }
    }
    let mut violations = Vec::new();
    let mut checked_writes = 0;
    for (rk, identity) in &identities {
        let touching: Vec<(&Op, Effect)> =
            history.iter().filter_map(|o| effect(o, rk, identity).map(|e| (o, e))).collect();
        let valid = valid_outcomes(&touching);
        let actual = live.get(rk).cloned().map_or(Effect::Absent, Effect::Write);
        if matches!(actual, Effect::Write(_)) {
            checked_writes += 1;
        }
        if !valid.contains(&actual) {
            violations.push(format!("identity {rk}: final {actual:?} is not among {} possible outcomes", valid.len()));
            // The evidence: every operation touching the identity, and its rows as stored.
            for (o, e) in &touching {
                eprintln!(
                    "  {rk}: issued {} ended {} acked {} wal {:?} effect {} ({})",
                    o.issued,
                    o.ended,
                    o.acked,
                    o.wal_id,
                    if matches!(e, Effect::Absent) { "absent" } else { "write" },
                    match &o.kind {
                        Kind::Upsert(r) => format!("upsert v={}", r["v"]),
                        Kind::Replace(f, r) => format!("replace {f:?} v={}", r["v"]),
                        Kind::Delete(f) => format!("delete {f:?}"),
                    }
                );
            }
            for row in rows.iter().filter(|e| &e.row_key == rk) {
                eprintln!("  {rk}: row {} {:?}", row.partition_key, RowMeta::of(row));
            }
        }
    }
    // History: one row per applied change of every identity, in WAL-id order.
    let history_rows = verify::scan_all(c0.store().as_ref(), &names.history_table).await.unwrap();
    let history_violations = check_history(&history, &identities, &live, &history_rows);
    eprintln!(
        "checker {backend:?} seed {seed} shards {shards}: history: {} rows of {} identities; {} violations",
        history_rows.len(),
        history_rows.iter().map(|e| &e.partition_key).collect::<BTreeSet<_>>().len(),
        history_violations.len()
    );
    violations.extend(history_violations);

    // Read-your-writes: each consistent read returned a state that the operations issued
    // before it ended allow, counting as acknowledged only those acknowledged before it began
    // (later ones were concurrent with it and may or may not show).
    let reads = reads.lock().unwrap().clone();
    let answered = reads.iter().filter(|r| r.found.is_some()).count();
    for read in &reads {
        let Some(found) = &read.found else { continue };
        let identity = identities.get(&read.rk).unwrap_or(&read.identity);
        let actual = found.clone().map_or(Effect::Absent, Effect::Write);
        if !outcomes_at(&history, &read.rk, identity, read.issued, read.ended).contains(&actual) {
            violations.push(format!(
                "consistent read of {} (issued {}, ended {}) returned {actual:?}, not a state the writes acknowledged before it allow",
                read.rk, read.issued, read.ended
            ));
        }
    }
    // Online index changes: every lookup by an added field against the index's states and
    // the model, then the final indexes against the final state.
    let mut counts = index_changes::LookupCounts::default();
    let mut index_summary = String::from("no index changes");
    if let Some(op) = &operator_instance {
        let touching: BTreeMap<String, (Record, Vec<Op>)> = identities
            .iter()
            .map(|(rk, id)| {
                (rk.clone(), (id.clone(), history.iter().filter(|o| effect(o, rk, id).is_some()).cloned().collect()))
            })
            .collect();
        let lookup_violations = index_changes::check_lookups(&u, &lookups, &timeline, &touching, &mut counts);
        let (final_violations, summary) = index_changes::check_final(op, &live).await;
        violations.extend(lookup_violations);
        violations.extend(final_violations);
        index_summary = format!(
            "{} adds and {} drops ({} while the clients wrote); final: {summary}, verify under schema version {} clean",
            operated.adds,
            operated.drops,
            operated.during_writes,
            final_schema.version()
        );
    }
    eprintln!(
        "checker {backend:?} seed {seed} shards {shards}: indexes: {index_summary}; {} lookups by added fields: {} index_not_ready, \
         {} invalid, {} answered, {} consistent ones checked exactly ({} records)",
        lookups.len(),
        counts.not_ready,
        counts.invalid,
        counts.answered,
        counts.exact,
        counts.exact_records
    );
    let stray: BTreeSet<&String> = live.keys().filter(|k| !identities.contains_key(*k)).collect();
    assert!(stray.is_empty(), "seed {seed} shards {shards}: records nobody wrote: {stray:?}");
    let (calls, injected): (u64, u64) = faulty.iter().map(|f| f.counts()).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    let cov = coverage(&history, shards);
    eprintln!(
        "checker {backend:?} seed {seed} shards {shards}: {} ops issued, {} writes checked ({} acknowledged) by {clients} clients on \
         {instances} instances in {issued_secs:.1} s; {calls} storage calls, {injected} faults injected; {} identities, {checked_writes} live, {} rows; \
         {} audit scans; {} consistent reads ({} answered, the rest refused as busy or failed); {} violations",
        history.len() as u64 + refused.load(Ordering::Relaxed),
        history.len(),
        history.iter().filter(|o| o.acked).count(),
        identities.len(),
        rows.len(),
        audit.scans,
        reads.len(),
        answered,
        violations.len() + audit.regressions.len()
    );
    eprintln!(
        "checker {backend:?} seed {seed} shards {shards}: workload (acknowledged, replayed in issue order): {} filters \
         matched records, {} of them in 2+ shards, {} after an acknowledged upsert of another shard; {} replaces moved \
         a record to another shard; shard leases hogged {hogged} times",
        cov.filters_matching, cov.cross_shard_filters, cov.after_other_shard_upsert, cov.moves
    );
    if shards > 1 && history.len() >= 200 {
        // The workload must exercise the barrier (a check that the generator still does).
        assert!(
            cov.cross_shard_filters > 0 && cov.after_other_shard_upsert > 0 && cov.moves > 0,
            "seed {seed} shards {shards}: the workload never crossed shards: {cov:?}"
        );
    }
    assert!(
        audit.regressions.is_empty(),
        "seed {seed} shards {shards}: {:#?}",
        &audit.regressions[..audit.regressions.len().min(10)]
    );
    assert!(violations.is_empty(), "seed {seed} shards {shards}: {:#?}", &violations[..violations.len().min(10)]);
}

/// The history check (issue 15): for every record identity, its history rows against the
/// operations that touched it.
/// - No duplicates and newest first: each row's RowKey is the one of its WAL id, and the rows
///   in RowKey order have strictly decreasing WAL ids (one row per WAL id).
/// - No gaps: every acknowledged upsert or replace writing the identity, whose WAL id the
///   call returned, has a row holding its record; an acknowledged replace or delete whose
///   filter matches the identity has a row when the row before it (in id order) is a live
///   record written by an operation acknowledged before the filter was issued (the barrier
///   makes the filter see it).
/// - Agreement: the newest row is the final state (its record, or absent after a removal);
///   an identity with no row was never live.
/// - Soundness: a row under a known WAL id belongs to an operation touching the identity.
///
/// Failed (indeterminate) operations and queue intents have no known id: their rows are
/// allowed, not required. Merged runs need nothing special (every upsert has its own row).
fn check_history(
    history: &[Op],
    identities: &BTreeMap<String, Record>,
    live: &BTreeMap<String, Record>,
    rows: &[table_catalog::store::Entity],
) -> Vec<String> {
    let mut out = Vec::new();
    let mut by_identity: BTreeMap<&str, Vec<HistoryEntry>> = BTreeMap::new();
    for e in rows {
        match HistoryEntry::from_entity(e) {
            Ok(h) => by_identity.entry(e.partition_key.as_str()).or_default().push(h),
            Err(err) => out.push(format!("history row unreadable: {err}")),
        }
    }
    let by_id: HashMap<&str, &Op> = history.iter().filter_map(|o| o.wal_id.as_deref().map(|id| (id, o))).collect();
    for (rk, identity) in identities {
        let rows = by_identity.get(rk.as_str()).map(Vec::as_slice).unwrap_or_default();
        for h in rows {
            if table_catalog::wal::WalId::parse_effective(&h.wal_id).is_none_or(|id| hist::row_key(&id) != h.row_key) {
                out.push(format!("history of {rk}: row {} does not match its WAL id {}", h.row_key, h.wal_id));
            }
        }
        for w in rows.windows(2) {
            if w[0].wal_id <= w[1].wal_id {
                out.push(format!(
                    "history of {rk}: {} listed before {} (not newest first, or twice)",
                    w[0].wal_id, w[1].wal_id
                ));
            }
        }
        // Agreement with the final state.
        let newest = rows.first().map(|h| h.record.clone());
        let actual = live.get(rk);
        match (&newest, actual) {
            (None, None) => {}
            (Some(r), a) if r.as_ref() == a => {}
            _ => out.push(format!("history of {rk}: newest row {newest:?} but the record is {actual:?}")),
        }
        let row_of = |id: &str| rows.iter().find(|h| h.wal_id == id);
        for op in history.iter().filter(|o| o.acked) {
            let Some(id) = op.wal_id.as_deref() else { continue };
            match effect(op, rk, identity) {
                Some(Effect::Write(r)) => match row_of(id) {
                    Some(h) if h.record.as_ref() == Some(&r) => {}
                    other => out.push(format!("history of {rk}: write {id} has {other:?}, not a row with its record")),
                },
                Some(Effect::Absent) => {
                    if row_of(id).is_some() {
                        continue;
                    }
                    // The row before the filter in id order: a live record written by an
                    // operation acknowledged before the filter was issued?
                    let before = rows.iter().find(|h| h.wal_id.as_str() < id);
                    let seen = before.is_some_and(|h| {
                        h.record.is_some()
                            && by_id.get(h.wal_id.as_str()).is_some_and(|w| w.acked && w.ended < op.issued)
                    });
                    if seen {
                        out.push(format!(
                            "history of {rk}: {id} removed it after {} (acknowledged before it) but has no row",
                            before.map(|h| h.wal_id.as_str()).unwrap_or_default()
                        ));
                    }
                }
                None => {}
            }
        }
        for h in rows {
            if let Some(op) = by_id.get(h.wal_id.as_str()) {
                if effect(op, rk, identity).is_none() {
                    out.push(format!(
                        "history of {rk}: row {} belongs to an operation that does not touch it",
                        h.wal_id
                    ));
                }
            }
        }
    }
    let stray: Vec<&&str> = by_identity.keys().filter(|k| !identities.contains_key(**k)).collect();
    if !stray.is_empty() {
        out.push(format!("history rows of identities nobody wrote: {stray:?}"));
    }
    out
}

/// The final states of one record identity that the operations touching it allow: the
/// effect of any operation that no acknowledged operation issued after it ended supersedes.
fn valid_outcomes(touching: &[(&Op, Effect)]) -> Vec<Effect> {
    // Superseded: ended before the last acknowledged operation was issued (linear, as the
    // index lookups check thousands of identities' outcomes).
    let last_acked = touching.iter().filter(|(a, _)| a.acked).map(|(a, _)| a.issued).max();
    let maximal: Vec<&(&Op, Effect)> =
        touching.iter().filter(|(o, _)| last_acked.is_none_or(|issued| issued <= o.ended)).collect();
    let mut valid: Vec<Effect> = maximal.iter().map(|(_, e)| e.clone()).collect();
    if !touching.iter().any(|(o, _)| o.acked) || maximal.iter().all(|(o, _)| !o.acked) {
        // Only unacknowledged operations could be last: any of them may never have been
        // logged, so the state before them is possible too.
        valid.push(Effect::Absent);
        valid.extend(touching.iter().filter(|(o, _)| o.acked).map(|(_, e)| e.clone()));
    }
    valid
}

/// The states of identity `rk` that a read issued at `issued` and ended at `ended` (logical
/// times) may return: the outcomes the operations issued before it ended allow, counting as
/// acknowledged only those acknowledged before it began (later ones were concurrent with it
/// and may or may not show).
fn outcomes_at(ops: &[Op], rk: &str, identity: &Record, issued: u64, ended: u64) -> Vec<Effect> {
    let before: Vec<Op> = ops
        .iter()
        .filter(|o| o.issued < ended)
        .map(|o| {
            let acked = o.acked && o.ended < issued;
            Op { acked, ended: if acked { o.ended } else { u64::MAX }, ..o.clone() }
        })
        .collect();
    let touching: Vec<(&Op, Effect)> = before.iter().filter_map(|o| effect(o, rk, identity).map(|e| (o, e))).collect();
    valid_outcomes(&touching)
}

/// Seed 13 on Azurite with 16 shards: an upsert failed (a 503 after its WAL entry was
/// written) before its id was published; a delete issued after the failure, through another
/// instance, got a smaller id, so the upsert won. That is the contract (a failed write is
/// indeterminate), and the model must allow it; an acknowledged upsert stays superseded.
#[test]
fn a_failed_write_may_take_effect_after_a_later_acknowledged_delete() {
    let u = Universe::new();
    let r = u.paired_record(&mut StdRng::seed_from_u64(13), 0);
    let f = u.filter_matching(&mut StdRng::seed_from_u64(13), &r);
    let failed = Op::new(&u, Kind::Upsert(r.clone()), 189, 190, false, None);
    let acked = Op::new(&u, Kind::Upsert(r.clone()), 189, 190, true, None);
    let delete = Op::new(&u, Kind::Delete(f), 191, 192, true, None);
    let outcomes = |up: &Op| valid_outcomes(&[(up, Effect::Write(r.clone())), (&delete, Effect::Absent)]);
    assert!(outcomes(&failed).contains(&Effect::Write(r.clone())));
    assert!(outcomes(&failed).contains(&Effect::Absent));
    assert_eq!(outcomes(&acked), vec![Effect::Absent]);
}

/// A consistent read of `r`'s identity (by its ICAO code) through `c`. A read refused as
/// busy (frozen appliers held it past its deadline) is retried, up to three times.
async fn read_back(u: &Universe, c: &Catalog, r: Record, clock: &AtomicU64, seed: u64, shards: u16) -> Read {
    let rk = u.row_key(&r);
    let filter = Filter::new(vec![("icao".into(), r["icao"].as_str().unwrap_or_default().into())]);
    let mut tries = 0;
    loop {
        tries += 1;
        let issued = clock.fetch_add(1, Ordering::SeqCst);
        let result = c.query_consistent(&filter, 1000, None).await;
        let ended = clock.fetch_add(1, Ordering::SeqCst);
        let found = match result {
            Ok(page) => Some(page.records.into_iter().map(|f| f.record).find(|rec| u.row_key(rec) == rk)),
            Err(table_catalog::Error::Busy { .. }) if tries < 3 => continue,
            // Refused (a backlog, or not caught up in time), or failed: no answer to check.
            Err(table_catalog::Error::Busy { .. }) => None,
            Err(e) => {
                assert!(e.is_transient(), "seed {seed} shards {shards}: consistent read: {e}");
                None
            }
        };
        return Read { rk, identity: r, issued, ended, found };
    }
}

/// Long runs on one backend only: `TC_CHECKER_BACKEND=local` or `azurite`.
fn wanted(backend: common::Backend) -> bool {
    match std::env::var("TC_CHECKER_BACKEND").as_deref() {
        Ok("local") => backend == common::Backend::Local,
        Ok("azurite") => backend == common::Backend::Azurite,
        _ => true,
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The shard counts to run: `TC_CHECKER_SHARDS` (comma-separated, e.g. `4` or `1,4,16`),
/// else 1, 4 and 16.
fn shard_counts() -> Vec<u16> {
    match std::env::var("TC_CHECKER_SHARDS") {
        Ok(v) => {
            v.split(',').map(|s| s.trim().parse().unwrap_or_else(|_| panic!("TC_CHECKER_SHARDS: '{v}'"))).collect()
        }
        Err(_) => vec![1, 4, 16],
    }
}

/// One run per shard count; the operations (`TC_CHECKER_OPS`, default 1,000 on the embedded
/// store and 300 on Azurite) are split between them, so the bounded run costs what one run
/// did before shards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn randomized_checker_finds_no_violation() {
    let seed = env_u64("TC_CHECKER_SEED").unwrap_or(20261121);
    let counts = shard_counts();
    for backend in common::backends().into_iter().filter(|b| wanted(*b)) {
        let default_ops = if backend == common::Backend::Local { 1000 } else { 300 };
        let total = env_u64("TC_CHECKER_OPS").map_or(default_ops, |n| n as usize);
        let clients = env_u64("TC_CHECKER_CLIENTS").unwrap_or(4) as usize;
        for (i, shards) in counts.iter().enumerate() {
            let ops = total / counts.len() + usize::from(i < total % counts.len());
            check(backend, Run { seed, ops, clients, instances: 3, shards: *shards }).await;
        }
    }
}
