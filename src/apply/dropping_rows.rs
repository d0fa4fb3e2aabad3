//! The rows an applier wrote in partitions of dropping indexes and has not checked yet
//! ([`DroppingRows`]; the rule that notes and settles them is in `super::dropping`).

use std::collections::BTreeSet;
use std::sync::Mutex;

/// Rows written in partitions of dropping indexes and not yet checked: (PartitionKey, RowKey).
#[derive(Debug, Default)]
pub(crate) struct DroppingRows(pub(super) Mutex<BTreeSet<(String, String)>>);
