//! Bulk import from CSV (with a header) or JSON lines, through the batch write path.
//!
//! CSV: every cell is a string, except in numeric columns: a column whose non-empty cells
//! are all canonical numbers (`13`, `-0.5`, `1e3`; not `007` or `+1`) becomes numbers. Index
//! and row-key columns always stay strings (identifiers like `0001` keep their zeros).
//! Empty cells stay empty strings (an empty index value means "not indexed").

use std::path::Path;
use std::time::Instant;

use serde::Serialize;
use serde_json::{Map, Number, Value as Json};

use crate::catalog::Catalog;
use crate::error::{Error, Result};
use crate::record::Record;
use crate::schema::Schema;

/// One input row: its 1-based number (the line of a JSON-lines file, the data row of a CSV
/// file) and the record, or why it cannot be one.
pub type Row = (usize, std::result::Result<Record, String>);

/// Records per WAL append (each append writes entity group transactions of 100 entries).
pub const DEFAULT_BATCH: usize = 500;

/// Input format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Comma-separated values with a header row.
    Csv,
    /// One JSON object per line.
    JsonLines,
}

impl Format {
    /// Guesses the format from the file name (`.jsonl`, `.ndjson`, `.json` are JSON lines).
    pub fn from_path(path: &Path) -> Format {
        match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
            Some("jsonl" | "ndjson" | "json") => Format::JsonLines,
            _ => Format::Csv,
        }
    }
}

/// One input row that could not be imported.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rejected {
    /// 1-based line (JSON lines) or data row (CSV, header excluded).
    pub row: usize,
    /// Why.
    pub reason: String,
}

/// Outcome of an import.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Records read.
    pub read: usize,
    /// Records logged to the WAL.
    pub logged: usize,
    /// Rows rejected, with reasons.
    pub rejected: Vec<Rejected>,
    /// Wall time, in seconds.
    pub seconds: f64,
}

impl Summary {
    /// Logged records per second.
    pub fn records_per_second(&self) -> f64 {
        if self.seconds > 0.0 {
            self.logged as f64 / self.seconds
        } else {
            0.0
        }
    }
}

fn canonical_number(s: &str) -> Option<Number> {
    let digits = s.strip_prefix('-').unwrap_or(s);
    let int_part = digits.split(['.', 'e', 'E']).next().unwrap_or("");
    if int_part.is_empty()
        || (int_part.len() > 1 && int_part.starts_with('0'))
        || !int_part.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    if let Ok(i) = s.parse::<i64>() {
        return Some(Number::from(i));
    }
    if let Ok(u) = s.parse::<u64>() {
        return Some(Number::from(u));
    }
    s.parse::<f64>().ok().filter(|f| f.is_finite()).and_then(Number::from_f64)
}

/// Reads records from a file: rows of data, or per-row errors.
pub fn read_file(path: &Path, format: Format, schema: &Schema) -> Result<Vec<Row>> {
    let text = std::fs::read(path).map_err(|e| Error::invalid(format!("{}: {e}", path.display())))?;
    match format {
        Format::JsonLines => Ok(read_json_lines(&text)),
        Format::Csv => read_csv(&text, schema),
    }
}

/// Parses JSON lines, numbered by line (blank lines skipped; a line that is not UTF-8 is
/// rejected, never repaired).
pub fn read_json_lines(bytes: &[u8]) -> Vec<Row> {
    bytes
        .split(|b| *b == b'\n')
        .enumerate()
        .filter(|(_, l)| !l.iter().all(u8::is_ascii_whitespace))
        .map(|(i, l)| {
            let parsed = match std::str::from_utf8(l) {
                Err(_) => Err("line is not valid UTF-8".to_string()),
                Ok(text) => match serde_json::from_str::<Json>(text) {
                    Ok(Json::Object(r)) => Ok(r),
                    Ok(_) => Err("not a JSON object".to_string()),
                    Err(e) => Err(format!("invalid JSON: {e}")),
                },
            };
            (i + 1, parsed)
        })
        .collect()
}

/// Parses CSV with a header; numeric columns (see the module docs) become numbers.
pub fn read_csv(bytes: &[u8], schema: &Schema) -> Result<Vec<Row>> {
    let mut reader = csv::ReaderBuilder::new().has_headers(true).flexible(false).from_reader(bytes);
    let headers: Vec<String> =
        reader.headers().map_err(|e| Error::invalid(format!("CSV header: {e}")))?.iter().map(String::from).collect();
    for (i, h) in headers.iter().enumerate() {
        if headers[..i].contains(h) {
            return Err(Error::invalid(format!("CSV header: column '{h}' appears more than once")));
        }
    }
    let rows: Vec<std::result::Result<csv::StringRecord, String>> =
        reader.records().map(|r| r.map_err(|e| format!("CSV: {e}"))).collect();
    let numeric: Vec<bool> = headers
        .iter()
        .enumerate()
        .map(|(i, h)| {
            !schema.is_index(h)
                && h != &schema.row_key
                && rows.iter().flatten().any(|r| r.get(i).is_some_and(|c| !c.is_empty()))
                && rows.iter().flatten().all(|r| r.get(i).is_none_or(|c| c.is_empty() || canonical_number(c).is_some()))
        })
        .collect();
    Ok(rows
        .into_iter()
        .enumerate()
        .map(|(n, row)| (n + 1, row))
        .map(|(n, row)| {
            let Ok(row) = row else { return (n, row.map(|_| Record::new())) };
            let mut record = Map::new();
            for (i, cell) in row.iter().enumerate() {
                let value = match canonical_number(cell) {
                    Some(n) if numeric[i] && !cell.is_empty() => Json::Number(n),
                    _ => Json::String(cell.to_string()),
                };
                record.insert(headers[i].clone(), value);
            }
            (n, Ok(record))
        })
        .collect())
}

/// Logs `rows` through [`Catalog::upsert_many`] in batches of `batch`, calling `progress`
/// with the number of rows done after each batch. Rows that fail validation are rejected
/// with their reason; the rest are logged.
pub async fn import_rows(
    catalog: &Catalog,
    rows: Vec<Row>,
    batch: usize,
    mut progress: impl FnMut(usize),
) -> Result<Summary> {
    let started = Instant::now();
    let mut summary = Summary { read: rows.len(), ..Summary::default() };
    let mut done = 0;
    let mut chunk_rows = Vec::with_capacity(batch);
    let mut iter = rows.into_iter().peekable();
    while iter.peek().is_some() {
        chunk_rows.clear();
        let mut numbers = Vec::new();
        for (n, row) in iter.by_ref().take(batch.max(1)) {
            match row {
                Ok(r) => {
                    numbers.push(n);
                    chunk_rows.push(r);
                }
                Err(reason) => summary.rejected.push(Rejected { row: n, reason }),
            }
            done += 1;
        }
        let results = catalog.upsert_many(std::mem::take(&mut chunk_rows), false).await?;
        for (row, result) in numbers.into_iter().zip(results) {
            match result {
                Ok(_) => summary.logged += 1,
                Err(e) => summary.rejected.push(Rejected { row, reason: e.to_string() }),
            }
        }
        progress(done);
    }
    summary.rejected.sort_by_key(|r| r.row);
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_columns_only_when_every_cell_is_a_canonical_number() {
        let schema = Schema::new(vec!["icao".into(), "lid".into()], "name").unwrap();
        let csv = "icao,name,elevation,lat,code,lid\n00AA,A,3435,38.7,007,0001\n00AK,B,,-151.5,12,00AK\n";
        let rows = read_csv(csv.as_bytes(), &schema).unwrap();
        let a = rows[0].1.as_ref().unwrap();
        assert_eq!(a["icao"], "00AA");
        assert_eq!(a["elevation"], 3435);
        assert_eq!(a["lat"], 38.7);
        assert_eq!(a["code"], "007");
        assert_eq!(a["lid"], "0001");
        let b = rows[1].1.as_ref().unwrap();
        assert_eq!(b["elevation"], "");
        assert_eq!(b["lat"], -151.5);
        assert_eq!(b["code"], "12");
    }

    #[test]
    fn json_lines_report_bad_lines() {
        let rows = read_json_lines(b"{\"a\":1}\n\n[1]\n{bad\n{\"z\":\"\xfc\"}\n");
        assert_eq!(rows.len(), 4);
        assert!(rows[0].1.is_ok());
        assert_eq!((rows[1].0, rows[1].1.as_ref().unwrap_err().as_str()), (3, "not a JSON object"));
        assert!(rows[2].1.as_ref().unwrap_err().starts_with("invalid JSON"));
        assert_eq!(rows[3].1.as_ref().unwrap_err(), "line is not valid UTF-8");
    }

    #[test]
    fn canonical_numbers() {
        for (s, ok) in [
            ("0", true),
            ("-1", true),
            ("1.5", true),
            ("1e3", true),
            ("007", false),
            ("+1", false),
            ("", false),
            ("1.", true),
            ("abc", false),
            ("0.5", true),
            ("NaN", false),
        ] {
            assert_eq!(canonical_number(s).is_some(), ok, "{s}");
        }
    }
}
