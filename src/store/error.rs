//! Errors of a storage backend ([`StoreError`], [`StoreResult`]) and the errors every
//! backend answers the same way (a missing table, queue or message, an existing entity).

/// Errors of a storage backend, reduced to what callers branch on. Backend details are in
/// the message, which never contains credentials.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreError {
    /// The entity, table, queue or message does not exist (HTTP 404).
    #[error("not found: {0}")]
    NotFound(String),
    /// An insert found the entity already there (HTTP 409 EntityAlreadyExists).
    #[error("already exists: {0}")]
    AlreadyExists(String),
    /// An `If-Match` ETag or a pop receipt no longer matches (HTTP 412 / 400 PopReceiptMismatch).
    #[error("precondition failed: {0}")]
    PreconditionFailed(String),
    /// One operation of an entity group transaction failed; nothing of the batch was written.
    #[error("batch operation {index} failed: {source}")]
    BatchFailed {
        /// Zero-based index of the failing operation.
        index: usize,
        /// What that operation hit.
        source: Box<StoreError>,
    },
    /// The request broke a service rule (bad key, too many properties, too large, ...).
    #[error("invalid request: {0}")]
    InvalidInput(String),
    /// A transient failure (HTTP 408/429/500/503, timeout, connection reset). Retrying may
    /// succeed; a write that failed this way may or may not have been committed.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// Anything else (authentication, unexpected responses).
    #[error("storage error: {0}")]
    Other(String),
}

impl StoreError {
    /// True when retrying the same call may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Unavailable(_) => true,
            StoreError::BatchFailed { source, .. } => source.is_transient(),
            _ => false,
        }
    }

    /// True when the request itself broke a service rule (HTTP 400), so sending it again
    /// can never succeed; see [`crate::Error::is_input_fault`].
    pub fn is_input_fault(&self) -> bool {
        match self {
            StoreError::InvalidInput(_) => true,
            StoreError::BatchFailed { source, .. } => source.is_input_fault(),
            _ => false,
        }
    }
}

/// Result of a storage call.
pub type StoreResult<T> = Result<T, StoreError>;

/// The error for a message that is gone (deleted, or never there: MessageNotFound).
pub(crate) fn message_not_found(id: &str) -> StoreError {
    StoreError::NotFound(format!("message {id} not found (MessageNotFound)"))
}

/// The error for an operation on a table that does not exist (TableNotFound).
pub(crate) fn table_not_found(table: &str) -> StoreError {
    StoreError::NotFound(format!("table '{table}' does not exist (TableNotFound)"))
}

/// The error for an operation on a queue that does not exist (QueueNotFound).
pub(crate) fn queue_not_found(queue: &str) -> StoreError {
    StoreError::NotFound(format!("queue '{queue}' does not exist (QueueNotFound)"))
}

/// The error for an insert that found the entity already there (EntityAlreadyExists).
pub(crate) fn already_exists() -> StoreError {
    StoreError::AlreadyExists("insert: the entity already exists (EntityAlreadyExists)".into())
}
