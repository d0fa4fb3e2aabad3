//! Visible skips. A test that cannot run for a missing prerequisite calls [`skipped`], which
//! writes `SKIPPED: <test>: <reason>` straight to the process's stderr, past the test
//! harness's output capture, so the line shows in every run, passing or not.
//! `scripts/test.sh` fails the run when such a line appears. Under `CI`, or with
//! `TC_TEST_NO_SKIP=1`, the test fails instead of skipping.

use std::io::Write;

/// The marker `scripts/test.sh` looks for.
pub const MARKER: &str = "SKIPPED:";

/// Reports `test` as skipped for `reason` (or fails it under `CI` / `TC_TEST_NO_SKIP`).
pub fn skipped(test: &str, reason: &str) {
    if std::env::var_os("CI").is_some() || std::env::var("TC_TEST_NO_SKIP").is_ok_and(|v| v == "1") {
        panic!("{test} cannot run: {reason} (CI or TC_TEST_NO_SKIP is set, so this is a failure, not a skip)");
    }
    // One write, so the line stays whole among the harness's own output.
    let _ = std::io::stderr().write_all(format!("\n{MARKER} {test}: {reason}\n").as_bytes());
}

/// The name of the running test (libtest runs each test on a thread named after it).
pub fn current_test() -> String {
    std::thread::current().name().unwrap_or("unnamed test").to_string()
}

/// The Azurite connection string from `TC_TEST_AZURE_CONNECTION`, or `None` after reporting
/// `what` as skipped.
pub fn azurite(what: &str) -> Option<String> {
    match std::env::var("TC_TEST_AZURE_CONNECTION") {
        Ok(cs) if !cs.trim().is_empty() => Some(cs),
        _ => {
            skipped(
                what,
                "TC_TEST_AZURE_CONNECTION is not set (run scripts/test.sh, or `source scripts/azurite.sh start`)",
            );
            None
        }
    }
}
