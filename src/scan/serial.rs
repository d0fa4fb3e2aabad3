//! The whole scan tree walked depth-first in one process (the CLI, tests, and the serial
//! baseline of the distributed jobs).

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};

use super::step::{run_step, Step, StepOutput};
use crate::store::{Entity, StoreResult, TableStore};

/// Every step of the tree that starts at [`Step::root`], depth-first, with what it produced.
/// One store query per step (see [`run_step`]); the stream ends after the last step. Memory:
/// one step's output plus the pending steps (at most about two per prefix level, whatever
/// the table's size).
pub fn walk<'a>(
    store: &'a dyn TableStore,
    table: &'a str,
    segment: usize,
) -> BoxStream<'a, StoreResult<(Step, StepOutput)>> {
    futures::stream::try_unfold(vec![Step::root()], move |mut pending| async move {
        let Some(step) = pending.pop() else { return Ok(None) };
        let output = run_step(store, table, &step, segment).await?;
        // Reversed onto the stack, so the first child runs next: key order.
        pending.extend(output.next.iter().rev().cloned());
        Ok(Some(((step, output), pending)))
    })
    .boxed()
}

/// Every entity of `table` exactly once, in (PartitionKey, RowKey) order (UTF-16 code
/// units), found by the prefix scan's steps run one after another, `segment` (1..=1,000)
/// entities per query at most.
pub fn entities<'a>(store: &'a dyn TableStore, table: &'a str, segment: usize) -> BoxStream<'a, StoreResult<Entity>> {
    walk(store, table, segment)
        .map_ok(|(_, output)| futures::stream::iter(output.entities.into_iter().map(Ok)))
        .try_flatten()
        .boxed()
}
