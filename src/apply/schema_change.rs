//! Applying a schema change ([`crate::wal::Op::Schema`], logged by [`crate::indexes`]).
//!
//! The entry is logged in shard 0 and waits for the low-watermark barrier like a filter
//! entry ([`super::barrier`]), so every write acknowledged before the change was issued is
//! applied first. Then the **fence**: every shard's applier must apply with the new schema
//! before the change's job starts, because a backfill scan that had passed a record could
//! not see a later apply of it under the old schema (which would leave the record without a
//! row of the new index), and a drop's scan could not see a row written after it passed.
//!
//! The fence reads each other shard's lease row ([`crate::wal::lease`]):
//! - `sv >= version`: done. Every group its holder starts from then on uses the new
//!   schema, and any process taking the lease later reads `sv` and re-reads the schema first.
//! - free (released or expired) with an older `sv`: this applier takes the lease itself (a
//!   nested pass, which also applies the shard's pending upserts under the new schema), so
//!   the row shows the new version. A stale holder whose lease expired mid-group cannot leave
//!   an old-schema write behind: its group's entries stay pending until that group is fully
//!   written, so either they are still pending and the nested pass applies them again under
//!   the new schema, or all their writes landed before the nested pass read the shard.
//! - held with an older `sv`: raise `want_sv`. The holder's next renewal fails, it takes the
//!   lease again, re-reads the schema and renews with the new `sv`; or the lease expires and
//!   the case above applies. At most one lease duration.
//!
//! The fence gives up at the caller's deadline like the barrier (the entry stays pending and
//! the next pass retries); once it has passed, the job is started under an id derived from
//! the entry's WAL id, so applying the entry again starts nothing new. The engine starts it
//! through [`SchemaJobs`], which the catalog wires in (`crate::schema_manager`): the apply
//! engine does not depend on the jobs.

use std::time::Duration;

use crate::env::Instant;

use futures::future::BoxFuture;

use super::applier::Applier;
use super::barrier::Passed;
use super::outcome::DrainOutcome;
pub use super::schema_jobs::SchemaJobs;
use crate::error::{Error, Result};
use crate::schema::IndexState;
use crate::wal::lease::Lease;
use crate::wal::{ShardId, WalEntry};

impl Applier {
    /// Waits until every shard other than `own` applies with schema `version` or newer (see
    /// the module docs), applying free shards itself. Returns at `deadline` at the latest.
    /// (Boxed: it runs nested apply passes, which is recursion through
    /// [`Applier::run_shard`].)
    pub(crate) fn fence<'a>(
        &'a self,
        own: ShardId,
        version: u64,
        lease: &'a mut Lease,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Passed>> {
        Box::pin(self.wait_fence(own, version, lease, deadline))
    }

    async fn wait_fence(&self, own: ShardId, version: u64, lease: &mut Lease, deadline: Instant) -> Result<Passed> {
        self.ensure_schema(version).await?;
        let mut delays = crate::env::poll_delays(Duration::from_millis(10), Duration::from_millis(500));
        loop {
            let count = self.wal.current_shard_count().await?;
            let mut behind = 0;
            for shard in ShardId::all(count).filter(|s| *s != own) {
                let row = self.wal.lease_row(shard).await?;
                match row {
                    Some(r) if r.schema_version >= version => {}
                    Some(r) if !r.free() => {
                        behind += 1;
                        if r.wanted < version {
                            self.wal.want_schema(shard, &r, version).await?;
                        }
                    }
                    _ => {
                        // Free: take it (the nested pass stamps the row with our version).
                        if self.run_shard(shard, deadline, true).await? == DrainOutcome::Busy {
                            behind += 1;
                        }
                    }
                }
            }
            if behind == 0 {
                return Ok(Passed::Yes { cleared: None });
            }
            tracing::debug!(version, behind, "schema change waits for appliers to adopt it");
            if crate::env::now() >= deadline {
                return Ok(Passed::NotYet);
            }
            if !self.wal.keep_lease(lease).await? {
                return Ok(Passed::LeaseLost);
            }
            let left = deadline.saturating_duration_since(crate::env::now());
            crate::env::sleep(delays.next().unwrap_or(left).min(left)).await;
        }
    }

    /// Applies a schema-change entry whose fence has passed: records the id of the job the
    /// change needs on the index (backfill for an added index, row removal for a dropped
    /// one), then starts that job. Recorded first: an applier that wrote a row of a dropping
    /// index and then reads the schema without the job knows the job's scan has not begun
    /// (`super::dropping`; with the job started first, a scan could pass the row before the
    /// record, found by the checker on CI as rows of a dropped index left behind). Applying
    /// the entry again (a crash between the two steps, or the change published again) starts
    /// the recorded job, which is idempotent. Nothing to do when a later change superseded
    /// this one.
    pub(crate) async fn apply_schema_change(&self, entry: &WalEntry, version: u64) -> Result<()> {
        self.ensure_schema(version).await?;
        let schema = self.schema();
        let Some(index) = schema.added().iter().find(|a| a.version == version) else {
            return Ok(());
        };
        let dropping = match index.state {
            IndexState::Backfilling => false,
            IndexState::Dropping => true,
            IndexState::Active => return Ok(()),
        };
        let field = index.field.clone();
        crate::faults::point("before_schema_job")?;
        let jobs = self.jobs.clone().ok_or_else(|| {
            Error::Config("this applier has no scan queue; schema changes need one to start their job".into())
        })?;
        if index.job.is_none() {
            let id = jobs.job_id(&entry.id);
            crate::wal::schema_row::update(self.store.as_ref(), self.wal.table(), |_, added, _| {
                match added.iter_mut().find(|a| a.field == field && a.version == version) {
                    Some(a) if a.job.is_none() => {
                        a.job = Some(id.clone());
                        Ok(true)
                    }
                    _ => Ok(false),
                }
            })
            .await?;
            self.reload_schema().await?;
        }
        let schema = self.schema();
        let Some(recorded) = schema.added().iter().find(|a| a.version == version).and_then(|a| a.job.clone()) else {
            return Ok(()); // superseded meanwhile
        };
        jobs.start(&recorded, &field, dropping, version).await
    }
}
