//! The one message dispatcher: how a queue message becomes work, for every queue of the app
//! and for both ways messages arrive.
//!
//! - In the Functions app the host receives, Base64-decodes, counts deliveries, retries and
//!   poisons after `maxDequeueCount`; the handler is invoked with the decoded text
//!   ([`Dispatcher::invoke`]).
//! - In `serve` nothing does that for us, so [`Dispatcher::run`] plays the host: it receives,
//!   decodes, invokes the same handler and applies the same [`QueuePolicy`], read from the
//!   app's `host.json`.
//!
//! Either way a [`Handler`] only says what the message means: done, or [`Handled::Rejected`]
//! when it can never succeed (the dispatcher then moves it to the poison queue at once, with
//! the reason), or an error, which is retried and poisoned after `maxDequeueCount`
//! deliveries. Queue transport (Base64, poison bodies, dequeue counts, pop receipts) lives
//! here and nowhere else.

pub mod apply;
mod dispatcher;
mod handler;
pub mod poison;
pub mod policy;
mod worker;

use std::sync::Arc;

pub use dispatcher::{Dispatcher, Disposition};
pub use handler::{Delivery, Handled, Handler};
pub use policy::QueuePolicy;
pub use worker::WorkerOptions;

impl Dispatcher {
    /// Receives and dispatches until `stop` turns true (see [`worker`]).
    pub async fn run(self: Arc<Self>, opts: WorkerOptions, stop: tokio::sync::watch::Receiver<bool>) {
        worker::run(self, opts, stop).await
    }
}
