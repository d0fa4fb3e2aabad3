//! `table-catalog serve` as a child process: started on a port the OS picks (`--listen
//! 127.0.0.1:0`; serve prints the address it bound), its stderr drained so it never blocks.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Longest wait for serve to print its address (it opens the catalog first: on a loaded
/// machine with Azurite busy, a restart after a kill once took over 60 s; a passing test never
/// waits for the bound).
const START: Duration = Duration::from_secs(180);

/// A running `serve`.
pub struct Served {
    /// The process (killed when dropped).
    pub child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// Reads stderr until the process ends.
    pub drain: tokio::task::JoinHandle<()>,
    /// What it printed to stderr before its address (e.g. the import's summary line).
    pub said: Vec<String>,
}

/// Starts `table-catalog {global} serve --listen 127.0.0.1:0 {serve}` with `env` added (and,
/// unless `env` sets them, no connection string: the embedded store under `--local-path`).
pub async fn start(global: &[&str], serve: &[&str], env: &[(&str, &str)]) -> Served {
    start_in(None, global, serve, env).await
}

/// As [`start`], in the working folder `dir` (the test's own when `None`).
pub async fn start_in(dir: Option<&std::path::Path>, global: &[&str], serve: &[&str], env: &[(&str, &str)]) -> Served {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_table-catalog"));
    if let Some(dir) = dir {
        cmd.current_dir(dir);
    }
    cmd.env_remove("AZURE_STORAGE_CONNECTION_STRING").env_remove("AzureWebJobsStorage").env("RUST_LOG", "warn");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .args(global)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(serve)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn table-catalog serve");
    let mut stderr = BufReader::new(child.stderr.take().expect("piped stderr")).lines();
    let find_address = async {
        let mut said = Vec::new();
        while let Ok(Some(line)) = stderr.next_line().await {
            if let Some(rest) = line.split_once("listening on http://").map(|(_, r)| r) {
                return (rest.split_whitespace().next().unwrap_or_default().to_string(), said);
            }
            said.push(line);
        }
        panic!("serve exited without printing its address; it said: {}", said.join("\n"));
    };
    let (address, said) = tokio::time::timeout(START, find_address).await.expect("serve prints its address");
    let drain = tokio::spawn(async move { while let Ok(Some(_)) = stderr.next_line().await {} });
    Served { child, base: format!("http://{address}"), drain, said }
}
