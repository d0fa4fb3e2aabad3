//! Azure Functions custom-handler protocol (invocation payloads and routes).
//!
//! The Functions app (`host.json`, `functions/*/function.json`) has two kinds of functions:
//!
//! - HTTP functions with only an `httpTrigger` input and an `http` output, which the host
//!   forwards unchanged (`enableForwardingHttpRequest`) to the same axum routes `serve` uses;
//! - [`APPLY_FUNCTION`] and [`SCAN_FUNCTION`] (queue triggers) and [`SWEEP_FUNCTION`] (timer trigger), which the host
//!   invokes as `POST /{function name}` with a `{"Data", "Metadata"}` body ([`payload`]).
//!
//! The names below must match the function folders and their binding names;
//! `tests/suite/functions_assets.rs` checks that they do.

pub mod payload;
pub mod routes;

pub use routes::handler_router;

/// Function (folder) name of the queue-triggered applier; the host `POST`s `/apply`.
pub const APPLY_FUNCTION: &str = "apply";
/// Binding name of the `apply` queue trigger (`Data.message` in the invocation).
pub const APPLY_BINDING: &str = "message";
/// Function (folder) name of the queue-triggered job worker; the host `POST`s `/scan`.
pub const SCAN_FUNCTION: &str = "scan";
/// Binding name of the `scan` queue trigger (`Data.item` in the invocation).
pub const SCAN_BINDING: &str = "item";
/// Function (folder) name of the timer-triggered sweeper; the host `POST`s `/sweep`.
pub const SWEEP_FUNCTION: &str = "sweep";
/// Binding name of the `sweep` timer trigger (`Data.timer` in the invocation).
pub const SWEEP_BINDING: &str = "timer";
/// Route prefix of HTTP functions (host.json `extensions.http.routePrefix`). Forwarded
/// requests keep it in their path, so the API routes live under `/api`.
pub const HTTP_ROUTE_PREFIX: &str = "api";
/// Value of the `handler` subcommand argument in host.json `customHandler.description.arguments`.
pub const HANDLER_SUBCOMMAND: &str = "handler";
