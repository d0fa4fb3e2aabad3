//! The `rebuild` job: copies every live record of the catalog into another catalog with
//! another schema, through that catalog's WAL, one scan step per work item. What it is for:
//! - changing the row key (the sort field), which rewrites every RowKey;
//! - rotating the secret of hashed index fields, which rewrites every hashed PartitionKey and
//!   every RowKey fingerprint (`crate::hashed`);
//! - adding, dropping, hashing or un-hashing index fields in one pass.
//!
//! Parameters (`{"kind": "rebuild", "params": {...}}`):
//! - `into` (required): the new catalog's name (a table name; its WAL table and queues follow);
//! - `index_keys`, `row_key`, `hashed_keys`, `redact_keys` (optional): the new schema; each
//!   absent one is the source's;
//! - `segment` (optional): entities per scan query, 1..=1,000.
//!
//! The new catalog's hash secret is `crate::settings::REBUILD_HASH_KEY` when set (a key
//! rotation), else the source's; every worker must see the same value (opening the new
//! catalog with another key fails, like any catalog). A redacted field cannot be re-keyed: the
//! source holds only its HMAC, not the value; the job refuses to start then.
//!
//! Idempotent: a record is upserted under its identity in the new schema, so a rerun of a
//! work item logs the same upserts again. Writes to the source during the rebuild may or may
//! not be copied; stop writers (or re-run) before switching over, then verify the new catalog.

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;
use tokio::sync::OnceCell;

use crate::catalog::{Catalog, CatalogOptions};
use crate::error::{Error, Result};
use crate::export::owned_record;
use crate::hashed::HashKey;
use crate::job_core::segment::{segment, Segment, SCAN_STEP};
use crate::job_core::typed::{params_of, JobKindSpec, NoFinding, Outcome};
use crate::job_core::Job;
use crate::names::Names;
use crate::scan::{self, Step};
use crate::schema::Schema;
use crate::settings;

/// Parameters a rebuild accepts.
const PARAMS: &[&str] = &["into", "index_keys", "row_key", "hashed_keys", "redact_keys", "segment"];

/// The parameters of a rebuild, as given and stored: `{"into": "NewName"}` plus, optionally,
/// `index_keys`, `hashed_keys`, `redact_keys` (each a list of field names or one
/// comma-separated string), `row_key` (a field name) and `segment` (1..=1000). An absent or
/// `null` one is the source's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RebuildParams {
    /// The new catalog's name.
    pub into: String,
    /// Its index fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_keys: Option<FieldList>,
    /// Its row-key (sort) field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row_key: Option<String>,
    /// Its hashed index fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hashed_keys: Option<FieldList>,
    /// Its redacted fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redact_keys: Option<FieldList>,
    /// Entities per scan query.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment: Option<Segment>,
}

/// A list of field names, as given: a JSON list (`["a","b"]`) or one comma-separated string
/// (`"a,b"`, as the CLI flags take it); written back in the shape it came in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged, expecting = "a list of field names")]
pub(crate) enum FieldList {
    /// `["a", "b"]`.
    Names(Vec<String>),
    /// `"a,b"` ([`Schema::parse_list`]).
    Text(String),
}

impl FieldList {
    /// The field names.
    pub fn names(&self) -> Vec<String> {
        match self {
            FieldList::Names(names) => names.clone(),
            FieldList::Text(text) => Schema::parse_list(text),
        }
    }
}

/// Copies the source catalog into the one `params.into` names.
pub struct Rebuild {
    source: Arc<Catalog>,
    /// The new secret, if this process has one ([`settings::REBUILD_HASH_KEY`]); read when a
    /// rebuild first needs it, not when the runner is made (that happens for every job
    /// request and every work item of any kind).
    new_key: std::sync::OnceLock<Option<std::result::Result<HashKey, String>>>,
    /// The target, opened once per process (per job parameters: one rebuild at a time per
    /// process is the expected use; another target is opened when the parameters differ).
    target: tokio::sync::Mutex<Option<(RebuildParams, Target)>>,
}

/// The target catalog of one set of parameters, opened once.
type Target = Arc<OnceCell<Arc<Catalog>>>;

impl Rebuild {
    /// A rebuild runner reading from `source`; the new secret comes from the environment.
    pub fn new(source: Arc<Catalog>) -> Rebuild {
        Rebuild { source, new_key: std::sync::OnceLock::new(), target: tokio::sync::Mutex::new(None) }
    }

    fn new_key(&self) -> &Option<std::result::Result<HashKey, String>> {
        self.new_key.get_or_init(|| {
            std::env::var(settings::REBUILD_HASH_KEY)
                .ok()
                .filter(|v| !v.is_empty())
                .map(|v| HashKey::from_setting(&v).map_err(|e| format!("{}: {e}", settings::REBUILD_HASH_KEY)))
        })
    }

    /// The target's names and schema from the parameters.
    fn target_of(&self, params: &RebuildParams) -> Result<(Names, Schema)> {
        let names = Names::new(&params.into, None, None).map_err(|e| Error::invalid(format!("params.into: {e}")))?;
        let source = self.source.schema();
        if names.table.eq_ignore_ascii_case(&self.source.names().table) {
            return Err(Error::invalid("params.into: must name another catalog than the source"));
        }
        let index_keys = params.index_keys.as_ref().map_or_else(|| source.index_keys.clone(), FieldList::names);
        let row_key = params.row_key.clone().unwrap_or_else(|| source.row_key.clone());
        let hashed = params.hashed_keys.as_ref().map_or_else(|| source.hashed().to_vec(), FieldList::names);
        let redact = params.redact_keys.as_ref().map_or_else(|| source.redacted().to_vec(), FieldList::names);
        let key = match self.new_key() {
            Some(Ok(k)) => Some(k.clone()),
            Some(Err(e)) => return Err(Error::Config(e.clone())),
            None => source.hash_key().cloned(),
        };
        let rotating = key.as_ref().map(|k| k.id()) != source.hash_key().map(|k| k.id());
        if rotating {
            if let Some(f) = source.redacted().first() {
                return Err(Error::invalid(format!(
                    "params: field '{f}' is redacted: the catalog holds only its HMAC, not its value, so it cannot be keyed with another secret"
                )));
            }
        }
        let schema = Schema::new(index_keys, row_key)
            .and_then(|s| s.with_hashed_keys(hashed, redact, key))
            .map_err(|e| Error::invalid(format!("params: {e}")))?;
        Ok((names, schema))
    }

    /// The target catalog of a rebuild with these parameters (as given to
    /// [`super::Jobs::start`]), opened (created if new). [`Error::Invalid`] naming the
    /// parameter when they do not fit.
    pub async fn target(&self, params: &Json) -> Result<Arc<Catalog>> {
        self.target_for(&params_of(PARAMS, params)?).await
    }

    /// The target catalog of a rebuild with `params`, opened once per process.
    async fn target_for(&self, params: &RebuildParams) -> Result<Arc<Catalog>> {
        let cell = {
            let mut slot = self.target.lock().await;
            match &*slot {
                Some((p, cell)) if p == params => cell.clone(),
                _ => {
                    let cell = Arc::new(OnceCell::new());
                    *slot = Some((params.clone(), cell.clone()));
                    cell
                }
            }
        };
        let opened = cell
            .get_or_try_init(|| async {
                let (names, schema) = self.target_of(params)?;
                let store = self.source.store().clone();
                Ok::<_, Error>(Arc::new(Catalog::open(store, names, schema, CatalogOptions::default()).await?))
            })
            .await?;
        Ok(opened.clone())
    }
}

/// What one rebuild step counts, as stored (every key always): `rows` read, `records`
/// copied, `refused` (records the new schema refuses, logged and skipped).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RebuildCounters {
    /// Rows read.
    pub rows: u64,
    /// Records copied.
    pub records: u64,
    /// Records the new schema refused.
    pub refused: u64,
}

#[async_trait]
impl JobKindSpec for Rebuild {
    type Params = RebuildParams;
    type Step = Step;
    type Counters = RebuildCounters;
    type Finding = NoFinding;
    const PARAMS: &'static [&'static str] = PARAMS;
    const STEP: &'static str = SCAN_STEP;

    fn roots(&self, p: &RebuildParams) -> Result<Vec<Step>> {
        self.target_of(p)?;
        Ok(vec![Step::root()])
    }

    async fn run(&self, job: &Job, p: &RebuildParams, step: Step) -> Result<Outcome<Self>> {
        let target = self.target_for(p).await?;
        let source = &self.source;
        let out = scan::run_step(source.store().as_ref(), &source.names().table, &step, segment(p.segment)).await?;
        let rows = out.entities.len() as u64;
        let records: Vec<_> = out.entities.iter().filter_map(|e| owned_record(&source.schema(), e)).collect();
        let copied = records.len() as u64;
        let mut refused = 0u64;
        for result in target.upsert_many(records, false).await? {
            if let Err(e) = result {
                tracing::warn!(job = %job.id, error = %e, "rebuild: a record the new schema refuses was not copied");
                refused += 1;
            }
        }
        let counters = RebuildCounters { rows, records: copied - refused, refused };
        Ok(Outcome { counters, findings: Vec::new(), next: out.next })
    }
}
