//! `table-catalog serve` as a user runs it: the HTTP API, the queue worker applying writes
//! in the background, and a clean exit on SIGTERM.
#![cfg(unix)]

mod common;

use std::time::Duration;

use serde_json::{json, Value};
use tokio::process::Command;

/// Longest wait for each state below; only a broken or hung server reaches it.
const DEADLINE: Duration = Duration::from_secs(60);

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
