//! Micro-benchmark of the embedded store's write path: `clients` tasks each insert small
//! entities (one single-entity insert per call, every insert its own key) into a
//! file-backed `LocalStore` for `seconds`, then the acknowledged inserts per second are
//! printed, with the mean number of requests per commit (one fsync each with `--durability
//! full`). Nothing here asserts on time; the numbers go to docs/BENCHMARKS.md.
//!
//! ```text
//! cargo run --release --example local_store_writes -- --clients 16 --seconds 5 --durability full
//! ```
//!
//! `--dir` picks the folder (default: a fresh temporary folder, removed at the end); put it
//! on the disk you want to measure, since with `--durability full` every commit is fsynced.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Parser, ValueEnum};
use table_catalog::store::{Durability, LocalStore};
use table_catalog::store::{Entity, TableStore, Value};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum DurabilityArg {
    Full,
    Process,
}

#[derive(Debug, Parser)]
struct Args {
    /// Concurrent writer tasks.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// How long to write, in seconds.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// `full`: fsync every commit; `process`: fsync at checkpoints only.
    #[arg(long, value_enum, default_value_t = DurabilityArg::Full)]
    durability: DurabilityArg,
    /// Folder of the store (default: a new temporary folder).
    #[arg(long)]
    dir: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let tmp = tempfile::tempdir().context("temporary folder")?;
    let dir = args.dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    let durability = match args.durability {
        DurabilityArg::Full => Durability::Full,
        DurabilityArg::Process => Durability::Process,
    };
    let store = Arc::new(LocalStore::open(&dir, durability)?);
    let table = format!("bench{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    store.create_table(&table).await?;
    let done = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..args.clients)
        .map(|client| {
            let (store, table, done, acked) = (store.clone(), table.clone(), done.clone(), acked.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                while !done.load(Ordering::Relaxed) {
                    let entity = Entity::new(format!("p{client}"), format!("{n:012}"))
                        .with("payload", Value::String("x".repeat(200)));
                    store.insert(&table, &entity).await?;
                    acked.fetch_add(1, Ordering::Relaxed);
                    n += 1;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    done.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.context("writer task")??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let total = acked.load(Ordering::Relaxed);
    let stats = store.write_stats();
    println!(
        "clients={} durability={:?} inserts={} seconds={:.2} inserts/s={:.0} requests/commit={:.1}",
        args.clients,
        args.durability,
        total,
        elapsed,
        total as f64 / elapsed,
        stats.requests as f64 / stats.commits.max(1) as f64
    );
    Ok(())
}
