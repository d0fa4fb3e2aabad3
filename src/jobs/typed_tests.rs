//! The stored shapes of every job kind: today's JSON (written literally, object keys sorted as
//! every build wrote them) read into the kind's types and written back byte for byte, and a
//! bad shape refused with [`crate::error::Error::Invalid`] naming the field.

use std::collections::BTreeMap;

use serde_json::json;

use super::index::{self, IndexCounters};
use super::kinds::{CheckCounters, ScanParams};
use super::rebuild::{FieldList, RebuildCounters, RebuildParams};
use super::trim::{TrimCounters, TrimParams};
use crate::error::Error;
use crate::job_core::index_params::{IndexJobParams, IndexParams};
use crate::job_core::segment::SCAN_STEP;
use crate::job_core::typed::{counters_of, params_of, round_trip, step_of};
use crate::job_core::JobKind;
use crate::scan::Step;

/// `text` read as `T` and written back is `text`.
fn same<T: serde::Serialize + serde::de::DeserializeOwned>(text: &str) {
    assert_eq!(round_trip::<T>(text), text, "{}", std::any::type_name::<T>());
}

/// The message of the [`Error::Invalid`] that reading `params` as `P` gives.
fn refused<P: serde::de::DeserializeOwned + std::fmt::Debug>(known: &[&str], params: serde_json::Value) -> String {
    match params_of::<P>(known, &params) {
        Err(Error::Invalid(m)) => m,
        other => panic!("{params} gave {other:?}"),
    }
}

#[test]
fn scan_steps_keep_their_stored_shape() {
    for text in [
        r#"{"prefix":"","step":"prefix"}"#,
        "{\"hi\":\"4_iata\u{ffff}\",\"lo\":\"4_iata\",\"prefix\":\"4_iata\",\"step\":\"prefix\"}",
        r#"{"lo":"D","prefix":"D","step":"prefix"}"#,
        r#"{"pk":"4_iatajfk","step":"partition"}"#,
        r#"{"after":"john f kennedy:1a2b3c4d","pk":"4_iatajfk","step":"partition"}"#,
    ] {
        same::<Step>(text);
    }
    let e = step_of::<Step>(SCAN_STEP, &json!({"step": "prefix", "lo": 5})).unwrap_err().to_string();
    assert!(e.starts_with("work item: not a scan step: "), "{e}");
    assert!(step_of::<Step>(SCAN_STEP, &json!([0, 4])).is_err());
}

#[test]
fn verify_and_repair_keep_their_stored_shapes() {
    same::<ScanParams>("{}");
    same::<ScanParams>(r#"{"segment":250}"#);
    assert_eq!(params_of::<ScanParams>(&["segment"], &json!({"segment": null})).unwrap(), ScanParams::default());
    same::<CheckCounters>(r#"{"partitions":0}"#);
    same::<CheckCounters>(r#"{"partitions":1,"records":3,"rows":4,"tombstones":1}"#);
    let repair = r#"{"deletes":1,"findings":3,"missing_row":2,"partitions":2,"records":3,"removals":1,"rows":4,"stale":1,"tombstones":0,"unrepairable":1,"upserts":1}"#;
    same::<CheckCounters>(repair);
    let typed: CheckCounters = serde_json::from_str(repair).unwrap();
    let map: BTreeMap<String, u64> = serde_json::from_str(repair).unwrap();
    assert_eq!(counters_of(&typed).unwrap(), map, "stored as the same map");

    let e = refused::<ScanParams>(&["segment"], json!({"segment": 0}));
    assert_eq!(e, "params.segment: 0 is not a whole number in 1..=1000");
    assert!(refused::<ScanParams>(&["segment"], json!({"segment": "x"})).starts_with("params.segment: "));
    assert!(refused::<ScanParams>(&["segment"], json!({"segment": 2.5})).starts_with("params.segment: "));
    let e = refused::<ScanParams>(&["segment"], json!({"speed": 1}));
    assert_eq!(e, "params.speed: unknown parameter (known: segment)");
    assert_eq!(refused::<ScanParams>(&["segment"], json!([1])), "params: must be a JSON object");
}

#[test]
fn index_jobs_keep_their_stored_shapes() {
    same::<IndexJobParams>(r#"{"field":"iata","version":3}"#);
    same::<IndexJobParams>(r#"{"field":"iata","segment":10,"version":3}"#);
    // What a schema change stores, and the first work items of each kind.
    assert_eq!(
        IndexParams { field: "iata".into(), version: 3 }.to_json().to_string(),
        r#"{"field":"iata","version":3}"#
    );
    let drop = index::roots(JobKind::DropIndex, "IATA");
    assert_eq!(
        drop[0].to_string(),
        "{\"hi\":\"4_iata\u{ffff}\",\"lo\":\"4_iata\",\"prefix\":\"4_iata\",\"step\":\"prefix\"}"
    );
    assert_eq!(index::roots(JobKind::Backfill, "iata")[0].to_string(), r#"{"prefix":"","step":"prefix"}"#);
    same::<IndexCounters>(r#"{"written":0}"#);
    same::<IndexCounters>(r#"{"records":1,"rows":3,"tombstones":1,"unkeyable":1,"written":1}"#);
    same::<IndexCounters>(r#"{"deleted":5}"#);

    let known = ["field", "version", "segment"];
    assert!(refused::<IndexJobParams>(&known, json!({"field": 5, "version": 1})).starts_with("params.field: "));
    assert!(refused::<IndexJobParams>(&known, json!({"field": "", "version": 1})).starts_with("params.field: "));
    assert_eq!(refused::<IndexJobParams>(&known, json!({"field": "iata"})), "params.version: required");
    assert!(refused::<IndexJobParams>(&known, json!({"field": "iata", "version": -1})).starts_with("params.version: "));
    let e = refused::<IndexJobParams>(&known, json!({"field": "iata", "version": 1, "x": 1}));
    assert_eq!(e, "params.x: unknown parameter (known: field, version, segment)");
    let e = IndexParams::of(&json!({"version": 1})).unwrap_err().to_string();
    assert_eq!(e, "params.field: required");
}

#[test]
fn rebuild_keeps_its_stored_shapes() {
    same::<RebuildParams>(r#"{"into":"Dst"}"#);
    // Lists as lists, and as the comma-separated strings the CLI passes through.
    let full = r#"{"hashed_keys":["ssn"],"index_keys":"icao, iata","into":"Dst","redact_keys":[],"row_key":"name","segment":100}"#;
    same::<RebuildParams>(full);
    let p: RebuildParams = serde_json::from_str(full).unwrap();
    assert_eq!(p.index_keys.as_ref().map(FieldList::names), Some(vec!["icao".into(), "iata".into()]));
    assert_eq!(p.hashed_keys.as_ref().map(FieldList::names), Some(vec!["ssn".into()]));
    same::<RebuildCounters>(r#"{"records":3,"refused":1,"rows":5}"#);

    let known = ["into", "index_keys", "row_key", "hashed_keys", "redact_keys", "segment"];
    assert_eq!(refused::<RebuildParams>(&known, json!({})), "params.into: required");
    assert!(refused::<RebuildParams>(&known, json!({"into": 5})).starts_with("params.into: "));
    let e = refused::<RebuildParams>(&known, json!({"into": "Dst", "index_keys": 5}));
    assert_eq!(e, "params.index_keys: a list of field names");
    let e = refused::<RebuildParams>(&known, json!({"into": "Dst", "redact_keys": ["a", 1]}));
    assert_eq!(e, "params.redact_keys: a list of field names");
    assert!(refused::<RebuildParams>(&known, json!({"into": "Dst", "row_key": ["a"]})).starts_with("params.row_key: "));
}

#[test]
fn trim_history_keeps_its_stored_shapes() {
    same::<TrimParams>("{}");
    same::<TrimParams>(r#"{"days":30,"segment":7}"#);
    same::<TrimCounters>(r#"{"removed":2,"rows":60}"#);

    let known = ["days", "segment"];
    assert_eq!(refused::<TrimParams>(&known, json!({"days": 0})), "params.days: 0 is not a whole number in 1..=36500");
    assert!(refused::<TrimParams>(&known, json!({"days": u64::MAX})).starts_with("params.days: "));
    assert!(refused::<TrimParams>(&known, json!({"days": "30"})).starts_with("params.days: "));
    assert!(refused::<TrimParams>(&known, json!({"days": 1, "segment": 1001})).starts_with("params.segment: "));
}
