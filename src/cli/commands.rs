//! One function per command.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;
use table_catalog::catalog::Catalog;
use table_catalog::cli_support::apply::DrainOutcome;
use table_catalog::cli_support::import::{self, Format};
use table_catalog::cli_support::settings;
use table_catalog::query::Filter;
use table_catalog::record::Record;
use table_catalog::server::{self, ServeOptions};

use super::args::{Cli, Command, FormatArg};

/// The command's name when it does not exist in single-partition mode and `catalog` is in
/// it (history, index changes, WAL reads and redrive are refused by the library itself).
fn single_partition_refuses(catalog: &Catalog, command: &Command) -> Option<&'static str> {
    if catalog.mode() == table_catalog::config::Mode::Wal {
        return None;
    }
    match command {
        Command::Verify(_) => Some("verify"),
        Command::Repair(_) => Some("repair"),
        Command::Rebuild { .. } => Some("rebuild"),
        Command::Jobs { .. } => Some("jobs"),
        Command::Dead { .. } => Some("dead"),
        _ => None,
    }
}

pub async fn run(cli: Cli) -> Result<ExitCode> {
    let config = cli.catalog.config()?;
    let command = match cli.command {
        // `bench` opens no catalog of the configuration: it talks to running servers over
        // HTTP, or (`bench sim`) opens its own on a simulated store.
        #[cfg(feature = "bench")]
        Command::Bench(args) => {
            super::bench::run(args).await?;
            return Ok(ExitCode::SUCCESS);
        }
        other => other,
    };
    if let Command::Handler = command {
        // Bind before opening the catalog: the host probes the port from the start, and
        // connections wait in the backlog until the router serves them.
        let port = std::env::var(settings::CUSTOMHANDLER_PORT)
            .with_context(|| format!("{} is not set (the Functions host sets it)", settings::CUSTOMHANDLER_PORT))?;
        let port: u16 =
            port.trim().parse().with_context(|| format!("{}: '{port}' is not a port", settings::CUSTOMHANDLER_PORT))?;
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .with_context(|| format!("binding 127.0.0.1:{port}"))?;
        let catalog = Arc::new(config.open().await.context("opening the catalog")?);
        tracing::info!(port, "custom handler listening");
        let app = table_catalog::functions::handler_router(catalog);
        axum::serve(listener, app).with_graceful_shutdown(server::shutdown_signal()).await?;
        return Ok(ExitCode::SUCCESS);
    }
    let catalog = Arc::new(config.open().await.context("opening the catalog")?);
    if let Some(what) = single_partition_refuses(&catalog, &command) {
        bail!(
            "{what} is not supported in single-partition mode (catalog '{}'): there is no WAL, queue or jobs \
             table; every write is applied when acknowledged (docs/ARCHITECTURE.md, \"Single-partition mode\")",
            catalog.names().table
        );
    }
    match command {
        Command::Serve { listen, import, sweep_interval, scan_workers, queue_lease } => {
            // Bind before importing: a port already in use fails at once, not after the
            // import. Connections made meanwhile wait in the backlog until serving starts.
            let listener = tokio::net::TcpListener::bind(&listen).await.with_context(|| format!("binding {listen}"))?;
            if let Some(file) = import {
                import_file(&catalog, &file, None, import::DEFAULT_BATCH, false, Acks::Silent).await?;
            }
            // The bound address, so `--listen 127.0.0.1:0` reports the port it got.
            let address = listener.local_addr().map_or(listen, |a| a.to_string());
            let names = catalog.names();
            tracing::info!(%address, table = %names.table, wal = %names.wal_table, queue = %names.queue, backend = ?config.backend, "serving");
            eprintln!("table-catalog listening on http://{address} (catalog '{}'); Ctrl-C to stop", names.table);
            let opts = ServeOptions {
                sweep_interval: Duration::from_secs(sweep_interval.max(1)),
                scan_workers,
                worker: table_catalog::cli_support::dispatch::WorkerOptions {
                    lease: Duration::from_secs(queue_lease),
                    ..Default::default()
                },
                ..ServeOptions::default()
            };
            server::serve(catalog, listener, opts, server::shutdown_signal()).await?;
        }
        Command::Handler => {} // served above, before the catalog is opened
        Command::Import { file, batch, format, no_apply, print_acks, ack_gate } => {
            let format = format.map(|f| match f {
                FormatArg::Csv => Format::Csv,
                FormatArg::Jsonl => Format::JsonLines,
            });
            let acks = match (print_acks, ack_gate) {
                (false, _) => Acks::Silent,
                (true, false) => Acks::Print,
                (true, true) => Acks::Gated(stdin_lines()),
            };
            let summary = import_file(&catalog, &file, format, batch, no_apply, acks).await?;
            if summary.logged == 0 && summary.read > 0 {
                return Ok(ExitCode::FAILURE);
            }
        }
        Command::Query { filters, range, limit, allow_partial } => {
            let filter = parse_filters(&filters)?.range(range.row_from, range.row_to).allow_partial(allow_partial);
            let mut token: Option<String> = None;
            let mut printed = 0;
            // The first page is always asked for, so the catalog checks the limit (0 gets the
            // error HTTP answers 400 with); later pages ask for what is left, at most 1,000.
            loop {
                let page = catalog.query(&filter, limit.saturating_sub(printed).min(1000), token.as_deref()).await?;
                for r in page.records {
                    println!("{}", Value::Object(r.record));
                    printed += 1;
                }
                match page.continuation {
                    Some(t) if printed < limit => token = Some(t),
                    _ => break,
                }
            }
            if printed == 0 {
                eprintln!("no records match");
            }
        }
        Command::Insert { json, upsert } => {
            let record = parse_record(&json)?;
            let w = if upsert { catalog.upsert(record, true).await? } else { catalog.insert(record, true).await? };
            println!("{}", serde_json::to_string(&w)?);
        }
        Command::Replace { args, range } => {
            let Some((json, filters)) = args.split_last() else {
                bail!("replace: give FIELD=VALUE filters, then the record")
            };
            let record = parse_record(json)?;
            let w = catalog.replace(parse_filters(filters)?.range(range.row_from, range.row_to), record, true).await?;
            println!("{}", serde_json::to_string(&w)?);
        }
        Command::Delete { filters, range } => {
            let w = catalog.delete(parse_filters(&filters)?.range(range.row_from, range.row_to), true).await?;
            println!("{}", serde_json::to_string(&w)?);
        }
        Command::Recover => match catalog.recover().await? {
            DrainOutcome::Drained { applied } => println!("{{\"applied\":{applied}}}"),
            DrainOutcome::Partial { applied } => println!("{{\"applied\":{applied},\"more\":true}}"),
            DrainOutcome::Busy => eprintln!("another applier holds the WAL lease; it will apply the pending entries"),
        },
        Command::History { filter, limit } => {
            let (field, value) =
                filter.split_once('=').with_context(|| format!("filter '{filter}': expected field=value"))?;
            let c = &catalog;
            let printed = super::pages::print_pages(limit, |n, token| async move {
                let page = c.history(field, value, n, token.as_deref()).await?;
                Ok((page.history, page.continuation))
            })
            .await?;
            if printed == 0 {
                eprintln!("no history for {filter}");
            }
        }
        Command::Wal { action: super::args::WalAction::Show { id } } => {
            println!("{}", serde_json::to_string(&catalog.wal_entry_state(&id).await?)?)
        }
        Command::Status => println!("{}", serde_json::to_string(&catalog.status().await?)?),
        Command::Sweep => println!("{}", serde_json::to_string(&catalog.sweep().await?)?),
        Command::Dead { limit } => {
            // The WAL checks the limit (the first page is always asked for).
            let c = &catalog;
            super::pages::print_pages(limit, |n, token| async move {
                let page = c.dead(n, token.as_deref()).await?;
                Ok((page.entries, page.continuation))
            })
            .await?;
        }
        Command::Redrive { id } => {
            // stdout: HTTP's answer, `{redriven: [ids]}`; the CLI then applies them (stderr says how many).
            let moved = catalog.redrive(id.as_deref()).await?;
            let applied = catalog.recover().await?;
            println!("{}", serde_json::json!({"redriven": moved}));
            eprintln!("applied {} pending WAL entries", applied.applied());
        }
        Command::Verify(args) if args.parallel > 0 => {
            return super::jobs::run_parallel(catalog, table_catalog::jobs::JobKind::Verify, &args).await
        }
        Command::Repair(args) if args.parallel > 0 => {
            return super::jobs::run_parallel(catalog, table_catalog::jobs::JobKind::Repair, &args).await
        }
        Command::Verify(args) => return super::whole_table::verify(&catalog, &args).await,
        Command::Repair(args) => return super::whole_table::repair(&catalog, &args).await,
        Command::Jobs { action } => return super::jobs::run(catalog, action).await,
        Command::Index { action } => return super::index::run(catalog, action).await,
        Command::Rebuild { into, new_row_key, new_index_keys, new_hashed_keys, new_redact, segment, parallel } => {
            let mut params = serde_json::json!({ "into": into, "segment": segment });
            let lists = [("index_keys", new_index_keys), ("hashed_keys", new_hashed_keys), ("redact_keys", new_redact)];
            for (name, list) in lists {
                if let Some(list) = list {
                    params[name] = serde_json::json!(table_catalog::cli_support::schema::Schema::parse_list(&list));
                }
            }
            if let Some(f) = new_row_key {
                params["row_key"] = serde_json::json!(f);
            }
            return super::jobs::rebuild(catalog, params, parallel).await;
        }
        Command::Export { output, segment } => {
            return super::whole_table::export(&catalog, output.as_deref(), segment).await
        }
        #[cfg(feature = "bench")]
        Command::Bench(_) => {} // run above, without a catalog
    }
    Ok(ExitCode::SUCCESS)
}

/// The record argument of `insert` and `replace`: a JSON object.
fn parse_record(json: &str) -> Result<Record> {
    match serde_json::from_str::<Value>(json).context("the record is not valid JSON")? {
        Value::Object(r) => Ok(r),
        _ => bail!("the record must be a JSON object"),
    }
}

fn parse_filters(filters: &[String]) -> Result<Filter> {
    let mut fields = Vec::new();
    for f in filters {
        let (k, v) = f.split_once('=').with_context(|| format!("filter '{f}': expected field=value"))?;
        fields.push((k.to_string(), v.to_string()));
    }
    Ok(Filter::new(fields))
}

/// How an import reports acknowledgements (for the crash tests; hidden flags).
enum Acks {
    Silent,
    /// `acked N` on stdout after each batch.
    Print,
    /// Like `Print`, but each line waits for a line on stdin first (none: stop waiting).
    Gated(tokio::sync::mpsc::Receiver<()>),
}

/// One message per line of stdin, read on a plain thread (stdin reads block); the channel
/// closes at the end of input.
fn stdin_lines() -> tokio::sync::mpsc::Receiver<()> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::stdin().lock().lines() {
            if line.is_err() || tx.blocking_send(()).is_err() {
                return;
            }
        }
    });
    rx
}

/// Imports a file, streaming it, applying as it goes (unless `no_apply`), with a progress
/// counter and a summary.
async fn import_file(
    catalog: &Arc<Catalog>,
    file: &Path,
    format: Option<Format>,
    batch: usize,
    no_apply: bool,
    mut acks: Acks,
) -> Result<import::Summary> {
    let started = table_catalog::cli_support::env::now();
    let format = format.unwrap_or_else(|| Format::from_path(file));
    let mut rows = import::RowStream::open(file, format, &catalog.schema());
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} importing: {pos} records ({per_sec})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let worker =
        (!no_apply).then(|| tokio::spawn(server::run_worker(catalog.clone(), ServeOptions::default(), stop_rx)));
    let summary = async {
        let mut importer = import::Importer::new(catalog);
        loop {
            let chunk = rows.next_chunk(batch).await?;
            if chunk.is_empty() {
                return Ok::<_, table_catalog::Error>(importer.finish());
            }
            let done = importer.log(chunk).await?;
            bar.set_position(done as u64);
            if let Acks::Gated(gate) = &mut acks {
                if gate.recv().await.is_none() {
                    acks = Acks::Print;
                }
            }
            if !matches!(acks, Acks::Silent) {
                use std::io::Write as _;
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "acked {done}");
                let _ = out.flush();
            }
        }
    }
    .await;
    bar.finish_and_clear();
    let _ = stop_tx.send(true);
    if let Some(w) = worker {
        let _ = w.await;
    }
    let summary = summary?;
    let mut applied_note = "logged; apply pending (run `serve` or `recover`)".to_string();
    if !no_apply {
        let deadline = table_catalog::cli_support::env::now() + Duration::from_secs(600);
        loop {
            catalog.recover().await?;
            if catalog.status().await?.pending == 0 {
                break;
            }
            if table_catalog::cli_support::env::now() > deadline {
                bail!("the WAL did not drain within 10 minutes; another applier may be stuck (see `status`)");
            }
            table_catalog::cli_support::env::sleep(Duration::from_millis(200)).await;
        }
        applied_note = "applied to every index".to_string();
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "imported {} of {} records from {} in {secs:.2} s ({:.0} records/s), {}; {} rejected",
        summary.logged,
        summary.read,
        file.display(),
        summary.logged as f64 / secs.max(1e-9),
        applied_note,
        summary.rejected.len()
    );
    for r in summary.rejected.iter().take(20) {
        eprintln!("  row {}: {}", r.row, r.reason);
    }
    if summary.rejected.len() > 20 {
        eprintln!("  ... and {} more", summary.rejected.len() - 20);
    }
    Ok(summary)
}
