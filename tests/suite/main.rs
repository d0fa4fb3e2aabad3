//! The main integration-test binary: every suite that leaves process-wide state alone, one
//! module per concept (formerly one binary per file: 43 binaries of 150-215 MB, issue 29).
//! Suites that set the process-wide fault hook or environment variables are in `tests/faults`,
//! the randomized checker and the simulator in `tests/randomized`. Run one suite with
//! `cargo test --test suite -- NAME::`.

#[path = "../common/mod.rs"]
mod common;

mod airports;
mod allocator;
mod azure_store;
mod catalog;
mod cli_parity;
mod composite_indexes;
mod conformance;
mod crash_kill;
mod export;
mod fanout_requests;
mod filter_lease;
mod functions_assets;
mod functions_harness;
/// The Functions host harness (`functions_harness`; its storage proxy also serves `azure_store`).
mod harness;
mod hashed_keys;
mod history;
mod history_airports;
mod hostile;
mod http;
mod identity;
mod index_processes;
mod indexes;
mod job_kill;
mod jobs;
mod key_vectors;
mod late_logged;
mod metrics;
mod migration;
mod module_graph;
mod multi_process_kill;
mod non_unique;
mod package;
mod projection_cost;
mod projections;
mod python_compat;
mod range_pruning;
mod read_your_writes;
mod readme;
mod redrive;
mod repair;
mod scan;
mod serve;
mod single_partition;
mod stale_applier;
mod transient_retry;
mod whole_table_cli;
