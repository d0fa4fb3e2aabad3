//! `table-catalog jobs ...`, and `verify` / `repair` with `--parallel N`: the same jobs the
//! HTTP API and the Functions `scan` function run ([`table_catalog::jobs`]), with N workers
//! in this process and a progress bar on stderr.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use futures::TryStreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use table_catalog::catalog::Catalog;
use table_catalog::jobs::{Job, JobId, JobKind, JobState, Jobs};
use table_catalog::server::{self, ServeOptions};

use super::scan_args::ScanArgs;

/// Exit status when a verify job has findings (as the serial `verify`).
const FINDINGS_EXIT: u8 = 3;

/// The kinds `jobs start` starts: the ones that take no parameter but `segment`. Its help and
/// its error for another kind list these.
const STARTABLE: [&str; 3] = ["verify", "repair", "trim-history"];

/// `jobs` subcommands.
#[derive(Debug, Subcommand)]
pub enum JobsAction {
    /// Jobs, newest first, one JSON object per line.
    List {
        /// Most jobs to print.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// One job (JSON), with live totals while it runs.
    Show {
        /// The job id.
        id: String,
        /// Also print its findings, one JSON line each.
        #[arg(long)]
        findings: bool,
    },
    /// Cancel a job: its outstanding work items are dropped.
    Cancel {
        /// The job id.
        id: String,
    },
    /// Start a job and print it; workers elsewhere (`serve`, the Functions app, `jobs work`)
    /// run it. The other kinds start elsewhere: `rebuild` by `table-catalog rebuild`,
    /// `backfill` and `drop-index` by `index add` and `index drop`.
    Start {
        /// The kind of job (trim-history needs `--history on` and `--history-days N`).
        #[arg(value_parser = clap::builder::PossibleValuesParser::new(STARTABLE))]
        kind: String,
        /// Entities per scan query (1-1000).
        #[arg(long, default_value_t = table_catalog::cli_support::scan::MAX_SEGMENT)]
        segment: usize,
    },
    /// Re-enqueue the outstanding work items of a running job (after a lost enqueue).
    Resume {
        /// The job id.
        id: String,
    },
    /// Run N workers on the scan queue in this process until the job is final.
    Work {
        /// The job to follow.
        id: String,
        /// Work items at once.
        #[arg(long, default_value_t = 4)]
        parallel: usize,
    },
}

/// Runs a `jobs` subcommand.
pub async fn run(catalog: Arc<Catalog>, action: JobsAction) -> Result<ExitCode> {
    let jobs = Jobs::for_catalog(catalog.clone());
    match action {
        JobsAction::List { limit } => {
            // `Jobs::list` checks the limit (the first page is always asked for).
            super::pages::print_pages(limit, |n, token| {
                let jobs = &jobs;
                async move {
                    let page = jobs.list(n, token.as_deref()).await?;
                    Ok((page.jobs, page.continuation))
                }
            })
            .await?;
        }
        JobsAction::Show { id, findings } => {
            let id = JobId::parse(&id)?;
            println!("{}", serde_json::to_string(&jobs.get(&id).await?)?);
            if findings {
                print_findings(&jobs, &id).await?;
            }
        }
        JobsAction::Cancel { id } => println!("{}", serde_json::to_string(&jobs.cancel(&JobId::parse(&id)?).await?)?),
        JobsAction::Start { kind, segment } => {
            let job = jobs.start(JobKind::parse(&kind)?, json!({ "segment": segment })).await?;
            println!("{}", serde_json::to_string(&job)?);
        }
        JobsAction::Resume { id } => {
            let n = jobs.resume(&JobId::parse(&id)?).await?;
            println!("{}", json!({ "requeued": n }));
        }
        JobsAction::Work { id, parallel } => {
            let job = follow(&catalog, &jobs, &JobId::parse(&id)?, parallel).await?;
            println!("{}", serde_json::to_string(&job)?);
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn print_findings(jobs: &Jobs, id: &JobId) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let mut findings = jobs.findings(id);
    while let Some(f) = findings.try_next().await? {
        writeln!(out, "{f}").context("writing findings")?;
    }
    Ok(())
}

/// Runs `parallel` workers on the scan queue until job `id` is final, with a progress bar.
pub(super) async fn follow(catalog: &Arc<Catalog>, jobs: &Jobs, id: &JobId, parallel: usize) -> Result<Job> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let opts = ServeOptions { scan_workers: parallel.max(1), ..ServeOptions::default() };
    let worker = tokio::spawn(server::run_scan_worker(catalog.clone(), opts, stop_rx));
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let started = table_catalog::cli_support::env::now();
    let job = loop {
        let job = jobs.get(id).await?;
        let rows = job.counters.get("rows").copied().unwrap_or(0);
        let rate = rows as f64 / started.elapsed().as_secs_f64().max(0.001);
        bar.set_message(format!(
            "{} {}: {rows} rows, {} partitions, {} findings, {}/{} work items, {rate:.0} rows/s, {}",
            job.kind.name(),
            job.id,
            job.counters.get("partitions").copied().unwrap_or(0),
            job.counters.get("findings").copied().unwrap_or(0),
            job.steps_done,
            job.steps_done + job.steps_pending,
            eta(&job, rate),
        ));
        if job.state.is_final() {
            break job;
        }
        table_catalog::cli_support::env::sleep(Duration::from_millis(500)).await;
    };
    bar.finish_and_clear();
    let _ = stop_tx.send(true);
    let _ = worker.await;
    Ok(job)
}

/// An estimate of the time left: the outstanding work items times the rows a finished item
/// read on average, at the rate so far. The table's size is unknown until the scan ends (that
/// is why it is scanned), and an outstanding prefix range may still split, so the estimate
/// is a lower bound that firms up as the job runs; "ETA ?" before the first item is done.
fn eta(job: &Job, rows_per_sec: f64) -> String {
    let rows = job.counters.get("rows").copied().unwrap_or(0);
    if job.steps_done == 0 || rows == 0 || rows_per_sec <= 0.0 {
        return "ETA ?".to_string();
    }
    let left = job.steps_pending as f64 * rows as f64 / job.steps_done as f64 / rows_per_sec;
    format!("ETA ≥{}s", left.ceil() as u64)
}

/// `verify` / `repair` as a job with `args.parallel` workers here: the same output as the
/// serial commands (findings on stdout, counts on stderr, exit 3 with findings; repair
/// applies and prints what it did).
pub async fn run_parallel(catalog: Arc<Catalog>, kind: JobKind, args: &ScanArgs) -> Result<ExitCode> {
    let jobs = Jobs::for_catalog(catalog.clone());
    let job = run_job(&catalog, &jobs, kind, json!({ "segment": args.segment }), args.parallel).await?;
    match kind {
        JobKind::Verify => {
            print_findings(&jobs, &job.id).await?;
            eprintln!("{}", verify_summary(&job.counters)?);
            let findings = job.counters.get("findings").copied().unwrap_or(0);
            Ok(if findings == 0 { ExitCode::SUCCESS } else { ExitCode::from(FINDINGS_EXIT) })
        }
        JobKind::Repair | JobKind::Rebuild | JobKind::TrimHistory | JobKind::Backfill | JobKind::DropIndex => {
            let applied = catalog.recover().await?.applied();
            let mut out = scan_summary(kind, &job.counters);
            out["applied"] = applied.into();
            out["job"] = json!(job.id);
            println!("{out}");
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Counters of a scan job that are totals, not finding kinds.
const TOTALS: [&str; 9] =
    ["partitions", "rows", "records", "tombstones", "findings", "upserts", "deletes", "removals", "unrepairable"];

/// The finding kinds among a scan job's counters, `{kind: n}`.
fn finding_counts(counters: &BTreeMap<String, u64>) -> BTreeMap<&str, u64> {
    counters.iter().filter(|(k, _)| !TOTALS.contains(&k.as_str())).map(|(k, v)| (k.as_str(), *v)).collect()
}

/// A verify job's counters as the serial `verify` prints its `VerifyReport` (same fields, same
/// order: `{rows, records, tombstones, findings: {kind: n}}`), so `--parallel` changes how the
/// scan runs, not what it reports.
fn verify_summary(counters: &BTreeMap<String, u64>) -> Result<String> {
    #[derive(serde::Serialize)]
    struct Summary<'a> {
        rows: u64,
        records: u64,
        tombstones: u64,
        findings: BTreeMap<&'a str, u64>,
    }
    let n = |k: &str| counters.get(k).copied().unwrap_or(0);
    let summary = Summary {
        rows: n("rows"),
        records: n("records"),
        tombstones: n("tombstones"),
        findings: finding_counts(counters),
    };
    Ok(serde_json::to_string(&summary)?)
}

/// A repair job's counters as the serial `repair` prints its `RepairReport`
/// (`{rows, findings, upserts, deletes, removals, unrepairable}`); other kinds' counters as
/// they are.
fn scan_summary(kind: JobKind, counters: &BTreeMap<String, u64>) -> serde_json::Value {
    let n = |k: &str| counters.get(k).copied().unwrap_or(0);
    match kind {
        JobKind::Repair => json!({
            "rows": n("rows"), "findings": finding_counts(counters), "upserts": n("upserts"), "deletes": n("deletes"),
            "removals": n("removals"), "unrepairable": n("unrepairable"),
        }),
        _ => json!(counters),
    }
}

/// Starts a job and runs it with `parallel` workers here until it is done.
async fn run_job(
    catalog: &Arc<Catalog>,
    jobs: &Jobs,
    kind: JobKind,
    params: serde_json::Value,
    parallel: usize,
) -> Result<Job> {
    let job = jobs.start(kind, params).await?;
    eprintln!("{} job {} started with {} workers here", kind.name(), job.id, parallel.max(1));
    let job = follow(catalog, jobs, &job.id, parallel).await?;
    if job.state != JobState::Done {
        bail!(
            "job {} ended {}: {}",
            job.id,
            job.state.name(),
            job.last_error.as_deref().unwrap_or("no reason recorded")
        );
    }
    Ok(job)
}

/// `rebuild`: copies the catalog into `params.into` with the new schema as a job, applies the
/// new catalog, verifies it and prints `{copied, refused, applied, verify}`; exit 3 when the
/// new catalog does not verify clean.
pub async fn rebuild(catalog: Arc<Catalog>, params: serde_json::Value, parallel: usize) -> Result<ExitCode> {
    let jobs = Jobs::for_catalog(catalog.clone());
    let job = run_job(&catalog, &jobs, JobKind::Rebuild, params.clone(), parallel).await?;
    let target = table_catalog::cli_support::jobs::rebuild::Rebuild::new(catalog.clone()).target(&params).await?;
    let applied = target.recover().await?.applied();
    let report =
        table_catalog::cli_support::verify::verify(target.store().as_ref(), &target.names().table, &target.schema())
            .await?;
    let out = json!({
        "job": job.id,
        "into": target.names().table,
        "rows_read": job.counters.get("rows"),
        "copied": job.counters.get("records"),
        "refused": job.counters.get("refused"),
        "applied": applied,
        "verify": report,
    });
    println!("{out}");
    Ok(if report.ok() { ExitCode::SUCCESS } else { ExitCode::from(FINDINGS_EXIT) })
}
