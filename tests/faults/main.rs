//! Suites that change process-wide state: the fault hook of `src/faults.rs` (which makes a
//! named point fail in every catalog of the process) and environment variables read by the
//! catalog. Every test here holds [`TURN`] while it runs, so no two of them overlap and none
//! sees another's hook. Run one with `cargo test --test faults --
//! NAME::`.

#[path = "../common/mod.rs"]
mod common;

/// Held by every test of this binary for its whole run.
pub static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

mod barrier;
mod fault_points;
mod history_crash;
mod identity_azurite;
mod index_faults;
mod rebuild;
