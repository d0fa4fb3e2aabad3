//! The table and queue names of one catalog, checked against Azure's naming rules.
//!
//! Its own module so that both the catalog and its configuration can use it without
//! importing each other: `config` depends on `catalog`, never the reverse.

use crate::error::{Error, Result};
use crate::settings;

/// Suffix of the history table name.
pub const HISTORY_SUFFIX: &str = "history";

/// Table and queue names of one catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// Catalog table.
    pub table: String,
    /// WAL table (default `{table}wal`).
    pub wal_table: String,
    /// Apply queue (default `{table lowercased}-apply`).
    pub queue: String,
    /// Poison queue (`{queue}-poison`).
    pub poison_queue: String,
    /// Queue of job work items (`{queue}-scan`; see [`crate::jobs`]).
    pub scan_queue: String,
    /// Its poison queue (`{queue}-scan-poison`).
    pub scan_poison_queue: String,
    /// History table (`{table}history`), used when the catalog keeps history
    /// ([`crate::history`]); checked by [`Names::check_history_table`].
    pub history_table: String,
}

/// Suffix of the scan queue's name.
pub const SCAN_SUFFIX: &str = "-scan";

/// Checks an Azure table name: alphanumeric, 3-63 characters, starting with a letter.
pub fn validate_table_name(setting: &str, name: &str) -> Result<()> {
    if crate::store::check_table_name(name).is_ok() {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "{setting}: '{name}' is not a valid table name (letters and digits, 3-63 characters, starting with a letter)"
        )))
    }
}

/// Checks an Azure queue name: lowercase letters, digits and single dashes, 3-63
/// characters, starting and ending with a letter or digit. The scan queue's poison queue
/// adds 12 (`-scan-poison`), so 51 is the longest usable name.
pub fn validate_queue_name(setting: &str, name: &str) -> Result<()> {
    const LONGEST: usize = 63 - SCAN_SUFFIX.len() - settings::POISON_SUFFIX.len();
    if name.len() <= LONGEST && crate::store::check_queue_name(name).is_ok() {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "{setting}: '{name}' is not a valid queue name (lowercase letters, digits and single dashes, 3-{LONGEST} characters so that '{name}{SCAN_SUFFIX}{}' fits)",
            settings::POISON_SUFFIX
        )))
    }
}

impl Names {
    /// Names for catalog `table`, with optional explicit WAL table and queue names.
    pub fn new(table: &str, wal_table: Option<&str>, queue: Option<&str>) -> Result<Names> {
        validate_table_name(settings::NAME, table)?;
        let wal_table = wal_table.map_or_else(|| format!("{table}wal"), String::from);
        validate_table_name(settings::WAL_NAME, &wal_table)?;
        if wal_table.eq_ignore_ascii_case(table) {
            return Err(Error::Config(format!(
                "{}: the WAL table must differ from the catalog table",
                settings::WAL_NAME
            )));
        }
        let queue = queue.map_or_else(|| format!("{}-apply", table.to_lowercase()), String::from);
        validate_queue_name(settings::QUEUE, &queue)?;
        let poison_queue = format!("{queue}{}", settings::POISON_SUFFIX);
        let scan_queue = format!("{queue}{SCAN_SUFFIX}");
        let scan_poison_queue = format!("{scan_queue}{}", settings::POISON_SUFFIX);
        let history_table = format!("{table}{HISTORY_SUFFIX}");
        Ok(Names {
            table: table.to_string(),
            wal_table,
            queue,
            poison_queue,
            scan_queue,
            scan_poison_queue,
            history_table,
        })
    }

    /// Checks the history table name (a catalog name of more than 56 characters leaves no
    /// room for the suffix). Only a catalog that keeps history needs it.
    pub fn check_history_table(&self) -> Result<()> {
        if crate::store::check_table_name(&self.history_table).is_ok() {
            return Ok(());
        }
        Err(Error::Config(format!(
            "{}: '{}' is too long for history: the history table '{}' must be at most 63 characters (catalog names up to {} characters)",
            settings::NAME,
            self.table,
            self.history_table,
            63 - HISTORY_SUFFIX.len()
        )))
    }
}
