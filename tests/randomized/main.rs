//! The randomized checker (`checker`, docs/RELIABILITY.md) and the deterministic simulator
//! (`sim`, docs/SIMULATION.md): bounded runs here; long runs and seed sweeps through
//! `scripts/checker_long.sh` and `scripts/sim.sh`, which build this binary in release.

#[path = "../common/mod.rs"]
mod common;

mod checker;
/// The linearizability check the checker and the simulator share.
#[cfg(feature = "testing")]
#[path = "checker/linearizable.rs"]
mod linearizable;
mod sim;
