//! A relay node's appends, one lane per recipient (`docs/cluster.md#appends-on-a-node`). An
//! append to JetStream takes several round trips, and one connection's frames to one recipient
//! must be journaled in the order it sent them: awaited one by one, a connection could send no
//! faster than one append's latency. Queued in a lane instead, a connection goes on reading
//! while the lane journals its frames in order; lanes of different recipients run side by side,
//! and appends to one recipient through this node no longer overtake each other on the
//! journal's conditional publish.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use crate::cluster::{Appended, ClusterError, JetStreamStore};
use crate::lock;
use crate::mailbox::Envelope;
use crate::store::Named;

/// Appends queued on a node, all lanes together; past it a connection waits to queue more.
const QUEUED: usize = 4096;

/// What is done with an append's outcome, once it has one.
pub type Done = Box<dyn FnOnce(Result<Appended, ClusterError>) + Send>;

/// An append queued in a lane.
struct Job {
    envelope: Envelope,
    done: Done,
    /// Its place among the [`QUEUED`], given back once it is answered.
    _room: OwnedSemaphorePermit,
}

pub struct Lanes {
    store: JetStreamStore,
    /// Each append's time, from its first read to JetStream's acknowledgement.
    commit_seconds: Histogram,
    open: Arc<Mutex<HashMap<Named, mpsc::UnboundedSender<Job>>>>,
    room: Arc<Semaphore>,
}

impl Lanes {
    pub fn new(store: JetStreamStore, commit_seconds: Histogram) -> Self {
        Self {
            store,
            commit_seconds,
            open: Arc::new(Mutex::new(HashMap::new())),
            room: Arc::new(Semaphore::new(QUEUED)),
        }
    }

    /// Queues `envelope` for `recipient` behind the appends queued for it before; `done` gets
    /// the outcome once it is journaled. Waits only while [`QUEUED`] appends are queued
    /// already.
    pub async fn queue(&self, recipient: Named, envelope: Envelope, done: Done) {
        let room = Arc::clone(&self.room)
            .acquire_owned()
            .await
            .unwrap_or_else(|_| unreachable!("the semaphore is never closed"));
        let job = Job {
            envelope,
            done,
            _room: room,
        };
        // Under the lock: a lane's worker closes it only under the lock too, after finding its
        // queue empty, so a job sent here is never left in a closed lane.
        let mut open = lock(&self.open);
        let job = match open.get(&recipient) {
            Some(lane) => match lane.send(job) {
                Ok(()) => return,
                // Its worker is gone without closing it (it panicked): a new lane takes over.
                Err(mpsc::error::SendError(job)) => job,
            },
            None => job,
        };
        let (lane, jobs) = mpsc::unbounded_channel();
        let _ = lane.send(job);
        open.insert(recipient.clone(), lane);
        tokio::spawn(run_lane(
            recipient,
            jobs,
            self.store.clone(),
            self.commit_seconds.clone(),
            Arc::clone(&self.open),
        ));
    }
}

/// Journals the lane's appends in order, then closes the lane once nothing is queued in it.
async fn run_lane(
    recipient: Named,
    mut jobs: mpsc::UnboundedReceiver<Job>,
    store: JetStreamStore,
    commit_seconds: Histogram,
    open: Arc<Mutex<HashMap<Named, mpsc::UnboundedSender<Job>>>>,
) {
    loop {
        let job = match jobs.try_recv() {
            Ok(job) => job,
            Err(_) => {
                let mut lanes = lock(&open);
                // Checked again under the lock, which every sender holds.
                match jobs.try_recv() {
                    Ok(job) => job,
                    Err(_) => {
                        lanes.remove(&recipient);
                        return;
                    }
                }
            }
        };
        let started = Instant::now();
        let appended = store.append(recipient.clone(), &job.envelope).await;
        commit_seconds.observe(started.elapsed().as_secs_f64());
        (job.done)(appended);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::cluster::ClusterConfig;
    use crate::config::{AddressLimits, MailboxLimits};

    use crate::nats_harness as nats;

    fn envelope(message_id: &str) -> Envelope {
        Envelope {
            seq: None,
            sender: "alice".into(),
            sender_account: "alice".into(),
            message_id: message_id.into(),
            content: format!("content of {message_id}").into(),
            reply_to_msg: None,
            accepted_ms: crate::now_ms(),
            group: None,
        }
    }

    /// `docs/cluster.md#appends-on-a-node`: frames queued for two recipients without waiting
    /// for any answer are each journaled in the order queued, answered in that order, and
    /// every lane ends once it is empty.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_lane_journals_its_frames_in_the_order_queued() {
        const FRAMES: usize = 40;
        let cluster = nats::NatsCluster::start(1).await;
        let store = JetStreamStore::open(&ClusterConfig {
            servers: cluster.urls(),
            name: ClusterConfig::DEFAULT_NAME.into(),
            replicas: 1,
            mailbox: MailboxLimits {
                max_journal_bytes: 64 * 1024 * 1024,
                ..MailboxLimits::default()
            },
            addresses: AddressLimits::default(),
            presence_ttl: ClusterConfig::DEFAULT_PRESENCE_TTL,
        })
        .await
        .unwrap();
        let recipients = ["bob", "carol"];
        for account in recipients {
            store.ensure_account(account, 1).await.unwrap();
        }
        let lanes = Lanes::new(store.clone(), Histogram::new([1.0]));
        let (tx, mut answers) = mpsc::unbounded_channel();
        for i in 0..FRAMES {
            for account in recipients {
                let tx = tx.clone();
                let id = format!("m{i:02}");
                let done: Done = Box::new(move |appended| {
                    let _ = tx.send((account, id, appended));
                });
                lanes
                    .queue(
                        Named::Account(account.into()),
                        envelope(&format!("m{i:02}")),
                        done,
                    )
                    .await;
            }
        }
        let mut answered: HashMap<&str, Vec<(String, u64)>> = HashMap::new();
        for _ in 0..FRAMES * recipients.len() {
            let (account, id, appended) =
                tokio::time::timeout(nats::CLUSTER_DEADLINE, answers.recv())
                    .await
                    .expect("every append answered within the deadline")
                    .unwrap();
            let Ok(Appended::Accepted { seq }) = appended else {
                panic!("{account} {id}: {appended:?}");
            };
            answered.entry(account).or_default().push((id, seq));
        }
        let expected: Vec<String> = (0..FRAMES).map(|i| format!("m{i:02}")).collect();
        for account in recipients {
            let ids: Vec<&String> = answered[account].iter().map(|(id, _)| id).collect();
            assert_eq!(
                ids,
                expected.iter().collect::<Vec<_>>(),
                "{account}'s answers"
            );
            let seqs: Vec<u64> = answered[account].iter().map(|&(_, seq)| seq).collect();
            assert!(
                seqs.windows(2).all(|w| w[0] < w[1]),
                "{account}'s seqs: {seqs:?}"
            );
            let up_to = store.highest_seq(account).await.unwrap();
            let held = store
                .fetch(account, 0, up_to, 0)
                .await
                .unwrap()
                .iter()
                .map(|e| e.message_id.clone())
                .collect::<Vec<_>>();
            assert_eq!(held, expected, "{account}'s journal");
        }
        let deadline = tokio::time::Instant::now() + nats::CLUSTER_DEADLINE;
        while !lock(&lanes.open).is_empty() {
            assert!(tokio::time::Instant::now() < deadline, "the lanes end");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
