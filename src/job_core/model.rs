//! What a job is: its id, kind, state and counters, as stored and as returned by the API.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::error::{Error, Result};
use crate::wal::id::now_micros;

/// A job id: `{i64::MAX - micros, 19 digits}-{8 hex digits}`, so job ids sort newest first
/// (a listing is one query from the top) and are valid RowKeys and URL path segments.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JobId(String);

impl JobId {
    /// A new id, for now.
    pub fn new() -> JobId {
        let random = crate::env::uuid().simple().to_string();
        JobId(format!("{:019}-{}", i64::MAX - now_micros(), &random[..8]))
    }

    /// The id of the job a schema change logged as WAL entry `wal_id` starts: the same for
    /// every applier of that entry, so starting it again is a no-op. Sorts by the entry's
    /// time like [`JobId::new`]; the tail is 8 hex digits of MD5 of the id.
    pub fn for_wal(wal_id: &crate::wal::WalId) -> JobId {
        let micros = wal_id.micros().unwrap_or(0);
        let tail = crate::keys::fingerprint([wal_id.as_str()]);
        JobId(format!("{:019}-{tail}", i64::MAX - micros))
    }

    /// Checks an id from a request: [`Error::Invalid`] naming `id` and the shape otherwise.
    pub fn parse(s: &str) -> Result<JobId> {
        let ok = s.len() == 28
            && s.as_bytes()[19] == b'-'
            && s[..19].bytes().all(|b| b.is_ascii_digit())
            && s[20..].bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if ok {
            Ok(JobId(s.to_string()))
        } else {
            Err(Error::invalid(format!("id: '{}' is not a job id (19 digits, '-', 8 hex digits)", short(s))))
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for JobId {
    fn default() -> Self {
        JobId::new()
    }
}

impl std::fmt::Display for JobId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn short(s: &str) -> String {
    s.chars().take(64).collect()
}

/// What a job does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobKind {
    /// Check every record's rows against each other (docs/ARCHITECTURE.md, "Convergence").
    Verify,
    /// Verify, and re-log the latest state of every disagreeing record through the WAL.
    Repair,
    /// Copy every live record into another catalog with another schema (row key, index
    /// fields, hashed fields, hash secret): see `crate::jobs::rebuild`.
    Rebuild,
    /// Remove history rows older than the retention period: see `crate::jobs::trim`.
    #[serde(rename = "trim-history")]
    TrimHistory,
    /// Add the rows of an index added online to every existing record: see
    /// `crate::jobs::index`. Started by the index's schema change, never by hand.
    Backfill,
    /// Remove the rows of a dropped index: see `crate::jobs::index`. Started by the drop's
    /// schema change, never by hand.
    #[serde(rename = "drop-index")]
    DropIndex,
}

impl JobKind {
    /// Every kind, for error messages.
    pub const ALL: [JobKind; 6] = [
        JobKind::Verify,
        JobKind::Repair,
        JobKind::Rebuild,
        JobKind::TrimHistory,
        JobKind::Backfill,
        JobKind::DropIndex,
    ];

    /// The kinds `POST /api/jobs` starts by hand (`backfill` and `drop-index` start with an
    /// index change), as its error for a missing kind lists them.
    pub const BY_HAND: [JobKind; 4] = [JobKind::Verify, JobKind::Repair, JobKind::Rebuild, JobKind::TrimHistory];

    /// The kind's name (`verify`, ...).
    pub fn name(self) -> &'static str {
        match self {
            JobKind::Verify => "verify",
            JobKind::Repair => "repair",
            JobKind::Rebuild => "rebuild",
            JobKind::TrimHistory => "trim-history",
            JobKind::Backfill => "backfill",
            JobKind::DropIndex => "drop-index",
        }
    }

    /// Parses a kind name; [`Error::Invalid`] naming `kind` and the known kinds otherwise.
    pub fn parse(s: &str) -> Result<JobKind> {
        JobKind::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| {
            let known: Vec<&str> = JobKind::ALL.iter().map(|k| k.name()).collect();
            Error::invalid(format!("kind: unknown job kind '{}' (known: {})", short(s), known.join(", ")))
        })
    }
}

/// Where a job is in its life. `done`, `failed` and `cancelled` are final.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Created; its first work items are being enqueued.
    Queued,
    /// Work items are outstanding.
    Running,
    /// Every work item completed; the counters are final.
    Done,
    /// A work item failed for good (after the queue's `maxDequeueCount`, or a fault of its
    /// own content); `last_error` says why.
    Failed,
    /// Cancelled by an operator; outstanding work items are dropped when delivered.
    Cancelled,
}

impl JobState {
    /// The state's name (`running`, ...), as serialised.
    pub fn name(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Done => "done",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    /// True for `done`, `failed` and `cancelled`.
    pub fn is_final(self) -> bool {
        matches!(self, JobState::Done | JobState::Failed | JobState::Cancelled)
    }
}

/// A job as stored (the WAL table's `jobs` partition) and returned by the API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// Id.
    pub id: JobId,
    /// Kind.
    pub kind: JobKind,
    /// Parameters as given (a JSON object; e.g. `{"segment": 1000}`), stored unchanged; each
    /// kind reads them into its own parameter type when the job starts and when an item runs.
    pub params: Json,
    /// State.
    pub state: JobState,
    /// Totals of the completed work items (`rows`, `records`, findings by kind, ...). Final
    /// once the job is `done`; while it runs, [`super::Jobs::get`] sums them live.
    pub counters: BTreeMap<String, u64>,
    /// Work items completed.
    pub steps_done: u64,
    /// Work items outstanding (0 once final).
    pub steps_pending: u64,
    /// When the job was created (RFC 3339, UTC).
    pub created: String,
    /// When its first work items were on the queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<String>,
    /// When it reached a final state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished: Option<String>,
    /// Why it failed, or the last error a work item hit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// Now, as RFC 3339 (UTC, seconds).
pub(crate) fn now_rfc3339() -> String {
    let now = crate::env::now_utc().replace_nanosecond(0).unwrap_or_else(|_| crate::env::now_utc());
    now.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_sort_newest_first_and_parse_back() {
        let a = JobId::new();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = JobId::new();
        assert!(b < a, "{b} sorts before {a}");
        assert_eq!(JobId::parse(a.as_str()).unwrap(), a);
        for bad in ["", "x", "9223372036854775807_0000000g", &"1".repeat(28), "../../etc/passwd"] {
            let e = JobId::parse(bad).unwrap_err().to_string();
            assert!(e.contains("id:"), "{e}");
        }
    }

    #[test]
    fn kinds_and_states_serialise_lowercase() {
        assert_eq!(serde_json::to_string(&JobKind::Verify).unwrap(), "\"verify\"");
        assert_eq!(JobKind::parse("repair").unwrap(), JobKind::Repair);
        assert!(JobKind::parse("vacuum")
            .unwrap_err()
            .to_string()
            .contains("known: verify, repair, rebuild, trim-history"));
        assert_eq!(serde_json::to_string(&JobState::Cancelled).unwrap(), "\"cancelled\"");
        assert!(JobState::Done.is_final() && !JobState::Running.is_final());
    }
}
