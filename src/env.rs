//! The environment: the one place where the engine reads time, sleeps and draws randomness.
//!
//! Every wall-clock read (WAL ids, tombstone and clock-row stamps, history times, job ids),
//! every monotonic read (leases, deadlines, budgets, backoff), every sleep, every UUID and
//! every random draw (jitter, backoff seeds) goes through this module; nothing else in
//! `src/` calls `SystemTime::now`, `Instant::now`, `tokio::time::sleep`, `Uuid::new_v4` or
//! `rand::thread_rng` (the unit test `nothing_else_reads_time_or_randomness` below fails if
//! something does).
//!
//! **In production** these are the real clock, tokio's timer and the operating system's
//! randomness, at the cost of one thread-local check per call (docs/BENCHMARKS.md).
//!
//! **In a simulation** ([`simulate`]) the thread that runs the simulation (a tokio
//! current-thread runtime with paused time) gets:
//! - monotonic time from tokio's paused clock ([`Instant`] is `tokio::time::Instant`, which
//!   follows it), so sleeping advances simulated time instantly and in a fixed order;
//! - wall time = the simulation's start (µs since the Unix epoch, chosen by the caller)
//!   plus the simulated time elapsed;
//! - UUIDs and every random draw from one generator seeded by the simulation's seed.
//!
//! So one seed gives one execution, on any machine.

use std::cell::RefCell;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

/// A monotonic instant. tokio's: the real monotonic clock in production, the paused clock
/// of a simulation.
pub type Instant = tokio::time::Instant;

struct Simulation {
    rng: StdRng,
    /// Wall time at `start`, µs since the Unix epoch.
    wall_start_us: i64,
    start: Instant,
}

thread_local! {
    static SIMULATION: RefCell<Option<Simulation>> = const { RefCell::new(None) };
}

/// Now, monotonic.
#[inline]
pub fn now() -> Instant {
    Instant::now()
}

/// Now, wall clock, in µs since the Unix epoch.
pub fn now_micros() -> i64 {
    let simulated =
        SIMULATION.with(|s| s.borrow().as_ref().map(|sim| sim.wall_start_us + sim.start.elapsed().as_micros() as i64));
    simulated.unwrap_or_else(|| (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1000) as i64)
}

/// Now, wall clock, as a date-time (UTC).
pub fn now_utc() -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(now_micros()) * 1000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

/// Waits `duration` (tokio's timer: simulated time in a simulation).
pub async fn sleep(duration: Duration) {
    tokio::time::sleep(duration).await
}

/// Waits until `deadline` (tokio's timer: simulated time in a simulation).
pub async fn sleep_until(deadline: Instant) {
    tokio::time::sleep_until(deadline).await
}

/// Runs `f` with the random source: the simulation's seeded generator, or the thread's
/// generator seeded by the operating system.
pub fn with_rng<T>(f: impl FnOnce(&mut dyn RngCore) -> T) -> T {
    let mut f = Some(f);
    let simulated = SIMULATION.with(|s| {
        s.borrow_mut().as_mut().map(|sim| (f.take().expect("called once"))(&mut sim.rng as &mut dyn RngCore))
    });
    match (simulated, f) {
        (Some(out), _) => out,
        (None, Some(f)) => f(&mut rand::thread_rng()),
        (None, None) => unreachable!("the closure runs exactly once"),
    }
}

/// A random (version 4) UUID from the random source.
pub fn uuid() -> uuid::Uuid {
    let mut bytes = [0u8; 16];
    with_rng(|r| r.fill_bytes(&mut bytes));
    uuid::Builder::from_random_bytes(bytes).into_uuid()
}

/// A seed for a generator of its own (a seeded fault injector, backoff jitter).
pub fn seed() -> u64 {
    with_rng(|r| r.next_u64())
}

/// A generator of its own, seeded from the random source.
pub fn rng() -> StdRng {
    StdRng::seed_from_u64(seed())
}

/// Capped exponential backoff with jitter drawn from the random source: the one backoff
/// policy of the engine's retry loops (`backon`). `min` and `max` bound the delay, `times`
/// the retries.
pub fn backoff(min: Duration, max: Duration, times: usize) -> backon::ExponentialBuilder {
    backon::ExponentialBuilder::default()
        .with_min_delay(min)
        .with_max_delay(max)
        .with_max_times(times)
        .with_jitter()
        .with_jitter_seed(seed())
}

/// The delays of a wait that polls until its caller's deadline (a barrier, a schema fence, a
/// read-your-writes catch-up, a `wait`, an idle queue worker): [`backoff`]'s policy, `min`
/// doubling up to `max` with jitter, without a retry limit (the caller's deadline, or what it
/// waits for, ends the wait). The one helper for such waits; a retry of a failed request uses
/// [`backoff`] with a limit.
pub fn poll_delays(min: Duration, max: Duration) -> impl Iterator<Item = Duration> + Send {
    use backon::BackoffBuilder;
    backoff(min, max, 0).without_max_times().build().map(move |d| d.min(max))
}

/// While alive, this thread runs a simulation (see the module docs). Dropping it restores
/// the real environment.
#[derive(Debug)]
pub struct Simulated(());

/// Makes this thread's environment simulated: randomness from `seed`, wall time starting at
/// `wall_start_us` (µs since the Unix epoch) and advancing with tokio's clock, which the
/// caller pauses (`tokio::time::pause`, or a runtime built with `start_paused`). Call it
/// inside that runtime.
pub fn simulate(seed: u64, wall_start_us: i64) -> Simulated {
    let sim = Simulation { rng: StdRng::seed_from_u64(seed), wall_start_us, start: now() };
    SIMULATION.with(|s| *s.borrow_mut() = Some(sim));
    Simulated(())
}

impl Drop for Simulated {
    fn drop(&mut self) {
        SIMULATION.with(|s| *s.borrow_mut() = None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_simulation_replays_from_its_seed() {
        let draw = || {
            let _sim = simulate(42, 1_700_000_000_000_000);
            (uuid(), seed(), now_micros())
        };
        let (a, b) = (draw(), draw());
        assert_eq!(a, b);
        assert_eq!(a.0.get_version_num(), 4);
        assert_ne!(uuid(), uuid(), "outside a simulation: the operating system's randomness");
        assert!(now_micros() > 1_700_000_000_000_000);
    }

    /// The cost of going through this module in production, next to the direct calls (a
    /// benchmark, not a check: `cargo test --release --lib env::tests::cost -- --ignored
    /// --nocapture`; figures in docs/BENCHMARKS.md, "Environment").
    #[test]
    #[ignore = "benchmark"]
    fn cost() {
        const N: u32 = 2_000_000;
        let time = |label: &str, f: &dyn Fn() -> u64| {
            let start = std::time::Instant::now();
            let mut acc = 0u64;
            for _ in 0..N {
                acc = acc.wrapping_add(std::hint::black_box(f()));
            }
            let ns = start.elapsed().as_nanos() as f64 / f64::from(N);
            println!("{label:<40} {ns:6.1} ns/call ({acc})");
        };
        for _ in 0..2 {
            time("wall clock, direct (OffsetDateTime)", &|| {
                (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1000) as u64
            });
            time("wall clock, env::now_micros", &|| now_micros() as u64);
            time("uuid, direct (Uuid::new_v4)", &|| uuid::Uuid::new_v4().as_u128() as u64);
            time("uuid, env::uuid", &|| uuid().as_u128() as u64);
            time("monotonic, direct (std Instant)", &|| std::time::Instant::now().elapsed().as_nanos() as u64);
            time("monotonic, env::now", &|| now().elapsed().as_nanos() as u64);
        }
    }

    /// Time and randomness are read here and nowhere else in `src/`: a call of one of these
    /// anywhere else fails this test, naming the file and line.
    #[test]
    fn nothing_else_reads_time_or_randomness() {
        const FORBIDDEN: [&str; 7] = [
            "SystemTime::now",
            "Instant::now",
            "tokio::time::sleep",
            "Uuid::new_v4",
            "thread_rng",
            "OffsetDateTime::now_utc",
            "from_entropy",
        ];
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut found = Vec::new();
        let mut dirs = vec![root.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") && path != root.join("env.rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    for (n, line) in text.lines().enumerate() {
                        let code = line.split("//").next().unwrap_or("");
                        if let Some(call) = FORBIDDEN.iter().find(|f| code.contains(*f)) {
                            found.push(format!("{}:{}: {call}", path.display(), n + 1));
                        }
                    }
                }
            }
        }
        assert!(found.is_empty(), "read time or randomness through crate::env instead:\n{}", found.join("\n"));
    }
}
