//! How a whole-table command walks the table ([`ScanArgs`]), shared by the commands that scan,
//! and the parser of its `--segment`.

use clap::Args;

/// How a whole-table command walks the table.
#[derive(Debug, Clone, Args)]
pub struct ScanArgs {
    /// Entities per scan query (1-1000).
    #[arg(long, default_value_t = table_catalog::cli_support::scan::MAX_SEGMENT, value_parser = parse_segment)]
    pub segment: usize,
    /// Rows checked at once (each reads at most one row per index field).
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Run as a job (the scan split into work items on the scan queue) with this many
    /// workers in this process; other workers (`serve`, Functions) may join. 0: a serial
    /// scan in this process.
    #[arg(long, default_value_t = 0)]
    pub parallel: usize,
}

/// Parses a scan segment (1..=1000 entities per query), naming the flag and the limit on
/// error.
pub(super) fn parse_segment(value: &str) -> std::result::Result<usize, String> {
    let max = table_catalog::cli_support::scan::MAX_SEGMENT;
    match value.trim().parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("--segment: '{value}' is not a number of entities per query (1..={max})")),
    }
}
