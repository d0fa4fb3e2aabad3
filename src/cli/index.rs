//! `table-catalog index add|drop|list`: online index changes ([`table_catalog::indexes`]).
//! `add` and `drop` log the change, apply it (which starts its job once every applier uses
//! the new schema) and, with `--parallel N` (default 4), run the job with N workers here
//! and a progress bar, other workers (`serve`, the Functions `scan` function) joining in.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Subcommand;
use table_catalog::catalog::Catalog;
use table_catalog::cli_support::wal::{ShardId, WalId};
use table_catalog::indexes::{self, IndexChange};
use table_catalog::jobs::{JobId, JobState, Jobs};

/// `index` subcommands.
#[derive(Debug, Subcommand)]
pub enum IndexAction {
    /// Every index with its state, one JSON object per line.
    List,
    /// Add an index on FIELD online: it is `backfilling` until its backfill job is done,
    /// then `active`.
    Add {
        /// The record field to index.
        field: String,
        /// What the index's rows hold: all (the whole record), keys (the record's identity,
        /// its indexed values and its fact row's PartitionKey) or include:FIELD,FIELD (keys
        /// and those fields).
        #[arg(long, default_value = "all")]
        projection: String,
        /// Run the backfill with this many workers here and wait for it (0: only log the
        /// change; workers elsewhere run the job).
        #[arg(long, default_value_t = 4)]
        parallel: usize,
    },
    /// Drop an added index: it stops being maintained, and a job removes its rows.
    Drop {
        /// The indexed field.
        field: String,
        /// Run the removal with this many workers here and wait for it (0: only log the
        /// change).
        #[arg(long, default_value_t = 4)]
        parallel: usize,
    },
}

/// Runs an `index` subcommand.
pub async fn run(catalog: Arc<Catalog>, action: IndexAction) -> Result<ExitCode> {
    let (change, parallel) = match action {
        IndexAction::List => {
            for index in indexes::list(&catalog).await? {
                println!("{}", serde_json::to_string(&index)?);
            }
            return Ok(ExitCode::SUCCESS);
        }
        IndexAction::Add { field, projection, parallel } => {
            let projection = indexes::Projection::parse(&projection)?;
            (indexes::add_projected(&catalog, &field, projection).await?, parallel)
        }
        IndexAction::Drop { field, parallel } => (indexes::drop(&catalog, &field).await?, parallel),
    };
    eprintln!(
        "{} '{}': schema version {}, change logged as {}",
        change.index.state.name(),
        change.index.field,
        change.version,
        change.wal_id
    );
    if parallel == 0 {
        println!("{}", serde_json::to_string(&change)?);
        return Ok(ExitCode::SUCCESS);
    }
    wait_applied(&catalog, &change).await?;
    let jobs = Jobs::for_catalog(catalog.clone());
    let job = super::jobs::follow(&catalog, &jobs, &JobId::parse(&change.job)?, parallel).await?;
    if job.state != JobState::Done {
        bail!("job {} ended {}: {}", job.id, job.state.name(), job.last_error.as_deref().unwrap_or("no reason"));
    }
    let now = indexes::list(&catalog).await?;
    let index = now.iter().find(|i| i.field == change.index.field);
    println!("{}", serde_json::json!({ "job": job, "index": index }));
    Ok(ExitCode::SUCCESS)
}

/// Applies shard 0 until the change's entry is applied (its fence passed and its job
/// started), telling the operator when appliers elsewhere keep it waiting.
async fn wait_applied(catalog: &Catalog, change: &IndexChange) -> Result<()> {
    let id = WalId::from_stored(change.wal_id.clone());
    loop {
        match catalog.wait_applied(ShardId::ZERO, &id).await {
            Ok(_) => return Ok(()),
            Err(table_catalog::Error::Timeout(_)) => {
                eprintln!("waiting for every applier to use schema version {} ...", change.version);
                table_catalog::cli_support::env::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}
