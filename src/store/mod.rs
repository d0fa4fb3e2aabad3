//! The storage abstraction: exactly the Azure Table and Queue operations the engine needs.
//!
//! Two backends implement it: `local` ([`LocalStore`]: embedded SQLite, the default) and `azure`
//! ([`AzureStore`]: Azure Storage through `azure_data_tables` / `azure_storage_queues`). Both must behave
//! identically; the conformance suite in `conformance` is the judge, and any difference it
//! finds is a bug in `local`. A third, `mem` ([`MemStore`]: in memory, deterministic), serves the
//! simulator and fast tests and passes the same suite.
//!
//! Semantics follow the Azure Table service REST API
//! (learn.microsoft.com/rest/api/storageservices/, "Understanding the Table service data model",
//! "Query timeout and pagination", "Performing entity group transactions"):
//! - entities are addressed by (PartitionKey, RowKey); keys are validated by `crate::keys`
//!   before they reach a backend, so backends may assume valid keys;
//! - every write returns a new opaque [`ETag`]; conditional writes compare it;
//! - partition queries return at most [`MAX_PAGE`] entities in RowKey order plus a continuation
//!   token; a page may be short (even empty) and still carry a token;
//! - an entity group transaction (EGT) holds at most [`MAX_BATCH_OPS`] operations on one
//!   partition and is atomic.
//!
//! Everything a user of the library names is re-exported here; the modules below are
//! `pub(crate)`, so none of them is public.

pub(crate) mod azure;
pub(crate) mod bulk_delete;
#[cfg(any(test, feature = "testing"))]
pub(crate) mod conformance;
pub(crate) mod counting;
pub(crate) mod error;
#[cfg(any(test, feature = "testing"))]
pub(crate) mod fault;
pub(crate) mod key_rules;
pub(crate) mod layer;
pub(crate) mod local;
pub(crate) mod mem;
pub(crate) mod op;
pub(crate) mod page;
pub(crate) mod pager;
pub(crate) mod queue;
#[cfg(any(test, feature = "testing", feature = "bench"))]
pub(crate) mod sim;
pub(crate) mod table;
pub(crate) mod value;

pub use azure::identity::{IdentityConnection, ManagedIdentityCredential};
pub use azure::{AzureStore, CredentialKind, RetryPolicy, CONNECTION_STRING_VARS, DEV_ACCOUNT, DEV_ACCOUNT_KEY};
pub use counting::{CountingStore, OpCounts, Outcome, RequestCounts, RequestSnapshot};
pub use error::{StoreError, StoreResult};
pub use layer::{Call, Layer, LayeredStore, Returned};
pub use local::{Durability, LocalStore, WriteStats};
pub use mem::MemStore;
pub use op::OpKind;
pub use page::{Page, PartitionRange, RowRange, MAX_PAGE};
pub use queue::{
    check_queue_name, validate_message, validate_receive, QueueStore, ReceivedMessage, Store, MAX_MESSAGE_BYTES,
    MAX_RECEIVE,
};
pub use table::{check_table_name, validate_batch, BatchOp, IfMatch, TableStore, MAX_BATCH_BYTES, MAX_BATCH_OPS};
pub use value::{
    check_entity, ETag, Entity, Properties, Value, MAX_BINARY_BYTES, MAX_ENTITY_BYTES, MAX_NAME_CHARS, MAX_PROPERTIES,
    MAX_STRING_UNITS,
};
