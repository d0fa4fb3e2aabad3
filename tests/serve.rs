//! `table-catalog serve` as a user runs it: the HTTP API, the queue worker applying writes
//! in the background, and a clean exit on SIGTERM.
#![cfg(unix)]

use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// Longest wait for each state below; only a broken or hung server reaches it.
const DEADLINE: Duration = Duration::from_secs(60);

/// Polls `probe` until it returns `Some`, failing with `what` after [`DEADLINE`].
async fn wait_for<T, F: std::future::Future<Output = Option<T>>>(what: &str, mut probe: impl FnMut() -> F) -> T {
    let polling = async {
        loop {
            if let Some(v) = probe().await {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    };
    tokio::time::timeout(DEADLINE, polling).await.unwrap_or_else(|_| panic!("{what}: not within {DEADLINE:?}"))
}

#[tokio::test]
async fn serve_applies_in_the_background_and_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    // Port 0: the OS picks a free port and serve prints it (a port probed free and then
    // released could be taken by another process before serve binds it).
    let mut child = Command::new(env!("CARGO_BIN_EXE_table-catalog"))
        .env_remove("AZURE_STORAGE_CONNECTION_STRING")
        .env_remove("AzureWebJobsStorage")
        .env("RUST_LOG", "warn")
        .args(["--name", "served", "--index-keys", "icao,iata,lid", "--row-key", "name", "--local-path"])
        .arg(dir.path())
        .args(["serve", "--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    let find_address = async {
        while let Some(line) = stderr.next_line().await.unwrap() {
            if let Some(rest) = line.split_once("listening on http://").map(|(_, r)| r) {
                return rest.split_whitespace().next().unwrap_or_default().to_string();
            }
        }
        panic!("serve exited without printing its address");
    };
    let address = tokio::time::timeout(DEADLINE, find_address).await.expect("serve prints its address");
    // Keep reading so a chatty server never blocks on a full pipe.
    let drain = tokio::spawn(async move { while let Ok(Some(_)) = stderr.next_line().await {} });
    let base = format!("http://{address}");
    let client = reqwest::Client::new();
    let health = client.get(format!("{base}/api/health")).send().await.unwrap();
    assert!(health.status().is_success(), "{}", health.status());

    // Without wait: 202, then the in-process worker applies it from the queue hint.
    let record = json!({"icao": "KJFK", "iata": "JFK", "lid": "JFK", "name": "John F Kennedy International Airport"});
    let resp = client.post(format!("{base}/api/records")).json(&record).send().await.unwrap();
    assert_eq!(resp.status(), 202);
    let found = wait_for("the record is visible", || async {
        let found: Value = client.get(format!("{base}/api/records?lid=JFK")).send().await.ok()?.json().await.ok()?;
        found["records"].as_array().is_some_and(|r| !r.is_empty()).then_some(found)
    })
    .await;
    assert_eq!(found["records"], json!([record]));
    // The worker removes the WAL entry only after writing every row, so the record can be
    // visible while the entry is still pending: wait for pending == 0 rather than snapshot it.
    wait_for("no WAL entry pending", || async {
        let status: Value = client.get(format!("{base}/api/status")).send().await.ok()?.json().await.ok()?;
        (status["pending"] == 0).then_some(())
    })
    .await;

    let killed = Command::new("kill").args(["-TERM", &child.id().unwrap().to_string()]).status().await.unwrap();
    assert!(killed.success());
    let exit = tokio::time::timeout(DEADLINE, child.wait()).await.expect("serve stops after SIGTERM").unwrap();
    assert!(exit.success(), "clean exit after SIGTERM: {exit:?}");
    drain.await.unwrap();
}
