//! TableCatalog: a multi-index catalog over Azure Table Storage with a crash-safe
//! write-ahead log.
#![warn(missing_docs)]

pub mod error;
pub mod functions;
pub mod keys;
pub mod record;
pub mod schema;
pub mod settings;
pub mod store;

pub use error::{Error, Result};
pub mod faults;
pub mod query;
pub mod wal;
pub mod catalog;
pub mod config;
pub mod messages;
pub use catalog::{Catalog, CatalogOptions};
pub use config::Config;
pub mod http;
pub mod server;
pub mod import;
pub mod verify;
