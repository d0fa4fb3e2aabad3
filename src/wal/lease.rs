//! The applier lease: one row per shard with an owner and an expiry, taken and renewed with
//! ETag compare-and-swap, so at most one applier works on a shard at a time while the lease
//! holds. Shard 0's row is `metadata/lease-wal`; every other shard's is `lease` in its own
//! partition ([`ShardId::lease_home`]), so the appliers' lease traffic (a read and a
//! conditional replace per take, one per release, a replace per renewal) spreads with the
//! shards instead of concentrating on `metadata`. A catalog from before the move may still
//! hold released `metadata/lease-wal-{k:02}` rows: nothing reads them. (A process of an
//! older version takes those rows, not these: stop old processes before new ones apply, as
//! a deployment does.)
//!
//! **Schema versions** ([`crate::indexes`]). A lease row also says which schema version its
//! holder applies with (`sv`), and which version a schema change wants every holder to reach
//! (`want_sv`). A holder writes `sv` each time it takes or renews the lease, and applies a
//! group only after the renewal (or take) that precedes it, so a row showing `sv >= N`
//! proves every group its holder starts from then on uses version `N` or newer. A schema
//! change raises `want_sv`, which also changes the row's ETag: the holder's next renewal
//! fails, it takes the lease again (it is still the owner), sees `want_sv`, re-reads the
//! schema and renews with the new `sv`.
//!
//! A lease can still expire while its holder works (a long pause, a slow clock). That is
//! safe: catalog rows are fenced by WAL id (see `crate::apply`), so a stale holder cannot
//! undo newer work. The holder stops writing once its lease is past 3/4 of its duration by
//! its own monotonic clock and cannot be renewed.

use std::time::Duration;

use crate::env::Instant;

use super::{ShardId, Wal};
use crate::error::Result;
use crate::store::{ETag, Entity, IfMatch, StoreError, Value};

/// A held lease.
#[derive(Debug)]
pub struct Lease {
    shard: ShardId,
    etag: ETag,
    renewed: Instant,
    duration: Duration,
    /// The largest schema version the row asked for when it was taken (`sv`, `want_sv`).
    wanted: u64,
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

    /// How long the lease lasts from each renewal.
    pub fn duration(&self) -> Duration {
        self.duration
    }

    /// True while the lease has not expired by the holder's monotonic clock (with margin).
    pub fn valid(&self) -> bool {
        self.renewed.elapsed() < self.duration * 3 / 4
    }

    /// The schema version the lease row asked for when it was taken: the holder re-reads
    /// the schema when its own is older, then renews ([`Wal::renew_lease`]) to say so.
    pub fn wanted_schema(&self) -> u64 {
        self.wanted
    }
}

/// What a lease row says, as a schema change's fence reads it ([`Wal::lease_row`]).
#[derive(Debug, Clone)]
pub struct LeaseRow {
    /// The holder's lease owner id.
    pub owner: String,
    /// Expiry, in ms since the Unix epoch (0: released).
    pub expires_ms: i64,
    /// The schema version the holder applies with.
    pub schema_version: u64,
    /// The schema version a change asked for.
    pub wanted: u64,
    /// The row's ETag.
    pub etag: Option<ETag>,
}

impl LeaseRow {
    fn of(e: &Entity) -> LeaseRow {
        let int = |name: &str| match e.properties.get(name) {
            Some(Value::Int64(v)) => *v,
            _ => 0,
        };
        LeaseRow {
            owner: e.str("owner").unwrap_or_default().to_string(),
            expires_ms: int("expires"),
            schema_version: int("sv").max(0) as u64,
            wanted: int("want_sv").max(0) as u64,
            etag: e.etag.clone(),
        }
    }

    /// True when nobody holds the lease now (released or expired by the wall clock).
    pub fn free(&self) -> bool {
        self.expires_ms <= wall_ms()
    }
}

fn wall_ms() -> i64 {
    super::id::now_micros() / 1000
}

impl Wal {
    fn lease_entity(&self, shard: ShardId, expires_ms: i64, wanted: u64) -> Entity {
        let (pk, rk) = shard.lease_home();
        let mut e = Entity::new(pk, rk)
            .with("owner", Value::String(self.owner.clone()))
            .with("expires", Value::Int64(expires_ms));
        let sv = self.schema_version();
        if sv > 0 {
            e.properties.insert("sv".into(), Value::Int64(sv as i64));
        }
        if wanted > sv {
            e.properties.insert("want_sv".into(), Value::Int64(wanted as i64));
        }
        e
    }

    /// The lease row of `shard`, if any (one read).
    pub async fn lease_row(&self, shard: ShardId) -> Result<Option<LeaseRow>> {
        let (pk, rk) = shard.lease_home();
        Ok(self.store.get(&self.table, &pk, &rk).await?.as_ref().map(LeaseRow::of))
    }

    /// Asks the holder of `shard`'s lease to move to schema `version`: raises the row's
    /// `want_sv` under its ETag, keeping owner and expiry (see the module docs). `Ok(false)`
    /// when the row changed since `row` was read (read it again).
    pub async fn want_schema(&self, shard: ShardId, row: &LeaseRow, version: u64) -> Result<bool> {
        let (pk, rk) = shard.lease_home();
        let e = Entity::new(pk, rk)
            .with("owner", Value::String(row.owner.clone()))
            .with("expires", Value::Int64(row.expires_ms))
            .with("sv", Value::Int64(row.schema_version as i64))
            .with("want_sv", Value::Int64(version.max(row.wanted) as i64));
        let tag = row.etag.clone().map_or(IfMatch::Any, IfMatch::Etag);
        match self.store.replace(&self.table, &e, &tag).await {
            Ok(_) => Ok(true),
            Err(StoreError::PreconditionFailed(_) | StoreError::NotFound(_)) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Takes the lease if it is free, expired, or already ours. `None` when someone else
    /// holds it.
    pub async fn acquire_lease(&self, shard: ShardId) -> Result<Option<Lease>> {
        let dur = self.opts.lease_duration;
        let started = crate::env::now();
        let (pk, rk) = shard.lease_home();
        let cur = self.store.get(&self.table, &pk, &rk).await?;
        let wanted = cur.as_ref().map_or(0, |c| {
            let row = LeaseRow::of(c);
            row.wanted.max(row.schema_version)
        });
        let want = self.lease_entity(shard, wall_ms() + dur.as_millis() as i64, wanted);
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
            Ok(etag) => Ok(Some(Lease { shard, etag, renewed: started, duration: dur, wanted })),
            Err(StoreError::AlreadyExists(_) | StoreError::PreconditionFailed(_) | StoreError::NotFound(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Extends a held lease. `Ok(false)` when it was lost to another applier.
    pub async fn renew_lease(&self, lease: &mut Lease) -> Result<bool> {
        let started = crate::env::now();
        let want = self.lease_entity(lease.shard, wall_ms() + lease.duration.as_millis() as i64, lease.wanted);
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
        let e = self.lease_entity(lease.shard, 0, lease.wanted);
        if let Err(err) = self.store.replace(&self.table, &e, &IfMatch::Etag(lease.etag)).await {
            tracing::debug!(error = %err, "lease release failed; it will expire");
        }
    }
}
