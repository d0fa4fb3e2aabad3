//! Pacing of append rounds: the catalog's rounds held under a budget, so that the clock
//! partition stays under half of Azure's per-partition target however many processes write.
//!
//! Every append round costs the `clock` partition a point read of the high row and, unless
//! another process's publication covers it, a conditional replace, plus a read for each
//! replace that meets 412 (another process published meanwhile): 2 entities per round for a
//! process alone, about 2.7 with 32 processes writing on simulated Azure, when most rounds
//! are covered by another process's publication after a 412 (docs/BENCHMARKS.md, "Pacing
//! the append rounds"). Azure's scalability target is 2,000 entities/s per
//! partition (Microsoft, "Scalability and performance targets for Table storage"); the
//! catalog's rounds are paced so that their clock requests stay under
//! [`ENTITIES_PER_SECOND`], under half of it.
//!
//! The high row counts its publications (property `n`, raised by one by each publication,
//! [`super::clock`]). Two observations of it (a read, or a process's own replace) some
//! [`WINDOW`] apart give the catalog's publication rate λ, exactly; counting its own
//! publications gives a process its rate μ, and counting its clock requests and rounds its
//! cost per round `e`. With `k = λ / μ` (how many processes like this one write), a process
//! starts its rounds at least `k × e / ENTITIES_PER_SECOND` apart ([`Pace::next_start`]): N
//! processes writing evenly together cost the clock partition about
//! [`ENTITIES_PER_SECOND`], a process alone starts its rounds 2.9 ms apart (less than a
//! round takes, so a lone writer never waits), and a process that writes more than the
//! others gets the larger part of the budget. Under load a paced round carries the writes
//! that queued meanwhile, so the requests per write fall as well.
//!
//! Only timing: nothing about ids, order or durability depends on the pace; a wrong
//! estimate costs latency or clock traffic, never correctness. Rates come from counters on
//! the row and [`crate::env`]'s clock, so the simulator replays them from its seed.

use std::sync::Mutex;
use std::time::Duration;

use crate::env::Instant;

/// The clock partition's traffic the catalog's rounds aim under, in entities per second:
/// 35% of Azure's 2,000 entities/s per-partition target (the estimates overshoot it by
/// up to a third at 32 processes and a half at 64: docs/BENCHMARKS.md, "Pacing the append rounds").
pub const ENTITIES_PER_SECOND: f64 = 700.0;
/// Clock requests per round before any is counted: a read and a publication.
const FIRST_COST: f64 = 2.0;
/// Shortest span two rate samples are taken over.
pub const WINDOW: Duration = Duration::from_millis(200);
/// Longest gap between one process's round starts, however many processes write (a bound
/// on what a wrong estimate can cost one write).
pub const MAX_GAP: Duration = Duration::from_millis(250);
/// Publications per second below which a process's own rate counts as this (its gap is
/// then [`MAX_GAP`] at any catalog rate that matters).
const MIN_RATE: f64 = 0.5;
/// Weight of each new window in the moving averages of λ and μ.
const ALPHA: f64 = 0.25;

/// One process's pace (see the module docs). Cheap to share behind an `Arc`.
#[derive(Debug, Default)]
pub struct Pace {
    state: Mutex<State>,
}

/// What a process counts of its own.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    publications: u64,
    requests: u64,
    rounds: u64,
}

#[derive(Debug, Default)]
struct State {
    /// Start of the current window: when, the row's counter, and [`Counts`] then.
    start: Option<(Instant, i64, Counts)>,
    /// This process's counts so far.
    own: Counts,
    /// Moving averages of the catalog's and this process's publications per second, and of
    /// this process's clock requests per round.
    catalog: Option<f64>,
    mine: f64,
    cost: Option<f64>,
    /// When the latest round started (or is due to).
    last_start: Option<Instant>,
}

impl Pace {
    /// Notes an observation of the high row at `at` showing publication count `n`.
    pub fn observe(&self, at: Instant, n: i64) {
        let mut s = self.lock();
        let own = s.own;
        let Some((t0, n0, own0)) = s.start else {
            s.start = Some((at, n, own));
            return;
        };
        if at < t0 + WINDOW {
            return;
        }
        let dt = (at - t0).as_secs_f64();
        let catalog = (n - n0).max(0) as f64 / dt;
        let mine = (own.publications - own0.publications) as f64 / dt;
        let rounds = own.rounds - own0.rounds;
        if rounds > 0 {
            let cost = (own.requests - own0.requests) as f64 / rounds as f64;
            s.cost = Some(s.cost.map_or(cost, |c| c + ALPHA * (cost - c)));
        }
        match s.catalog {
            Some(c) => {
                s.catalog = Some(c + ALPHA * (catalog - c));
                s.mine += ALPHA * (mine - s.mine);
            }
            None => {
                s.catalog = Some(catalog);
                s.mine = mine;
            }
        }
        s.start = Some((at, n, own));
    }

    /// This process's share of the catalog's publications (μ / λ, within (0, 1]; 1 when the
    /// catalog published nothing lately), once a window has closed.
    pub fn share(&self) -> Option<f64> {
        let (catalog, mine, _) = self.lock().rates()?;
        Some(if catalog > 0.0 { (mine / catalog).clamp(f64::MIN_POSITIVE, 1.0) } else { 1.0 })
    }

    /// Notes one publication of this process.
    pub fn published(&self) {
        self.lock().own.publications += 1;
    }

    /// Notes one request of this process on the clock partition (a read or a replace).
    pub fn requested(&self) {
        self.lock().own.requests += 1;
    }

    /// When a round may start, if it starts now or as soon as the pace allows (the instant
    /// is taken: the next round is paced from it). Round starts are at least the gap apart:
    /// `k × e / ENTITIES_PER_SECOND` with `k = λ / μ` at least 1 (module docs), at most
    /// [`MAX_GAP`]; before any estimate, that of a process alone.
    pub fn next_start(&self, now: Instant) -> Instant {
        let mut s = self.lock();
        let gap = gap_for(s.rates());
        s.own.rounds += 1;
        let at = match s.last_start {
            Some(last) if last + gap > now => last + gap,
            _ => now,
        };
        s.last_start = Some(at);
        at
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl State {
    /// (λ, μ, e) when a window has closed, else `None`.
    fn rates(&self) -> Option<(f64, f64, f64)> {
        self.catalog.map(|c| (c, self.mine, self.cost.unwrap_or(FIRST_COST)))
    }
}

/// The gap for `(λ, μ)` in publications per second and `e` in clock requests per round
/// (module docs).
fn gap_for(rates: Option<(f64, f64, f64)>) -> Duration {
    let (processes, cost) = match rates {
        // A process that published (almost) nothing lately is held to [`MAX_GAP`].
        Some((catalog, mine, cost)) => ((catalog / mine.max(MIN_RATE)).max(1.0), cost),
        None => (1.0, FIRST_COST),
    };
    Duration::from_secs_f64(processes * cost / ENTITIES_PER_SECOND).min(MAX_GAP)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn close(a: Duration, secs: f64) -> bool {
        (a.as_secs_f64() - secs).abs() < 1e-9
    }

    #[test]
    fn a_process_alone_starts_rounds_no_more_than_the_budget_apart() {
        assert!(close(gap_for(None), FIRST_COST / ENTITIES_PER_SECOND));
        assert!(close(gap_for(Some((100.0, 100.0, 2.0))), 2.0 / ENTITIES_PER_SECOND));
    }

    #[test]
    fn n_even_processes_share_the_budget_by_what_their_rounds_cost() {
        let gap = gap_for(Some((320.0, 10.0, 4.0))); // 32 processes like this one, 4 requests a round
        assert!(close(gap, 32.0 * 4.0 / ENTITIES_PER_SECOND), "{gap:?}");
        assert_eq!(gap_for(Some((10_000.0, 0.0, 2.0))), MAX_GAP, "bounded when this one publishes nothing");
    }

    #[tokio::test(start_paused = true)]
    async fn rates_come_from_the_rows_counter_and_own_publications() {
        let pace = Pace::default();
        let t = crate::env::now();
        pace.observe(t, 1000);
        for _ in 0..10 {
            pace.next_start(t); // a round: 3 requests, one publication
            pace.published();
            pace.requested();
            pace.requested();
            pace.requested();
        }
        pace.observe(t + ms(100), 1040); // inside the window: no sample yet
        assert_eq!(pace.lock().rates(), None);
        assert_eq!(pace.share(), None);
        pace.observe(t + ms(500), 1200); // 200 publications in 0.5 s, 10 of them ours
        let k = 200.0 / 10.0;
        let gap = gap_for(pace.lock().rates());
        assert!(close(gap, k * 3.0 / ENTITIES_PER_SECOND), "{gap:?}");
        assert_eq!(pace.share(), Some(1.0 / k));
    }

    #[tokio::test(start_paused = true)]
    async fn round_starts_are_spaced_by_the_gap_and_a_late_one_starts_at_once() {
        let pace = Pace::default();
        let t = crate::env::now();
        let gap = gap_for(None);
        assert_eq!(pace.next_start(t), t);
        assert_eq!(pace.next_start(t), t + gap, "the next one waits");
        assert_eq!(pace.next_start(t), t + gap * 2);
        assert_eq!(pace.next_start(t + ms(100)), t + ms(100), "after a pause: at once");
    }
}
