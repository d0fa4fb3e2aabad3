//! Every environment setting the binary reads, in one machine-readable table.
//!
//! [`SETTINGS`] is the single list that configuration code, the documentation and the
//! deployment assets are checked against: `tests/suite/functions_assets.rs` verifies that every
//! setting the Functions app needs is set by `infra/main.bicep` and by `local.settings.json`,
//! and that the table, queue and function names agree with the defaults here.
//!
//! Defaults are written as templates: `{SETTING_NAME}` stands for the value of another
//! setting (after its own default applies), and [`default_value`] expands them. Test-only
//! switches (`TABLE_CATALOG_CRASH_AT`, feature `testing`) are not settings and are not
//! listed. CLI flags override these settings; that mapping lives with the CLI.

/// Catalog table name setting.
pub const NAME: &str = "TABLE_CATALOG_NAME";
/// Indexed fields setting.
pub const INDEX_KEYS: &str = "TABLE_CATALOG_INDEX_KEYS";
/// Row-key (sort) field setting.
pub const ROW_KEY: &str = "TABLE_CATALOG_ROW_KEY";
/// Hashed index fields setting (see `crate::hashed`).
pub const HASHED_KEYS: &str = "TABLE_CATALOG_HASHED_KEYS";
/// Redacted index fields setting (a subset of [`HASHED_KEYS`]).
pub const REDACT_KEYS: &str = "TABLE_CATALOG_REDACT_KEYS";
/// The HMAC secret of hashed index fields (never logged).
pub const HASH_KEY: &str = "TABLE_CATALOG_HASH_KEY";
/// The new HMAC secret of a `rebuild` job that rotates the key (never logged).
pub const REBUILD_HASH_KEY: &str = "TABLE_CATALOG_REBUILD_HASH_KEY";
/// WAL table name setting.
pub const WAL_NAME: &str = "TABLE_CATALOG_WAL_NAME";
/// Apply queue name setting (also the queue the `apply` function triggers on).
pub const QUEUE: &str = "TABLE_CATALOG_QUEUE";
/// Scan queue name setting (the queue the `scan` function triggers on; see [`crate::jobs`]).
pub const SCAN_QUEUE: &str = "TABLE_CATALOG_SCAN_QUEUE";
/// WAL shard count setting (see [`crate::wal::shard`]).
pub const WAL_SHARDS: &str = "TABLE_CATALOG_WAL_SHARDS";
/// History switch setting (see [`crate::history`]).
pub const HISTORY: &str = "TABLE_CATALOG_HISTORY";
/// History retention in days setting.
pub const HISTORY_DAYS: &str = "TABLE_CATALOG_HISTORY_DAYS";
/// History retention in rows per record setting.
pub const HISTORY_MAX: &str = "TABLE_CATALOG_HISTORY_MAX";
/// Catalog mode setting: `wal` (default) or `single-partition` (see `crate::single`).
pub const MODE: &str = "TABLE_CATALOG_MODE";
/// Tenant key of a single-partition catalog: the name of its one partition.
pub const TENANT: &str = "TABLE_CATALOG_TENANT";
/// Embedded-store folder setting.
pub const LOCAL_PATH: &str = "TABLE_CATALOG_LOCAL_PATH";
/// `serve` listen address setting.
pub const LISTEN: &str = "TABLE_CATALOG_LISTEN";
/// Storage connection string setting read first.
pub const CONNECTION_STRING: &str = "AZURE_STORAGE_CONNECTION_STRING";
/// The Functions host's storage connection, the fallback for [`CONNECTION_STRING`].
pub const WEBJOBS_STORAGE: &str = "AzureWebJobsStorage";
/// Identity-based storage: account name (endpoints `https://{name}.{table|queue}.core.windows.net`).
pub const WEBJOBS_ACCOUNT_NAME: &str = "AzureWebJobsStorage__accountName";
/// Identity-based storage: table service endpoint.
pub const WEBJOBS_TABLE_URI: &str = "AzureWebJobsStorage__tableServiceUri";
/// Identity-based storage: queue service endpoint.
pub const WEBJOBS_QUEUE_URI: &str = "AzureWebJobsStorage__queueServiceUri";
/// Identity-based storage: `managedidentity`.
pub const WEBJOBS_CREDENTIAL: &str = "AzureWebJobsStorage__credential";
/// Identity-based storage: client id of the user-assigned identity.
pub const WEBJOBS_CLIENT_ID: &str = "AzureWebJobsStorage__clientId";
/// Managed-identity token endpoint, set by App Service / Functions.
pub const IDENTITY_ENDPOINT: &str = "IDENTITY_ENDPOINT";
/// Secret header value of the managed-identity endpoint, set by App Service / Functions.
pub const IDENTITY_HEADER: &str = "IDENTITY_HEADER";
/// Port the Functions host assigns to the custom handler.
pub const CUSTOMHANDLER_PORT: &str = "FUNCTIONS_CUSTOMHANDLER_PORT";

/// Default embedded-store folder.
pub const DEFAULT_LOCAL_PATH: &str = ".table-catalog";
/// Default `serve` listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7071";
/// Default catalog table name; the Functions app deploys with it.
pub const DEFAULT_NAME: &str = "catalog";
/// Suffix of the poison queue name: the Functions host moves a message that failed
/// `maxDequeueCount` times to `{queue}-poison`, and the catalog puts permanently bad
/// messages there itself.
pub const POISON_SUFFIX: &str = "-poison";

/// Which commands of the binary read a setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsedIn {
    /// Not `handler`: `serve` (and the operator commands, where the description says so).
    Serve,
    /// Only `handler` (the Azure Functions custom handler).
    Handler,
    /// Every command, `handler` included.
    Both,
}

/// How the Azure Functions app provides a setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FunctionsApp {
    /// An app setting: `infra/main.bicep` and `local.settings.json` set it (directly, or
    /// through the setting its default refers to).
    AppSetting,
    /// Left unset: `serve`-only, or a fallback that never applies in a Functions app.
    Unset,
    /// Set by the Functions host when it starts the handler.
    Host,
    /// Identity-based storage access: `infra/main.bicep` sets it (no key anywhere);
    /// `local.settings.json` uses the `AzureWebJobsStorage` connection string instead.
    Identity,
    /// An optional app setting, off when empty: `infra/main.bicep` sets it from a parameter
    /// that defaults to empty, and `local.settings.json` lists it as an empty placeholder.
    Optional,
}

/// One environment setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// Environment variable name, exactly as read (case matters on Linux).
    pub name: &'static str,
    /// Value used when unset; `{OTHER}` stands for the value of setting `OTHER`.
    /// `None`: no default (required where used, or the feature is off; see the description).
    pub default: Option<&'static str>,
    /// What the setting does, its constraints, and what happens when it is unset.
    pub description: &'static str,
    /// Which commands read it.
    pub used_in: UsedIn,
    /// How the Functions app provides it.
    pub functions_app: FunctionsApp,
}

impl Setting {
    /// True when the Functions app must have this setting configured by the operator
    /// (app settings in Azure, `Values` of `local.settings.json` locally).
    pub fn required_in_functions_app(&self) -> bool {
        self.functions_app == FunctionsApp::AppSetting
    }
}

/// Every setting the binary reads, in the order the documentation lists them.
pub const SETTINGS: &[Setting] = &[
    Setting {
        name: NAME,
        default: Some(DEFAULT_NAME),
        description: "Catalog table name. Azure table names are alphanumeric, 3-63 characters, \
                      starting with a letter.",
        used_in: UsedIn::Both,
        functions_app: FunctionsApp::AppSetting,
    },
    Setting {
        name: INDEX_KEYS,
        default: None,
        description: "Comma-separated indexed fields (e.g. `eid,ssn,npi`). Required to create \
                      the catalog (at least one); optional once its schema is stored in the WAL \
                      table, and then it must match. The Functions app sets it.",
        used_in: UsedIn::Both,
        functions_app: FunctionsApp::AppSetting,
    },
    Setting {
        name: ROW_KEY,
        default: None,
        description: "Field whose value starts the RowKey (sort order within an index \
                      partition). Required to create the catalog; optional once its schema is \
                      stored, and then it must match. The Functions app sets it.",
        used_in: UsedIn::Both,
        functions_app: FunctionsApp::AppSetting,
    },
    Setting {
        name: HASHED_KEYS,
        default: None,
        description: "Comma-separated index fields keyed by `HMAC-SHA-256(TABLE_CATALOG_HASH_KEY, \
                      lowercased value)` instead of their value, so no PartitionKey or RowKey \
                      holds them in plaintext (e.g. `ssn`). Lookups stay exact; ranges are \
                      impossible, so the row-key field cannot be hashed. Stored with the schema \
                      on first use; then it must match. Unset: no field is hashed.",
        used_in: UsedIn::Both,
        functions_app: FunctionsApp::Optional,
    },
    Setting {
        name: REDACT_KEYS,
        default: None,
        description: "Comma-separated hashed fields (a subset of `TABLE_CATALOG_HASHED_KEYS`) \
                      that records hold as `hmac-sha256:<hex>` instead of their value, in the \
                      WAL and in every catalog row. Stored with the schema; then it must match.",
        used_in: UsedIn::Both,
        functions_app: FunctionsApp::Optional,
    },
    Setting {
        name: HASH_KEY,
        default: None,
        description: "The HMAC secret of hashed fields: at least 32 bytes, as hex (only hex \
                      digits) or standard base64 (`openssl rand -base64 32`). In Azure a Key \
                      Vault reference that the Functions host resolves. Never logged; the catalog \
                      stores only its id (8 hex digits of its SHA-256), and opening it with \
                      another key fails. Required when a field is hashed.",
        used_in: UsedIn::Both,
        functions_app: FunctionsApp::Optional,
    },
    Setting {
        name: WAL_NAME,
        default: Some("{TABLE_CATALOG_NAME}wal"),
        description: "WAL table name (alphanumeric, like every Azure table name).",
        used_in: UsedIn::Both,
        functions_app: FunctionsApp::AppSetting,
    },
    Setting {
        name: QUEUE,
        default: Some("{TABLE_CATALOG_NAME}-apply"),
        description: "Apply queue: hint and write-intent messages. Lowercased (queue names are \
                      lowercase letters, digits and single hyphens, 3-63 characters). The poison \
                      queue is `{queue}-poison`. The `apply` function's queue trigger names this \
                      setting (`%TABLE_CATALOG_QUEUE%`), so the Functions app must set it.",
        used_in: UsedIn::Both,
        functions_app: FunctionsApp::AppSetting,
    },
    Setting {
        name: REBUILD_HASH_KEY,
        default: None,
        description: "The new HMAC secret while a `rebuild` job rotates the key of hashed fields \
                      (same format as `TABLE_CATALOG_HASH_KEY`). Set it on every process that \
                      runs the job's work items for the duration of the rotation, then make it \
                      the new catalog's `TABLE_CATALOG_HASH_KEY`. Unset: a rebuild keeps the key.",
        used_in: UsedIn::Both,
        functions_app: FunctionsApp::Unset,
    },
    Setting {
        name: SCAN_QUEUE,
        default: Some("{TABLE_CATALOG_QUEUE}-scan"),
        description: "Scan queue: work items of jobs (verify, repair). Always `{queue}-scan`, \
                      with the poison queue `{queue}-scan-poison`; any other value is refused. \
                      The `scan` function's queue trigger names this setting \
                      (`%TABLE_CATALOG_SCAN_QUEUE%`), so the Functions app must set it.",
        used_in: UsedIn::Both,
        functions_app: FunctionsApp::AppSetting,
    },
    Setting {
        name: WAL_SHARDS,
        default: Some("4"),
        description: "WAL shards new writes are spread over, 1-64: each has its own WAL \
                      partition, applier lease and checkpoint, applied in parallel. The catalog \
                      stores the largest count it was ever opened with and uses that: raising \
                      it takes effect at once, lowering it has no effect. 4 suits up to about \
                      800 writes/s on Azure; raise it to 8 or 16 above (docs/BENCHMARKS.md).",
        used_in: UsedIn::Both,
        functions_app: FunctionsApp::AppSetting,
    },
    Setting {
        name: HISTORY,
        default: Some("off"),
        description: "`on` records every applied change in the table `{TABLE_CATALOG_NAME}history`, \
                      one row per record and change, newest first (`GET /api/records/history`, \
                      `table-catalog history`). Off by default: it costs one more storage \
                      request per record written and keeps past versions of records, deleted \
                      ones included, until retention removes them. Turning it on records \
                      changes applied from then on.",
        used_in: UsedIn::Both,
        functions_app: FunctionsApp::Unset,
    },
    Setting {
        name: HISTORY_DAYS,
        default: None,
        description: "History retention: rows older than this many days (1-36500) are removed \
                      when their record changes again. Unset: kept.",
        used_in: UsedIn::Both,
        functions_app: FunctionsApp::Unset,
    },
    Setting {
        name: HISTORY_MAX,
        default: None,
        description: "History retention: keep about this many rows per record (1-1000000); a \
                      record's history is trimmed back to it when a change finds more than \
                      this plus a tenth. Unset: kept.",
        used_in: UsedIn::Both,
        functions_app: FunctionsApp::Unset,
    },
    Setting {
        name: MODE,
        default: Some("wal"),
        description: "How the catalog stores records, chosen when it is created and stored with \
                      it (opening it in the other mode is refused): `wal`, one partition per \
                      indexed value with the write-ahead log, or `single-partition`, every row \
                      in the one partition named by TABLE_CATALOG_TENANT, each write one atomic \
                      entity group transaction (no WAL, queue or sweeper; at most 99 index \
                      values per record; README.md, \"Choosing a mode\").",
        used_in: UsedIn::Both,
        functions_app: FunctionsApp::Optional,
    },
    Setting {
        name: TENANT,
        default: None,
        description: "The tenant key of a single-partition catalog (required with \
                      TABLE_CATALOG_MODE=single-partition): the PartitionKey its rows share, \
                      at most 1 KiB once escaped. Ignored in WAL mode.",
        used_in: UsedIn::Both,
        functions_app: FunctionsApp::Optional,
    },
    Setting {
        name: LOCAL_PATH,
        default: Some(DEFAULT_LOCAL_PATH),
        description: "Folder of the embedded store, used when no storage connection string is \
                      set. A Functions app always has one, so it leaves this unset.",
        used_in: UsedIn::Both,
        functions_app: FunctionsApp::Unset,
    },
    Setting {
        name: LISTEN,
        default: Some(DEFAULT_LISTEN),
        description: "Address `serve` listens on (HTTP API).",
        used_in: UsedIn::Serve,
        functions_app: FunctionsApp::Unset,
    },
    Setting {
        name: CONNECTION_STRING,
        default: Some("{AzureWebJobsStorage}"),
        description: "Azure Storage connection string (Shared Key or SAS; \
                      `UseDevelopmentStorage=true` for Azurite). Unset: falls back to \
                      `AzureWebJobsStorage`, then to the identity-based \
                      `AzureWebJobsStorage__*` settings; none set: the embedded store. The \
                      Functions app leaves it unset (keyless: managed identity).",
        used_in: UsedIn::Both,
        functions_app: FunctionsApp::Unset,
    },
    Setting {
        name: WEBJOBS_STORAGE,
        default: None,
        description: "The Functions host's storage connection string; the fallback for \
                      `AZURE_STORAGE_CONNECTION_STRING`. In Azure the app uses the \
                      identity-based form instead (the `AzureWebJobsStorage__*` settings below), \
                      which the binary reads too.",
        used_in: UsedIn::Both,
        functions_app: FunctionsApp::AppSetting,
    },
    Setting {
        name: WEBJOBS_ACCOUNT_NAME,
        default: None,
        description: "Identity-based storage: the account name; endpoints \
                      `https://{name}.table.core.windows.net` and `.queue.`. Used when no \
                      connection string is set. The Bicep sets the service URIs instead.",
        used_in: UsedIn::Both,
        functions_app: FunctionsApp::Unset,
    },
    Setting {
        name: WEBJOBS_TABLE_URI,
        default: None,
        description: "Identity-based storage: table service endpoint (overrides the one \
                      derived from `AzureWebJobsStorage__accountName`). Requests carry Entra ID \
                      tokens of the managed identity; the identity needs Storage Table Data \
                      Contributor.",
        used_in: UsedIn::Both,
        functions_app: FunctionsApp::Identity,
    },
    Setting {
        name: WEBJOBS_QUEUE_URI,
        default: None,
        description: "Identity-based storage: queue service endpoint (the apply queue; the \
                      host's queue trigger reads it too). The identity needs Storage Queue Data \
                      Contributor.",
        used_in: UsedIn::Both,
        functions_app: FunctionsApp::Identity,
    },
    Setting {
        name: WEBJOBS_CREDENTIAL,
        default: Some("managedidentity"),
        description: "Identity-based storage: `managedidentity`, the only value accepted.",
        used_in: UsedIn::Both,
        functions_app: FunctionsApp::Identity,
    },
    Setting {
        name: WEBJOBS_CLIENT_ID,
        default: None,
        description: "Identity-based storage: client id of the user-assigned managed identity \
                      whose tokens are used. Unset: the system-assigned identity.",
        used_in: UsedIn::Both,
        functions_app: FunctionsApp::Identity,
    },
    Setting {
        name: IDENTITY_ENDPOINT,
        default: None,
        description: "Managed-identity token endpoint; App Service and Functions set it (with \
                      `IDENTITY_HEADER`). Required for identity-based storage access.",
        used_in: UsedIn::Both,
        functions_app: FunctionsApp::Host,
    },
    Setting {
        name: IDENTITY_HEADER,
        default: None,
        description: "Secret the managed-identity endpoint requires in `X-IDENTITY-HEADER`; App \
                      Service and Functions set it. Never logged.",
        used_in: UsedIn::Both,
        functions_app: FunctionsApp::Host,
    },
    Setting {
        name: CUSTOMHANDLER_PORT,
        default: None,
        description: "TCP port on 127.0.0.1 that `handler` listens on; the Functions host picks \
                      it and sets this variable when it starts the handler. Required by \
                      `handler`.",
        used_in: UsedIn::Handler,
        functions_app: FunctionsApp::Host,
    },
];

/// The setting named `name`, if the binary reads it.
pub fn find(name: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.name == name)
}

/// The effective value of setting `name`: `lookup(name)` if it returns a value, else its
/// default with `{OTHER}` references expanded recursively through `lookup` and the defaults.
/// The apply queue's value is lowercased, as the binary does.
///
/// `None` when the setting is unknown, unset without a default, or its default refers to a
/// setting that has no value (or to itself, directly or not).
pub fn default_value(name: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    resolve(name, lookup, 0)
}

fn resolve(name: &str, lookup: &dyn Fn(&str) -> Option<String>, depth: usize) -> Option<String> {
    // Deeper than the table is long means a reference cycle.
    if depth > SETTINGS.len() {
        return None;
    }
    let setting = find(name)?;
    let value = match lookup(name) {
        Some(v) => v,
        None => expand(setting.default?, lookup, depth)?,
    };
    Some(if name == QUEUE || name == SCAN_QUEUE { value.to_lowercase() } else { value })
}

fn expand(template: &str, lookup: &dyn Fn(&str) -> Option<String>, depth: usize) -> Option<String> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        let end = after.find('}')?;
        out.push_str(&resolve(&after[..end], lookup, depth + 1)?);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Some(out)
}

/// Name of the poison queue of `queue`.
pub fn poison_queue_name(queue: &str) -> String {
    format!("{queue}{POISON_SUFFIX}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wal_shards_default_is_the_library_default() {
        let default = find(WAL_SHARDS).and_then(|s| s.default).map(str::to_string);
        assert_eq!(default, Some(crate::wal::shard::DEFAULT_SHARDS.to_string()));
    }

    fn none(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn names_are_unique() {
        for (i, s) in SETTINGS.iter().enumerate() {
            assert!(SETTINGS[..i].iter().all(|o| o.name != s.name), "{} listed twice", s.name);
        }
    }

    #[test]
    fn derived_defaults_follow_the_catalog_name() {
        assert_eq!(default_value(NAME, &none).as_deref(), Some("catalog"));
        assert_eq!(default_value(WAL_NAME, &none).as_deref(), Some("catalogwal"));
        assert_eq!(default_value(QUEUE, &none).as_deref(), Some("catalog-apply"));
        assert_eq!(poison_queue_name("catalog-apply"), "catalog-apply-poison");
        let named = |n: &str| (n == NAME).then(|| "Providers".to_string());
        assert_eq!(default_value(WAL_NAME, &named).as_deref(), Some("Providerswal"));
        assert_eq!(default_value(QUEUE, &named).as_deref(), Some("providers-apply"));
    }

    #[test]
    fn connection_string_falls_back_to_webjobs_storage() {
        assert_eq!(default_value(CONNECTION_STRING, &none), None);
        let dev = |n: &str| (n == WEBJOBS_STORAGE).then(|| "UseDevelopmentStorage=true".to_string());
        assert_eq!(default_value(CONNECTION_STRING, &dev).as_deref(), Some("UseDevelopmentStorage=true"));
    }

    #[test]
    fn required_and_unknown_settings_have_no_value() {
        assert_eq!(default_value(INDEX_KEYS, &none), None);
        assert_eq!(default_value("NOT_A_SETTING", &none), None);
    }

    #[test]
    fn every_template_reference_names_a_setting() {
        for s in SETTINGS {
            let Some(mut rest) = s.default else { continue };
            while let Some(start) = rest.find('{') {
                let end = rest[start..].find('}').expect("unclosed reference") + start;
                let target = &rest[start + 1..end];
                assert!(find(target).is_some(), "{} refers to unknown {target}", s.name);
                rest = &rest[end + 1..];
            }
        }
    }

    #[test]
    fn functions_app_requirements() {
        let required: Vec<&str> = SETTINGS.iter().filter(|s| s.required_in_functions_app()).map(|s| s.name).collect();
        assert!(required.contains(&QUEUE));
        assert!(!required.contains(&LISTEN));
        assert!(!required.contains(&LOCAL_PATH));
        assert!(!required.contains(&CUSTOMHANDLER_PORT));
    }
}
