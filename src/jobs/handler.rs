//! The scan queue's handler: work items of jobs, run by [`Jobs::run_item`].

use std::sync::Arc;

use async_trait::async_trait;

use crate::catalog::Catalog;
use crate::dispatch::{Delivery, Dispatcher, Handled, Handler};
use crate::error::Result;
use crate::job_core::{Jobs, WorkItem, VERSION};

/// Hands scan-queue messages to [`Jobs`].
#[derive(Debug, Clone)]
pub struct JobHandler(pub Arc<Jobs>);

impl JobHandler {
    /// The dispatcher of `catalog`'s scan queue (`{queue}-scan`, poison
    /// `{queue}-scan-poison`), running the catalog's job kinds ([`Jobs::for_catalog`]).
    pub(crate) fn dispatcher(catalog: Arc<Catalog>) -> Dispatcher {
        let names = catalog.names().clone();
        let handler = Arc::new(JobHandler(Arc::new(Jobs::for_catalog(catalog.clone()))));
        Dispatcher::new(catalog.store().clone(), names.scan_queue, names.scan_poison_queue, handler)
    }
}

fn parse(text: &str) -> std::result::Result<WorkItem, String> {
    let item: WorkItem = serde_json::from_str(text).map_err(|e| format!("work item: not a valid work item: {e}"))?;
    if item.v != VERSION {
        return Err(format!("work item: unknown format version {} (this version reads {VERSION})", item.v));
    }
    Ok(item)
}

#[async_trait]
impl Handler for JobHandler {
    async fn handle(&self, d: Delivery<'_>) -> Result<Handled> {
        match parse(d.text) {
            Ok(item) => Ok(Handled::Done(self.0.run_item(&item).await?)),
            Err(reason) => Ok(Handled::Rejected(reason)),
        }
    }

    async fn on_poisoned(&self, d: Delivery<'_>, reason: &str) {
        if let Ok(item) = parse(d.text) {
            if let Err(e) = self.0.fail(&item.job, &format!("a work item was given up on: {reason}")).await {
                tracing::error!(job = %item.job, error = %e, "could not mark the job failed");
            }
        }
    }
}
