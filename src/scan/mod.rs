//! The distributed prefix scanner of seed 004 ("How to run a distributed scan of Azure Table
//! Storage", Joel Verhagen; NuGet Insights' `TablePrefixScanner`): every entity of a table,
//! found by small independent steps that can travel in queue messages and run on many
//! workers at once, instead of one serial walk over continuation tokens.
//!
//! The Table service can answer `PartitionKey gt X` cheaply, so the scanner discovers the
//! PartitionKey prefixes of an unknown table recursively, like a trie:
//! - a [`Step::Prefix`] runs one query of at most `segment` entities over a PartitionKey range
//!   whose keys all start with its prefix. If the page is the whole range, the range is done.
//!   Otherwise the last entity `(pk, rk)` splits the rest in three disjoint ranges: the rest of
//!   partition `pk` ([`Step::Partition`]), the subtree of the next prefix `c` = prefix + the
//!   next character of `pk` (`pk < PK <= c + U+FFFF`), and the rest of the range after that
//!   subtree (`PK > c + U+FFFF`), which the parent continues with;
//! - a [`Step::Partition`] reads one page of one partition after a RowKey; a larger
//!   partition continues in a further step (the position is the RowKey, never a token).
//!
//! U+FFFF is the largest UTF-16 code unit, and the service orders keys by UTF-16 code units
//! (an astral character, a surrogate pair, counts as one "next character" but sorts below
//! U+E000), so `c + U+FFFF` bounds every key starting with `c` except those continuing with
//! U+FFFF itself, which fall into the parent's remaining range: nothing is lost, they are only
//! not split further. Upper bounds are inclusive (`PartitionKey le`): with an exclusive one,
//! a key exactly equal to `c + U+FFFF` would fall between a subtree and its parent's
//! remaining range. (NuGet Insights uses `lt`, and leaves such keys and keys starting with
//! U+FFFF unreachable.) `%XX` escapes of our keys need nothing special: `%` is an ordinary
//! character that sorts below digits and letters.
//!
//! Every entity of a static table is returned by exactly one step of the tree that starts at
//! [`Step::root`]; sibling ranges never overlap, so steps can run in any order, concurrently
//! and more than once (a redelivered message repeats its step's entities, so consumers must be
//! idempotent). A table that changes during the scan yields every entity that existed
//! throughout, once; entities written meanwhile may or may not appear.
//!
//! [`step`] runs one step (the unit the job system distributes); [`serial`] walks the whole
//! tree in one process.

pub mod serial;
pub mod step;
#[cfg(test)]
mod tests;

pub use serial::{entities, walk};
pub use step::{run_step, Step, StepOutput, MAX_SEGMENT, SENTINEL};
