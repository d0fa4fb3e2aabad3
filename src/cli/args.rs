//! The command line's arguments (clap): the catalog flags and the commands, with the
//! settings they fall back to.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use table_catalog::cli_support::schema::Schema;
use table_catalog::cli_support::settings;
use table_catalog::cli_support::wal::shard::{DEFAULT_SHARDS, MAX_SHARDS};
use table_catalog::config::{Backend, Config, Mode};
use table_catalog::store::Durability;

#[cfg(feature = "bench")]
use super::bench;
use super::scan_args::{parse_segment, ScanArgs};
use super::{index, jobs};

/// TableCatalog: look records up by any of their identifiers, on Azure Table Storage or an
/// embedded store, with crash-safe multi-index writes.
#[derive(Debug, Parser)]
#[command(name = "table-catalog", version, about)]
pub struct Cli {
    #[command(flatten)]
    pub catalog: CatalogArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Which catalog, and where. The storage connection string is read from
/// AZURE_STORAGE_CONNECTION_STRING (or AzureWebJobsStorage) only, never from a flag, so it
/// does not show in process listings; without one the embedded store is used.
#[derive(Debug, Args)]
pub struct CatalogArgs {
    /// Catalog table name.
    #[arg(long, env = settings::NAME, default_value = settings::DEFAULT_NAME, global = true)]
    pub name: String,
    /// Indexed fields, comma-separated (e.g. icao,iata,lid). Optional once the catalog exists.
    #[arg(long, env = settings::INDEX_KEYS, global = true)]
    pub index_keys: Option<String>,
    /// The field that starts the RowKey (sort order). Optional once the catalog exists.
    #[arg(long, env = settings::ROW_KEY, global = true)]
    pub row_key: Option<String>,
    /// Index fields keyed by an HMAC of their value instead of the value, comma-separated
    /// (e.g. ssn): no key holds them in plaintext; lookups stay exact. Needs the secret in
    /// TABLE_CATALOG_HASH_KEY (environment only). Optional once the catalog exists.
    #[arg(long, env = settings::HASHED_KEYS, global = true)]
    pub hashed_keys: Option<String>,
    /// Hashed fields that records hold as `hmac-sha256:<hex>` instead of the value.
    #[arg(long = "redact", env = settings::REDACT_KEYS, global = true)]
    pub redact_keys: Option<String>,
    /// WAL table name [default: {name}wal].
    #[arg(long, env = settings::WAL_NAME, global = true)]
    pub wal_name: Option<String>,
    /// Apply queue name [default: {name}-apply].
    #[arg(long, env = settings::QUEUE, global = true)]
    pub queue: Option<String>,
    /// Folder of the embedded store.
    #[arg(long, env = settings::LOCAL_PATH, default_value = settings::DEFAULT_LOCAL_PATH, global = true)]
    pub local_path: PathBuf,
    /// Embedded store durability: `full` fsyncs every commit, `process` survives a killed
    /// process but not an OS crash.
    #[arg(long, value_enum, default_value = "full", global = true)]
    pub durability: DurabilityArg,
    /// Seconds an applier lease lasts; after a crash, another process takes over the WAL
    /// once its lease expires.
    #[arg(long, default_value_t = 60, global = true)]
    pub lease_secs: u64,
    /// WAL shards new writes are spread over (1-64). The catalog keeps the largest count it
    /// was ever opened with; a smaller value has no effect.
    #[arg(long, env = settings::WAL_SHARDS, default_value_t = DEFAULT_SHARDS, value_parser = parse_shards, global = true)]
    pub wal_shards: u16,
    /// Record every applied change in the table {name}history (on/off).
    #[arg(long, env = settings::HISTORY, default_value = "off", value_parser = parse_history, action = clap::ArgAction::Set, global = true)]
    pub history: bool,
    /// History retention: remove rows older than this many days (1-36500) [default: keep].
    #[arg(long, env = settings::HISTORY_DAYS, global = true)]
    pub history_days: Option<u32>,
    /// History retention: keep about this many rows per record (1-1000000) [default: keep].
    #[arg(long, env = settings::HISTORY_MAX, global = true)]
    pub history_max: Option<u32>,
    /// The catalog's mode, chosen when it is created: `wal` (one partition per indexed
    /// value, write-ahead log) or `single-partition` (every row in the partition --tenant,
    /// each write one atomic entity group transaction; README.md, "Choosing a mode")
    /// [default: TABLE_CATALOG_MODE, else wal].
    // Not `env = ..`: the Functions app lists the setting empty, which clap would refuse.
    #[arg(long, value_enum, global = true)]
    pub mode: Option<ModeArg>,
    /// The tenant key of a single-partition catalog: the PartitionKey of its rows.
    #[arg(long, env = settings::TENANT, global = true)]
    pub tenant: Option<String>,
}

/// `--mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    /// One partition per indexed value, with the write-ahead log (the default).
    Wal,
    /// Every row in one partition (--tenant), each write one entity group transaction.
    SinglePartition,
}

/// Parses the history switch, naming the setting on error.
fn parse_history(value: &str) -> std::result::Result<bool, String> {
    table_catalog::history::parse_switch(settings::HISTORY, value).map_err(|e| e.to_string())
}

/// Parses a WAL shard count (1..=[`MAX_SHARDS`]), naming the setting and the limit on error.
fn parse_shards(value: &str) -> std::result::Result<u16, String> {
    let n: u16 = value
        .trim()
        .parse()
        .map_err(|_| format!("{}: '{value}' is not a number of WAL shards (1..={MAX_SHARDS})", settings::WAL_SHARDS))?;
    table_catalog::cli_support::wal::shard::check_count(settings::WAL_SHARDS, n).map_err(|e| e.to_string())
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum DurabilityArg {
    Full,
    Process,
}

// Parsed once per run: the size of the `bench sim` arguments does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the whole system: HTTP API, queue worker and sweeper.
    Serve {
        /// Address to listen on (port 0: any free port; the bound address is printed on stderr).
        #[arg(long, env = settings::LISTEN, default_value = settings::DEFAULT_LISTEN)]
        listen: String,
        /// Import this file (CSV or JSON lines) before serving (after binding the address, so
        /// an address in use fails before the import).
        #[arg(long)]
        import: Option<PathBuf>,
        /// Seconds between sweeps.
        #[arg(long, default_value_t = 30)]
        sweep_interval: u64,
        /// Job work items (verify, repair) handled at once from the scan queue; 0 = none.
        #[arg(long, default_value_t = 4)]
        scan_workers: usize,
        /// Seconds a received queue message stays invisible while it is handled: after a
        /// crash, its redelivery waits this long.
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
        queue_lease: u64,
    },
    /// Run as an Azure Functions custom handler on 127.0.0.1:$FUNCTIONS_CUSTOMHANDLER_PORT.
    Handler,
    /// Import a CSV (with header) or JSON-lines file through the batch write path.
    Import {
        /// The file.
        #[arg(long)]
        file: PathBuf,
        /// Records per WAL append.
        #[arg(long, default_value_t = table_catalog::cli_support::import::DEFAULT_BATCH)]
        batch: usize,
        /// Input format [default: from the file extension].
        #[arg(long, value_enum)]
        format: Option<FormatArg>,
        /// Log only; leave applying to a running `serve` or to the sweeper.
        #[arg(long)]
        no_apply: bool,
        /// Print `acked N` on stdout each time the first N rows are durable (for crash tests).
        #[arg(long, hide = true)]
        print_acks: bool,
        /// With --print-acks: before each `acked` line, wait for one line on stdin (end of input
        /// stops the waiting), so a crash test can stop the import after exactly N
        /// acknowledgements, while it is still logging.
        #[arg(long, hide = true, requires = "print_acks")]
        ack_gate: bool,
    },
    /// Print the records matching field=value filters, one JSON object per line.
    Query {
        /// Filters, e.g. icao=KJFK (all must match).
        #[arg(required = true)]
        filters: Vec<String>,
        #[command(flatten)]
        range: RowRangeArgs,
        /// Most records to print (1 or more; read in pages of up to 1,000).
        #[arg(long, default_value_t = 1000)]
        limit: usize,
        /// Read an index that is still backfilling: the rows it has so far, which miss records
        /// written before it was added and not yet backfilled (HTTP: allow_partial=true).
        #[arg(long)]
        allow_partial: bool,
    },
    /// Insert one record (a JSON object) and apply it.
    Insert {
        /// The record as JSON.
        json: String,
        /// Overwrite a record with the same identity.
        #[arg(long)]
        upsert: bool,
    },
    /// Replace the records a filter matches with one record (HTTP `PUT /api/records?FILTERS`):
    /// the matched records are removed and the record is stored, as one WAL entry.
    /// `table-catalog replace iata=JFK '{"icao":"KJFK",...}'`.
    Replace {
        /// Filters, e.g. iata=JFK, then the new record as a JSON object (the last argument).
        #[arg(required = true, num_args = 2.., value_names = ["FIELD=VALUE", "JSON"])]
        args: Vec<String>,
        #[command(flatten)]
        range: RowRangeArgs,
    },
    /// Delete the records matching field=value filters and apply it (HTTP
    /// `DELETE /api/records?FILTERS`).
    Delete {
        /// Filters, e.g. iata=JFK.
        #[arg(required = true)]
        filters: Vec<String>,
        #[command(flatten)]
        range: RowRangeArgs,
    },
    /// Apply every pending WAL entry now.
    Recover,
    /// Print pending entries, oldest pending age, checkpoint and poison count (JSON).
    Status,
    /// Print the history of the records with FIELD=VALUE, newest first, one JSON object per
    /// line (needs TABLE_CATALOG_HISTORY=on).
    History {
        /// The record's identifier, e.g. icao=KJFK.
        filter: String,
        /// Most changes to print.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Run one sweep and print its report (JSON).
    Sweep,
    /// Walk the whole catalog table (prefix scan) and check that every record's index rows
    /// agree: each finding as a JSON line on stdout, the counts as JSON on stderr; exit
    /// status 3 when there are findings.
    Verify(ScanArgs),
    /// Re-log the latest state of every record `verify` finds disagreeing through the WAL
    /// (never editing rows directly), then apply; prints what it did (JSON).
    Repair(ScanArgs),
    /// Write every live record once as JSON lines (readable by `import`): a serial scan in
    /// this process (`GET /api/export` streams it over HTTP).
    Export {
        /// Write to this file [default: stdout].
        #[arg(long)]
        output: Option<PathBuf>,
        /// Entities per scan query (1-1000).
        #[arg(long, default_value_t = table_catalog::cli_support::scan::MAX_SEGMENT, value_parser = parse_segment)]
        segment: usize,
    },
    /// Copy every record into a new catalog with another schema, as a job: change the row
    /// key, index fields or hashed fields, or rotate the hash secret (set
    /// TABLE_CATALOG_REBUILD_HASH_KEY); then apply and verify the new catalog (exit 3 when it
    /// does not verify clean).
    Rebuild {
        /// Name of the new catalog.
        #[arg(long)]
        into: String,
        /// The new row-key (sort) field [default: the current one].
        #[arg(long = "new-row-key")]
        new_row_key: Option<String>,
        /// The new index fields, comma-separated [default: the current ones].
        #[arg(long = "new-index-keys")]
        new_index_keys: Option<String>,
        /// The new hashed index fields, comma-separated [default: the current ones].
        #[arg(long = "new-hashed-keys")]
        new_hashed_keys: Option<String>,
        /// The new redacted fields, comma-separated [default: the current ones].
        #[arg(long = "new-redact")]
        new_redact: Option<String>,
        /// Entities per scan query (1-1000).
        #[arg(long, default_value_t = table_catalog::cli_support::scan::MAX_SEGMENT)]
        segment: usize,
        /// Workers in this process (serve and Functions workers may join).
        #[arg(long, default_value_t = 4)]
        parallel: usize,
    },
    /// Whole-table jobs (verify, repair) run by many workers: list, show, start, cancel,
    /// resume, or work on one here.
    Jobs {
        #[command(subcommand)]
        action: jobs::JobsAction,
    },
    /// Add, drop and list indexes of a live catalog (online: writes go on).
    Index {
        #[command(subcommand)]
        action: index::IndexAction,
    },
    /// List the WAL's dead entries (entries that can never be applied), one JSON object per
    /// line with the reason each died.
    Dead {
        /// Most entries to print.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
    },
    /// WAL entries: `wal show ID` prints where one is, as `GET /api/wal/{id}` does.
    Wal {
        #[command(subcommand)]
        action: WalAction,
    },
    /// Move dead WAL entries back to pending (all, or one with --id), then apply them; each
    /// keeps its id, so writes acknowledged after it still win.
    Redrive {
        /// The WAL id of one dead entry [default: every dead entry].
        #[arg(long)]
        id: Option<String>,
    },
    /// Benchmarks: lookups and writes against running servers, a simulated-Azure scale-out run,
    /// a synthetic catalog for the whole-table runs (see docs/BENCHMARKS.md). Only in builds
    /// with the `bench` feature (not the packaged Functions binary).
    #[cfg(feature = "bench")]
    Bench(bench::BenchArgs),
}

/// `wal` subcommands.
#[derive(Debug, Subcommand)]
pub enum WalAction {
    /// Where WAL entry ID is, as JSON `{id, state, detail}` (the answer of
    /// `GET /api/wal/{id}`): pending, applied (its shard's checkpoint), dead, or unknown
    /// (below a checkpoint: applied if it was ever logged). Exit status 1 for an id that is
    /// not pending and above every checkpoint.
    Show {
        /// The WAL id a write returned, e.g. 2026-11-26T10:00:00.000000_0f8fad5b-d9cb-469f-a165-70867728950e.
        id: String,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum FormatArg {
    Csv,
    Jsonl,
}

impl CatalogArgs {
    /// The catalog configuration: flags over environment. Errors: `--mode single-partition`
    /// without `--tenant`.
    pub fn config(&self) -> anyhow::Result<Config> {
        let mut c = Config::from_env();
        c.name = self.name.clone();
        c.index_keys = self.index_keys.as_deref().map(Schema::parse_list);
        c.row_key = self.row_key.clone();
        c.hashed_keys = self.hashed_keys.as_deref().map(Schema::parse_list);
        c.redact_keys = self.redact_keys.as_deref().map(Schema::parse_list);
        c.wal_name = self.wal_name.clone();
        c.queue = self.queue.clone();
        if let Backend::Local(_) = c.backend {
            c.backend = Backend::Local(self.local_path.clone());
        }
        c.options.wal.lease_duration = std::time::Duration::from_secs(self.lease_secs.max(1));
        c.options.wal.shards = self.wal_shards;
        c.options.history.enabled = self.history;
        c.options.history.keep_days = self.history_days;
        c.options.history.max_per_record = self.history_max;
        c.durability = match self.durability {
            DurabilityArg::Full => Durability::Full,
            DurabilityArg::Process => Durability::Process,
        };
        // The flags over TABLE_CATALOG_MODE (read by `Config::from_env`, an empty value
        // meaning unset) and TABLE_CATALOG_TENANT.
        let tenant = self.tenant.as_deref().filter(|t| !t.trim().is_empty());
        let from_env = std::env::var(settings::MODE).ok().filter(|m| !m.trim().is_empty());
        let (setting, name) = match self.mode {
            Some(ModeArg::Wal) => ("--mode", Some("wal".to_string())),
            Some(ModeArg::SinglePartition) => ("--mode", Some("single-partition".to_string())),
            None => (settings::MODE, from_env),
        };
        if let Some(name) = name {
            c = c.mode(Mode::parse(setting, &name, tenant)?);
        }
        Ok(c)
    }
}

/// The sort-value range of a filter (`--row-from`, `--row-to`), shared by `query`, `replace`
/// and `delete`.
#[derive(Debug, Args)]
pub struct RowRangeArgs {
    /// Smallest sort value.
    #[arg(long)]
    pub row_from: Option<String>,
    /// Largest sort value.
    #[arg(long)]
    pub row_to: Option<String>,
}
