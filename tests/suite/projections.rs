//! Projections per index (issue 31, item 1; first slice): `index add FIELD --projection
//! keys|all|include:a,b` and `POST /api/indexes {"field": .., "projection": ..}` store the
//! projection with the index, `index list` / `GET /api/indexes` show it (identity fields:
//! `all`), and bad projections are refused with 400 naming the field and the limit, writing
//! nothing. On the embedded store and on Azurite.

use serde_json::json;
use table_catalog::indexes::{self, Projection};

use crate::common;
use crate::indexes::{airports, opts};

/// POST /api/indexes with `body`: (status, body).
async fn post(app: &axum::Router, body: serde_json::Value) -> (u16, serde_json::Value) {
    let (status, body) = common::call(app, "POST", "/api/indexes", Some("application/json"), body.to_string()).await;
    (status.as_u16(), body)
}

common::backend_tests! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn projections_are_stored_listed_and_validated(backend) {
        let label = format!("{backend:?}");
        let c = common::catalog_with(backend, common::airports_schema(), opts()).await;
        c.upsert_many(airports(5), true).await.unwrap();
        let app = table_catalog::http::router(c.clone());
        let many: Vec<String> = (0..33).map(|i| format!("f{i}")).collect();
        let many = format!("include:{}", many.join(","));
        let refused = [
            (json!({"field": "country", "projection": "KEYS"}), "projection: 'KEYS' is not a projection; use all, keys or include:"),
            (json!({"field": "country", "projection": "include:"}), "projection: include: lists no field"),
            (json!({"field": "country", "projection": "include:lat,,lon"}), "field 2 is empty"),
            (json!({"field": "country", "projection": "include:la-t"}), "field name 'la-t' is not a valid property name"),
            (json!({"field": "country", "projection": "include:lat,LAT"}), "'LAT' is listed twice"),
            (json!({"field": "country", "projection": many}), "lists 33 fields; the limit is 32"),
            (json!({"field": "country", "projection": 7}), "projection: a string"),
            (json!({"field": "country", "projections": "keys"}), "projections: unknown field"),
            (json!({"field": "icao", "projection": "keys"}), "projection: 'icao' is an identity field"),
        ];
        for (body, text) in refused {
            let (status, reply) = post(&app, body.clone()).await;
            let message = reply["error"]["message"].as_str().unwrap_or_default();
            assert_eq!(status, 400, "{label}: {body}: {reply}");
            assert!(message.contains(text), "{label}: {body}: {message}");
        }
        assert_eq!(indexes::list(&c).await.unwrap().len(), 3, "{label}: nothing was added");
        assert_eq!(c.schema().version(), 0, "{label}: the schema did not change");

        let (status, reply) = post(&app, json!({"field": "country", "projection": "keys"})).await;
        assert_eq!(status, 202, "{label}: {reply}");
        assert_eq!(reply["index"]["projection"], "keys", "{label}: {reply}");
        let change = indexes::add_projected(&c, "tz", Projection::parse("include:elevation,lat").unwrap()).await.unwrap();
        assert_eq!(change.index.projection, Projection::Include(vec!["elevation".into(), "lat".into()]));
        let (status, reply) = post(&app, json!({"field": "subd"})).await;
        assert_eq!(status, 202, "{label}: {reply}");
        assert_eq!(reply["index"]["projection"], "all", "{label}: absent means all");

        // Listed (and so stored: `list` re-reads the schema row).
        let (status, listed) = common::call(&app, "GET", "/api/indexes", None, "").await;
        assert_eq!(status.as_u16(), 200, "{label}: {listed}");
        let shown: Vec<(String, String)> = listed["indexes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| (i["field"].as_str().unwrap().to_string(), i["projection"].as_str().unwrap().to_string()))
            .collect();
        let want = [("icao", "all"), ("iata", "all"), ("lid", "all"), ("country", "keys"), ("tz", "include:elevation,lat"), ("subd", "all")];
        let want: Vec<(String, String)> = want.iter().map(|(f, p)| (f.to_string(), p.to_string())).collect();
        assert_eq!(shown, want, "{label}");
        assert_eq!(c.schema().projection_of("country"), &Projection::Keys, "{label}");
        assert_eq!(c.schema().projection_of("icao"), &Projection::All, "{label}");

        // The same index again: 409 as before, whatever the projection.
        let (status, reply) = post(&app, json!({"field": "country", "projection": "all"})).await;
        assert_eq!(status, 409, "{label}: {reply}");
    }
}
