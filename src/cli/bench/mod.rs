//! `bench`: load generators and measurements. Numbers go to docs/BENCHMARKS.md; nothing here
//! asserts on time.
//!
//! - `bench lookups` (or plain `bench` with its flags): lookup latency against a running server;
//! - `bench writes`: single-record writes over HTTP against one or more running servers;
//! - `bench sim`: N catalog instances in one process on a simulated Azure account;
//! - `bench gen`: a synthetic catalog (JSON lines) for the whole-table benchmarks.

mod gen;
mod lookups;
mod percentile;
mod sim;
mod writes;

use anyhow::Result;
use clap::{Args, Subcommand};

/// Arguments of `bench`: a subcommand, or the flags of `bench lookups` (the original form).
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: Option<BenchCommand>,
    #[command(flatten)]
    lookups: Option<lookups::LookupArgs>,
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Latency of lookups by one identifier against a running server.
    Lookups(lookups::LookupArgs),
    /// Single-record upserts over HTTP against running servers: acknowledged writes/s and
    /// acknowledgement latency.
    Writes(writes::WriteArgs),
    /// N catalog instances in this process on one embedded store behind a simulated Azure
    /// account (latency, 503 ServerBusy at the scalability targets): writes/s, visibility lag,
    /// storage requests per write.
    Sim(sim::SimArgs),
    /// A synthetic catalog as JSON lines for `import` (deterministic for a seed): N records
    /// with three unique identifiers each (index keys eid,npi,email, row key lastname), so
    /// N records give 3·N index rows.
    Gen(gen::GenArgs),
}

/// Runs the benchmark.
pub async fn run(args: BenchArgs) -> Result<()> {
    match (args.command, args.lookups) {
        (Some(BenchCommand::Lookups(a)), _) | (None, Some(a)) => lookups::run(a).await,
        (Some(BenchCommand::Writes(a)), _) => writes::run(a).await,
        (Some(BenchCommand::Sim(a)), _) => sim::run(a).await,
        (Some(BenchCommand::Gen(a)), _) => gen::run(a),
        (None, None) => {
            anyhow::bail!("bench: name a benchmark (lookups, writes, sim, gen); see `table-catalog bench --help`")
        }
    }
}
