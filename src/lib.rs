//! TableCatalog: a multi-index catalog over Azure Table Storage with a crash-safe
//! write-ahead log.
#![warn(missing_docs)]

pub mod store;
pub mod functions;
