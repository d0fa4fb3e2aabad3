//! `bench sim`: scale-out on a simulated Azure account, in one process.
//!
//! One in-memory embedded store ([`LocalStore::in_memory`]) behind a [`SimAzureStore`]
//! (lognormal latency, 503 ServerBusy at the per-partition and per-account targets, retried
//! like the Azure backend), behind a [`CountingStore`]. N [`Catalog`]s are opened on it, each
//! with its own `Catalog::open`, queue worker and sweeper, as N Functions instances would be.
//! C clients issue single-record upserts (`Catalog::upsert(record, false)`) round-robin over the
//! instances for S seconds; then the backlog drains (bounded), so the visibility lag covers
//! every acknowledged write.
//!
//! Visibility lag = from a write's acknowledgement to the removal of its WAL entry from the
//! pending partition, which the applier does right after writing the entry's index rows. A
//! probe layer observes those removals (the batch deletes of partition `wal` of the WAL table)
//! as they succeed, so measuring costs no storage request.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Args;
use rand::{Rng, SeedableRng};
use serde_json::json;
use table_catalog::catalog::{Catalog, CatalogOptions};
use table_catalog::config::Names;
use table_catalog::schema::Schema;
use table_catalog::server::{self, ServeOptions};
use table_catalog::store::counting::{CountingStore, RequestSnapshot};
use table_catalog::store::layer::{Call, Layer, LayeredStore, Returned};
use table_catalog::store::local::LocalStore;
use table_catalog::store::sim::{self as simulated, LogNormal, SimAzureStore, SimOptions, SimStats};
use table_catalog::store::{BatchOp, OpKind, Store, StoreResult};
use table_catalog::wal::{ShardId, PENDING_BEFORE};

use super::percentile;

/// Scale-out on a simulated Azure account.
#[derive(Debug, Args)]
pub struct SimArgs {
    /// Catalog instances (stand-ins for Functions instances); several values, comma-separated,
    /// make one run each (e.g. 1,2,4,8).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    instances: Vec<usize>,
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
}

impl SimArgs {
    fn validate(&self) -> Result<()> {
        if self.instances.is_empty() || self.instances.iter().any(|n| !(1..=64).contains(n)) {
            bail!("--instances: each value must be 1..=64 (got {:?})", self.instances);
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

/// Observes successful removals of pending WAL entries and when they happened.
struct Probe {
    wal_table: String,
    removed: Mutex<HashMap<String, Instant>>,
    changed: tokio::sync::Notify,
}

impl Probe {
    fn note<'a>(&self, row_keys: impl Iterator<Item = &'a str>) {
        let now = Instant::now();
        if let Ok(mut removed) = self.removed.lock() {
            for rk in row_keys.filter(|rk| *rk < PENDING_BEFORE) {
                removed.entry(rk.to_string()).or_insert(now);
            }
        }
        self.changed.notify_waiters();
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
        if result.is_ok() && call.target == self.wal_table && call.partition_key.and_then(ShardId::from_partition).is_some() {
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
}

impl Load {
    /// Record `ident` of `client`, version `version`: same `ident`, same identity.
    fn record(&self, client: usize, ident: u64, version: u64) -> table_catalog::record::Record {
        let mut r = serde_json::Map::new();
        for (j, k) in self.keys.iter().enumerate() {
            r.insert(k.clone(), json!(format!("c{client}n{ident}k{j}")));
        }
        r.insert("name".into(), json!(format!("Sim field {client} {ident}")));
        r.insert("version".into(), json!(version));
        r.insert("city".into(), json!("Simville"));
        r
    }

    async fn client(self: Arc<Self>, client: usize, deadline: Instant) -> ClientOutcome {
        let mut rng = rand::rngs::StdRng::seed_from_u64(self.seed.wrapping_mul(1_000_003).wrapping_add(client as u64));
        let mut out = ClientOutcome::default();
        let mut written: Vec<u64> = Vec::new();
        let mut seq = 0u64;
        while Instant::now() < deadline {
            let update = !written.is_empty() && rng.gen_bool(self.updates);
            let ident = if update { written[rng.gen_range(0..written.len())] } else { seq };
            let record = self.record(client, ident, seq);
            let catalog = &self.catalogs[self.next.fetch_add(1, Ordering::Relaxed) % self.catalogs.len()];
            let started = Instant::now();
            match catalog.upsert(record, false).await {
                Ok(w) => {
                    out.acks.push(Ack { id: w.id, at: Instant::now(), latency: started.elapsed() });
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

/// What one run measured.
struct RunReport {
    instances: usize,
    seconds: f64,
    acked: usize,
    failures: BTreeMap<String, u64>,
    ack: Vec<Duration>,
    lag: Vec<Duration>,
    not_applied: usize,
    /// Apply hints still queued when the drain ended (0 unless it timed out).
    hints_left: u64,
    drain_secs: f64,
    requests: RequestSnapshot,
    sim: SimStats,
}

impl RunReport {
    fn per_write(&self, n: u64) -> f64 {
        if self.acked == 0 {
            0.0
        } else {
            n as f64 / self.acked as f64
        }
    }

    fn json(&self) -> serde_json::Value {
        let by_op: BTreeMap<&str, f64> =
            self.requests.by_op.iter().map(|(op, c)| (op.name(), self.per_write(c.total))).collect();
        json!({
            "instances": self.instances,
            "seconds": self.seconds,
            "acked": self.acked,
            "failed": self.failures.values().sum::<u64>(),
            "failures": self.failures,
            "writes_per_s": self.acked as f64 / self.seconds,
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
        })
    }
}

async fn run_one(args: &SimArgs, instances: usize) -> Result<RunReport> {
    let names = Names::new("simbench", None, None)?;
    let keys: Vec<String> = (0..args.indexes).map(|j| format!("id{j}")).collect();
    let schema = Schema::new(keys.clone(), "name")?;
    let local: Arc<dyn Store> = Arc::new(LocalStore::in_memory()?);
    let sim = Arc::new(SimAzureStore::new(local.clone(), args.sim_options(args.seed.wrapping_add(instances as u64))));
    let probe = Arc::new(Probe {
        wal_table: names.wal_table.clone(),
        removed: Mutex::new(HashMap::new()),
        changed: tokio::sync::Notify::new(),
    });
    let probed: Arc<dyn Store> = Arc::new(LayeredStore::with_layer(sim.clone() as Arc<dyn Store>, probe.clone()));
    let counting = CountingStore::new(probed);
    let counts = counting.counts().clone();
    let store: Arc<dyn Store> = Arc::new(counting);

    let mut catalogs = Vec::with_capacity(instances);
    for _ in 0..instances {
        let c = Catalog::open(store.clone(), names.clone(), schema.clone(), CatalogOptions::default()).await?;
        catalogs.push(Arc::new(c));
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut background = Vec::new();
    for c in &catalogs {
        background.push(tokio::spawn(server::run_worker(c.clone(), ServeOptions::default(), stop_rx.clone())));
        let sweep = Duration::from_secs(args.sweep_secs.max(1));
        background.push(tokio::spawn(server::run_sweeper(c.clone(), sweep, stop_rx.clone())));
    }
    let (counts_before, sim_before) = (counts.snapshot(), sim.sim().stats());

    let load = Arc::new(Load { catalogs, next: AtomicUsize::new(0), keys, updates: args.updates, seed: args.seed });
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(args.seconds);
    let writers = if args.per_instance { args.clients * instances } else { args.clients };
    let clients: Vec<_> = (0..writers).map(|c| tokio::spawn(load.clone().client(c, deadline))).collect();
    let mut acks = Vec::new();
    let mut failures: BTreeMap<String, u64> = BTreeMap::new();
    for c in clients {
        let out = c.await?;
        acks.extend(out.acks);
        for (k, n) in out.failures {
            *failures.entry(k).or_default() += n;
        }
    }
    let seconds = started.elapsed().as_secs_f64();

    // Drain (bounded): until every acknowledged entry has been removed from pending (for the
    // visibility lag) and every apply hint consumed (so the requests per write include
    // handling the hints). The queue is read on the embedded store directly: not counted.
    let drain_started = Instant::now();
    let drain_deadline = drain_started + Duration::from_secs_f64(args.drain_secs);
    let hints_left = loop {
        let changed = probe.changed.notified();
        let missing = {
            let removed = probe.removed.lock().map_err(|_| anyhow::anyhow!("probe lock poisoned"))?;
            acks.iter().filter(|a| !removed.contains_key(&a.id)).count()
        };
        let hints = local.approximate_count(&names.queue).await?;
        if (missing == 0 && hints == 0) || Instant::now() >= drain_deadline {
            break hints;
        }
        let _ = tokio::time::timeout(Duration::from_millis(200), changed).await;
    };
    let drain_secs = drain_started.elapsed().as_secs_f64();
    let _ = stop_tx.send(true);
    for task in background {
        let _ = task.await;
    }

    let removed = probe.removed.lock().map_err(|_| anyhow::anyhow!("probe lock poisoned"))?;
    let mut lag: Vec<Duration> =
        acks.iter().filter_map(|a| removed.get(&a.id).map(|t| t.saturating_duration_since(a.at))).collect();
    let not_applied = acks.len() - lag.len();
    lag.sort();
    let mut ack: Vec<Duration> = acks.iter().map(|a| a.latency).collect();
    ack.sort();
    let sim_after = sim.sim().stats();
    Ok(RunReport {
        instances,
        seconds,
        acked: acks.len(),
        failures,
        ack,
        lag,
        not_applied,
        hints_left,
        drain_secs,
        requests: counts.snapshot().since(&counts_before),
        sim: SimStats {
            requests: sim_after.requests - sim_before.requests,
            throttled_partition: sim_after.throttled_partition - sim_before.throttled_partition,
            throttled_account: sim_after.throttled_account - sim_before.throttled_account,
            throttled_queue: sim_after.throttled_queue - sim_before.throttled_queue,
            gave_up: sim_after.gave_up - sim_before.gave_up,
        },
    })
}

fn markdown(args: &SimArgs, runs: &[RunReport]) -> String {
    let mut s = String::new();
    let f1 = |x: f64| format!("{x:.1}");
    s.push_str(&format!(
        "Simulated Azure: point ops median {} ms / p99 {} ms, query pages {} / {} ms, {} entities/s per partition, \
         {} transactions/s per account; {} clients{}, {} s of load per run, {} indexed identifiers per record, \
         {:.0}% updates, seed {}; one in-memory embedded store.\n\n",
        args.point_median_ms,
        args.point_p99_ms,
        args.query_median_ms,
        args.query_p99_ms,
        args.partition_rate,
        args.account_rate,
        args.clients,
        if args.per_instance { " per instance" } else { "" },
        args.seconds,
        args.indexes,
        args.updates * 100.0,
        args.seed
    ));
    s.push_str("| instances | acked writes/s | failed writes | ack p50 / p99 ms | visibility lag p50 / p99 ms | not applied after drain | drain s | storage requests / write (table + queue) | 503s from the simulator (gave up) |\n");
    s.push_str("|---|---|---|---|---|---|---|---|---|\n");
    for r in runs {
        s.push_str(&format!(
            "| {} | **{:.0}** | {} | {} / {} | {} / {} | {} | {:.1} | **{:.2}** ({:.2} + {:.2}) | {} ({}) |\n",
            r.instances,
            r.acked as f64 / r.seconds,
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
        ));
    }
    let ops: std::collections::BTreeSet<OpKind> = runs.iter().flat_map(|r| r.requests.by_op.keys().copied()).collect();
    s.push_str("\nStorage requests per acknowledged write, by operation (a batch is one request):\n\n| operation |");
    for r in runs {
        s.push_str(&format!(" N={} |", r.instances));
    }
    s.push_str("\n|---|");
    s.push_str(&"---|".repeat(runs.len()));
    s.push('\n');
    for op in ops {
        s.push_str(&format!("| {} |", op.name()));
        for r in runs {
            s.push_str(&format!(" {:.3} |", r.per_write(r.requests.op(op))));
        }
        s.push('\n');
    }
    s.push_str("| entities in batches |");
    for r in runs {
        s.push_str(&format!(" {:.3} |", r.per_write(r.requests.batch_entities)));
    }
    s.push('\n');
    for r in runs.iter().filter(|r| r.hints_left > 0) {
        s.push_str(&format!(
            "\nN={}: the drain timed out with {} apply hints queued; their handling is not counted.\n",
            r.instances, r.hints_left
        ));
    }
    for r in runs.iter().filter(|r| !r.failures.is_empty()) {
        s.push_str(&format!("\nN={} failures: {:?}\n", r.instances, r.failures));
    }
    s
}

pub async fn run(args: SimArgs) -> Result<()> {
    args.validate()?;
    let mut runs = Vec::new();
    for &n in &args.instances {
        eprintln!(
            "bench sim: {n} instance(s), {} clients, {} s, seed {} (latency seed {})",
            args.clients,
            args.seconds,
            args.seed,
            args.seed.wrapping_add(n as u64)
        );
        let report = run_one(&args, n).await?;
        eprintln!(
            "bench sim: {n} instance(s): {} acked ({:.0}/s), drained in {:.1} s, {} not applied, {} hints left",
            report.acked,
            report.acked as f64 / report.seconds,
            report.drain_secs,
            report.not_applied,
            report.hints_left
        );
        if args.json {
            println!("{}", report.json());
        }
        runs.push(report);
    }
    println!("{}", markdown(&args, &runs));
    Ok(())
}
