//! Whole-table commands over the prefix scanner: `verify`, `repair`, `export`. Each shows a
//! progress bar on stderr (rows and rate; hidden when stderr is not a terminal).

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use futures::TryStreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use table_catalog::catalog::Catalog;
use table_catalog::cli_support::verify::{self, VerifyOptions, VerifyReport};
use table_catalog::cli_support::CatalogInternals;
use table_catalog::cli_support::{export, repair};

use super::scan_args::ScanArgs;

/// Exit status of `verify` when it finds disagreements.
const FINDINGS_EXIT: u8 = 3;

impl ScanArgs {
    fn options(&self) -> VerifyOptions {
        VerifyOptions { segment: self.segment, concurrency: self.concurrency.max(1) }
    }
}

/// A spinner counting `what` with its rate, on stderr (indicatif draws nothing when stderr
/// is not a terminal).
fn progress(what: &str) -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    let template = format!("{{spinner}} {what}: {{pos}} rows ({{per_sec}}, {{elapsed}})");
    bar.set_style(ProgressStyle::with_template(&template).unwrap_or_else(|_| ProgressStyle::default_spinner()));
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar
}

async fn warn_if_pending(catalog: &Catalog) -> Result<()> {
    let pending = catalog.status().await?.pending;
    if pending > 0 {
        eprintln!("warning: {pending} WAL entries are pending; run `recover` first for a meaningful check");
    }
    Ok(())
}

/// `verify`: findings as JSON lines on stdout, the counts as one JSON line on stderr; exit
/// status 3 when there are findings.
pub async fn verify(catalog: &Catalog, args: &ScanArgs) -> Result<ExitCode> {
    warn_if_pending(catalog).await?;
    let bar = progress("verifying");
    let schema = catalog.schema();
    let mut checks = verify::row_checks(catalog.store().as_ref(), &catalog.names().table, &schema, args.options());
    let mut report = VerifyReport::default();
    let mut out = std::io::stdout().lock();
    while let Some(check) = checks.try_next().await? {
        for f in &check.findings {
            bar.suspend(|| writeln!(out, "{}", f.json_line())).context("writing findings")?;
        }
        report.add(&check);
        bar.inc(1);
    }
    bar.finish_and_clear();
    out.flush()?;
    eprintln!("{}", serde_json::to_string(&report)?);
    Ok(if report.ok() { ExitCode::SUCCESS } else { ExitCode::from(FINDINGS_EXIT) })
}

/// `repair`: re-logs every disagreeing record, applies, prints the report (JSON) on stdout.
pub async fn repair(catalog: &Catalog, args: &ScanArgs) -> Result<ExitCode> {
    warn_if_pending(catalog).await?;
    let bar = progress("repairing");
    let report = repair::repair(catalog, args.options(), |_| bar.inc(1)).await?;
    bar.finish_and_clear();
    let applied = catalog.recover().await?.applied();
    let mut json = serde_json::to_value(&report)?;
    json["applied"] = applied.into();
    println!("{json}");
    Ok(ExitCode::SUCCESS)
}

/// `export`: every live record once, as JSON lines, to `output` or stdout, `segment` entities
/// per scan query.
pub async fn export(catalog: &Catalog, output: Option<&Path>, segment: usize) -> Result<ExitCode> {
    warn_if_pending(catalog).await?;
    let mut sink: Box<dyn Write> = match output {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let bar = progress("exporting");
    let (store, table) = (catalog.store().as_ref(), &catalog.names().table);
    let written = match catalog.single_records(segment) {
        // Single-partition mode: the owner rows, one per record.
        Some(mut records) => {
            let mut n = 0u64;
            while let Some(record) = records.try_next().await? {
                writeln!(sink, "{}", serde_json::Value::Object(record))?;
                n += 1;
                bar.set_position(n);
            }
            sink.flush()?;
            n
        }
        None => export::to_writer(store, table, &catalog.schema(), segment, &mut sink, |n| bar.set_position(n)).await?,
    };
    bar.finish_and_clear();
    eprintln!("{}", serde_json::json!({ "exported": written }));
    Ok(ExitCode::SUCCESS)
}
