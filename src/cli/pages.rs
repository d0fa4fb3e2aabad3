//! One loop for the CLI commands that print a paged listing (`history`, `dead`, `jobs list`)
//! as JSON lines, up to a limit, following continuation tokens.

use std::future::Future;

use anyhow::Result;
use serde::Serialize;

/// Most items one page may ask for (the listings' own page limit).
const PAGE: usize = 1000;

/// Prints the items of the pages `fetch(size, token)` returns, one JSON object per line,
/// until `limit` items were printed or a page carries no continuation token. The first page
/// is always asked for, so the listing itself checks `limit` (a 0 is refused there, as over
/// HTTP). Returns how many items were printed.
pub(crate) async fn print_pages<T, F, Fut>(limit: usize, mut fetch: F) -> Result<usize>
where
    T: Serialize,
    F: FnMut(usize, Option<String>) -> Fut,
    Fut: Future<Output = Result<(Vec<T>, Option<String>)>>,
{
    let mut token: Option<String> = None;
    let mut printed = 0;
    loop {
        let (items, continuation) = fetch(limit.saturating_sub(printed).min(PAGE), token.take()).await?;
        for item in items {
            println!("{}", serde_json::to_string(&item)?);
            printed += 1;
        }
        match continuation {
            Some(t) if printed < limit => token = Some(t),
            _ => return Ok(printed),
        }
    }
}
