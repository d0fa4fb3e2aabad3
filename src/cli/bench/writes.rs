//! `bench writes`: black-box write load over HTTP. C clients each send one
//! `POST /api/records?upsert=true` at a time (a new synthetic airport per request, fields
//! `icao`, `iata`, `lid`, `name`, the schema of scripts/bench_local.sh), round-robin over one
//! or more servers, for S seconds. Reports acknowledged writes/s and acknowledgement latency.
//! Only HTTP is spoken, so it can load any version of `serve`.

use std::sync::Arc;
use std::time::Duration;

use table_catalog::cli_support::env::Instant;

use anyhow::{bail, Result};
use clap::Args;
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::percentile::percentile;

/// Write load over HTTP.
#[derive(Debug, Args)]
pub struct WriteArgs {
    /// Base URL of a running `serve`.
    #[arg(long, default_value = "http://127.0.0.1:7071")]
    url: String,
    /// Several servers, comma-separated (overrides --url); requests go round-robin.
    #[arg(long, value_delimiter = ',')]
    urls: Vec<String>,
    /// Writers, each with one request in flight.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Seconds of load.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Seed of the synthetic records (printed; a run tag derived from it keeps the records of
    /// different runs apart).
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// A synthetic airport, unique per (tag, client, seq): identifiers never repeat, so every
/// write is a new record with three index rows.
fn airport(tag: &str, client: usize, seq: u64) -> serde_json::Value {
    json!({
        "icao": format!("W{tag}{client:02}{seq:06}"),
        "iata": format!("I{tag}{client:02}{seq:06}"),
        "lid": format!("L{tag}{client:02}{seq:06}"),
        "name": format!("Bench Field {tag} {client} {seq}"),
        "city": "Benchville",
        "elevation": (seq % 5000) as i64,
    })
}

struct ClientResult {
    latencies: Vec<Duration>,
    errors: Vec<String>,
}

async fn client_loop(
    http: reqwest::Client,
    urls: Arc<Vec<String>>,
    tag: Arc<String>,
    client: usize,
    deadline: Instant,
) -> ClientResult {
    let mut out = ClientResult { latencies: Vec::new(), errors: Vec::new() };
    let mut seq = 0u64;
    while table_catalog::cli_support::env::now() < deadline {
        let url = &urls[(client + seq as usize) % urls.len()];
        let body = airport(&tag, client, seq);
        seq += 1;
        let started = table_catalog::cli_support::env::now();
        let sent = http.post(format!("{url}/api/records?upsert=true")).json(&body).send().await;
        match sent {
            Ok(resp) if resp.status().is_success() => {
                let _ = resp.bytes().await;
                out.latencies.push(started.elapsed());
            }
            Ok(resp) => out.errors.push(format!("HTTP {}", resp.status().as_u16())),
            Err(e) => out.errors.push(format!("request failed: {}", e.without_url())),
        }
    }
    out
}

pub async fn run(args: WriteArgs) -> Result<()> {
    let urls: Vec<String> = if args.urls.is_empty() { vec![args.url.clone()] } else { args.urls.clone() };
    let urls: Vec<String> =
        urls.iter().map(|u| u.trim().trim_end_matches('/').to_string()).filter(|u| !u.is_empty()).collect();
    if urls.is_empty() {
        bail!("--urls: no server URL given");
    }
    if args.clients == 0 || !args.seconds.is_finite() || args.seconds <= 0.0 {
        bail!("--clients and --seconds must be positive (got {} and {})", args.clients, args.seconds);
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let tag: String = (0..4).map(|_| char::from(b'A' + rng.gen_range(0..26u8))).collect();
    eprintln!(
        "bench writes: seed {}, run tag {tag}, {} clients, {} s, {} server(s)",
        args.seed,
        args.clients,
        args.seconds,
        urls.len()
    );
    let http = reqwest::Client::builder().pool_max_idle_per_host(args.clients).build()?;
    let (urls, tag) = (Arc::new(urls), Arc::new(tag));
    let started = table_catalog::cli_support::env::now();
    let deadline = started + Duration::from_secs_f64(args.seconds);
    let tasks: Vec<_> = (0..args.clients)
        .map(|c| tokio::spawn(client_loop(http.clone(), urls.clone(), tag.clone(), c, deadline)))
        .collect();
    let mut latencies = Vec::new();
    let mut errors: std::collections::BTreeMap<String, u64> = Default::default();
    for t in tasks {
        let r = t.await?;
        latencies.extend(r.latencies);
        for e in r.errors {
            *errors.entry(e).or_default() += 1;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort();
    println!(
        "{}",
        json!({
            "servers": urls.len(),
            "clients": args.clients,
            "seconds": elapsed,
            "acked": latencies.len(),
            "failed": errors.values().sum::<u64>(),
            "errors": errors,
            "writes_per_s": latencies.len() as f64 / elapsed,
            "ack_p50_ms": percentile(&latencies, 0.50),
            "ack_p90_ms": percentile(&latencies, 0.90),
            "ack_p99_ms": percentile(&latencies, 0.99),
            "ack_max_ms": percentile(&latencies, 1.0),
            "seed": args.seed,
            "tag": *tag,
        })
    );
    Ok(())
}
