//! Where an applier writes history rows ([`HistoryTarget`]; the writing is in
//! `super::history`).

use crate::history::HistoryOptions;

/// Where an applier writes history, and the retention limits.
#[derive(Debug, Clone)]
pub struct HistoryTarget {
    /// The history table (`{catalog}history`).
    pub table: String,
    /// Retention.
    pub opts: HistoryOptions,
}
