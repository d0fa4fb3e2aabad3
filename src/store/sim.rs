//! A simulated Azure Storage account in front of any store (the embedded one, in the
//! benchmarks): per-request latency drawn from a lognormal distribution, and the documented
//! scalability targets enforced with token buckets, answering `503 ServerBusy` when a target
//! is exceeded, as the service does. Retries of those 503s follow the Azure backend's own
//! [`RetryPolicy`], so the engine above sees what it would see on Azure through
//! [`super::azure::AzureStore`]. Always compiled, so `table-catalog bench sim` works in a
//! release build; no cost unless used.
//!
//! Figures (see docs/BENCHMARKS.md, "Simulated Azure", for the full list and sources):
//! - one table partition: up to **2,000 entities/s**, one storage account: **20,000
//!   transactions/s** (1 KiB entities), one queue: **2,000 messages/s**; beyond them the
//!   service answers 503 ServerBusy (learn.microsoft.com/azure/storage/tables/scalability-targets,
//!   learn.microsoft.com/azure/storage/queues/scalability-targets);
//! - latency in the same region: Microsoft publishes no percentiles. Table point reads from
//!   inside Azure take "under 10 ms" (third-party measurement, vunvulearadu.blogspot.com,
//!   2016) and queries about 30 ms on average (Azure/durabletask#654). The defaults,
//!   point operations median 5 ms / p99 50 ms and queries median 30 ms / p99 150 ms, are our
//!   reading of those figures, not a measurement.
//!
//! What is charged: a point operation costs 1 entity on its partition; an entity group
//! transaction costs its operation count on its partition; a query costs 1 entity before it
//! runs and the rest of what it returned afterwards (the bucket may go into debt, which
//! throttles the following requests); every Table request costs 1 transaction on the account;
//! every Queue request costs 1 message on its queue and 1 on the account's Queue budget.
//! Each bucket holds at most `burst` worth of its rate (default 100 ms), so a partition
//! accepts at most 200 entities at once. These pricing rules are a model, not Azure's
//! documented algorithm.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::env::Instant;

use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::azure::RetryPolicy;
use super::error::{StoreError, StoreResult};
use super::layer::{Call, Layer, LayeredStore, Returned};
use super::op::OpKind;
use super::queue::Store;

/// Entities per second one table partition serves (Azure scalability target).
pub const PARTITION_ENTITIES_PER_S: f64 = 2_000.0;
/// Transactions per second one storage account serves for the Table service (Azure target).
pub const ACCOUNT_TRANSACTIONS_PER_S: f64 = 20_000.0;
/// Messages per second one queue serves (Azure target).
pub const QUEUE_MESSAGES_PER_S: f64 = 2_000.0;
/// Messages per second one storage account serves for the Queue service (Azure target).
pub const ACCOUNT_MESSAGES_PER_S: f64 = 20_000.0;

/// The 99th percentile of the standard normal distribution.
const Z99: f64 = 2.326_347_874_040_841;

/// A lognormal latency distribution given by its median and 99th percentile.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogNormal {
    mu: f64,
    sigma: f64,
}

impl LogNormal {
    /// The distribution with this median and p99. A p99 below the median is taken as equal
    /// to it (no spread).
    pub fn from_median_p99(median: Duration, p99: Duration) -> LogNormal {
        let m = median.as_secs_f64().max(1e-9);
        let p = p99.as_secs_f64().max(m);
        LogNormal { mu: m.ln(), sigma: (p / m).ln() / Z99 }
    }

    /// One draw.
    pub fn sample(&self, rng: &mut impl Rng) -> Duration {
        // Box-Muller: u1 in (0, 1] keeps ln finite.
        let u1: f64 = 1.0 - rng.gen::<f64>();
        let u2: f64 = rng.gen::<f64>();
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        Duration::from_secs_f64((self.mu + self.sigma * z).exp().min(3600.0))
    }
}

/// A token bucket: `rate` tokens per second, holding at most `capacity`. Time is passed in,
/// so it is deterministic under test.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: f64,
    capacity: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket at `now`.
    pub fn new(rate_per_s: f64, capacity: f64, now: Instant) -> TokenBucket {
        TokenBucket { rate: rate_per_s, capacity, tokens: capacity, last: now }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.capacity);
        self.last = self.last.max(now);
    }

    /// Takes `n` tokens if the bucket holds them at `now`; otherwise takes nothing and
    /// returns false. A request larger than the capacity is admitted when the bucket is full
    /// (and drives it into debt), so it is never refused for ever.
    pub fn try_take(&mut self, n: f64, now: Instant) -> bool {
        self.refill(now);
        if self.tokens >= n.min(self.capacity) {
            self.tokens -= n;
            true
        } else {
            false
        }
    }

    /// Takes `n` tokens unconditionally (the bucket may go negative: later requests wait the
    /// debt off).
    pub fn charge(&mut self, n: f64, now: Instant) {
        self.refill(now);
        self.tokens -= n;
    }

    /// Tokens held at `now`.
    pub fn tokens(&mut self, now: Instant) -> f64 {
        self.refill(now);
        self.tokens
    }

    fn is_full(&mut self, now: Instant) -> bool {
        self.tokens(now) >= self.capacity
    }
}

/// Settings of the simulated account. `Default` gives the cited Azure figures.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// Latency of point operations, batches and queue operations.
    pub point_latency: LogNormal,
    /// Latency of one query page (partition query, scan, count).
    pub query_latency: LogNormal,
    /// Entities per second per table partition.
    pub partition_entities_per_s: f64,
    /// Table transactions per second per account.
    pub account_transactions_per_s: f64,
    /// Messages per second per queue.
    pub queue_messages_per_s: f64,
    /// Queue messages per second per account.
    pub account_messages_per_s: f64,
    /// How much of its rate a bucket can hold (burst allowance).
    pub burst: Duration,
    /// How 503s are retried before the caller sees one (`None`: not at all). Default: the
    /// Azure backend's [`RetryPolicy::default`].
    pub retry: Option<RetryPolicy>,
    /// Seed of the latency draws.
    pub seed: u64,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            point_latency: LogNormal::from_median_p99(Duration::from_millis(5), Duration::from_millis(50)),
            query_latency: LogNormal::from_median_p99(Duration::from_millis(30), Duration::from_millis(150)),
            partition_entities_per_s: PARTITION_ENTITIES_PER_S,
            account_transactions_per_s: ACCOUNT_TRANSACTIONS_PER_S,
            queue_messages_per_s: QUEUE_MESSAGES_PER_S,
            account_messages_per_s: ACCOUNT_MESSAGES_PER_S,
            burst: Duration::from_millis(100),
            retry: Some(RetryPolicy::default()),
            seed: 1,
        }
    }
}

/// What the simulated service did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SimStats {
    /// Requests that reached the simulated service (retries included).
    pub requests: u64,
    /// 503s for a table partition over its entity rate.
    pub throttled_partition: u64,
    /// 503s for the account over its Table transaction rate.
    pub throttled_account: u64,
    /// 503s for a queue (or the account's Queue budget) over its message rate.
    pub throttled_queue: u64,
    /// Calls whose last retry was still throttled, so the caller saw a 503.
    pub gave_up: u64,
}

struct Buckets {
    partitions: HashMap<(String, String), TokenBucket>,
    queues: HashMap<String, TokenBucket>,
    account_table: TokenBucket,
    account_queue: TokenBucket,
    calls_since_prune: u32,
}

/// Which limit refused a request.
enum Busy {
    Partition,
    Account,
    Queue,
}

/// The layer behind [`SimAzureStore`].
pub struct SimAzure {
    opts: SimOptions,
    rng: Mutex<rand::rngs::StdRng>,
    buckets: Mutex<Buckets>,
    requests: AtomicU64,
    throttled: [AtomicU64; 3],
    /// 503s for a partition over its entity rate, by (table, partition).
    throttled_by_partition: Mutex<HashMap<(String, String), u64>>,
    gave_up: AtomicU64,
}

impl std::fmt::Debug for SimAzure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimAzure").field("opts", &self.opts).finish()
    }
}

impl SimAzure {
    /// A simulated account with these settings.
    pub fn new(opts: SimOptions) -> SimAzure {
        let now = crate::env::now();
        let burst = opts.burst.as_secs_f64();
        let buckets = Buckets {
            partitions: HashMap::new(),
            queues: HashMap::new(),
            account_table: TokenBucket::new(
                opts.account_transactions_per_s,
                opts.account_transactions_per_s * burst,
                now,
            ),
            account_queue: TokenBucket::new(opts.account_messages_per_s, opts.account_messages_per_s * burst, now),
            calls_since_prune: 0,
        };
        SimAzure {
            rng: Mutex::new(rand::rngs::StdRng::seed_from_u64(opts.seed)),
            opts,
            buckets: Mutex::new(buckets),
            requests: AtomicU64::new(0),
            throttled: Default::default(),
            throttled_by_partition: Mutex::new(HashMap::new()),
            gave_up: AtomicU64::new(0),
        }
    }

    /// The settings.
    pub fn options(&self) -> &SimOptions {
        &self.opts
    }

    /// Counts so far.
    pub fn stats(&self) -> SimStats {
        let t = |i: usize| self.throttled[i].load(Ordering::Relaxed);
        SimStats {
            requests: self.requests.load(Ordering::Relaxed),
            throttled_partition: t(0),
            throttled_account: t(1),
            throttled_queue: t(2),
            gave_up: self.gave_up.load(Ordering::Relaxed),
        }
    }

    /// 503s for a partition over its entity rate so far, by (table, partition), most first.
    pub fn throttled_by_partition(&self) -> Vec<(String, String, u64)> {
        let Ok(map) = self.throttled_by_partition.lock() else { return Vec::new() };
        let mut out: Vec<(String, String, u64)> = map.iter().map(|((t, p), n)| (t.clone(), p.clone(), *n)).collect();
        out.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| (&a.0, &a.1).cmp(&(&b.0, &b.1))));
        out
    }

    fn latency(&self, op: OpKind) -> Duration {
        let dist = match op {
            OpKind::Query | OpKind::Scan | OpKind::QueryPartitions => &self.opts.query_latency,
            _ => &self.opts.point_latency,
        };
        match self.rng.lock() {
            Ok(mut rng) => dist.sample(&mut *rng),
            Err(_) => Duration::ZERO,
        }
    }

    /// Admits the request or names the limit it is over.
    fn admit(&self, call: &Call<'_>, now: Instant) -> Result<(), Busy> {
        let Ok(mut b) = self.buckets.lock() else { return Ok(()) };
        let burst = self.opts.burst.as_secs_f64();
        b.prune(now);
        if call.op.is_queue() {
            let rate = self.opts.queue_messages_per_s;
            let queue =
                b.queues.entry(call.target.to_string()).or_insert_with(|| TokenBucket::new(rate, rate * burst, now));
            if !queue.try_take(1.0, now) {
                return Err(Busy::Queue);
            }
            return if b.account_queue.try_take(1.0, now) { Ok(()) } else { Err(Busy::Queue) };
        }
        if !b.account_table.try_take(1.0, now) {
            return Err(Busy::Account);
        }
        let (Some(pk), cost) = (call.partition_key, call.entities().max(1)) else { return Ok(()) };
        let rate = self.opts.partition_entities_per_s;
        let bucket = b
            .partitions
            .entry((call.target.to_string(), pk.to_string()))
            .or_insert_with(|| TokenBucket::new(rate, rate * burst, now));
        if bucket.try_take(cost as f64, now) {
            Ok(())
        } else {
            Err(Busy::Partition)
        }
    }

    /// Charges what a query read beyond the one entity it was admitted for.
    fn charge_read(&self, call: &Call<'_>, returned: usize) {
        let (OpKind::Query, Some(pk)) = (call.op, call.partition_key) else { return };
        if returned <= 1 {
            return;
        }
        let now = crate::env::now();
        if let Ok(mut b) = self.buckets.lock() {
            if let Some(bucket) = b.partitions.get_mut(&(call.target.to_string(), pk.to_string())) {
                bucket.charge((returned - 1) as f64, now);
            }
        }
    }

    async fn attempt_once<T, Fut>(&self, call: Call<'_>, request: Fut) -> StoreResult<T>
    where
        T: Returned,
        Fut: Future<Output = StoreResult<T>>,
    {
        crate::env::sleep(self.latency(call.op)).await;
        self.requests.fetch_add(1, Ordering::Relaxed);
        if let Err(busy) = self.admit(&call, crate::env::now()) {
            if let (Busy::Partition, Some(pk), Ok(mut map)) =
                (&busy, call.partition_key, self.throttled_by_partition.lock())
            {
                *map.entry((call.target.to_string(), pk.to_string())).or_default() += 1;
            }
            let (i, what) = match busy {
                Busy::Partition => (
                    0,
                    format!(
                        "partition '{}' of table '{}' is over {} entities/s",
                        call.partition_key.unwrap_or_default(),
                        call.target,
                        self.opts.partition_entities_per_s
                    ),
                ),
                Busy::Account => {
                    (1, format!("the account is over {} Table transactions/s", self.opts.account_transactions_per_s))
                }
                Busy::Queue => (
                    2,
                    format!(
                        "queue '{}' is over {} messages/s (or the account over {})",
                        call.target, self.opts.queue_messages_per_s, self.opts.account_messages_per_s
                    ),
                ),
            };
            self.throttled[i].fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::Unavailable(format!("503 ServerBusy (simulated Azure): {what}")));
        }
        let result = request.await;
        if let Ok(v) = &result {
            self.charge_read(&call, v.returned());
        }
        result
    }
}

impl Buckets {
    /// Drops full buckets now and then: a full bucket behaves like an absent one, and the
    /// catalog touches a new partition with nearly every new identifier.
    fn prune(&mut self, now: Instant) {
        self.calls_since_prune += 1;
        if self.calls_since_prune < 4096 {
            return;
        }
        self.calls_since_prune = 0;
        self.partitions.retain(|_, b| !b.is_full(now));
        self.queues.retain(|_, b| !b.is_full(now));
    }
}

impl Layer for SimAzure {
    async fn run<'a, T, F, Fut>(&'a self, call: Call<'a>, mut attempt: F) -> StoreResult<T>
    where
        T: Returned + Send + 'a,
        F: FnMut() -> Fut + Send + 'a,
        Fut: Future<Output = StoreResult<T>> + Send + 'a,
    {
        let Some(policy) = &self.opts.retry else { return self.attempt_once(call, attempt()).await };
        let result = policy.run(call.op.name(), || self.attempt_once(call, attempt())).await.result;
        if matches!(&result, Err(StoreError::Unavailable(m)) if m.contains("simulated Azure")) {
            self.gave_up.fetch_add(1, Ordering::Relaxed);
        }
        result
    }
}

/// A store behind a simulated Azure account (see the module docs).
pub type SimAzureStore = LayeredStore<Arc<SimAzure>>;

impl SimAzureStore {
    /// Puts `inner` behind a simulated account with these settings.
    pub fn new(inner: Arc<dyn Store>, opts: SimOptions) -> SimAzureStore {
        LayeredStore::with_layer(inner, Arc::new(SimAzure::new(opts)))
    }

    /// The simulated account (settings and statistics).
    pub fn sim(&self) -> &Arc<SimAzure> {
        self.layer()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::local::LocalStore;
    use crate::store::table::{BatchOp, TableStore};
    use crate::store::value::Entity;

    #[test]
    fn lognormal_draws_hit_the_configured_median_and_p99() {
        let seed = 20261121;
        println!("seed {seed}");
        let dist = LogNormal::from_median_p99(Duration::from_millis(5), Duration::from_millis(50));
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut ms: Vec<f64> = (0..100_000).map(|_| dist.sample(&mut rng).as_secs_f64() * 1000.0).collect();
        ms.sort_by(f64::total_cmp);
        let (p50, p99) = (ms[50_000], ms[99_000]);
        assert!((4.8..5.2).contains(&p50), "p50 {p50} ms");
        assert!((46.0..54.0).contains(&p99), "p99 {p99} ms");
        // The same seed gives the same draws.
        let mut again = rand::rngs::StdRng::seed_from_u64(seed);
        let mut first = rand::rngs::StdRng::seed_from_u64(seed);
        assert_eq!(dist.sample(&mut again), dist.sample(&mut first));
        // No spread when p99 equals the median.
        let flat = LogNormal::from_median_p99(Duration::from_millis(7), Duration::from_millis(7));
        let d = flat.sample(&mut rng).as_secs_f64() * 1000.0;
        assert!((d - 7.0).abs() < 1e-6, "{d}");
    }

    #[test]
    fn token_bucket_admits_its_rate_and_refuses_beyond() {
        let t0 = crate::env::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        // 2,000/s with a 100 ms burst: 200 tokens.
        let mut b = TokenBucket::new(2000.0, 200.0, t0);
        assert!(b.try_take(100.0, t0));
        assert!(b.try_take(100.0, t0));
        assert!(!b.try_take(1.0, t0), "empty");
        assert!(!b.try_take(3.0, ms(1)), "1 ms refills 2 tokens, not 3");
        assert!(b.try_take(2.0, ms(1)));
        // Over one simulated second of requests every millisecond, 2,000 entities get through
        // (plus the initial burst), whatever is asked.
        let mut b = TokenBucket::new(2000.0, 200.0, t0);
        let admitted: u32 = (0..1000).map(|i| if b.try_take(5.0, ms(i)) { 5 } else { 0 }).sum();
        assert!((2000..=2200).contains(&admitted), "{admitted}");
        // Debt: a charge beyond the tokens delays the next admission.
        let mut b = TokenBucket::new(1000.0, 100.0, t0);
        b.charge(300.0, t0);
        assert!(!b.try_take(1.0, ms(150)), "still 50 in debt");
        assert!(b.try_take(1.0, ms(201)));
        // Capacity caps the refill.
        let mut b = TokenBucket::new(1000.0, 100.0, t0);
        assert_eq!(b.tokens(ms(10_000)), 100.0);
        // A request larger than the capacity passes only when the bucket is full.
        let mut b = TokenBucket::new(10.0, 5.0, t0);
        assert!(b.try_take(8.0, t0));
        assert!(!b.try_take(8.0, ms(200)));
    }

    fn fast(retry: Option<RetryPolicy>) -> SimOptions {
        let zero = LogNormal::from_median_p99(Duration::from_nanos(1), Duration::from_nanos(1));
        SimOptions { point_latency: zero, query_latency: zero, retry, ..SimOptions::default() }
    }

    #[tokio::test]
    async fn a_hot_partition_gets_503_server_busy_and_other_partitions_do_not() {
        // 200 entities of burst, refilled at 1 entity/s: the test never waits long enough for
        // a refill to matter.
        let opts = SimOptions { partition_entities_per_s: 1.0, burst: Duration::from_secs(200), ..fast(None) };
        let sim = SimAzureStore::new(Arc::new(LocalStore::in_memory().unwrap()), opts);
        sim.create_table("things").await.unwrap();
        // Two full batches take the partition's 200-entity burst; the third is refused.
        let batch = |p: &str, from: usize| -> Vec<BatchOp> {
            (from..from + 100).map(|i| BatchOp::Upsert(Entity::new(p, format!("r{i:03}")))).collect()
        };
        sim.batch("things", "hot", &batch("hot", 0)).await.unwrap();
        sim.batch("things", "hot", &batch("hot", 100)).await.unwrap();
        let err = sim.batch("things", "hot", &batch("hot", 200)).await.unwrap_err();
        assert!(matches!(&err, StoreError::Unavailable(m) if m.contains("ServerBusy") && m.contains("'hot'")), "{err}");
        assert!(err.is_transient());
        sim.batch("things", "cold", &batch("cold", 0)).await.unwrap();
        let stats = sim.sim().stats();
        assert_eq!((stats.requests, stats.throttled_partition, stats.throttled_account), (5, 1, 0));
        assert_eq!(sim.sim().throttled_by_partition(), vec![("things".to_string(), "hot".to_string(), 1)]);
        // Nothing of the refused batch was written (read behind the simulator: the hot
        // partition would refuse the read too).
        assert!(sim.inner().get("things", "hot", "r250").await.unwrap().is_none());
        assert!(sim.inner().get("things", "hot", "r150").await.unwrap().is_some());
        assert!(sim.get("things", "hot", "r150").await.is_err(), "reads count against the partition too");
    }

    #[tokio::test]
    async fn throttled_calls_are_retried_like_the_azure_backend() {
        let policy = RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(1),
            request_timeout: Duration::from_secs(30),
        };
        // One entity of burst per partition, refilled in 1,000 s: the second write is refused
        // on every attempt.
        let opts =
            SimOptions { partition_entities_per_s: 0.001, burst: Duration::from_secs(1000), ..fast(Some(policy)) };
        let sim = SimAzureStore::new(Arc::new(LocalStore::in_memory().unwrap()), opts);
        sim.create_table("things").await.unwrap();
        sim.upsert("things", &Entity::new("p", "a")).await.unwrap();
        let err = sim.upsert("things", &Entity::new("p", "b")).await.unwrap_err();
        assert!(err.is_transient(), "{err}");
        let stats = sim.sim().stats();
        assert_eq!(stats.throttled_partition, 3, "three attempts, all refused");
        assert_eq!(stats.gave_up, 1);
        assert_eq!(stats.requests, 1 + 1 + 3);
    }
}
