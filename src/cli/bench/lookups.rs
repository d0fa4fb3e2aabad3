//! `bench lookups` (also plain `bench`): latency of lookups by one identifier against a
//! running server. Numbers go to docs/BENCHMARKS.md; nothing here asserts on time.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use futures::StreamExt;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use table_catalog::cli_support::import::{self, Format};
use table_catalog::cli_support::schema::Schema;

use super::percentile::percentile;

/// Lookups by one identifier over HTTP.
#[derive(Debug, Args)]
pub struct LookupArgs {
    /// Base URL of a running `serve` (or handler).
    #[arg(long, default_value = "http://127.0.0.1:7071")]
    url: String,
    /// File whose identifiers to look up (the file that was imported).
    #[arg(long)]
    file: PathBuf,
    /// Identifier field to look up by.
    #[arg(long, default_value = "icao")]
    field: String,
    /// Number of lookups.
    #[arg(long, default_value_t = 5000)]
    requests: usize,
    /// Lookups in flight at once.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Seed of the lookup order.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

pub async fn run(args: LookupArgs) -> Result<()> {
    let schema = Schema::new(vec![args.field.clone()], "_unused_")?;
    // Streams the file on a blocking thread and keeps only the looked-up values.
    let (file, field) = (args.file.clone(), args.field.clone());
    let mut values = tokio::task::spawn_blocking(move || -> Result<Vec<String>> {
        let mut values = Vec::new();
        for row in import::open(&file, Format::from_path(&file), &schema)? {
            let Ok(record) = row?.1 else { continue };
            if let Some(v) =
                record.get(&field).and_then(table_catalog::cli_support::keys::key_string).filter(|v| !v.is_empty())
            {
                values.push(v);
            }
        }
        Ok(values)
    })
    .await
    .context("reading the file")??;
    if values.is_empty() {
        bail!("no values of '{}' in {}", args.field, args.file.display());
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    values.shuffle(&mut rng);
    let client = reqwest::Client::new();
    let targets: Vec<String> = (0..args.requests).map(|i| values[i % values.len()].clone()).collect();
    let started = table_catalog::cli_support::env::now();
    let results: Vec<Result<(Duration, bool)>> = futures::stream::iter(targets)
        .map(|v| {
            let client = client.clone();
            let url = format!("{}/api/records", args.url.trim_end_matches('/'));
            let field = args.field.clone();
            async move {
                let t = table_catalog::cli_support::env::now();
                let resp = client.get(&url).query(&[(field.as_str(), v.as_str())]).send().await.context("request")?;
                let status = resp.status();
                let body: serde_json::Value = resp.json().await.context("response body")?;
                let found = status.is_success() && body["records"].as_array().is_some_and(|a| !a.is_empty());
                Ok((t.elapsed(), found))
            }
        })
        .buffer_unordered(args.concurrency.max(1))
        .collect()
        .await;
    let total = started.elapsed();
    let mut latencies = Vec::with_capacity(results.len());
    let mut misses = 0;
    for r in results {
        let (d, found) = r?;
        latencies.push(d);
        misses += usize::from(!found);
    }
    latencies.sort();
    println!(
        "{}",
        serde_json::json!({
            "lookups": latencies.len(),
            "field": args.field,
            "concurrency": args.concurrency,
            "not_found": misses,
            "p50_ms": percentile(&latencies, 0.50),
            "p90_ms": percentile(&latencies, 0.90),
            "p99_ms": percentile(&latencies, 0.99),
            "max_ms": percentile(&latencies, 1.0),
            "lookups_per_s": latencies.len() as f64 / total.as_secs_f64(),
        })
    );
    Ok(())
}
