//! Command-line interface: arguments (clap), then one function per command. Settings come
//! from flags, falling back to the environment variables listed in `--help`.

mod args;
#[cfg(feature = "bench")]
mod bench;
mod commands;
mod index;
mod jobs;
mod pages;
mod scan_args;
mod whole_table;

use std::process::ExitCode;

use anyhow::Result;

pub use args::Cli;
use args::Command;

/// Logs to stderr; `RUST_LOG` overrides the default level (info for servers, warn otherwise).
/// Colour (ANSI escapes) only when stderr is a terminal and `NO_COLOR` is unset or empty
/// (<https://no-color.org>), so log files hold plain text.
pub fn init_logging(command: &Command) {
    use std::io::IsTerminal as _;
    let ansi = colour(std::io::stderr().is_terminal(), std::env::var_os("NO_COLOR").as_deref());
    let default = match command {
        Command::Serve { .. } | Command::Handler => "info",
        _ => "warn",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi).try_init();
}

/// Whether log lines carry colour: on a terminal, unless `NO_COLOR` holds a non-empty value.
fn colour(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Runs the command.
pub async fn run(cli: Cli) -> Result<ExitCode> {
    commands::run(cli).await
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    /// Colour only on a terminal, and `NO_COLOR=1` turns it off there too (an empty
    /// `NO_COLOR` does not, as no-color.org says).
    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(super::colour(true, None));
        assert!(super::colour(true, Some(OsStr::new(""))));
        assert!(!super::colour(true, Some(OsStr::new("1"))));
        assert!(!super::colour(false, None));
    }
}
