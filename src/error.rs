//! The catalog's error type: what callers branch on, with HTTP status mapping done in
//! [`crate::http`]. Messages name the offending field and the limit, and never contain
//! credentials.

pub use crate::keys::KeyError;
use crate::store::StoreError;

/// Errors of catalog operations. `Clone`, so one failure can be reported to every caller
/// that shared a group commit.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Bad input: the request can never succeed as sent. Nothing was written.
    #[error("{0}")]
    Invalid(String),
    /// The input is over a size limit (record, body, batch). Nothing was written.
    #[error("{0}")]
    TooLarge(String),
    /// The named thing does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The write conflicts with the current state (e.g. insert of an existing record).
    #[error("{0}")]
    Conflict(String),
    /// The catalog was created with another schema (index keys / row key).
    #[error("{0}")]
    SchemaMismatch(String),
    /// Configuration is missing or invalid.
    #[error("configuration: {0}")]
    Config(String),
    /// A blocking wait ended before the write was applied; the write stays durable.
    #[error("{0}")]
    Timeout(String),
    /// The request cannot be answered as asked right now (a consistent read with a backlog
    /// to apply first, or a write while this process's queue of writes waiting to be logged
    /// is full: `WalOptions::max_queued_writes`); retry after `retry_after_secs`. Nothing
    /// was written.
    #[error("{message}")]
    Busy {
        /// What is in the way.
        message: String,
        /// Seconds to wait before retrying (HTTP `Retry-After`).
        retry_after_secs: u64,
    },
    /// The lookup names an index that is still being backfilled ([`crate::indexes`]); the
    /// message says how far the backfill is. Pass `allow_partial` to read it anyway.
    #[error("{0}")]
    IndexNotReady(String),
    /// The catalog's schema changed (to this version) while the write was being logged;
    /// nothing was written. The catalog re-reads the schema and validates the write again.
    #[error(
        "the catalog's schema changed to version {0} while the write was being logged; nothing was written, retry"
    )]
    SchemaChanged(u64),
    /// The operation does not exist in the catalog's mode (history, index changes, jobs and
    /// the WAL's reads in single-partition mode: docs/ARCHITECTURE.md, "Single-partition
    /// mode"). HTTP 409 `not_supported_in_single_partition_mode`. Nothing was done.
    #[error("{0}")]
    NotSupported(String),
    /// The storage backend failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Error {
    /// True when retrying may succeed (transient storage failures).
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Store(e) if e.is_transient())
    }

    /// True when the failure lies in the input itself, so the same input can never succeed:
    /// it is invalid or too large, or storage refused it as breaking a service rule (HTTP
    /// 400, [`StoreError::InvalidInput`]). Transient failures and faults of the environment
    /// (a missing table, 403, authentication, anything unexpected) are not: they can go away
    /// while the input stays the same. The apply engine moves an entry to `dead` on input
    /// faults only and retries everything else (docs/ARCHITECTURE.md, "Dead entries").
    pub fn is_input_fault(&self) -> bool {
        match self {
            Error::Invalid(_) | Error::TooLarge(_) => true,
            Error::Store(e) => e.is_input_fault(),
            _ => false,
        }
    }

    /// Shorthand for [`Error::Invalid`].
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::Invalid(msg.into())
    }
}

impl From<KeyError> for Error {
    fn from(e: KeyError) -> Self {
        Error::Invalid(e.to_string())
    }
}

/// Result of catalog operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;
