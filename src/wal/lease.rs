//! The applier lease: one row per shard (`metadata/lease-{partition}`) with an owner and an expiry, taken
//! and renewed with ETag compare-and-swap, so at most one applier works on a shard at a
//! time while the lease holds.
//!
//! A lease can still expire while its holder works (a long pause, a slow clock). That is
//! safe: catalog rows are fenced by WAL id (see [`crate::apply`]), so a stale holder cannot
//! undo newer work. The holder stops writing once its lease is past 3/4 of its duration by
//! its own monotonic clock and cannot be renewed.

use std::time::{Duration, Instant};

use super::{ShardId, Wal, METADATA};
use crate::error::Result;
use crate::store::{ETag, Entity, IfMatch, StoreError, Value};

/// A held lease.
#[derive(Debug)]
pub struct Lease {
    shard: ShardId,
    etag: ETag,
    renewed: Instant,
    duration: Duration,
}

impl Lease {
    /// The shard it is the lease of.
    pub fn shard(&self) -> ShardId {
        self.shard
    }

    /// True while the holder may still write without renewing.
    pub fn fresh(&self) -> bool {
        self.renewed.elapsed() < self.duration / 2
    }

    /// True while the lease has not expired by the holder's monotonic clock (with margin).
    pub fn valid(&self) -> bool {
        self.renewed.elapsed() < self.duration * 3 / 4
    }
}

fn wall_ms() -> i64 {
    super::id::now_micros() / 1000
}

impl Wal {
    fn lease_entity(&self, shard: ShardId, expires_ms: i64) -> Entity {
        Entity::new(METADATA, shard.lease_row())
            .with("owner", Value::String(self.owner.clone()))
            .with("expires", Value::Int64(expires_ms))
    }

    /// Takes the lease if it is free, expired, or already ours. `None` when someone else
    /// holds it.
    pub async fn acquire_lease(&self, shard: ShardId) -> Result<Option<Lease>> {
        let dur = self.opts.lease_duration;
        let started = Instant::now();
        let want = self.lease_entity(shard, wall_ms() + dur.as_millis() as i64);
        let cur = self.store.get(&self.table, METADATA, &shard.lease_row()).await?;
        let written = match cur {
            None => self.store.insert(&self.table, &want).await,
            Some(c) => {
                let expires = match c.properties.get("expires") {
                    Some(Value::Int64(v)) => *v,
                    _ => 0,
                };
                if c.str("owner") != Some(self.owner.as_str()) && expires > wall_ms() {
                    return Ok(None);
                }
                let tag = c.etag.clone().unwrap_or(ETag(String::new()));
                self.store.replace(&self.table, &want, &IfMatch::Etag(tag)).await
            }
        };
        match written {
            Ok(etag) => Ok(Some(Lease { shard, etag, renewed: started, duration: dur })),
            Err(StoreError::AlreadyExists(_) | StoreError::PreconditionFailed(_) | StoreError::NotFound(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Extends a held lease. `Ok(false)` when it was lost to another applier.
    pub async fn renew_lease(&self, lease: &mut Lease) -> Result<bool> {
        let started = Instant::now();
        let want = self.lease_entity(lease.shard, wall_ms() + lease.duration.as_millis() as i64);
        match self.store.replace(&self.table, &want, &IfMatch::Etag(lease.etag.clone())).await {
            Ok(etag) => {
                lease.etag = etag;
                lease.renewed = started;
                Ok(true)
            }
            Err(StoreError::PreconditionFailed(_) | StoreError::NotFound(_)) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Renews the lease if it is past half its duration. `Ok(false)` when it is lost or too
    /// old to write under.
    pub async fn keep_lease(&self, lease: &mut Lease) -> Result<bool> {
        if lease.fresh() {
            return Ok(true);
        }
        Ok(self.renew_lease(lease).await? && lease.valid())
    }

    /// Gives the lease up (best effort: an expired lease is free anyway).
    pub async fn release_lease(&self, lease: Lease) {
        let e = self.lease_entity(lease.shard, 0);
        if let Err(err) = self.store.replace(&self.table, &e, &IfMatch::Etag(lease.etag)).await {
            tracing::debug!(error = %err, "lease release failed; it will expire");
        }
    }
}
