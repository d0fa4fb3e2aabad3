//! The names the Functions app and this handler share: function (folder) names, their
//! binding names, the HTTP route prefix and the `handler` subcommand.

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
