//! Azure Functions custom-handler protocol (invocation payloads and routes).
//!
//! The Functions app (`host.json`, `functions/*/function.json`) has two kinds of functions:
//!
//! - HTTP functions with only an `httpTrigger` input and an `http` output, which the host
//!   forwards unchanged (`enableForwardingHttpRequest`) to the same axum routes `serve` uses;
//! - [`APPLY_FUNCTION`] and [`SCAN_FUNCTION`] (queue triggers) and [`SWEEP_FUNCTION`] (timer trigger), which the host
//!   invokes as `POST /{function name}` with a `{"Data", "Metadata"}` body (`payload`).
//!
//! The names re-exported below must match the function folders and their binding names;
//! `tests/suite/functions_assets.rs` checks that they do.

pub(crate) mod names;
pub(crate) mod payload;
pub(crate) mod routes;

pub use names::{
    APPLY_BINDING, APPLY_FUNCTION, HANDLER_SUBCOMMAND, HTTP_ROUTE_PREFIX, SCAN_BINDING, SCAN_FUNCTION, SWEEP_BINDING,
    SWEEP_FUNCTION,
};
pub use routes::handler_router;
