//! `table-catalog serve` as a user runs it: the HTTP API, the queue worker applying writes
//! in the background, and a clean exit on SIGTERM.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[tokio::test]
async fn serve_applies_in_the_background_and_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_table-catalog"))
        .env_remove("AZURE_STORAGE_CONNECTION_STRING")
        .env_remove("AzureWebJobsStorage")
        .args(["--name", "served", "--index-keys", "icao,iata,lid", "--row-key", "name", "--local-path"])
        .arg(dir.path())
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let started = Instant::now();
    while client.get(format!("{base}/api/health")).send().await.is_err() {
        assert!(started.elapsed() < Duration::from_secs(30), "serve did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Without wait: 202, then the in-process worker applies it from the queue hint.
    let record = json!({"icao": "KJFK", "iata": "JFK", "lid": "JFK", "name": "John F Kennedy International Airport"});
    let resp = client.post(format!("{base}/api/records")).json(&record).send().await.unwrap();
    assert_eq!(resp.status(), 202);
    let mut found = Value::Null;
    for _ in 0..200 {
        found = client.get(format!("{base}/api/records?lid=JFK")).send().await.unwrap().json().await.unwrap();
        if found["records"].as_array().is_some_and(|r| !r.is_empty()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(found["records"][0], record);
    let status: Value = client.get(format!("{base}/api/status")).send().await.unwrap().json().await.unwrap();
    assert_eq!(status["pending"], 0);

    let killed = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let exit = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "serve did not stop after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "clean exit after SIGTERM: {exit:?}");
}
