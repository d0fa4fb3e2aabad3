//! `bench gen`: a synthetic catalog for the whole-table benchmarks (docs/BENCHMARKS.md,
//! "Whole-table scan: verify and export"), written as JSON lines for `table-catalog import`.
//!
//! Each record is a hospital employee with three identifiers, all unique across the file, so
//! N records give exactly 3·N index rows, one per partition:
//! - `eid`: `E` and 9 digits, the record number (`E000000001`);
//! - `npi`: 10 digits, `1` followed by a bijection of the record number onto 0..10⁹ (distinct
//!   for up to 10⁹ records, unordered);
//! - `email`: `{first}.{last}{number}@{domain}`, lowercase;
//!
//! plus `lastname` (the row-key field), `firstname`, `dept`, `salary` (integer), `active`
//! (boolean) and `hired` (a date): about 190 bytes of JSON per record. The same `--records`
//! and `--seed` give the same file byte for byte (the random choices come from `StdRng`
//! seeded with `--seed`; its algorithm is pinned by Cargo.lock).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

/// The index fields of a generated catalog (`--index-keys`).
pub const INDEX_KEYS: &str = "eid,npi,email";
/// The row-key field of a generated catalog (`--row-key`).
pub const ROW_KEY: &str = "lastname";
/// Most records one run writes (the NPI bijection is over 10⁹ values).
pub const MAX_RECORDS: u64 = 1_000_000_000;

const FIRST: &[&str] = &[
    "Ada", "Ben", "Chloé", "David", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kemal", "Lena", "Mateo",
    "Nora", "Olu", "Priya", "Quinn", "Rosa", "Sven", "Tariq", "Uma", "Viktor", "Wen", "Yara", "Zoë",
];
const LAST: &[&str] = &[
    "Abbott",
    "Berg",
    "Castillo",
    "Dubois",
    "Eriksen",
    "Fischer",
    "García",
    "Hughes",
    "Ivanova",
    "Jensen",
    "Kowalski",
    "Lindqvist",
    "Müller",
    "Nakamura",
    "O'Brien",
    "Petrov",
    "Quiroga",
    "Rossi",
    "Schmidt",
    "Tanaka",
    "Uçar",
    "Varga",
    "Weber",
    "Xu",
    "Young",
    "Zielinski",
];
const DEPTS: &[&str] = &["cardiology", "emergency", "neurology", "oncology", "pediatrics", "radiology", "surgery"];
const DOMAINS: &[&str] = &["example.org", "clinic.example", "hospital.example"];

/// A multiplier coprime with 10⁹ (odd, not a multiple of 5): `n ↦ n·M mod 10⁹` is a bijection.
const NPI_MULTIPLIER: u64 = 387_420_489;

/// Arguments of `bench gen`.
#[derive(Debug, Args)]
pub struct GenArgs {
    /// Records to write (each has 3 index values: 3 index rows once imported); at most 10⁹.
    #[arg(long)]
    records: u64,
    /// Seed of the random fields: the same seed and count give the same file.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write to this file [default: stdout].
    #[arg(long)]
    output: Option<PathBuf>,
}

fn pick<'a>(rng: &mut StdRng, from: &[&'a str]) -> &'a str {
    from[rng.gen_range(0..from.len())]
}

/// Record number `n` (1-based) of the file, drawing its random fields from `rng`.
fn record(n: u64, rng: &mut StdRng) -> serde_json::Value {
    let (first, last) = (pick(rng, FIRST), pick(rng, LAST));
    let email = format!("{first}.{last}{n}@{}", pick(rng, DOMAINS)).to_lowercase().replace('\'', "");
    json!({
        "eid": format!("E{n:09}"),
        "npi": format!("1{:09}", (n % MAX_RECORDS) * NPI_MULTIPLIER % MAX_RECORDS),
        "email": email,
        "lastname": last,
        "firstname": first,
        "dept": pick(rng, DEPTS),
        "salary": rng.gen_range(40_000..250_000),
        "active": rng.gen_bool(0.9),
        "hired": format!("{}-{:02}-{:02}", rng.gen_range(1990..2027), rng.gen_range(1..=12), rng.gen_range(1..=28)),
    })
}

/// Writes the records as JSON lines; prints the import flags on stderr.
pub fn run(args: GenArgs) -> Result<()> {
    if args.records > MAX_RECORDS {
        bail!("--records: {} is more than the {MAX_RECORDS} records one file can hold", args.records);
    }
    let mut out: Box<dyn Write> = match &args.output {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let mut rng = StdRng::seed_from_u64(args.seed);
    for n in 1..=args.records {
        serde_json::to_writer(&mut out, &record(n, &mut rng)).context("writing a record")?;
        out.write_all(b"\n").context("writing a record")?;
    }
    out.flush().context("writing the records")?;
    eprintln!(
        "{} records ({} index rows); import with --index-keys {INDEX_KEYS} --row-key {ROW_KEY}",
        args.records,
        args.records * 3
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use table_catalog::cli_support::schema::Schema;

    fn records(n: u64, seed: u64) -> Vec<serde_json::Value> {
        let mut rng = StdRng::seed_from_u64(seed);
        (1..=n).map(|i| record(i, &mut rng)).collect()
    }

    #[test]
    fn the_same_seed_gives_the_same_records_and_another_seed_other_ones() {
        assert_eq!(records(200, 7), records(200, 7));
        assert_ne!(records(200, 7), records(200, 8));
    }

    #[test]
    fn every_record_has_three_unique_index_values_and_a_unique_identity() {
        let schema = Schema::new(INDEX_KEYS.split(',').map(String::from).collect(), ROW_KEY).unwrap();
        let (mut partitions, mut identities) = (HashSet::new(), HashSet::new());
        for r in records(5_000, 1) {
            let keys = schema.record_keys(r.as_object().unwrap()).unwrap();
            assert_eq!(keys.partitions.len(), 3, "{r}");
            for (_, pk) in keys.partitions {
                assert!(partitions.insert(pk), "a partition holds two records: {r}");
            }
            assert!(identities.insert(keys.row_key), "two records share an identity: {r}");
        }
        assert_eq!(partitions.len(), 15_000);
    }

    #[test]
    fn npi_numbers_are_a_bijection() {
        let npis: HashSet<u64> = (1..=100_000u64).map(|n| n * NPI_MULTIPLIER % MAX_RECORDS).collect();
        assert_eq!(npis.len(), 100_000);
        assert_eq!(NPI_MULTIPLIER % 2, 1);
        assert_ne!(NPI_MULTIPLIER % 5, 0);
    }
}
