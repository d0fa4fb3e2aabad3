//! Starting the custom handler like the host does (contract §1): the executable of
//! `customHandler.description.defaultExecutablePath` with the `arguments`, in the working
//! directory (default: the app root), with the app settings plus the host's variables in
//! its environment; then `GET http://127.0.0.1:{port}/` every 25 ms until any HTTP response,
//! for at most `initializationTimeout` (30 s).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::app::{command_line_args, App};
use super::client;

/// Readiness poll interval of the host.
pub const POLL_INTERVAL: Duration = Duration::from_millis(25);

/// Variables the harness never passes through from its own environment: the app settings
/// and host variables come from local.settings.json, the test and the harness only.
fn is_app_variable(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    ["TABLE_CATALOG_", "AZURE_STORAGE_", "AZUREWEBJOBS", "FUNCTIONS_"].iter().any(|p| upper.starts_with(p))
}

/// A free loopback port (bind :0, read it, release it), as the host picks one.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The running handler and its captured output.
pub struct HandlerProcess {
    child: Child,
    pub port: u16,
    pub pid: u32,
    /// stdout lines (the host logs them as information) and stderr lines (logged as errors,
    /// or warnings when they contain "warn"), prefixed `out|` / `err|`.
    pub output: Arc<Mutex<Vec<String>>>,
    pub ready_after: Duration,
}

impl HandlerProcess {
    /// Spawns `executable` as the handler and waits until it answers `GET /`.
    pub async fn start(
        app: &App,
        executable: &Path,
        app_env: &BTreeMap<String, String>,
        port: u16,
        echo: bool,
    ) -> Result<HandlerProcess, String> {
        let file_name = executable.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let declared = Path::new(&app.host.executable).file_name().and_then(|n| n.to_str()).unwrap_or_default();
        assert_eq!(
            file_name, declared,
            "host.json defaultExecutablePath '{}' does not name the binary under test",
            app.host.executable
        );
        let args = command_line_args(&app.host.arguments, app_env)?;
        let cwd: PathBuf = match &app.host.working_directory {
            Some(d) if Path::new(d).is_absolute() => PathBuf::from(d),
            Some(d) => app.root.join(d),
            None => app.root.clone(),
        };
        let mut cmd = Command::new(executable);
        cmd.args(&args).current_dir(&cwd).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd.kill_on_drop(true);
        for (k, _) in std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v))) {
            if is_app_variable(&k) {
                cmd.env_remove(&k);
            }
        }
        cmd.envs(app_env);
        let mut child = cmd.spawn().map_err(|e| format!("starting {}: {e}", executable.display()))?;
        let pid = child.id().unwrap_or(0);
        let output = Arc::new(Mutex::new(Vec::new()));
        if let Some(out) = child.stdout.take() {
            spawn_reader(out, "out", output.clone(), echo);
        }
        if let Some(err) = child.stderr.take() {
            spawn_reader(err, "err", output.clone(), echo);
        }
        let mut handler = HandlerProcess { child, port, pid, output, ready_after: Duration::ZERO };
        let started = Instant::now();
        handler.wait_ready(app.host.initialization_timeout).await?;
        handler.ready_after = started.elapsed();
        Ok(handler)
    }

    async fn wait_ready(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().map_err(|e| e.to_string())? {
                return Err(format!(
                    "the handler exited during initialization ({status}); output:\n{}",
                    self.output_tail(40)
                ));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("Initializing HttpWorker timed out.\n{}", self.output_tail(40)));
            }
            match client::request(self.port, "GET", "/", &[], None, false, left).await {
                Ok(_) => return Ok(()), // any HTTP response, 404 included
                // A socket-level failure (nothing listening yet) means keep waiting.
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                // The host treats other errors as ready too; the first invocation will tell.
                Err(_) => return Ok(()),
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// The last `n` output lines, joined.
    pub fn output_tail(&self, n: usize) -> String {
        let out = self.output.lock().unwrap();
        out[out.len().saturating_sub(n)..].join("\n")
    }

    /// True while the process runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Kills the process and waits for it.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }
}

fn spawn_reader<R>(reader: R, tag: &'static str, sink: Arc<Mutex<Vec<String>>>, echo: bool)
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let mut lines = BufReader::new(reader).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if echo {
                eprintln!("[handler {tag}] {line}");
            }
            sink.lock().unwrap().push(format!("{tag}| {line}"));
        }
    });
}
