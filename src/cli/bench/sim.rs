//! `bench sim`: scale-out on a simulated Azure account, in one process.
//!
//! One in-memory embedded store ([`LocalStore::in_memory`]) behind a [`SimAzureStore`]
//! (lognormal latency, 503 ServerBusy at the per-partition and per-account targets, retried
//! like the Azure backend), behind a [`CountingStore`]. N [`Catalog`]s are opened on it, each
//! with its own `Catalog::open` (with `wal.shards` = S), queue worker ([`server::run_worker`],
//! which handles the messages of one receive concurrently, so the shards named by the hints
//! it received are applied in parallel) and sweeper, as N Functions instances would be. Runs
//! make a grid: every `--shards` value × every `--instances` value × every `--rate` value.
//!
//! Load mode (the default): C clients issue single-record upserts (`Catalog::upsert(record,
//! false)`) round-robin over the instances for S seconds, as fast as they can or paced to a
//! total offered rate (`--rate`); then the backlog drains (bounded), so the visibility lag
//! covers every acknowledged write.
//!
//! Apply-throughput mode (`--backlog E`): E upserts are logged without being applied (through
//! `Wal::append` of a catalog opened on the embedded store directly, routed like writes by
//! `Applier::route`), then the queue workers of the N instances start with one hint per shard
//! on the queue, and the run measures entries applied per second until the backlog is gone.
//!
//! Visibility lag = from a write's acknowledgement to the removal of its WAL entry from the
//! pending partition of its shard, which the applier does right after writing the entry's
//! index rows. A probe layer observes those removals (the batch deletes of the shard
//! partitions `wal`, `wal-01`.. of the WAL table) as they succeed, so measuring costs no
//! storage request. The same probe counts entries applied per second.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use table_catalog::cli_support::CatalogInternals;

use table_catalog::cli_support::env::Instant;

use anyhow::{bail, Result};
use clap::Args;
use rand::{Rng, SeedableRng};
use serde_json::json;
use table_catalog::catalog::{Catalog, CatalogOptions, Mode};
use table_catalog::cli_support::dispatch::WorkerOptions;
use table_catalog::cli_support::messages;
use table_catalog::cli_support::schema::Schema;
use table_catalog::cli_support::store::sim::{self as simulated, LogNormal, SimAzureStore, SimOptions, SimStats};
use table_catalog::cli_support::wal::shard::{DEFAULT_SHARDS, MAX_SHARDS};
use table_catalog::cli_support::wal::{Op, ShardId, WalId, WalOptions, PENDING_BEFORE};
use table_catalog::config::Names;
use table_catalog::server::{self, ServeOptions};
use table_catalog::store::LocalStore;
use table_catalog::store::{BatchOp, OpKind, Store, StoreResult};
use table_catalog::store::{Call, Layer, LayeredStore, Returned};
use table_catalog::store::{CountingStore, RequestCounts, RequestSnapshot};

use super::percentile::percentile;

/// Scale-out on a simulated Azure account.
#[derive(Debug, Args)]
pub struct SimArgs {
    /// Catalog instances (stand-ins for Functions instances); several values, comma-separated,
    /// make one run each (e.g. 1,2,4,8).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    instances: Vec<usize>,
    /// WAL shards of the catalog (`wal.shards`); several values, comma-separated, make one run
    /// each with every `--instances` value (e.g. 1,4,16). Default: the library's default.
    #[arg(long, value_delimiter = ',')]
    shards: Vec<u16>,
    /// Offered load in writes/s over all clients; each client paces its writes at rate /
    /// clients (a client whose write took longer than its interval catches up). 0: every
    /// client writes as fast as it can. Several values make one run each.
    #[arg(long, value_delimiter = ',', default_value = "0")]
    rate: Vec<f64>,
    /// Apply-throughput mode: log this many upserts without applying them, then start the
    /// queue workers of `--instances` instances (the appliers) with one hint per shard on the
    /// queue, and measure entries applied per second until the backlog is applied. No clients.
    #[arg(long)]
    backlog: Option<usize>,
    /// Writers, each with one write in flight (per instance with `--per-instance`).
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Count `--clients` per instance, as on Flex Consumption, which adds HTTP instances as the
    /// concurrent requests per instance pass its `perInstanceConcurrency` setting: N instances
    /// then carry N times the load.
    #[arg(long)]
    per_instance: bool,
    /// Seconds of load per run.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Indexed identifiers per record (index rows per write).
    #[arg(long, default_value_t = 3)]
    indexes: usize,
    /// Fraction of writes that update a record the same client wrote before (same identity)
    /// instead of adding a new one.
    #[arg(long, default_value_t = 0.1)]
    updates: f64,
    /// Seed of the records and of the simulated latency (run with N instances uses seed + N).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Longest wait, after the load, for every acknowledged write to be applied (seconds).
    #[arg(long, default_value_t = 120.0)]
    drain_secs: f64,
    /// Median latency of point operations, batches and queue operations (ms).
    #[arg(long, default_value_t = 5.0)]
    point_median_ms: f64,
    /// 99th-percentile latency of point operations (ms).
    #[arg(long, default_value_t = 50.0)]
    point_p99_ms: f64,
    /// Median latency of a query page (ms).
    #[arg(long, default_value_t = 30.0)]
    query_median_ms: f64,
    /// 99th-percentile latency of a query page (ms).
    #[arg(long, default_value_t = 150.0)]
    query_p99_ms: f64,
    /// Entities per second one partition serves.
    #[arg(long, default_value_t = simulated::PARTITION_ENTITIES_PER_S)]
    partition_rate: f64,
    /// Table transactions per second the account serves.
    #[arg(long, default_value_t = simulated::ACCOUNT_TRANSACTIONS_PER_S)]
    account_rate: f64,
    /// Seconds between sweeps of each instance.
    #[arg(long, default_value_t = 30)]
    sweep_secs: u64,
    /// Also print each run as one JSON line.
    #[arg(long)]
    json: bool,
    /// Open the catalogs in single-partition mode (tenant `simbench`): every write one entity
    /// group transaction on one partition, no WAL, no queue worker or sweeper; a write is
    /// applied when acknowledged (visibility lag 0). Load mode only; `--shards` is ignored.
    #[arg(long)]
    single_partition: bool,
}

impl SimArgs {
    fn validate(&self) -> Result<()> {
        if self.instances.is_empty() || self.instances.iter().any(|n| !(1..=64).contains(n)) {
            bail!("--instances: each value must be 1..=64 (got {:?})", self.instances);
        }
        if self.shards.iter().any(|s| !(1..=MAX_SHARDS).contains(s)) {
            bail!("--shards: each value must be 1..={MAX_SHARDS} (got {:?})", self.shards);
        }
        if self.rate.is_empty() || self.rate.iter().any(|r| !(r.is_finite() && *r >= 0.0)) {
            bail!("--rate: each value must be a number of writes/s >= 0 (got {:?})", self.rate);
        }
        if self.single_partition && self.backlog.is_some() {
            bail!("--single-partition: load mode only (a single-partition catalog has no backlog to apply)");
        }
        if self.backlog.is_some_and(|e| !(1..=10_000_000).contains(&e)) {
            bail!("--backlog: out of range 1..=10000000");
        }
        if !(1..=4096).contains(&self.clients) {
            bail!("--clients: {} is out of range 1..=4096", self.clients);
        }
        if !((0.0..=3600.0).contains(&self.seconds) && self.seconds > 0.0 && (0.0..=3600.0).contains(&self.drain_secs))
        {
            bail!("--seconds must be in (0, 3600] and --drain-secs in [0, 3600]");
        }
        if !(1..=16).contains(&self.indexes) {
            bail!("--indexes: {} is out of range 1..=16", self.indexes);
        }
        if !(0.0..=1.0).contains(&self.updates) {
            bail!("--updates: {} is not a fraction in [0, 1]", self.updates);
        }
        for (name, median, p99) in
            [("--point", self.point_median_ms, self.point_p99_ms), ("--query", self.query_median_ms, self.query_p99_ms)]
        {
            if !(median >= 0.0 && p99 >= median && p99 <= 60_000.0) {
                bail!("{name}-median-ms / {name}-p99-ms: need 0 <= median <= p99 <= 60000 (got {median} / {p99})");
            }
        }
        if !(self.partition_rate > 0.0 && self.account_rate > 0.0) {
            bail!("--partition-rate and --account-rate must be positive");
        }
        Ok(())
    }

    fn shard_counts(&self) -> Vec<u16> {
        if self.shards.is_empty() {
            vec![DEFAULT_SHARDS]
        } else {
            self.shards.clone()
        }
    }

    fn sim_options(&self, seed: u64) -> SimOptions {
        let ms = Duration::from_secs_f64;
        SimOptions {
            point_latency: LogNormal::from_median_p99(ms(self.point_median_ms / 1e3), ms(self.point_p99_ms / 1e3)),
            query_latency: LogNormal::from_median_p99(ms(self.query_median_ms / 1e3), ms(self.query_p99_ms / 1e3)),
            partition_entities_per_s: self.partition_rate,
            account_transactions_per_s: self.account_rate,
            seed,
            ..SimOptions::default()
        }
    }
}

/// Requests and entities of one kind of call on one WAL-table partition.
type Traffic = HashMap<String, BTreeMap<(&'static str, &'static str), (u64, u64)>>;

/// Observes successful removals of pending WAL entries and when they happened, and the
/// traffic on each partition of the WAL table (which partition is hot, and with what).
struct Probe {
    wal_table: String,
    removed: Mutex<HashMap<String, Instant>>,
    changed: tokio::sync::Notify,
    /// Per WAL-table partition, per (row kind, operation): (requests, entities). Entities as
    /// the simulator charges them: a point operation 1, a batch its operations, a query what
    /// it returned (at least 1). Counted once per call (retries of a 503 not included).
    traffic: Mutex<Traffic>,
}

/// The kind of row a call on the WAL table addresses, by its RowKey.
fn row_kind(row_key: Option<&str>) -> &'static str {
    match row_key {
        None => "(query)",
        Some(rk) if rk.starts_with("clock-") => "clock",
        Some(table_catalog::cli_support::wal::clock::HIGH_ROW) => "high row",
        Some(rk) if rk.starts_with("lease") => "lease",
        Some(rk) if rk.starts_with("checkpoint") => "checkpoint",
        Some(rk) if rk < PENDING_BEFORE => "entry",
        Some(_) => "other",
    }
}

impl Probe {
    fn new(wal_table: String) -> Probe {
        Probe {
            wal_table,
            removed: Mutex::new(HashMap::new()),
            changed: tokio::sync::Notify::new(),
            traffic: Mutex::new(HashMap::new()),
        }
    }

    fn note<'a>(&self, row_keys: impl Iterator<Item = &'a str>) {
        let now = table_catalog::cli_support::env::now();
        if let Ok(mut removed) = self.removed.lock() {
            for rk in row_keys.filter(|rk| *rk < PENDING_BEFORE) {
                removed.entry(rk.to_string()).or_insert(now);
            }
        }
        self.changed.notify_waiters();
    }

    fn traffic(&self) -> Traffic {
        self.traffic.lock().map(|t| t.clone()).unwrap_or_default()
    }
}

impl Layer for Probe {
    async fn run<'a, T, F, Fut>(&'a self, call: Call<'a>, mut attempt: F) -> StoreResult<T>
    where
        T: Returned + Send + 'a,
        F: FnMut() -> Fut + Send + 'a,
        Fut: std::future::Future<Output = StoreResult<T>> + Send + 'a,
    {
        let result = attempt().await;
        if call.target != self.wal_table {
            return result;
        }
        if let Some(pk) = call.partition_key {
            let entities = match (&result, call.op) {
                (Ok(v), OpKind::Query) => v.returned().max(1),
                _ => call.entities().max(1),
            };
            let kind = if call.op == OpKind::Batch { "entry" } else { row_kind(call.row_key) };
            if let Ok(mut t) = self.traffic.lock() {
                let c = t.entry(pk.to_string()).or_default().entry((kind, call.op.name())).or_default();
                c.0 += 1;
                c.1 += entities as u64;
            }
        }
        if result.is_ok() && call.partition_key.and_then(ShardId::from_partition).is_some() {
            match call.op {
                OpKind::Batch => self.note(call.batch.iter().filter_map(|op| match op {
                    BatchOp::Delete { row_key, .. } => Some(row_key.as_str()),
                    _ => None,
                })),
                OpKind::Delete => self.note(call.row_key.into_iter()),
                _ => {}
            }
        }
        result
    }
}

/// `after` minus `before`.
fn traffic_since(after: Traffic, before: &Traffic) -> Traffic {
    let mut out = after;
    for (pk, kinds) in before {
        if let Some(p) = out.get_mut(pk) {
            for (k, c) in kinds {
                if let Some(a) = p.get_mut(k) {
                    a.0 -= c.0.min(a.0);
                    a.1 -= c.1.min(a.1);
                }
            }
        }
    }
    out
}

/// The WAL table's hot spots during `seconds`: entities/s on `metadata` (with what), on the
/// clock partition (the WAL id allocator's reads and publications) and on the busiest shard
/// partition.
fn wal_traffic(traffic: &Traffic, seconds: f64) -> String {
    let per_s = |n: u64| n as f64 / seconds.max(1e-9);
    let total = |p: &BTreeMap<(&str, &str), (u64, u64)>| p.values().map(|c| c.1).sum::<u64>();
    let mut out = Vec::new();
    let detailed = |name: &str, p: &BTreeMap<(&str, &str), (u64, u64)>| {
        let mut kinds: Vec<(String, u64)> = p.iter().map(|((kind, op), c)| (format!("{kind} {op}"), c.1)).collect();
        kinds.sort_by_key(|k| std::cmp::Reverse(k.1));
        let detail: Vec<String> = kinds.iter().take(5).map(|(k, n)| format!("{k} {:.0}", per_s(*n))).collect();
        format!("{name} {:.0} entities/s ({})", per_s(total(p)), detail.join(", "))
    };
    if let Some(meta) = traffic.get("metadata") {
        out.push(detailed("metadata", meta));
    }
    if let Some(clock) = traffic.get(table_catalog::cli_support::wal::clock::CLOCK) {
        out.push(detailed("clock", clock));
    }
    let shards: Vec<(&String, u64)> =
        traffic.iter().filter(|(pk, _)| ShardId::from_partition(pk).is_some()).map(|(pk, p)| (pk, total(p))).collect();
    if let Some((pk, n)) = shards.iter().max_by_key(|(_, n)| *n) {
        out.push(format!("busiest shard {pk} {:.0} entities/s ({} shards used)", per_s(*n), shards.len()));
    }
    out.join("; ")
}

/// A synthetic record: `ident` of `client`, `version`; same `ident`, same identity.
fn record(keys: &[String], client: usize, ident: u64, version: u64) -> table_catalog::record::Record {
    let mut r = serde_json::Map::new();
    for (j, k) in keys.iter().enumerate() {
        r.insert(k.clone(), json!(format!("c{client}n{ident}k{j}")));
    }
    r.insert("name".into(), json!(format!("Sim field {client} {ident}")));
    r.insert("version".into(), json!(version));
    r.insert("city".into(), json!("Simville"));
    r
}

/// CPU time (user + system) this process has used, in seconds: fields 14 and 15 of
/// /proc/self/stat, in clock ticks of 1/100 s (USER_HZ on Linux). `None` elsewhere.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.get(stat.rfind(')')? + 1..)?.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
    Some((ticks(11)? + ticks(12)?) / 100.0)
}

/// The 1-minute load average now (Linux).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// The simulated account, the probe and the counters of one run, on a fresh in-memory store.
struct Env {
    names: Names,
    schema: Schema,
    keys: Vec<String>,
    /// The embedded store itself (behind nothing: not simulated, not counted, not probed).
    local: Arc<dyn Store>,
    sim: Arc<SimAzureStore>,
    probe: Arc<Probe>,
    counts: Arc<RequestCounts>,
    /// What the instances use: counting → probe → simulated Azure → embedded store.
    store: Arc<dyn Store>,
}

fn catalog_options(shards: u16) -> CatalogOptions {
    CatalogOptions { wal: WalOptions { shards, ..WalOptions::default() }, ..CatalogOptions::default() }
}

impl Env {
    fn new(args: &SimArgs, latency_seed: u64) -> Result<Env> {
        let names = Names::new("simbench", None, None)?;
        let keys: Vec<String> = (0..args.indexes).map(|j| format!("id{j}")).collect();
        let schema = Schema::new(keys.clone(), "name")?;
        let local: Arc<dyn Store> = Arc::new(LocalStore::in_memory()?);
        let sim = Arc::new(SimAzureStore::new(local.clone(), args.sim_options(latency_seed)));
        let probe = Arc::new(Probe::new(names.wal_table.clone()));
        let probed: Arc<dyn Store> = Arc::new(LayeredStore::with_layer(sim.clone() as Arc<dyn Store>, probe.clone()));
        let counting = CountingStore::new(probed);
        let counts = counting.counts().clone();
        Ok(Env { names, schema, keys, local, sim, probe, counts, store: Arc::new(counting) })
    }

    /// `n` instances, each opened with its own `Catalog::open`, with `shards` WAL shards (in
    /// single-partition mode: `Catalog::open_with_mode`, tenant `simbench`).
    async fn open(&self, n: usize, shards: u16, single: bool) -> Result<Vec<Arc<Catalog>>> {
        let mut catalogs = Vec::with_capacity(n);
        for _ in 0..n {
            let (store, names, schema) = (self.store.clone(), self.names.clone(), self.schema.clone());
            let c = if single {
                let mode = Mode::SinglePartition { tenant: "simbench".into() };
                Catalog::open_with_mode(store, names, Some(schema), catalog_options(shards), &mode).await?
            } else {
                Catalog::open(store, names, schema, catalog_options(shards)).await?
            };
            catalogs.push(Arc::new(c));
        }
        Ok(catalogs)
    }

    fn removed_count(&self) -> Result<usize> {
        Ok(self.probe.removed.lock().map_err(|_| anyhow::anyhow!("probe lock poisoned"))?.len())
    }

    fn sim_since(&self, before: &SimStats) -> SimStats {
        let after = self.sim.sim().stats();
        SimStats {
            requests: after.requests - before.requests,
            throttled_partition: after.throttled_partition - before.throttled_partition,
            throttled_account: after.throttled_account - before.throttled_account,
            throttled_queue: after.throttled_queue - before.throttled_queue,
            gave_up: after.gave_up - before.gave_up,
        }
    }
}

/// The partitions that drew the most 503s, as "table/partition n, ..." (at most `k`).
fn busiest(partitions: &[(String, String, u64)], k: usize) -> String {
    if partitions.is_empty() {
        return "none".into();
    }
    let total: u64 = partitions.iter().map(|p| p.2).sum();
    let mut s: Vec<String> = partitions.iter().take(k).map(|(t, p, n)| format!("{t}/{p} {n}")).collect();
    if partitions.len() > k {
        s.push(format!(
            "{} more partitions {}",
            partitions.len() - k,
            total - partitions[..k].iter().map(|p| p.2).sum::<u64>()
        ));
    }
    s.join(", ")
}

struct Ack {
    id: String,
    at: Instant,
    latency: Duration,
}

#[derive(Default)]
struct ClientOutcome {
    acks: Vec<Ack>,
    failures: BTreeMap<String, u64>,
}

struct Load {
    catalogs: Vec<Arc<Catalog>>,
    next: AtomicUsize,
    keys: Vec<String>,
    updates: f64,
    seed: u64,
    /// Writers in all.
    writers: usize,
    /// Time between two writes of one client (`None`: as fast as it can).
    interval: Option<Duration>,
}

impl Load {
    async fn client(self: Arc<Self>, client: usize, started: Instant, deadline: Instant) -> ClientOutcome {
        let mut rng = rand::rngs::StdRng::seed_from_u64(self.seed.wrapping_mul(1_000_003).wrapping_add(client as u64));
        let mut out = ClientOutcome::default();
        let mut written: Vec<u64> = Vec::new();
        let mut seq = 0u64;
        // Paced clients start spread over one interval, so the offered load is even.
        let mut next =
            started + self.interval.map_or(Duration::ZERO, |i| i.mul_f64(client as f64 / self.writers as f64));
        while table_catalog::cli_support::env::now() < deadline {
            if let Some(interval) = self.interval {
                if next >= deadline {
                    break;
                }
                table_catalog::cli_support::env::sleep_until(next).await;
                next += interval;
            }
            let update = !written.is_empty() && rng.gen_bool(self.updates);
            let ident = if update { written[rng.gen_range(0..written.len())] } else { seq };
            let record = record(&self.keys, client, ident, seq);
            let catalog = &self.catalogs[self.next.fetch_add(1, Ordering::Relaxed) % self.catalogs.len()];
            let started = table_catalog::cli_support::env::now();
            match catalog.upsert(record, false).await {
                Ok(w) => {
                    out.acks.push(Ack {
                        id: w.id,
                        at: table_catalog::cli_support::env::now(),
                        latency: started.elapsed(),
                    });
                    if !update {
                        written.push(seq);
                    }
                }
                Err(e) => {
                    let kind = if e.is_transient() { "storage unavailable (503)".to_string() } else { e.to_string() };
                    *out.failures.entry(kind.chars().take(120).collect()).or_default() += 1;
                }
            }
            seq += 1;
        }
        out
    }
}

/// What one load run measured.
struct RunReport {
    /// Single-partition mode (no WAL: `shards` means nothing).
    single: bool,
    shards: u16,
    instances: usize,
    /// Offered writes/s (`None`: unpaced).
    rate: Option<f64>,
    writers: usize,
    seconds: f64,
    acked: usize,
    failures: BTreeMap<String, u64>,
    ack: Vec<Duration>,
    lag: Vec<Duration>,
    /// WAL entries removed from pending (applied) while the load ran.
    applied_in_load: usize,
    not_applied: usize,
    /// Apply hints still queued when the drain ended (0 unless it timed out).
    hints_left: u64,
    drain_secs: f64,
    requests: RequestSnapshot,
    sim: SimStats,
    throttled_partitions: Vec<(String, String, u64)>,
    /// Entities/s on the WAL table's metadata partition and busiest shard during the load.
    wal_traffic: String,
    /// CPU cores this process kept busy during the load (CPU seconds / wall seconds).
    cpu_cores: Option<f64>,
    load_average: String,
}

impl RunReport {
    fn per_write(&self, n: u64) -> f64 {
        if self.acked == 0 {
            0.0
        } else {
            n as f64 / self.acked as f64
        }
    }

    fn label(&self, rates: usize) -> String {
        let mode = if self.single { "single-partition".to_string() } else { format!("S={}", self.shards) };
        match (rates > 1, self.rate) {
            (true, Some(r)) => format!("{mode} N={} {r:.0}/s", self.instances),
            _ => format!("{mode} N={}", self.instances),
        }
    }

    /// The shards column: the count, or the mode that has none.
    fn shards_cell(&self) -> String {
        if self.single {
            "single-partition".into()
        } else {
            self.shards.to_string()
        }
    }

    fn json(&self) -> serde_json::Value {
        let by_op: BTreeMap<&str, f64> =
            self.requests.by_op.iter().map(|(op, c)| (op.name(), self.per_write(c.total))).collect();
        json!({
            "mode": "load",
            "catalog_mode": if self.single { "single-partition" } else { "wal" },
            "shards": self.shards,
            "instances": self.instances,
            "offered_writes_per_s": self.rate,
            "writers": self.writers,
            "seconds": self.seconds,
            "acked": self.acked,
            "failed": self.failures.values().sum::<u64>(),
            "failures": self.failures,
            "writes_per_s": self.acked as f64 / self.seconds,
            "applied_per_s_during_load": self.applied_in_load as f64 / self.seconds,
            "ack_p50_ms": percentile(&self.ack, 0.5),
            "ack_p99_ms": percentile(&self.ack, 0.99),
            "visibility_p50_ms": percentile(&self.lag, 0.5),
            "visibility_p99_ms": percentile(&self.lag, 0.99),
            "visibility_max_ms": percentile(&self.lag, 1.0),
            "not_applied_after_drain": self.not_applied,
            "hints_left_after_drain": self.hints_left,
            "drain_seconds": self.drain_secs,
            "requests_per_write": self.per_write(self.requests.total),
            "requests_per_write_by_op": by_op,
            "requests": self.requests,
            "sim": self.sim,
            "throttled_by_partition": self.throttled_partitions,
            "wal_traffic": self.wal_traffic,
            "cpu_cores": self.cpu_cores,
            "load_average_1m": self.load_average,
        })
    }
}

async fn run_one(args: &SimArgs, shards: u16, instances: usize, rate: f64) -> Result<RunReport> {
    let env = Env::new(args, args.seed.wrapping_add(instances as u64))?;
    let single = args.single_partition;
    let catalogs = env.open(instances, shards, single).await?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut background = Vec::new();
    // Single-partition mode has no queue or WAL: nothing runs beside the writers.
    for c in catalogs.iter().filter(|_| !single) {
        background.push(tokio::spawn(server::run_worker(c.clone(), ServeOptions::default(), stop_rx.clone())));
        let sweep = Duration::from_secs(args.sweep_secs.max(1));
        background.push(tokio::spawn(server::run_sweeper(c.clone(), sweep, stop_rx.clone())));
    }
    let (counts_before, sim_before) = (env.counts.snapshot(), env.sim.sim().stats());

    let writers = if args.per_instance { args.clients * instances } else { args.clients };
    let interval = (rate > 0.0).then(|| Duration::from_secs_f64(writers as f64 / rate));
    let load = Arc::new(Load {
        catalogs,
        next: AtomicUsize::new(0),
        keys: env.keys.clone(),
        updates: args.updates,
        seed: args.seed,
        writers,
        interval,
    });
    let (cpu_before, traffic_before) = (cpu_seconds(), env.probe.traffic());
    let started = table_catalog::cli_support::env::now();
    let deadline = started + Duration::from_secs_f64(args.seconds);
    let clients: Vec<_> = (0..writers).map(|c| tokio::spawn(load.clone().client(c, started, deadline))).collect();
    let mut acks = Vec::new();
    let mut failures: BTreeMap<String, u64> = BTreeMap::new();
    for c in clients {
        let out = c.await?;
        acks.extend(out.acks);
        for (k, n) in out.failures {
            *failures.entry(k).or_default() += n;
        }
    }
    let load_ended = table_catalog::cli_support::env::now();
    let seconds = (load_ended - started).as_secs_f64();
    let cpu_cores = cpu_before.zip(cpu_seconds()).map(|(b, a)| (a - b) / seconds);
    let wal_traffic = wal_traffic(&traffic_since(env.probe.traffic(), &traffic_before), seconds);

    // Drain (bounded): until every acknowledged entry has been removed from pending (for the
    // visibility lag) and every apply hint consumed (so the requests per write include
    // handling the hints). The queue is read on the embedded store directly: not counted.
    let drain_started = table_catalog::cli_support::env::now();
    let drain_deadline = drain_started + Duration::from_secs_f64(args.drain_secs);
    let hints_left = loop {
        if single {
            // Nothing to drain: every acknowledged write was applied by its EGT.
            break 0;
        }
        let changed = env.probe.changed.notified();
        let missing = {
            let removed = env.probe.removed.lock().map_err(|_| anyhow::anyhow!("probe lock poisoned"))?;
            acks.iter().filter(|a| !removed.contains_key(&a.id)).count()
        };
        let hints = env.local.approximate_count(&env.names.queue).await?;
        if (missing == 0 && hints == 0) || table_catalog::cli_support::env::now() >= drain_deadline {
            break hints;
        }
        let _ = tokio::time::timeout(Duration::from_millis(200), changed).await;
    };
    let drain_secs = drain_started.elapsed().as_secs_f64();
    let _ = stop_tx.send(true);
    for task in background {
        let _ = task.await;
    }

    let removed = env.probe.removed.lock().map_err(|_| anyhow::anyhow!("probe lock poisoned"))?;
    let applied_in_load = if single { acks.len() } else { removed.values().filter(|t| **t <= load_ended).count() };
    // Single-partition mode: a write is applied by its EGT before it is acknowledged.
    let mut lag: Vec<Duration> = if single {
        acks.iter().map(|_| Duration::ZERO).collect()
    } else {
        acks.iter().filter_map(|a| removed.get(&a.id).map(|t| t.saturating_duration_since(a.at))).collect()
    };
    let not_applied = acks.len() - lag.len();
    lag.sort();
    let mut ack: Vec<Duration> = acks.iter().map(|a| a.latency).collect();
    ack.sort();
    Ok(RunReport {
        single,
        shards,
        instances,
        rate: (rate > 0.0).then_some(rate),
        writers,
        seconds,
        acked: acks.len(),
        failures,
        ack,
        lag,
        applied_in_load,
        not_applied,
        hints_left,
        drain_secs,
        requests: env.counts.snapshot().since(&counts_before),
        sim: env.sim_since(&sim_before),
        throttled_partitions: env.sim.sim().throttled_by_partition(),
        wal_traffic,
        cpu_cores,
        load_average: load_average(),
    })
}

/// What one apply-throughput run measured.
struct BacklogReport {
    shards: u16,
    appliers: usize,
    entries: usize,
    /// Entries logged per shard.
    per_shard: BTreeMap<ShardId, usize>,
    /// Seconds it took to log the backlog (on the embedded store directly: not simulated).
    log_secs: f64,
    applied: usize,
    /// From starting the workers to the last removal of a pending entry.
    apply_secs: f64,
    requests: RequestSnapshot,
    sim: SimStats,
    throttled_partitions: Vec<(String, String, u64)>,
    /// Entities/s on the WAL table's metadata partition and busiest shard while applying.
    wal_traffic: String,
    cpu_cores: Option<f64>,
    load_average: String,
}

impl BacklogReport {
    fn rate(&self) -> f64 {
        if self.apply_secs > 0.0 {
            self.applied as f64 / self.apply_secs
        } else {
            0.0
        }
    }

    fn per_entry(&self, n: u64) -> f64 {
        if self.applied == 0 {
            0.0
        } else {
            n as f64 / self.applied as f64
        }
    }

    fn json(&self) -> serde_json::Value {
        let by_op: BTreeMap<&str, f64> =
            self.requests.by_op.iter().map(|(op, c)| (op.name(), self.per_entry(c.total))).collect();
        let per_shard: BTreeMap<String, usize> = self.per_shard.iter().map(|(s, n)| (s.partition(), *n)).collect();
        json!({
            "mode": "backlog",
            "shards": self.shards,
            "appliers": self.appliers,
            "entries": self.entries,
            "entries_per_shard": per_shard,
            "log_seconds": self.log_secs,
            "applied": self.applied,
            "apply_seconds": self.apply_secs,
            "applied_per_s": self.rate(),
            "requests_per_entry": self.per_entry(self.requests.total),
            "requests_per_entry_by_op": by_op,
            "requests": self.requests,
            "sim": self.sim,
            "throttled_by_partition": self.throttled_partitions,
            "wal_traffic": self.wal_traffic,
            "cpu_cores": self.cpu_cores,
            "load_average_1m": self.load_average,
        })
    }
}

async fn run_backlog(args: &SimArgs, shards: u16, appliers: usize, entries: usize) -> Result<BacklogReport> {
    let env = Env::new(args, args.seed.wrapping_add(appliers as u64))?;
    // Log the backlog through a catalog on the embedded store directly (not simulated, not
    // counted, not probed): `Wal::append` logs without hinting, and nothing applies.
    let loader =
        Catalog::open(env.local.clone(), env.names.clone(), env.schema.clone(), catalog_options(shards)).await?;
    let log_started = table_catalog::cli_support::env::now();
    let mut latest: BTreeMap<ShardId, WalId> = BTreeMap::new();
    let mut per_shard: BTreeMap<ShardId, usize> = BTreeMap::new();
    let mut i = 0;
    while i < entries {
        let n = (entries - i).min(1000);
        let mut ops = Vec::with_capacity(n);
        for j in i..i + n {
            let op = Op::Upsert { record: record(&env.keys, j % 16, (j / 16) as u64, 0) };
            ops.push((loader.applier().route(&op)?, op));
        }
        let routed: Vec<ShardId> = ops.iter().map(|(s, _)| *s).collect();
        let ids = loader.wal().append(ops).await?;
        for (shard, id) in routed.into_iter().zip(ids) {
            *per_shard.entry(shard).or_default() += 1;
            latest.insert(shard, id);
        }
        i += n;
    }
    let log_secs = log_started.elapsed().as_secs_f64();
    drop(loader);

    // The appliers: instances on the simulated account, each with its queue worker, and one
    // hint per shard on the queue. Each worker receives up to ceil(shards / appliers) messages
    // at a time, so the shards spread over the instances.
    let catalogs = env.open(appliers, shards, false).await?;
    for (shard, id) in &latest {
        let text = messages::encode(&messages::hint_json(&shard.partition(), id.as_str()));
        env.local.put_message(&env.names.queue, &text, Duration::ZERO).await?;
    }
    let opts = ServeOptions {
        worker: WorkerOptions {
            concurrency: Some(latest.len().div_ceil(appliers).clamp(1, 32)),
            ..WorkerOptions::default()
        },
        ..ServeOptions::default()
    };
    let (counts_before, sim_before, cpu_before) = (env.counts.snapshot(), env.sim.sim().stats(), cpu_seconds());
    let traffic_before = env.probe.traffic();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let started = table_catalog::cli_support::env::now();
    let workers: Vec<_> =
        catalogs.iter().map(|c| tokio::spawn(server::run_worker(c.clone(), opts.clone(), stop_rx.clone()))).collect();
    let deadline = started + Duration::from_secs_f64(args.drain_secs);
    loop {
        let changed = env.probe.changed.notified();
        if env.removed_count()? >= entries || table_catalog::cli_support::env::now() >= deadline {
            break;
        }
        let _ = tokio::time::timeout(Duration::from_millis(200), changed).await;
    }
    let wall = started.elapsed().as_secs_f64();
    let cpu_cores = cpu_before.zip(cpu_seconds()).map(|(b, a)| (a - b) / wall);
    let (requests, sim) = (env.counts.snapshot().since(&counts_before), env.sim_since(&sim_before));
    let _ = stop_tx.send(true);
    for w in workers {
        let _ = w.await;
    }
    let removed = env.probe.removed.lock().map_err(|_| anyhow::anyhow!("probe lock poisoned"))?;
    let last = removed.values().max().copied().unwrap_or(started);
    let apply_secs = last.saturating_duration_since(started).as_secs_f64();
    Ok(BacklogReport {
        shards,
        appliers,
        entries,
        per_shard,
        log_secs,
        applied: removed.len(),
        apply_secs,
        requests,
        sim,
        throttled_partitions: env.sim.sim().throttled_by_partition(),
        wal_traffic: wal_traffic(&traffic_since(env.probe.traffic(), &traffic_before), apply_secs),
        cpu_cores,
        load_average: load_average(),
    })
}

fn header(args: &SimArgs) -> String {
    format!(
        "Simulated Azure: point ops median {} ms / p99 {} ms, query pages {} / {} ms, {} entities/s per partition, \
         {} transactions/s per account; {} indexed identifiers per record; seed {}; one in-memory embedded store.",
        args.point_median_ms,
        args.point_p99_ms,
        args.query_median_ms,
        args.query_p99_ms,
        args.partition_rate,
        args.account_rate,
        args.indexes,
        args.seed
    )
}

fn cores(c: Option<f64>) -> String {
    c.map_or("?".into(), |c| format!("{c:.2}"))
}

fn markdown(args: &SimArgs, runs: &[RunReport]) -> String {
    let mut s = String::new();
    let f1 = |x: f64| format!("{x:.1}");
    s.push_str(&format!(
        "{} {} clients{}, {} s of load per run, {:.0}% updates.\n\n",
        header(args),
        args.clients,
        if args.per_instance { " per instance" } else { "" },
        args.seconds,
        args.updates * 100.0,
    ));
    s.push_str("| shards | instances | offered writes/s | acked writes/s | applied entries/s during load | failed writes | ack p50 / p99 ms | visibility lag p50 / p99 ms | not applied after drain | drain s | storage requests / write (table + queue) | 503s from the simulator (gave up) | CPU cores busy (load avg 1 min after) |\n");
    s.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in runs {
        s.push_str(&format!(
            "| {} | {} | {} | **{:.0}** | {:.0} | {} | {} / {} | {} / {} | {} | {:.1} | **{:.2}** ({:.2} + {:.2}) | {} ({}) | {} ({}) |\n",
            r.shards_cell(),
            r.instances,
            r.rate.map_or("unpaced".into(), |x| format!("{x:.0}")),
            r.acked as f64 / r.seconds,
            r.applied_in_load as f64 / r.seconds,
            r.failures.values().sum::<u64>(),
            f1(percentile(&r.ack, 0.5)),
            f1(percentile(&r.ack, 0.99)),
            f1(percentile(&r.lag, 0.5)),
            f1(percentile(&r.lag, 0.99)),
            r.not_applied,
            r.drain_secs,
            r.per_write(r.requests.total),
            r.per_write(r.requests.table),
            r.per_write(r.requests.queue),
            r.sim.throttled_partition + r.sim.throttled_account + r.sim.throttled_queue,
            r.sim.gave_up,
            cores(r.cpu_cores),
            r.load_average,
        ));
    }
    s.push_str("\nStorage requests per acknowledged write, by operation (a batch is one request):\n\n");
    push_ops_table(&mut s, runs, |r| r.label(args.rate.len()), |r| &r.requests, |r, n| r.per_write(n));
    s.push_str("| entities in batches |");
    for r in runs {
        s.push_str(&format!(" {:.3} |", r.per_write(r.requests.batch_entities)));
    }
    s.push('\n');
    s.push_str("\nWAL table traffic during the load (entities/s as the simulator charges them, first attempts; the partition target is 2,000):\n\n");
    for r in runs {
        s.push_str(&format!("- {}: {}\n", r.label(args.rate.len()), r.wal_traffic));
    }
    let throttled: Vec<&RunReport> = runs.iter().filter(|r| !r.throttled_partitions.is_empty()).collect();
    if !throttled.is_empty() {
        s.push_str("\n503s by partition (table/partition count, most first):\n\n");
        for r in throttled {
            s.push_str(&format!("- {}: {}\n", r.label(args.rate.len()), busiest(&r.throttled_partitions, 4)));
        }
    }
    for r in runs.iter().filter(|r| r.hints_left > 0) {
        s.push_str(&format!(
            "\n{}: the drain timed out with {} apply hints queued; their handling is not counted.\n",
            r.label(args.rate.len()),
            r.hints_left
        ));
    }
    for r in runs.iter().filter(|r| !r.failures.is_empty()) {
        s.push_str(&format!("\n{} failures: {:?}\n", r.label(args.rate.len()), r.failures));
    }
    s
}

fn markdown_backlog(args: &SimArgs, runs: &[BacklogReport]) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "{} Apply throughput: a backlog of {} upserts logged without applying, then the queue workers of N \
         instances started with one hint per shard on the queue.\n\n",
        header(args),
        args.backlog.unwrap_or_default()
    ));
    // Ratios against the first one-shard run (or the first run).
    let base = runs.iter().find(|r| r.shards == 1).or(runs.first()).map(|r| (r.rate(), r.shards, r.appliers));
    let base_label = base.map_or(String::new(), |(_, s, n)| format!("S={s} N={n}"));
    s.push_str(&format!(
        "| shards | instances (appliers) | entries applied | apply s | **applied entries/s** | × {base_label} | storage requests / entry | 503s from the simulator (gave up) | busiest partitions by 503s | CPU cores busy (load avg 1 min after) |\n"
    ));
    s.push_str("|---|---|---|---|---|---|---|---|---|---|\n");
    for r in runs {
        let ratio =
            base.map_or("".into(), |(b, _, _)| if b > 0.0 { format!("{:.2}", r.rate() / b) } else { "?".into() });
        s.push_str(&format!(
            "| {} | {} | {} of {} | {:.1} | **{:.0}** | {} | {:.2} | {} ({}) | {} | {} ({}) |\n",
            r.shards,
            r.appliers,
            r.applied,
            r.entries,
            r.apply_secs,
            r.rate(),
            ratio,
            r.per_entry(r.requests.total),
            r.sim.throttled_partition + r.sim.throttled_account + r.sim.throttled_queue,
            r.sim.gave_up,
            busiest(&r.throttled_partitions, 2),
            cores(r.cpu_cores),
            r.load_average,
        ));
    }
    s.push_str("\nStorage requests per applied entry, by operation (a batch is one request):\n\n");
    push_ops_table(
        &mut s,
        runs,
        |r| format!("S={} N={}", r.shards, r.appliers),
        |r| &r.requests,
        |r, n| r.per_entry(n),
    );
    s.push_str("\nWAL table traffic while applying (entities/s as the simulator charges them, first attempts):\n\n");
    for r in runs {
        s.push_str(&format!("- S={} N={}: {}\n", r.shards, r.appliers, r.wal_traffic));
    }
    for r in runs.iter().filter(|r| r.applied < r.entries) {
        s.push_str(&format!(
            "\nS={} N={}: stopped at --drain-secs with {} of {} entries applied.\n",
            r.shards, r.appliers, r.applied, r.entries
        ));
    }
    s
}

pub async fn run(args: SimArgs) -> Result<()> {
    args.validate()?;
    if let Some(entries) = args.backlog {
        let mut runs = Vec::new();
        for shards in args.shard_counts() {
            for &n in &args.instances {
                eprintln!("bench sim: backlog of {entries}, {shards} shard(s), {n} applier instance(s)");
                let report = run_backlog(&args, shards, n, entries).await?;
                eprintln!(
                    "bench sim: {shards} shard(s), {n} applier(s): logged in {:.1} s, {} applied in {:.1} s ({:.0}/s)",
                    report.log_secs,
                    report.applied,
                    report.apply_secs,
                    report.rate()
                );
                if args.json {
                    println!("{}", report.json());
                }
                runs.push(report);
            }
        }
        println!("{}", markdown_backlog(&args, &runs));
        return Ok(());
    }
    let mut runs = Vec::new();
    for shards in args.shard_counts() {
        for &n in &args.instances {
            for &rate in &args.rate {
                eprintln!(
                    "bench sim: {shards} shard(s), {n} instance(s), {} clients{}, rate {}, {} s, seed {} (latency seed {})",
                    args.clients,
                    if args.per_instance { " per instance" } else { "" },
                    if rate > 0.0 { format!("{rate}/s") } else { "unpaced".into() },
                    args.seconds,
                    args.seed,
                    args.seed.wrapping_add(n as u64)
                );
                let report = run_one(&args, shards, n, rate).await?;
                eprintln!(
                    "bench sim: {shards} shard(s), {n} instance(s): {} acked ({:.0}/s), lag p99 {:.0} ms, drained in {:.1} s, {} not applied, {} hints left",
                    report.acked,
                    report.acked as f64 / report.seconds,
                    percentile(&report.lag, 0.99),
                    report.drain_secs,
                    report.not_applied,
                    report.hints_left
                );
                if args.json {
                    println!("{}", report.json());
                }
                runs.push(report);
            }
        }
    }
    println!("{}", markdown(&args, &runs));
    Ok(())
}

/// Appends a Markdown table of storage requests by operation: one column per run (headed by
/// `label`), one row per operation any run made, each cell `per(run, count)`. The table ends
/// with a newline and no blank line, so callers may add rows.
fn push_ops_table<R>(
    s: &mut String,
    runs: &[R],
    label: impl Fn(&R) -> String,
    requests: impl Fn(&R) -> &RequestSnapshot,
    per: impl Fn(&R, u64) -> f64,
) {
    let ops: std::collections::BTreeSet<OpKind> = runs.iter().flat_map(|r| requests(r).by_op.keys().copied()).collect();
    s.push_str("| operation |");
    for r in runs {
        s.push_str(&format!(" {} |", label(r)));
    }
    s.push_str("\n|---|");
    s.push_str(&"---|".repeat(runs.len()));
    s.push('\n');
    for op in ops {
        s.push_str(&format!("| {} |", op.name()));
        for r in runs {
            s.push_str(&format!(" {:.3} |", per(r, requests(r).op(op))));
        }
        s.push('\n');
    }
}
