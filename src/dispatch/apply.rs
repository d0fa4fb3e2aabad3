//! The apply queue's handler: hints and intents, handled by the catalog.

use std::sync::Arc;

use async_trait::async_trait;

use super::dispatcher::Dispatcher;
use super::handler::{Delivery, Handled, Handler};
use crate::catalog::{Catalog, MessageOutcome};
use crate::error::Result;

/// Hands apply-queue messages to [`Catalog::process_message`].
#[derive(Debug, Clone)]
pub struct ApplyHandler(pub Arc<Catalog>);

#[async_trait]
impl Handler for ApplyHandler {
    async fn handle(&self, d: Delivery<'_>) -> Result<Handled> {
        Ok(match self.0.process_message(d.text, d.id).await? {
            MessageOutcome::Applied { id: Some(wal_id) } => {
                Handled::Done(format!("intent {} logged as {wal_id} and applied", d.id))
            }
            MessageOutcome::Applied { id: None } => Handled::Done(format!("hint {} handled", d.id)),
            MessageOutcome::Rejected { reason } => Handled::Rejected(reason),
        })
    }

    fn wake(&self) -> Option<&tokio::sync::Notify> {
        Some(self.0.work_signal())
    }
}

impl Dispatcher {
    /// The dispatcher of `catalog`'s apply queue (`{queue}`, poison `{queue}-poison`).
    pub fn apply(catalog: Arc<Catalog>) -> Dispatcher {
        let names = catalog.names().clone();
        Dispatcher::new(catalog.store().clone(), names.queue, names.poison_queue, Arc::new(ApplyHandler(catalog)))
    }
}
