//! The suites compiled only with `--features fault-injection` (`checker`, `fault_points`,
//! `stale_applier`, and the crash points of `crash_kill`) vanish from a build without it.
//! This reports them as skipped then, so the gap is visible (`scripts/test.sh` always builds
//! with the feature).

#[cfg(not(feature = "fault-injection"))]
use crate::common;

#[cfg(not(feature = "fault-injection"))]
#[test]
fn suites_that_need_fault_injection() {
    common::skip::skipped("checker, fault_points, stale_applier", "built without --features fault-injection");
}
