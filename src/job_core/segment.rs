//! What the scan-based job kinds share: `params.segment` (entities per scan query), the name
//! of their work item, and their counters' addition.

use serde::{Deserialize, Serialize};

use crate::store::MAX_PAGE;

/// What a scan-based kind's work item is, for errors.
pub(crate) const SCAN_STEP: &str = "a scan step";

/// `params.segment`: entities per scan query, a whole number in 1..=1,000 (JSON number;
/// absent or `null` = 1,000, Azure's page size). Shared by every scan-based job kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub(crate) struct Segment(u64);

impl TryFrom<u64> for Segment {
    type Error = String;

    fn try_from(n: u64) -> std::result::Result<Segment, String> {
        if (1..=MAX_PAGE as u64).contains(&n) {
            Ok(Segment(n))
        } else {
            Err(format!("{n} is not a whole number in 1..={MAX_PAGE}"))
        }
    }
}

impl From<Segment> for u64 {
    fn from(s: Segment) -> u64 {
        s.0
    }
}

/// The segment in force: `segment`, or 1,000 when absent.
pub(crate) fn segment(segment: Option<Segment>) -> usize {
    segment.map_or(MAX_PAGE, |s| s.0 as usize)
}

/// Adds `n` to a counter that is stored once counted.
pub(crate) fn add(counter: &mut Option<u64>, n: u64) {
    *counter.get_or_insert(0) += n;
}
