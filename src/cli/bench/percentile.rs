//! The percentiles the benchmarks report, from sorted measured durations.

use std::time::Duration;

/// The `p` quantile (0..=1, nearest rank) of sorted durations, in milliseconds; 0 when empty.
pub(super) fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}
