//! Copies a message that can never succeed to the poison queue, with the reason, in the shape
//! operators read back (`{"reason", "message_id", "dequeue_count", "message"}`, Base64 like
//! every message of the app).

use std::time::Duration;

use crate::error::Result;
use crate::messages;
use crate::store::{QueueStore, StoreError};

/// Characters of the original text kept in a poison entry (a queue message holds at most
/// 64 KiB; the rest of the entry must fit beside it).
pub const KEPT_CHARS: usize = 40_000;

/// Puts `text` (as received) on `poison_queue` with `reason`. A text too large to copy is
/// replaced by a note, so the entry is written whatever the message was.
pub async fn poison(
    store: &dyn QueueStore,
    poison_queue: &str,
    text: &str,
    message_id: &str,
    dequeue_count: u32,
    reason: &str,
) -> Result<()> {
    tracing::warn!(message_id, dequeue_count, reason, poison_queue, "message moved to the poison queue");
    let body = serde_json::json!({
        "reason": reason,
        "message_id": message_id,
        "dequeue_count": dequeue_count,
        "message": text.chars().take(KEPT_CHARS).collect::<String>(),
    });
    match store.put_message(poison_queue, &messages::encode(&body.to_string()), Duration::ZERO).await {
        Ok(_) => Ok(()),
        Err(StoreError::InvalidInput(_)) => {
            let short = serde_json::json!({
                "reason": reason,
                "message_id": message_id,
                "dequeue_count": dequeue_count,
                "message": "(too large to copy)",
            });
            store.put_message(poison_queue, &messages::encode(&short.to_string()), Duration::ZERO).await?;
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}
