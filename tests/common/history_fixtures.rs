//! Two airport records and a one-field filter, shared by the history tests.

use serde_json::{json, Value};
use table_catalog::query::Filter;
use table_catalog::record::Record;

/// A JSON object as a record.
pub fn rec(v: Value) -> Record {
    v.as_object().cloned().unwrap()
}

/// JFK with this elevation (an update changes only it).
pub fn jfk(elevation: i64) -> Record {
    rec(
        json!({"icao": "KJFK", "iata": "JFK", "lid": "JFK", "name": "John F Kennedy International Airport", "elevation": elevation}),
    )
}

/// LaGuardia with this IATA code (a different code is a different identity) and elevation.
pub fn lga(iata: &str, elevation: i64) -> Record {
    rec(json!({"icao": "KLGA", "iata": iata, "lid": "LGA", "name": "LaGuardia Airport", "elevation": elevation}))
}

/// `field = value`.
pub fn f(field: &str, value: &str) -> Filter {
    Filter::new(vec![(field.into(), value.into())])
}
