//! What the HTTP API's modules share: the handlers' state and the API's limits.

use std::sync::Arc;

use crate::catalog::Catalog;

/// Largest body of a single-record request, in bytes.
pub const MAX_RECORD_BODY: usize = 1024 * 1024;
/// Largest body of a batch request, in bytes.
pub const MAX_BATCH_BODY: usize = 32 * 1024 * 1024;
/// Default page size of `GET /api/records`.
pub const DEFAULT_LIMIT: usize = 100;

/// Shared state of the handlers.
pub type AppState = Arc<Catalog>;
