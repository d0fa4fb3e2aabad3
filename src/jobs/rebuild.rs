//! The `rebuild` job: copies every live record of the catalog into another catalog with
//! another schema, through that catalog's WAL, one scan step per work item. What it is for:
//! - changing the row key (the sort field), which rewrites every RowKey;
//! - rotating the secret of hashed index fields, which rewrites every hashed PartitionKey and
//!   every RowKey fingerprint ([`crate::hashed`]);
//! - adding, dropping, hashing or un-hashing index fields in one pass.
//!
//! Parameters (`{"kind": "rebuild", "params": {...}}`):
//! - `into` (required): the new catalog's name (a table name; its WAL table and queues follow);
//! - `index_keys`, `row_key`, `hashed_keys`, `redact_keys` (optional): the new schema; each
//!   absent one is the source's;
//! - `segment` (optional): entities per scan query, 1..=1,000.
//!
//! The new catalog's hash secret is [`crate::settings::REBUILD_HASH_KEY`] when set (a key
//! rotation), else the source's; every worker must see the same value (opening the new
//! catalog with another key fails, like any catalog). A redacted field cannot be re-keyed: the
//! source holds only its HMAC, not the value; the job refuses to start then.
//!
//! Idempotent: a record is upserted under its identity in the new schema, so a rerun of a
//! work item logs the same upserts again. Writes to the source during the rebuild may or may
//! not be copied; stop writers (or re-run) before switching over, then verify the new catalog.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{json, Value as Json};
use tokio::sync::OnceCell;

use super::kinds::{children, scan_step, segment_of};
use super::{Job, JobRunner, StepResult};
use crate::catalog::{Catalog, CatalogOptions};
use crate::error::{Error, Result};
use crate::export::owned_record;
use crate::hashed::HashKey;
use crate::names::Names;
use crate::scan::{self, Step};
use crate::schema::Schema;
use crate::settings;

/// Parameters a rebuild accepts.
const PARAMS: [&str; 6] = ["into", "index_keys", "row_key", "hashed_keys", "redact_keys", "segment"];

/// Copies the source catalog into the one `params.into` names.
pub struct Rebuild {
    source: Arc<Catalog>,
    /// The new secret, if this process has one ([`settings::REBUILD_HASH_KEY`]); read when a
    /// rebuild first needs it, not when the runner is made (that happens for every job
    /// request and every work item of any kind).
    new_key: std::sync::OnceLock<Option<std::result::Result<HashKey, String>>>,
    /// The target, opened once per process (per job parameters: one rebuild at a time per
    /// process is the expected use; another target is opened when the parameters differ).
    target: tokio::sync::Mutex<Option<(Json, Target)>>,
}

/// The target catalog of one set of parameters, opened once.
type Target = Arc<OnceCell<Arc<Catalog>>>;

fn list(params: &Json, name: &str) -> Result<Option<Vec<String>>> {
    match params.get(name) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(String::from)
                    .ok_or_else(|| Error::invalid(format!("params.{name}: a list of field names")))
            })
            .collect::<Result<Vec<_>>>()
            .map(Some),
        Some(Json::String(s)) => Ok(Some(Schema::parse_list(s))),
        Some(_) => Err(Error::invalid(format!("params.{name}: a list of field names"))),
    }
}

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
    fn target_of(&self, params: &Json) -> Result<(Names, Schema)> {
        if let Some(unknown) = params.as_object().and_then(|o| o.keys().find(|k| !PARAMS.contains(&k.as_str()))) {
            return Err(Error::invalid(format!("params.{unknown}: unknown parameter (known: {})", PARAMS.join(", "))));
        }
        let into = params
            .get("into")
            .and_then(Json::as_str)
            .ok_or_else(|| Error::invalid("params.into: the new catalog's name is required"))?;
        let names = Names::new(into, None, None).map_err(|e| Error::invalid(format!("params.into: {e}")))?;
        let source = self.source.schema();
        if names.table.eq_ignore_ascii_case(&self.source.names().table) {
            return Err(Error::invalid("params.into: must name another catalog than the source"));
        }
        let index_keys = list(params, "index_keys")?.unwrap_or_else(|| source.index_keys.clone());
        let row_key = match params.get("row_key") {
            None | Some(Json::Null) => source.row_key.clone(),
            Some(v) => v.as_str().map(String::from).ok_or_else(|| Error::invalid("params.row_key: a field name"))?,
        };
        let hashed = list(params, "hashed_keys")?.unwrap_or_else(|| source.hashed().to_vec());
        let redact = list(params, "redact_keys")?.unwrap_or_else(|| source.redacted().to_vec());
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

    /// The target catalog of a rebuild with these parameters, opened (created if new).
    pub async fn target(&self, params: &Json) -> Result<Arc<Catalog>> {
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

#[async_trait]
impl JobRunner for Rebuild {
    fn roots(&self, params: &Json) -> Result<Vec<Json>> {
        self.target_of(params)?;
        segment_of(params)?;
        Ok(vec![json!(Step::root())])
    }

    async fn run(&self, job: &Job, step: &Json) -> Result<StepResult> {
        let step = scan_step(step)?;
        let target = self.target(&job.params).await?;
        let source = &self.source;
        let out =
            scan::run_step(source.store().as_ref(), &source.names().table, &step, segment_of(&job.params)?).await?;
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
        let counters = BTreeMap::from([
            ("rows".to_string(), rows),
            ("records".to_string(), copied - refused),
            ("refused".to_string(), refused),
        ]);
        Ok(StepResult { counters, findings: Vec::new(), next: children(&out.next) })
    }
}
