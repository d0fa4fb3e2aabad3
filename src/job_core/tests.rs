//! The job protocol with a synthetic job kind: a range of numbers split in halves until a
//! piece is small, each number counted once and multiples of 7 reported as findings.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value as Json};

use super::typed;

use super::*;
use crate::dispatch::{Dispatcher, Disposition, QueuePolicy};
use crate::jobs::JobHandler;
use crate::store::local::LocalStore;
use crate::store::QueueStore;

/// Splits `[lo, hi)`; fails transiently on every `flaky`-th call, and always on the piece
/// starting at `poison` if set. With `drift`, each call splits one further to the right (as a
/// rerun of a repair step sees the rows the first run wrote).
#[derive(Default)]
struct Halves {
    calls: AtomicU32,
    flaky: u32,
    poison: Option<u64>,
    drift: bool,
}

/// `{"size": n}`.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Size {
    size: u64,
}

/// What a piece counts.
#[derive(Default, serde::Serialize)]
struct Numbers {
    #[serde(skip_serializing_if = "Option::is_none")]
    numbers: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    findings: Option<u64>,
}

/// A finding: `{"multiple_of_7": i}`.
#[derive(serde::Serialize)]
struct Multiple {
    multiple_of_7: u64,
}

#[async_trait]
impl typed::JobKindSpec for Halves {
    type Params = Size;
    /// `[lo, hi]`.
    type Step = (u64, u64);
    type Counters = Numbers;
    type Finding = Multiple;
    const PARAMS: &'static [&'static str] = &["size"];
    const STEP: &'static str = "a range";

    fn roots(&self, p: &Size) -> Result<Vec<(u64, u64)>> {
        Ok(vec![(0, p.size)])
    }

    async fn run(&self, _job: &Job, _p: &Size, (lo, hi): (u64, u64)) -> Result<typed::Outcome<Self>> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if self.flaky > 0 && call % self.flaky == 0 || self.poison == Some(lo) {
            return Err(Error::Store(StoreError::Unavailable(format!("flaky at call {call}"))));
        }
        let mut r = typed::Outcome { next: Vec::new(), counters: Numbers::default(), findings: Vec::new() };
        if hi - lo > 4 {
            let mid = if self.drift { ((lo + hi) / 2 + u64::from(call)).min(hi - 1) } else { (lo + hi) / 2 };
            r.next = vec![(lo, mid), (mid, hi)];
        } else {
            r.findings = (lo..hi).filter(|i| i % 7 == 0).map(|i| Multiple { multiple_of_7: i }).collect();
            r.counters = Numbers { numbers: Some(hi - lo), findings: Some(r.findings.len() as u64) };
        }
        Ok(r)
    }
}

async fn setup(flaky: u32, poison: Option<u64>) -> (Arc<dyn Store>, Arc<Jobs>, Dispatcher) {
    let store: Arc<dyn Store> = Arc::new(LocalStore::in_memory().unwrap());
    let (jobs, d) = setup_on(store.clone(), Halves { flaky, poison, ..Halves::default() }, 3).await;
    (store, jobs, d)
}

/// The job table and queues on `store`, jobs of `runner`, and a dispatcher that poisons after
/// `max_dequeue_count` deliveries.
async fn setup_on(store: Arc<dyn Store>, runner: Halves, max_dequeue_count: u32) -> (Arc<Jobs>, Dispatcher) {
    store.create_table("jobswal").await.unwrap();
    for q in ["scan", "scan-poison"] {
        store.create_queue(q).await.unwrap();
    }
    let runner = Arc::new(runner);
    let jobs = Arc::new(Jobs::new(store.clone(), "jobswal".into(), "scan".into()).with_runner(JobKind::Verify, runner));
    let policy = QueuePolicy { max_dequeue_count, retry_delay: Duration::ZERO, ..QueuePolicy::host() };
    let d = Dispatcher::new(store.clone(), "scan".into(), "scan-poison".into(), Arc::new(JobHandler(jobs.clone())))
        .with_policy(policy);
    (jobs, d)
}

/// Delivers every message, `copies` times each (a redelivery of the same text), until the
/// queue is empty.
async fn drain(store: &dyn QueueStore, d: &Dispatcher, copies: usize) -> Vec<Disposition> {
    let mut out = Vec::new();
    let mut copied = std::collections::HashSet::new();
    loop {
        let got = store.receive_messages("scan", 32, Duration::from_secs(60)).await.unwrap();
        if got.is_empty() {
            return out;
        }
        for m in got {
            if copied.insert(m.text.clone()) {
                for _ in 1..copies {
                    store.put_message("scan", &m.text, Duration::ZERO).await.unwrap();
                }
            }
            out.push(d.deliver(m).await);
        }
    }
}

#[tokio::test]
async fn a_job_counts_every_item_once_and_finishes_done() {
    let (store, jobs, d) = setup(0, None).await;
    let job = jobs.start(JobKind::Verify, json!({"size": 100})).await.unwrap();
    assert_eq!(job.state, JobState::Running);
    let running = jobs.get(&job.id).await.unwrap();
    assert_eq!((running.steps_pending, running.steps_done), (1, 0));
    drain(store.as_ref(), &d, 1).await;
    let done = jobs.get(&job.id).await.unwrap();
    assert_eq!(done.state, JobState::Done, "{done:?}");
    assert_eq!(done.counters["numbers"], 100);
    assert_eq!(done.counters["findings"], 15);
    assert_eq!(done.steps_pending, 0);
    let findings: Vec<Json> = jobs.findings(&job.id).try_collect().await.unwrap();
    assert_eq!(findings.len(), 15);
    assert!(done.finished.is_some());
    assert_eq!(jobs.list(10, None).await.unwrap().jobs.len(), 1);
}

#[tokio::test]
async fn redelivered_and_flaky_work_items_change_nothing() {
    // Every message delivered three times, and every 5th run fails (retried).
    let (store, jobs, d) = setup(5, None).await;
    let job = jobs.start(JobKind::Verify, json!({"size": 333})).await.unwrap();
    let dispositions = drain(store.as_ref(), &d, 3).await;
    assert!(dispositions.iter().any(|x| matches!(x, Disposition::Retry(_))), "some runs failed and were retried");
    let done = jobs.get(&job.id).await.unwrap();
    assert_eq!(done.state, JobState::Done, "{done:?}");
    assert_eq!((done.counters["numbers"], done.counters["findings"]), (333, 48));
    let findings: Vec<Json> = jobs.findings(&job.id).try_collect().await.unwrap();
    assert_eq!(findings.len(), 48, "each finding once");
}

#[tokio::test]
async fn a_work_item_failing_max_dequeue_count_times_fails_the_job() {
    let (store, jobs, d) = setup(0, Some(0)).await;
    let job = jobs.start(JobKind::Verify, json!({"size": 4})).await.unwrap();
    let dispositions = drain(store.as_ref(), &d, 1).await;
    assert!(matches!(dispositions.last(), Some(Disposition::Poisoned(_))), "{dispositions:?}");
    let failed = jobs.get(&job.id).await.unwrap();
    assert_eq!(failed.state, JobState::Failed);
    assert!(failed.last_error.as_deref().unwrap_or_default().contains("failed 3 times"), "{failed:?}");
}

#[tokio::test]
async fn a_cancelled_job_drops_its_work_items() {
    let (store, jobs, d) = setup(0, None).await;
    let job = jobs.start(JobKind::Verify, json!({"size": 50})).await.unwrap();
    assert_eq!(jobs.cancel(&job.id).await.unwrap().state, JobState::Cancelled);
    drain(store.as_ref(), &d, 1).await;
    let cancelled = jobs.get(&job.id).await.unwrap();
    assert_eq!(cancelled.state, JobState::Cancelled);
    assert!(cancelled.counters.is_empty(), "no work item ran: {cancelled:?}");
    assert!(matches!(jobs.cancel(&job.id).await, Err(Error::Conflict(_))));
}

#[tokio::test]
async fn a_lost_enqueue_is_recovered_by_resume() {
    let (store, jobs, d) = setup(0, None).await;
    let job = jobs.start(JobKind::Verify, json!({"size": 20})).await.unwrap();
    // The root's message is lost (as if the process died after recording it as outstanding).
    let lost = store.receive_messages("scan", 32, Duration::from_secs(60)).await.unwrap();
    for m in lost {
        store.delete_message("scan", &m.id, &m.pop_receipt).await.unwrap();
    }
    assert_eq!(jobs.get(&job.id).await.unwrap().state, JobState::Running);
    assert_eq!(jobs.resume(&job.id).await.unwrap(), 1);
    drain(store.as_ref(), &d, 1).await;
    let done = jobs.get(&job.id).await.unwrap();
    assert_eq!((done.state, done.counters["numbers"]), (JobState::Done, 20));
}

#[tokio::test]
async fn bad_parameters_and_work_items_are_refused() {
    let (store, jobs, d) = setup(0, None).await;
    let e = jobs.start(JobKind::Verify, json!({})).await.unwrap_err().to_string();
    assert!(e.contains("params.size"), "{e}");
    assert!(jobs.list(10, None).await.unwrap().jobs.is_empty(), "nothing written");
    assert!(jobs.start(JobKind::Repair, json!({"size": 1})).await.unwrap_err().to_string().contains("kind:"));
    store.put_message("scan", &messages::encode("{\"v\":1}"), Duration::ZERO).await.unwrap();
    let out = drain(store.as_ref(), &d, 1).await;
    assert!(matches!(&out[..], [Disposition::Poisoned(r)] if r.contains("work item")), "{out:?}");
    assert!(matches!(jobs.get(&JobId::new()).await, Err(Error::NotFound(_))));
}

/// A work item whose completion is cut short after its counters were stored (the removal of
/// its outstanding row fails) runs again: its counters and findings must not count twice.
#[cfg(feature = "testing")]
#[tokio::test]
async fn a_work_item_rerun_after_its_counters_were_stored_counts_once() {
    use crate::store::fault::{unavailable, Fault, FaultStore, OpKind, Rule, Trigger};
    let local: Arc<dyn Store> = Arc::new(LocalStore::in_memory().unwrap());
    let faults = Arc::new(FaultStore::new(local, 7));
    let store: Arc<dyn Store> = faults.clone();
    let (jobs, d) = setup_on(store.clone(), Halves::default(), 100).await;
    let job = jobs.start(JobKind::Verify, json!({"size": 200})).await.unwrap();
    faults.add(Rule::new(&[OpKind::Delete], Trigger::Probability(0.5), Fault::Fail(unavailable())).on("jobswal"));
    let out = drain(store.as_ref(), &d, 1).await;
    assert!(out.iter().filter(|x| matches!(x, Disposition::Retry(_))).count() > 5, "items were rerun: {out:?}");
    let done = jobs.get(&job.id).await.unwrap();
    assert_eq!(done.state, JobState::Done, "{done:?}");
    assert_eq!((done.counters["numbers"], done.counters["findings"]), (200, 29));
    assert_eq!(jobs.findings(&job.id).try_collect::<Vec<_>>().await.unwrap().len(), 29);
}

/// Regression (CI, `job_kill`: a repair job stalled with one item outstanding): a work item
/// that discovered children and was cut short after recording one as outstanding but before
/// enqueueing it ran again, saw a changed table, discovered other children, and left the
/// first one outstanding with no message. A rerun now enqueues the children its first run
/// recorded.
#[cfg(feature = "testing")]
#[tokio::test]
async fn a_rerun_that_discovers_other_items_leaves_no_item_outstanding_without_a_message() {
    use crate::store::fault::{unavailable, Fault, FaultStore, OpKind, Rule, Trigger};
    let local: Arc<dyn Store> = Arc::new(LocalStore::in_memory().unwrap());
    let faults = Arc::new(FaultStore::new(local, 7));
    let store: Arc<dyn Store> = faults.clone();
    let (jobs, d) = setup_on(store.clone(), Halves { drift: true, ..Halves::default() }, 100).await;
    let job = jobs.start(JobKind::Verify, json!({"size": 100})).await.unwrap();
    // The root's first child is recorded as outstanding; its enqueue fails.
    faults.add(Rule::new(&[OpKind::PutMessage], Trigger::Nth(1), Fault::Fail(unavailable())).on("scan"));
    let out = drain(store.as_ref(), &d, 1).await;
    assert!(matches!(out.first(), Some(Disposition::Retry(_))), "the root was cut short: {out:?}");
    let done = jobs.get(&job.id).await.unwrap();
    assert_eq!(done.state, JobState::Done, "no item left outstanding: {done:?}");
    assert_eq!(done.counters["numbers"], 100, "each number counted once: {done:?}");
}
