//! The Functions app as the host sees it: `host.json`, every `functions/*/function.json` and
//! `local.settings.json`, read with serde_json and interpreted the way the host does
//! (functions-host-contract.md §1, §3, §5, §8; docs/FUNCTIONS.md).
//!
//! host.json keys are matched ignoring ASCII case (the host binds configuration sections
//! case-insensitively). TimeSpans are `[d.]hh:mm:ss[.fff]`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};

/// `extensions.queues.messageEncoding`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageEncoding {
    /// Message text is the base64 of the bytes (the default).
    Base64,
    /// Message text is used as-is.
    None,
}

/// `extensions.queues` with the Storage Queues extension 5.x defaults (contract §4).
#[derive(Debug, Clone, PartialEq)]
pub struct QueueOptions {
    pub batch_size: usize,
    pub new_batch_threshold: usize,
    pub max_polling_interval: Duration,
    pub visibility_timeout: Duration,
    pub max_dequeue_count: u32,
    pub message_encoding: MessageEncoding,
}

/// What host.json says about the custom handler and the extensions.
#[derive(Debug, Clone)]
pub struct HostJson {
    pub raw: Value,
    /// `customHandler.description.defaultExecutablePath`.
    pub executable: String,
    /// `customHandler.description.arguments`.
    pub arguments: Vec<String>,
    /// `customHandler.description.workingDirectory` (relative to the app root), if set.
    pub working_directory: Option<String>,
    /// `customHandler.enableForwardingHttpRequest` (the legacy mode: the host rebuilds the
    /// request and buffers the answer).
    pub forwarding: bool,
    /// `customHandler.enableProxyingHttpRequest` (newer hosts: YARP proxying, both bodies
    /// streamed). A host that predates it ignores the key.
    pub proxying: bool,
    /// `customHandler.initializationTimeout` (30 s default).
    pub initialization_timeout: Duration,
    /// `extensions.http.routePrefix` (`api` default, `""` allowed).
    pub route_prefix: String,
    /// `functionTimeout`, if set.
    pub function_timeout: Option<Duration>,
    pub queues: QueueOptions,
}

/// How the host hands an HTTP request to the handler when the function has only its
/// `httpTrigger` input and `http` output (H `DefaultHttpWorkerService.InvokeAsync`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpMode {
    /// `enableProxyingHttpRequest`: `ProxyInvocationRequest`, YARP; checked first, so it wins
    /// when both flags are set.
    Proxying,
    /// `enableForwardingHttpRequest`: `ProcessHttpInAndOutInvocationRequest`, request rebuilt,
    /// answer buffered.
    Forwarding,
}

impl HostJson {
    /// The mode a host that knows both flags uses; `None` = the JSON payload mode (not
    /// implemented by this harness).
    pub fn http_mode(&self) -> Option<HttpMode> {
        if self.proxying {
            Some(HttpMode::Proxying)
        } else if self.forwarding {
            Some(HttpMode::Forwarding)
        } else {
            None
        }
    }

    /// Plays a host that uses `mode`: `Forwarding` is an older host, which ignores
    /// `enableProxyingHttpRequest`.
    pub fn set_http_mode(&mut self, mode: HttpMode) {
        self.proxying = mode == HttpMode::Proxying;
        self.forwarding = self.forwarding || mode == HttpMode::Forwarding;
    }
}

/// Authorization level of an HTTP trigger (`function` when omitted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthLevel {
    Anonymous,
    Function,
    Admin,
}

/// The trigger of a function and what the harness needs of it.
#[derive(Debug, Clone)]
pub enum Trigger {
    Http {
        binding: String,
        /// Route template without the prefix (function name when omitted).
        route: String,
        /// Lowercase method names; `None` = every method.
        methods: Option<Vec<String>>,
        auth_level: AuthLevel,
        /// Exactly one `httpTrigger` input and one `http` output: eligible for forwarding or
        /// proxying.
        in_and_out_only: bool,
    },
    Queue {
        binding: String,
        /// `queueName` as written (may be `%SETTING%`).
        queue_name: String,
        /// `connection` setting name (`AzureWebJobsStorage` when omitted).
        connection: String,
        /// `dataType` (`binary` changes the Data encoding); lowercased.
        data_type: Option<String>,
    },
    Timer {
        binding: String,
        schedule: String,
        run_on_startup: bool,
        use_monitor: bool,
    },
}

/// One function folder.
#[derive(Debug, Clone)]
pub struct FunctionDef {
    /// Folder name, case preserved (the host `POST`s `/{name}`).
    pub name: String,
    pub bindings: Vec<Value>,
    pub trigger: Trigger,
}

/// The whole app.
#[derive(Debug, Clone)]
pub struct App {
    /// App root (`FUNCTIONS_APP_ROOT_PATH`, default working directory).
    pub root: PathBuf,
    pub host: HostJson,
    pub functions: Vec<FunctionDef>,
    /// `local.settings.json` `Values`.
    pub local_values: BTreeMap<String, String>,
}

/// `obj[key]`, the exact key first, else the first key equal ignoring ASCII case.
pub fn get_ci<'a>(obj: &'a Value, key: &str) -> Option<&'a Value> {
    let map = obj.as_object()?;
    map.get(key).or_else(|| map.iter().find(|(k, _)| k.eq_ignore_ascii_case(key)).map(|(_, v)| v))
}

fn path_ci<'a>(obj: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(obj, |v, k| get_ci(v, k))
}

fn str_ci(obj: &Value, key: &str) -> Option<String> {
    get_ci(obj, key).and_then(Value::as_str).map(String::from)
}

/// A host-style boolean: JSON bool, or the strings "true"/"false".
fn bool_value(v: Option<&Value>) -> Option<bool> {
    match v? {
        Value::Bool(b) => Some(*b),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// Parses a .NET TimeSpan `[d.]hh:mm:ss[.fffffff]`.
pub fn parse_timespan(s: &str) -> Result<Duration, String> {
    let err = || format!("'{s}' is not a TimeSpan ([d.]hh:mm:ss[.fff])");
    let s = s.trim();
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 3 {
        return Err(err());
    }
    let (days, hours) = match parts[0].split_once('.') {
        Some((d, h)) => (d.parse::<u64>().map_err(|_| err())?, h.parse::<u64>().map_err(|_| err())?),
        None => (0, parts[0].parse::<u64>().map_err(|_| err())?),
    };
    let minutes = parts[1].parse::<u64>().map_err(|_| err())?;
    let seconds: f64 = parts[2].parse().map_err(|_| err())?;
    if hours > 23 || minutes > 59 || !(0.0..60.0).contains(&seconds) {
        return Err(err());
    }
    Ok(Duration::from_secs(days * 86_400 + hours * 3600 + minutes * 60) + Duration::from_secs_f64(seconds))
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

impl HostJson {
    pub fn parse(raw: Value) -> Result<HostJson, String> {
        let version = str_ci(&raw, "version");
        if version.as_deref() != Some("2.0") {
            return Err(format!("host.json: version must be \"2.0\", got {version:?}"));
        }
        let ch = get_ci(&raw, "customHandler")
            .or_else(|| get_ci(&raw, "httpWorker"))
            .ok_or("host.json: no customHandler section")?;
        let desc = get_ci(ch, "description").ok_or("host.json: customHandler.description missing")?;
        let executable = str_ci(desc, "defaultExecutablePath").filter(|s| !s.trim().is_empty()).ok_or(
            "host.json: customHandler.description.defaultExecutablePath is required (the host throws ValidationException)",
        )?;
        let arguments = match get_ci(desc, "arguments") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| v.as_str().map(String::from).ok_or("host.json: arguments must be strings"))
                .collect::<Result<_, _>>()?,
            Some(_) => return Err("host.json: customHandler.description.arguments must be an array".into()),
        };
        let initialization_timeout = match str_ci(ch, "initializationTimeout") {
            Some(t) => parse_timespan(&t)?,
            None => Duration::from_secs(30),
        };
        let route_prefix = match path_ci(&raw, &["extensions", "http", "routePrefix"]) {
            Some(Value::String(p)) => p.trim_matches('/').to_string(),
            Some(_) => return Err("host.json: extensions.http.routePrefix must be a string".into()),
            None => "api".to_string(),
        };
        let function_timeout = match str_ci(&raw, "functionTimeout") {
            Some(t) if t.trim() == "-1" => None,
            Some(t) => Some(parse_timespan(&t)?),
            None => None,
        };
        let q = path_ci(&raw, &["extensions", "queues"]).cloned().unwrap_or(Value::Object(Map::new()));
        let num = |key: &str, default: u64| -> Result<u64, String> {
            match get_ci(&q, key) {
                None => Ok(default),
                Some(v) => {
                    v.as_u64().ok_or(format!("host.json: extensions.queues.{key} must be a non-negative integer"))
                }
            }
        };
        let span = |key: &str, default: Duration| -> Result<Duration, String> {
            match get_ci(&q, key).and_then(Value::as_str) {
                None => Ok(default),
                Some(s) => parse_timespan(s).map_err(|e| format!("host.json: extensions.queues.{key}: {e}")),
            }
        };
        let batch_size = num("batchSize", 16)? as usize;
        if !(1..=32).contains(&batch_size) {
            return Err(format!("host.json: extensions.queues.batchSize {batch_size} is outside 1..=32"));
        }
        let message_encoding = match str_ci(&q, "messageEncoding").map(|s| s.to_ascii_lowercase()).as_deref() {
            None | Some("base64") => MessageEncoding::Base64,
            Some("none") => MessageEncoding::None,
            Some(other) => return Err(format!("host.json: unknown messageEncoding '{other}'")),
        };
        let queues = QueueOptions {
            batch_size,
            // Default batchSize/2 per vCPU; one vCPU as on Consumption (contract §4).
            new_batch_threshold: num("newBatchThreshold", (batch_size / 2) as u64)? as usize,
            max_polling_interval: span("maxPollingInterval", Duration::from_secs(60))?,
            visibility_timeout: span("visibilityTimeout", Duration::ZERO)?,
            max_dequeue_count: num("maxDequeueCount", 5)? as u32,
            message_encoding,
        };
        Ok(HostJson {
            executable,
            arguments,
            working_directory: str_ci(desc, "workingDirectory"),
            forwarding: bool_value(get_ci(ch, "enableForwardingHttpRequest")).unwrap_or(false),
            proxying: bool_value(get_ci(ch, "enableProxyingHttpRequest")).unwrap_or(false),
            initialization_timeout,
            route_prefix,
            function_timeout,
            queues,
            raw,
        })
    }
}

fn valid_function_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && name.len() <= 128
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl FunctionDef {
    /// Parses a function.json; `name` is its folder name.
    pub fn parse(name: &str, json: &Value) -> Result<FunctionDef, String> {
        if !valid_function_name(name) {
            return Err(format!("function folder '{name}' is not a valid function name"));
        }
        let bindings: Vec<Value> = get_ci(json, "bindings")
            .and_then(Value::as_array)
            .cloned()
            .ok_or(format!("{name}/function.json: no bindings array"))?;
        let direction = |b: &Value| str_ci(b, "direction").unwrap_or_default().to_ascii_lowercase();
        let kind = |b: &Value| str_ci(b, "type").unwrap_or_default();
        let triggers: Vec<&Value> =
            bindings.iter().filter(|b| kind(b).to_ascii_lowercase().ends_with("trigger")).collect();
        let [trigger] = triggers.as_slice() else {
            return Err(format!(
                "{name}/function.json: expected exactly one trigger binding, found {}",
                triggers.len()
            ));
        };
        if direction(trigger) != "in" {
            return Err(format!("{name}/function.json: the trigger must have direction \"in\""));
        }
        let binding = str_ci(trigger, "name").ok_or(format!("{name}/function.json: the trigger has no name"))?;
        let trigger = match kind(trigger).to_ascii_lowercase().as_str() {
            "httptrigger" => {
                let inputs = bindings.iter().filter(|b| direction(b) == "in").count();
                let outputs: Vec<&Value> = bindings.iter().filter(|b| direction(b) == "out").collect();
                let in_and_out_only =
                    inputs == 1 && outputs.len() == 1 && kind(outputs[0]).eq_ignore_ascii_case("http");
                let methods = match get_ci(trigger, "methods") {
                    None | Some(Value::Null) => None,
                    Some(Value::Array(m)) => Some(
                        m.iter()
                            .map(|v| {
                                v.as_str()
                                    .map(str::to_ascii_lowercase)
                                    .ok_or(format!("{name}: methods must be strings"))
                            })
                            .collect::<Result<Vec<_>, _>>()?,
                    ),
                    Some(_) => return Err(format!("{name}/function.json: methods must be an array")),
                };
                let auth_level = match str_ci(trigger, "authLevel").map(|s| s.to_ascii_lowercase()).as_deref() {
                    None | Some("function") => AuthLevel::Function,
                    Some("anonymous") => AuthLevel::Anonymous,
                    Some("admin") => AuthLevel::Admin,
                    Some(other) => return Err(format!("{name}/function.json: unknown authLevel '{other}'")),
                };
                let route = str_ci(trigger, "route").unwrap_or_else(|| name.to_string());
                Trigger::Http {
                    binding,
                    route: route.trim_matches('/').to_string(),
                    methods,
                    auth_level,
                    in_and_out_only,
                }
            }
            "queuetrigger" => Trigger::Queue {
                binding,
                queue_name: str_ci(trigger, "queueName")
                    .ok_or(format!("{name}/function.json: queueTrigger without queueName"))?,
                connection: str_ci(trigger, "connection").unwrap_or_else(|| "AzureWebJobsStorage".into()),
                data_type: str_ci(trigger, "dataType").map(|s| s.to_ascii_lowercase()),
            },
            "timertrigger" => Trigger::Timer {
                binding,
                schedule: str_ci(trigger, "schedule")
                    .ok_or(format!("{name}/function.json: timerTrigger without schedule"))?,
                run_on_startup: bool_value(get_ci(trigger, "runOnStartup")).unwrap_or(false),
                use_monitor: bool_value(get_ci(trigger, "useMonitor")).unwrap_or(true),
            },
            other => {
                return Err(format!("{name}/function.json: trigger type '{other}' is not supported by this harness"))
            }
        };
        Ok(FunctionDef { name: name.to_string(), bindings, trigger })
    }
}

impl App {
    /// Reads the app of the repository: `host.json` and `local.settings.json` at the root,
    /// function folders under `functions/` (the package script puts them at the zip root).
    pub fn load(root: &Path) -> App {
        let host = HostJson::parse(read_json(&root.join("host.json"))).unwrap_or_else(|e| panic!("{e}"));
        let mut functions = Vec::new();
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(root.join("functions"))
            .expect("functions/ folder")
            .map(|e| e.unwrap().path())
            .filter(|p| p.join("function.json").is_file())
            .collect();
        dirs.sort();
        for dir in dirs {
            let name = dir.file_name().unwrap().to_str().expect("UTF-8 function name").to_string();
            let def =
                FunctionDef::parse(&name, &read_json(&dir.join("function.json"))).unwrap_or_else(|e| panic!("{e}"));
            functions.push(def);
        }
        assert!(!functions.is_empty(), "no functions/*/function.json");
        let mut names: Vec<String> = functions.iter().map(|f| f.name.to_ascii_lowercase()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), functions.len(), "function names must be unique ignoring case");

        let settings = read_json(&root.join("local.settings.json"));
        let local_values = get_ci(&settings, "Values")
            .and_then(Value::as_object)
            .expect("local.settings.json: Values object")
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                (k.clone(), v)
            })
            .collect();
        App { root: root.to_path_buf(), host, functions, local_values }
    }

    pub fn function(&self, name: &str) -> Option<&FunctionDef> {
        self.functions.iter().find(|f| f.name.eq_ignore_ascii_case(name))
    }

    /// The single function with a trigger of this kind (`queue`, `timer`).
    pub fn only(&self, kind: &str) -> &FunctionDef {
        let found: Vec<&FunctionDef> = self
            .functions
            .iter()
            .filter(|f| {
                matches!(
                    (&f.trigger, kind),
                    (Trigger::Queue { .. }, "queue")
                        | (Trigger::Timer { .. }, "timer")
                        | (Trigger::Http { .. }, "http")
                )
            })
            .collect();
        assert_eq!(found.len(), 1, "expected one {kind}-triggered function, found {}", found.len());
        found[0]
    }

    pub fn http_functions(&self) -> impl Iterator<Item = &FunctionDef> {
        self.functions.iter().filter(|f| matches!(f.trigger, Trigger::Http { .. }))
    }
}

/// Expands `%NAME%` references from `env` (the host's app-setting resolution). An unknown
/// name is an error, as in the host (binding fails to index).
pub fn resolve_setting_refs(value: &str, env: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = value;
    while let Some(start) = rest.find('%') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        let end = after.find('%').ok_or(format!("unclosed %...% in '{value}'"))?;
        let name = &after[..end];
        let v = env
            .get(name)
            .or_else(|| env.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v))
            .ok_or(format!("'{value}' refers to app setting '{name}', which is not set"))?;
        out.push_str(v);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The host joins `arguments` with single spaces into one command line (no quoting), which
/// .NET splits back into argv: whitespace separates, double quotes group.
pub fn command_line_args(arguments: &[String], env: &BTreeMap<String, String>) -> Result<Vec<String>, String> {
    let joined = arguments.iter().map(|a| resolve_setting_refs(a, env)).collect::<Result<Vec<_>, _>>()?.join(" ");
    let mut args = Vec::new();
    let mut cur = String::new();
    let mut in_quotes = false;
    let mut has = false;
    for c in joined.chars() {
        match c {
            '"' => {
                in_quotes = !in_quotes;
                has = true;
            }
            c if c.is_whitespace() && !in_quotes => {
                if has {
                    args.push(std::mem::take(&mut cur));
                    has = false;
                }
            }
            c => {
                cur.push(c);
                has = true;
            }
        }
    }
    if has {
        args.push(cur);
    }
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timespans() {
        assert_eq!(parse_timespan("00:00:30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_timespan("1.02:00:00").unwrap(), Duration::from_secs(26 * 3600));
        assert_eq!(parse_timespan("00:00:00.5").unwrap(), Duration::from_millis(500));
        assert!(parse_timespan("30").is_err());
    }

    #[test]
    fn proxying_wins_when_both_http_flags_are_set() {
        let host = |ch: Value| {
            let mut ch = ch;
            ch["description"] = serde_json::json!({"defaultExecutablePath": "table-catalog"});
            HostJson::parse(serde_json::json!({"version": "2.0", "customHandler": ch})).unwrap()
        };
        let both = host(serde_json::json!({"enableForwardingHttpRequest": true, "EnableProxyingHttpRequest": "true"}));
        assert_eq!(both.http_mode(), Some(HttpMode::Proxying));
        let mut older = both.clone();
        older.set_http_mode(HttpMode::Forwarding);
        assert_eq!(older.http_mode(), Some(HttpMode::Forwarding));
        assert_eq!(
            host(serde_json::json!({"enableForwardingHttpRequest": true})).http_mode(),
            Some(HttpMode::Forwarding)
        );
        assert_eq!(host(serde_json::json!({})).http_mode(), None);
    }

    #[test]
    fn args_and_refs() {
        let env: BTreeMap<String, String> = [("Q".to_string(), "q1".to_string())].into();
        assert_eq!(resolve_setting_refs("%Q%", &env).unwrap(), "q1");
        assert_eq!(resolve_setting_refs("x-%q%-y", &env).unwrap(), "x-q1-y");
        assert!(resolve_setting_refs("%NOPE%", &env).is_err());
        let a = command_line_args(&["handler".into(), "--x \"a b\"".into()], &env).unwrap();
        assert_eq!(a, ["handler", "--x", "a b"]);
    }
}
