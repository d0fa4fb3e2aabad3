//! `table-catalog serve` as a user runs it: the HTTP API, the queue worker applying writes
//! in the background, and a clean exit on SIGTERM.
#![cfg(unix)]

use crate::common;

use std::time::Duration;

use serde_json::{json, Value};
use tokio::process::Command;

/// Longest wait for each state below; only a broken or hung server reaches it.
const DEADLINE: Duration = Duration::from_secs(180);

#[tokio::test]
async fn serve_applies_in_the_background_and_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    // Port 0: the OS picks a free port and serve prints it (a port probed free and then
    // released could be taken by another process before serve binds it).
    let path = dir.path().to_str().unwrap();
    let served = common::serve::start(
        &["--name", "served", "--index-keys", "icao,iata,lid", "--row-key", "name", "--local-path", path],
        &[],
        &[],
    )
    .await;
    let (mut child, drain) = (served.child, served.drain);
    let base = served.base;
    let client = reqwest::Client::new();
    let health = client.get(format!("{base}/api/health")).send().await.unwrap();
    assert!(health.status().is_success(), "{}", health.status());

    // Without wait: 202, then the in-process worker applies it from the queue hint.
    let record = json!({"icao": "KJFK", "iata": "JFK", "lid": "JFK", "name": "John F Kennedy International Airport"});
    let resp = client.post(format!("{base}/api/records")).json(&record).send().await.unwrap();
    assert_eq!(resp.status(), 202);
    let found = common::wait_for("the record is visible", || async {
        let found: Value = client.get(format!("{base}/api/records?lid=JFK")).send().await.ok()?.json().await.ok()?;
        found["records"].as_array().is_some_and(|r| !r.is_empty()).then_some(found)
    })
    .await;
    assert_eq!(found["records"], json!([record]));
    // The worker removes the WAL entry only after writing every row, so the record can be
    // visible while the entry is still pending: wait for pending == 0 rather than snapshot it.
    common::wait_for("no WAL entry pending", || async {
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

/// `serve --import` on an address already in use fails at once, naming the address, and
/// imports nothing (it binds before it imports).
#[tokio::test]
async fn serve_binds_before_it_imports() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let csv = dir.path().join("two.csv");
    std::fs::write(&csv, "icao,name\nKAAA,Field A\nKBBB,Field B\n").unwrap();
    let store = dir.path().join("store");
    let global = ["--name", "bindfirst", "--index-keys", "icao", "--row-key", "name", "--local-path"];
    let out = Command::new(env!("CARGO_BIN_EXE_table-catalog"))
        .env_remove("AZURE_STORAGE_CONNECTION_STRING")
        .env_remove("AzureWebJobsStorage")
        .args(global)
        .arg(&store)
        .args(["serve", "--listen", &address, "--import"])
        .arg(&csv)
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("binding {address}")), "{stderr}");
    assert!(!stderr.contains("imported"), "nothing is imported: {stderr}");
    let c = table_catalog::config::Config::new("bindfirst").local_path(&store).open().await.unwrap();
    assert_eq!(c.status().await.unwrap().checkpoint, None, "nothing was applied");
    drop(taken);
}

/// Log lines carry no ANSI colour codes when stderr is not a terminal (a pipe, a file).
#[tokio::test]
async fn logs_to_a_pipe_have_no_colour_codes() {
    use tokio::io::AsyncBufReadExt;
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_table-catalog"))
        .env_remove("AZURE_STORAGE_CONNECTION_STRING")
        .env_remove("AzureWebJobsStorage")
        .env("RUST_LOG", "info")
        .args(["--name", "plainlog", "--index-keys", "icao", "--row-key", "name", "--local-path"])
        .arg(dir.path())
        .args(["serve", "--listen", "127.0.0.1:0"])
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut said = Vec::new();
    let read = async {
        while let Ok(Some(line)) = lines.next_line().await {
            let done = line.contains("listening on http://");
            said.push(line);
            if done {
                break;
            }
        }
    };
    tokio::time::timeout(DEADLINE, read).await.expect("serve starts");
    child.kill().await.unwrap();
    let text = said.join("\n");
    assert!(text.contains("INFO") && text.contains("serving"), "an info line was logged: {text}");
    assert!(!text.contains('\u{1b}'), "no escape codes: {text:?}");
}
