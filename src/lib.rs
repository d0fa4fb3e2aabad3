//! TableCatalog: a multi-index catalog over Azure Table Storage with a crash-safe
//! write-ahead log.
#![warn(missing_docs)]

pub mod env;
pub mod error;
pub mod functions;
pub mod hashed;
pub mod keys;
pub mod record;
pub mod schema;
pub mod settings;
pub mod store;

pub use error::{Error, Result};
pub mod apply;
pub mod catalog;
pub mod config;
pub mod dispatch;
pub mod faults;
pub mod hinter;
pub mod history;
pub mod messages;
pub mod metrics;
pub mod names;
pub mod query;
pub mod scan;
pub mod wal;
pub use catalog::{Catalog, CatalogOptions};
pub use config::Config;
pub mod export;
pub mod http;
pub mod import;
pub mod indexes;
pub mod jobs;
pub mod repair;
pub mod server;
pub mod verify;

/// README.md, so that its Rust example (the "Library" section) compiles as a doctest; its
/// command blocks run in `tests/suite/readme.rs`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
