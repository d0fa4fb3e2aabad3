//! One step of the prefix scan: its description ([`Step`], serialisable so it can travel in
//! a queue message) and how it runs ([`run_step`]).

use std::cmp::Ordering;
use std::fmt;

use futures::stream::BoxStream;
use futures::TryStreamExt;
use serde::{Deserialize, Serialize};

use crate::keys::cmp_utf16;
use crate::store::{pager, Entity, Page, PartitionRange, RowRange, StoreError, StoreResult, TableStore, MAX_PAGE};

/// Most entities one step returns: one query page (Azure: 1,000 per response).
pub const MAX_SEGMENT: usize = MAX_PAGE;

/// The largest UTF-16 code unit: `prefix + SENTINEL` is at least every key starting with
/// `prefix` that does not continue with U+FFFF itself (seed 004 writes it `'D\uffff'`).
pub const SENTINEL: char = '\u{ffff}';

/// One unit of work of the scan. Serialised as JSON (`{"step":"prefix","prefix":"D",
/// "lo":"Davis","hi":"D\u{ffff}"}`), at most about 4.6 KiB (three keys of at most 512 UTF-16
/// units, 3 bytes of UTF-8 each), far below a queue message's 64 KiB.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum Step {
    /// Discover and visit the PartitionKeys in `(lo, hi]` (seed 004's prefix query), all of
    /// which start with `prefix`.
    Prefix {
        /// The prefix every PartitionKey of the range starts with (`""` at the root).
        prefix: String,
        /// Exclusive lower bound (`PartitionKey gt`); `None` = from the first key, `""`
        /// included.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lo: Option<String>,
        /// Inclusive upper bound (`PartitionKey le`): `None` (to the last key) or a prefix
        /// followed by [`SENTINEL`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hi: Option<String>,
    },
    /// Visit one partition, from after RowKey `after` (`None` = from its first row); a
    /// partition larger than a segment is paged, one page per step.
    Partition {
        /// The PartitionKey.
        pk: String,
        /// Exclusive lower RowKey bound (`RowKey gt`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<String>,
    },
}

/// What one step produced: entities to process, and the steps that cover the rest of its
/// range (disjoint from each other and from these entities).
#[derive(Debug, Clone, Default)]
pub struct StepOutput {
    /// At most `segment` entities, in (PartitionKey, RowKey) order.
    pub entities: Vec<Entity>,
    /// Child steps, in key order: running them depth-first in this order visits the table in
    /// (PartitionKey, RowKey) order.
    pub next: Vec<Step>,
}

impl Step {
    /// The step that covers the whole table.
    pub fn root() -> Step {
        Step::Prefix { prefix: String::new(), lo: None, hi: None }
    }

    /// True when the entity with these keys lies in this step's range (UTF-16 code-unit
    /// order, as the service compares keys). For checking that steps never overlap and for
    /// deduplicating redelivered work.
    pub fn contains(&self, partition_key: &str, row_key: &str) -> bool {
        match self {
            Step::Prefix { lo, hi, .. } => prefix_range(lo, hi).contains(partition_key),
            Step::Partition { pk, after } => {
                pk == partition_key && after.as_deref().is_none_or(|a| cmp_utf16(row_key, a).is_gt())
            }
        }
    }
}

impl fmt::Display for Step {
    /// The step's query in seed 004's notation, non-ASCII escaped: `PK > 'Davis' and PK <=
    /// 'D\u{ffff}'`, `PK = 'Davis' and RK > 'Gemma'`, `no filter`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lit = |s: &str| format!("'{}'", s.escape_debug());
        let terms: Vec<String> = match self {
            Step::Prefix { lo, hi, .. } => lo
                .iter()
                .map(|l| format!("PK > {}", lit(l)))
                .chain(hi.iter().map(|h| format!("PK <= {}", lit(h))))
                .collect(),
            Step::Partition { pk, after } => std::iter::once(format!("PK = {}", lit(pk)))
                .chain(after.iter().map(|a| format!("RK > {}", lit(a))))
                .collect(),
        };
        if terms.is_empty() {
            f.write_str("no filter")
        } else {
            f.write_str(&terms.join(" and "))
        }
    }
}

fn prefix_range(lo: &Option<String>, hi: &Option<String>) -> PartitionRange {
    PartitionRange { after: lo.clone(), before: None, to: hi.clone() }
}

/// Runs one step: one store query (plus following pages that come back empty with a
/// continuation token, which Azure may return), at most `segment` (1..=[`MAX_SEGMENT`])
/// entities. Every entity of the table is returned by exactly one step of the tree that
/// starts at [`Step::root`]; the child steps never overlap each other or the entities
/// returned. Errors: `InvalidInput` for a segment outside 1..=1,000 (before any I/O), and
/// whatever the store answers (a missing table is `NotFound`).
pub async fn run_step(store: &dyn TableStore, table: &str, step: &Step, segment: usize) -> StoreResult<StepOutput> {
    if !(1..=MAX_SEGMENT).contains(&segment) {
        return Err(StoreError::InvalidInput(format!(
            "scan segment: {segment} entities requested, allowed 1..={MAX_SEGMENT}"
        )));
    }
    match step {
        Step::Prefix { prefix, lo, hi } => prefix_step(store, table, prefix, lo, hi, segment).await,
        Step::Partition { pk, after } => partition_step(store, table, pk, after, segment).await,
    }
}

/// The first page that has entities or no continuation token.
async fn first_page(pages: BoxStream<'_, StoreResult<Page>>) -> StoreResult<Page> {
    let mut pages =
        pages.try_skip_while(|p| futures::future::ready(Ok(p.entities.is_empty() && p.continuation.is_some())));
    Ok(pages.try_next().await?.unwrap_or_default())
}

async fn prefix_step(
    store: &dyn TableStore,
    table: &str,
    prefix: &str,
    lo: &Option<String>,
    hi: &Option<String>,
    segment: usize,
) -> StoreResult<StepOutput> {
    if !nonempty(lo.as_deref(), hi.as_deref()) {
        return Ok(StepOutput::default());
    }
    let range = prefix_range(lo, hi);
    let page = first_page(pager::range_pages(store, table, &range, segment)).await?;
    let next = match (&page.continuation, page.entities.last()) {
        (Some(_), Some(last)) => split(prefix, hi, last),
        _ => Vec::new(),
    };
    Ok(StepOutput { entities: page.entities, next })
}

/// The steps that cover the rest of a prefix range `(.., hi]` after its page ended at
/// `last`: the rest of `last`'s partition, the subtree of the next prefix, and the rest of
/// the range after that subtree (each only when not empty).
fn split(prefix: &str, hi: &Option<String>, last: &Entity) -> Vec<Step> {
    let pk = &last.partition_key;
    let mut next = vec![Step::Partition { pk: pk.clone(), after: Some(last.row_key.clone()) }];
    let Some(child) = next_prefix(prefix, pk) else {
        // `pk` is the prefix itself (the empty PartitionKey at the root), or the step was
        // not one this module made: continue the same range after `pk`, without splitting.
        if nonempty(Some(pk), hi.as_deref()) {
            next.push(Step::Prefix { prefix: prefix.to_string(), lo: Some(pk.clone()), hi: hi.clone() });
        }
        return next;
    };
    let subtree_hi = format!("{child}{SENTINEL}");
    let child_hi = match hi {
        Some(h) if cmp_utf16(h, &subtree_hi).is_lt() => h.clone(),
        _ => subtree_hi.clone(),
    };
    if nonempty(Some(pk), Some(&child_hi)) {
        next.push(Step::Prefix { prefix: child, lo: Some(pk.clone()), hi: Some(child_hi) });
    }
    // A key continuing the child prefix with U+FFFF sorts above `subtree_hi`: the parent's
    // remaining range starts after whichever is larger.
    let rest_lo = if cmp_utf16(pk, &subtree_hi) == Ordering::Greater { pk.clone() } else { subtree_hi };
    if nonempty(Some(&rest_lo), hi.as_deref()) {
        next.push(Step::Prefix { prefix: prefix.to_string(), lo: Some(rest_lo), hi: hi.clone() });
    }
    next
}

/// `prefix` plus the character of `pk` that follows it (an astral character, a surrogate
/// pair, is one character); `None` when `pk` is `prefix` or does not start with it.
fn next_prefix(prefix: &str, pk: &str) -> Option<String> {
    let c = pk.strip_prefix(prefix)?.chars().next()?;
    Some(format!("{prefix}{c}"))
}

/// True when the range `(lo, hi]` can hold a key.
fn nonempty(lo: Option<&str>, hi: Option<&str>) -> bool {
    match (lo, hi) {
        (Some(l), Some(h)) => cmp_utf16(l, h).is_lt(),
        _ => true,
    }
}

async fn partition_step(
    store: &dyn TableStore,
    table: &str,
    pk: &str,
    after: &Option<String>,
    segment: usize,
) -> StoreResult<StepOutput> {
    let range = RowRange { after: after.clone(), ..RowRange::default() };
    let page = first_page(pager::pages(store, table, pk, &range, segment)).await?;
    let next = match (&page.continuation, page.entities.last()) {
        (Some(_), Some(last)) => vec![Step::Partition { pk: pk.to_string(), after: Some(last.row_key.clone()) }],
        _ => Vec::new(),
    };
    Ok(StepOutput { entities: page.entities, next })
}
