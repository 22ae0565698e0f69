//! The store thread: the only owner of the connection and the only writer. It takes every
//! request queued since its last commit and runs them in one transaction (group commit), each
//! undone alone if it fails (in a savepoint when it writes more than once) so one failing request
//! does not undo the others, and answers none of them before the transaction is durable.

use std::sync::Arc;
use std::time::Instant;

use prometheus_client::metrics::histogram::Histogram;

use courier_proto::{KeyPackage, KeyPackageBatch};
use rusqlite::{Connection, Transaction};
use tokio::sync::{mpsc, oneshot};

use super::groups::{self, Broadcast};
use super::mailboxes::Mailboxes;
use super::{accounts, addresses, contacts, journal, key_packages};
use super::{
    AppendOutcome, Counters, KeyPackagesHeld, Named, Release, StoreError, TakenKeyPackage,
};
use crate::config::MailboxLimits;
use crate::fanout::FannedOut;
use crate::group::{Actor, GroupRefusal};
use crate::mailbox::Envelope;
use crate::router::Router;

/// Requests per transaction.
const MAX_BATCH: usize = 512;
/// WAL checkpoints run when the store is idle after this many write transactions, and
/// regardless after the second figure so a never-idle relay still bounds its WAL.
const CHECKPOINT_IDLE: u32 = 64;
const CHECKPOINT_FORCED: u32 = 4096;

/// Where a request's answer goes.
pub(super) type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// A request to the store thread, with the channel its answer, of its own type, goes back on.
pub(super) enum Op {
    EnsureAccount {
        name: String,
        now_ms: u64,
        reply: Reply<()>,
    },
    AccountExists {
        name: String,
        reply: Reply<bool>,
    },
    Append {
        recipient: Named,
        /// Boxed: it is several times the size of most requests.
        envelope: Box<Envelope>,
        limits: MailboxLimits,
        reply: Reply<AppendOutcome>,
    },
    BindAddress {
        address: String,
        account: String,
        max_per_account: u32,
        now_ms: u64,
        reply: Reply<()>,
    },
    PurgeAddresses {
        older_than_ms: u64,
        reply: Reply<u64>,
    },
    ResolveAddress {
        address: String,
        reply: Reply<Option<String>>,
    },
    HighestSeq {
        account: String,
        reply: Reply<u64>,
    },
    Fetch {
        account: String,
        after: u64,
        up_to: u64,
        not_before_ms: u64,
        reply: Reply<Vec<Arc<Envelope>>>,
    },
    Release {
        account: String,
        release: Release,
        reply: Reply<()>,
    },
    Purge {
        older_than_ms: u64,
        reply: Reply<u64>,
    },
    RecordLastSeen {
        account: String,
        ms: u64,
        reply: Reply<()>,
    },
    PublishKeyPackages {
        address: String,
        packages: KeyPackageBatch,
        last_resort: Option<KeyPackage>,
        now_ms: u64,
        reply: Reply<KeyPackagesHeld>,
    },
    TakeKeyPackage {
        address: String,
        reply: Reply<Option<TakenKeyPackage>>,
    },
    CreateGroup {
        group_id: String,
        name: String,
        actor: Actor,
        now_ms: u64,
        reply: Reply<Result<(), GroupRefusal>>,
    },
    AddGroupMember {
        group_id: String,
        member: String,
        actor: Actor,
        max_members: u32,
        now_ms: u64,
        reply: Reply<Result<(), GroupRefusal>>,
    },
    RemoveGroupMember {
        group_id: String,
        member: String,
        actor: Actor,
        reply: Reply<Result<(), GroupRefusal>>,
    },
    LeaveGroup {
        group_id: String,
        actor: Actor,
        reply: Reply<Result<String, GroupRefusal>>,
    },
    Broadcast {
        /// Boxed: it is several times the size of any other request.
        broadcast: Box<Broadcast>,
        reply: Reply<Result<FannedOut, GroupRefusal>>,
    },
    HoldReport {
        account: String,
        report: String,
        now_ms: u64,
        keep: u32,
        reply: Reply<()>,
    },
    HeldReports {
        account: String,
        not_before_ms: u64,
        reply: Reply<Vec<(i64, String)>>,
    },
    DropHeldReports {
        ids: Vec<i64>,
        reply: Reply<()>,
    },
    PurgeGroups {
        older_than_ms: u64,
        reply: Reply<u64>,
    },
    RecordContact {
        a: String,
        b: String,
        reply: Reply<()>,
    },
    GroupPeers {
        identities: Vec<String>,
        reply: Reply<Vec<String>>,
    },
}

impl Op {
    /// Whether the request changes the database (counted towards the next checkpoint).
    fn writes(&self) -> bool {
        matches!(
            self,
            Op::EnsureAccount { .. }
                | Op::Append { .. }
                | Op::BindAddress { .. }
                | Op::PurgeAddresses { .. }
                | Op::Release { .. }
                | Op::Purge { .. }
                | Op::RecordLastSeen { .. }
                | Op::PublishKeyPackages { .. }
                | Op::TakeKeyPackage { .. }
                | Op::CreateGroup { .. }
                | Op::AddGroupMember { .. }
                | Op::RemoveGroupMember { .. }
                | Op::LeaveGroup { .. }
                | Op::Broadcast { .. }
                | Op::HoldReport { .. }
                | Op::DropHeldReports { .. }
                | Op::PurgeGroups { .. }
                | Op::RecordContact { .. }
        )
    }
}

pub(super) enum Msg {
    Op(Op),
    /// Finish what is queued, checkpoint, close; then say so.
    Shutdown(oneshot::Sender<()>),
}

/// Accounts, journal frames and their bytes (row sizes) one request added (negative: removed),
/// for the counters.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Delta {
    pub accounts: i64,
    pub frames: i64,
    pub bytes: i64,
}

impl Delta {
    /// One frame of `bytes` (its row's size) journaled.
    pub fn appended(bytes: i64) -> Self {
        Self {
            accounts: 0,
            frames: 1,
            bytes,
        }
    }
}

impl std::ops::AddAssign for Delta {
    fn add_assign(&mut self, other: Self) {
        self.accounts += other.accounts;
        self.frames += other.frames;
        self.bytes += other.bytes;
    }
}

/// One request's work inside the transaction, and what it leaves for after the commit.
pub(super) struct Applied<T> {
    delta: Delta,
    /// The answer, made once the commit is durable: it may act on the router (offer a frame to
    /// its recipient, move or register watches), which nobody may see before then.
    answer: Box<dyn FnOnce(&Router) -> T>,
}

impl<T: 'static> Applied<T> {
    /// An answer known now, with nothing left to do.
    pub fn value(value: T) -> Self {
        Self::then(move |_| value)
    }

    /// An answer made after the commit.
    pub fn then(answer: impl FnOnce(&Router) -> T + 'static) -> Self {
        Self {
            delta: Delta::default(),
            answer: Box::new(answer),
        }
    }

    pub fn counting(self, delta: Delta) -> Self {
        Self { delta, ..self }
    }

    /// The answer, as if the commit were durable.
    #[cfg(test)]
    pub fn answered(self, router: &Router) -> T {
        (self.answer)(router)
    }

    fn finish(self, router: &Router, counters: &Counters) -> T {
        counters.add(self.delta);
        (self.answer)(router)
    }
}

/// Answers one request once its transaction has ended: with the commit's error, with its own,
/// or with what it left for after the commit.
type Settle = Box<dyn FnOnce(&Result<(), StoreError>, &Router, &Counters)>;

fn settle<T: 'static>(reply: Reply<T>, applied: Result<Applied<T>, StoreError>) -> Settle {
    Box::new(move |committed, router, counters| {
        let answer = match committed {
            Ok(()) => applied.map(|applied| applied.finish(router, counters)),
            Err(e) => Err(e.clone()),
        };
        let _ = reply.send(answer);
    })
}

/// How a request's work is undone alone when it fails, leaving the rest of its transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Undo {
    /// The work reads, then writes with at most one statement: SQLite undoes a failing
    /// statement by itself and the transaction goes on, so no savepoint is opened — and none is
    /// paid for: inside a savepoint every page is copied to the sub-journal before its first
    /// change, which cost more than an append's own insert.
    Statement,
    /// The work writes with several statements: undone together in a savepoint.
    Savepoint,
}

/// Runs `work` in `tx`, undone alone if it fails (see [`Undo`]). The savepoint statements are
/// cached like any other: parsing them each time cost more than most requests' own work.
fn isolated<T>(
    tx: Result<&mut Transaction<'_>, &StoreError>,
    mailboxes: &mut Mailboxes,
    undo: Undo,
    work: impl FnOnce(&Connection, &mut Mailboxes) -> rusqlite::Result<Applied<T>>,
) -> Result<Applied<T>, StoreError> {
    let conn: &Connection = tx.map_err(StoreError::clone)?;
    let savepoint = undo == Undo::Savepoint;
    if savepoint {
        conn.prepare_cached("SAVEPOINT request")?.execute([])?;
    }
    let worked = work(conn, mailboxes).and_then(|applied| {
        if savepoint {
            conn.prepare_cached("RELEASE request")?.execute([])?;
        }
        Ok(applied)
    });
    match worked {
        Ok(applied) => {
            mailboxes.keep();
            Ok(applied)
        }
        Err(e) => {
            mailboxes.undo();
            tracing::error!(error = %e, "journal request failed");
            if savepoint {
                // Undone, then taken off the savepoint stack; if even that fails, the commit
                // does.
                for sql in ["ROLLBACK TO request", "RELEASE request"] {
                    if let Err(undo) = conn.prepare_cached(sql).and_then(|mut s| s.execute([])) {
                        tracing::error!(error = %undo, "undoing a failed journal request failed");
                    }
                }
            }
            Err(e.into())
        }
    }
}

/// Reads, or one write statement after every fallible read.
fn one_statement<T>(
    tx: Result<&mut Transaction<'_>, &StoreError>,
    mailboxes: &mut Mailboxes,
    work: impl FnOnce(&Connection, &mut Mailboxes) -> rusqlite::Result<Applied<T>>,
) -> Result<Applied<T>, StoreError> {
    isolated(tx, mailboxes, Undo::Statement, work)
}

/// Several write statements.
fn savepoint<T>(
    tx: Result<&mut Transaction<'_>, &StoreError>,
    mailboxes: &mut Mailboxes,
    work: impl FnOnce(&Connection, &mut Mailboxes) -> rusqlite::Result<Applied<T>>,
) -> Result<Applied<T>, StoreError> {
    isolated(tx, mailboxes, Undo::Savepoint, work)
}

/// Applies `op` (one function per operation, in the modules named for what they own) and
/// returns how to answer it.
fn apply(
    tx: Result<&mut Transaction<'_>, &StoreError>,
    mailboxes: &mut Mailboxes,
    op: Op,
) -> Settle {
    match op {
        Op::EnsureAccount {
            name,
            now_ms,
            reply,
        } => settle(
            reply,
            one_statement(tx, mailboxes, |c, _| accounts::ensure(c, &name, now_ms)),
        ),
        Op::AccountExists { name, reply } => settle(
            reply,
            one_statement(tx, mailboxes, |c, _| accounts::exists(c, &name)),
        ),
        Op::Append {
            recipient,
            envelope,
            limits,
            reply,
        } => settle(
            reply,
            one_statement(tx, mailboxes, |c, m| {
                journal::append(c, m, recipient, *envelope, &limits)
            }),
        ),
        Op::BindAddress {
            address,
            account,
            max_per_account,
            now_ms,
            reply,
        } => settle(
            reply,
            savepoint(tx, mailboxes, |c, _| {
                addresses::bind(c, address, account, max_per_account, now_ms)
            }),
        ),
        Op::PurgeAddresses {
            older_than_ms,
            reply,
        } => settle(
            reply,
            savepoint(tx, mailboxes, |c, _| addresses::purge(c, older_than_ms)),
        ),
        Op::ResolveAddress { address, reply } => settle(
            reply,
            one_statement(tx, mailboxes, |c, _| addresses::resolve(c, &address)),
        ),
        Op::HighestSeq { account, reply } => settle(
            reply,
            one_statement(tx, mailboxes, |c, m| journal::highest_seq(c, m, &account)),
        ),
        Op::Fetch {
            account,
            after,
            up_to,
            not_before_ms,
            reply,
        } => settle(
            reply,
            one_statement(tx, mailboxes, |c, _| {
                journal::fetch(c, &account, after, up_to, not_before_ms)
            }),
        ),
        Op::Release {
            account,
            release,
            reply,
        } => settle(
            reply,
            one_statement(tx, mailboxes, |c, m| {
                journal::release(c, m, &account, release)
            }),
        ),
        Op::Purge {
            older_than_ms,
            reply,
        } => settle(
            reply,
            savepoint(tx, mailboxes, |c, m| journal::purge(c, m, older_than_ms)),
        ),
        Op::RecordContact { a, b, reply } => settle(
            reply,
            one_statement(tx, mailboxes, |c, _| contacts::record(c, &a, &b)),
        ),
        Op::GroupPeers { identities, reply } => settle(
            reply,
            one_statement(tx, mailboxes, |c, _| contacts::group_peers(c, &identities)),
        ),
        Op::RecordLastSeen { account, ms, reply } => settle(
            reply,
            one_statement(tx, mailboxes, |c, _| {
                accounts::record_last_seen(c, &account, ms)
            }),
        ),
        Op::PublishKeyPackages {
            address,
            packages,
            last_resort,
            now_ms,
            reply,
        } => settle(
            reply,
            savepoint(tx, mailboxes, |c, _| {
                key_packages::publish(c, &address, packages, last_resort, now_ms)
            }),
        ),
        Op::TakeKeyPackage { address, reply } => settle(
            reply,
            savepoint(tx, mailboxes, |c, _| key_packages::take(c, &address)),
        ),
        Op::CreateGroup {
            group_id,
            name,
            actor,
            now_ms,
            reply,
        } => settle(
            reply,
            savepoint(tx, mailboxes, |c, _| {
                groups::create(c, &group_id, &name, &actor, now_ms)
            }),
        ),
        Op::AddGroupMember {
            group_id,
            member,
            actor,
            max_members,
            now_ms,
            reply,
        } => settle(
            reply,
            savepoint(tx, mailboxes, |c, _| {
                groups::add_member(c, &group_id, &member, &actor, max_members, now_ms)
            }),
        ),
        Op::RemoveGroupMember {
            group_id,
            member,
            actor,
            reply,
        } => settle(
            reply,
            savepoint(tx, mailboxes, |c, _| {
                groups::remove_member(c, &group_id, &member, &actor)
            }),
        ),
        Op::LeaveGroup {
            group_id,
            actor,
            reply,
        } => settle(
            reply,
            savepoint(tx, mailboxes, |c, _| groups::leave(c, &group_id, &actor)),
        ),
        Op::Broadcast { broadcast, reply } => settle(
            reply,
            savepoint(tx, mailboxes, |c, m| groups::broadcast(c, m, *broadcast)),
        ),
        Op::HoldReport {
            account,
            report,
            now_ms,
            keep,
            reply,
        } => settle(
            reply,
            savepoint(tx, mailboxes, |c, _| {
                groups::hold_report(c, account, &report, now_ms, keep)
            }),
        ),
        Op::HeldReports {
            account,
            not_before_ms,
            reply,
        } => settle(
            reply,
            one_statement(tx, mailboxes, |c, _| {
                groups::held_reports(c, &account, not_before_ms)
            }),
        ),
        Op::DropHeldReports { ids, reply } => settle(
            reply,
            savepoint(tx, mailboxes, |c, _| groups::drop_held_reports(c, &ids)),
        ),
        Op::PurgeGroups {
            older_than_ms,
            reply,
        } => settle(
            reply,
            savepoint(tx, mailboxes, |c, _| groups::purge(c, older_than_ms)),
        ),
    }
}

pub(super) struct Worker {
    pub conn: Connection,
    pub router: Arc<Router>,
    pub counters: Arc<Counters>,
    /// Observes each write batch, BEGIN to durable COMMIT.
    pub commit_seconds: Histogram,
    pub file_backed: bool,
    pub writes_since_checkpoint: u32,
    pub mailboxes: Mailboxes,
}

impl Worker {
    pub fn run(mut self, mut rx: mpsc::Receiver<Msg>) {
        let mut ops = Vec::with_capacity(MAX_BATCH);
        loop {
            let Some(first) = rx.blocking_recv() else {
                self.close();
                return;
            };
            let mut shutdown = None;
            match first {
                Msg::Op(op) => ops.push(op),
                Msg::Shutdown(done) => shutdown = Some(done),
            }
            while shutdown.is_none() && ops.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(Msg::Op(op)) => ops.push(op),
                    Ok(Msg::Shutdown(done)) => shutdown = Some(done),
                    Err(_) => break,
                }
            }
            if !ops.is_empty() {
                self.execute(&mut ops);
            }
            if let Some(done) = shutdown {
                // Requests still queued are dropped; their callers see `Closed`.
                rx.close();
                self.close();
                // Only now: `stop()` promises the database is closed when it returns.
                let _ = done.send(());
                return;
            }
            let idle = rx.is_empty();
            if (idle && self.writes_since_checkpoint >= CHECKPOINT_IDLE)
                || self.writes_since_checkpoint >= CHECKPOINT_FORCED
            {
                self.checkpoint("PASSIVE");
            }
        }
    }

    fn checkpoint(&mut self, mode: &str) {
        self.writes_since_checkpoint = 0;
        if !self.file_backed {
            return;
        }
        let sql = format!("PRAGMA wal_checkpoint({mode})");
        if let Err(e) = self.conn.query_row(&sql, [], |_| Ok(())) {
            tracing::warn!(error = %e, "WAL checkpoint failed");
        }
    }

    /// Folds the WAL into the database and closes the connection.
    fn close(mut self) {
        self.checkpoint("TRUNCATE");
        if let Err((_, e)) = self.conn.close() {
            tracing::warn!(error = %e, "closing the database failed");
        }
    }

    /// One transaction for the batch. Nobody hears an answer before it is durable.
    fn execute(&mut self, ops: &mut Vec<Op>) {
        let writes = ops.iter().any(Op::writes);
        let began_at = Instant::now();
        let mut began = self.conn.transaction().map_err(StoreError::from);
        if let Err(e) = &began {
            tracing::error!(error = %e, "cannot begin a journal transaction");
        }
        let mailboxes = &mut self.mailboxes;
        let settles: Vec<Settle> = ops
            .drain(..)
            .map(|op| apply(began.as_mut().map_err(|e| &*e), mailboxes, op))
            .collect();
        let committed = began.and_then(|tx| {
            mailboxes.write_back(&tx)?;
            tx.commit().map_err(StoreError::from)
        });
        match &committed {
            Ok(()) => {
                self.mailboxes.committed();
                if writes {
                    self.writes_since_checkpoint += 1;
                    self.commit_seconds
                        .observe(began_at.elapsed().as_secs_f64());
                }
            }
            Err(e) => {
                self.mailboxes.forget();
                tracing::error!(error = %e, "journal commit failed");
            }
        }
        // Durable from here on: answers and offers go out, in commit order.
        for settle in settles {
            settle(&committed, &self.router, &self.counters);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn insert(conn: &Connection, x: i64) -> rusqlite::Result<()> {
        conn.prepare_cached("INSERT INTO t (x) VALUES (?1)")?
            .execute([x])
            .map(drop)
    }

    /// Runs three requests in one transaction — insert 1, `failing`, insert 3 — each isolated
    /// by `undo`; answers whether each succeeded and what the committed table holds.
    fn three_requests(
        undo: Undo,
        failing: impl Fn(&Connection) -> rusqlite::Result<()>,
    ) -> ([bool; 3], Vec<i64>) {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (x INTEGER UNIQUE)")
            .unwrap();
        let mut tx = conn.transaction().map_err(StoreError::from);
        let mut mailboxes = Mailboxes::default();
        let mut run = |work: &dyn Fn(&Connection) -> rusqlite::Result<()>| {
            isolated(
                tx.as_mut().map_err(|e| &*e),
                &mut mailboxes,
                undo,
                |c, _| {
                    work(c)?;
                    Ok(Applied::value(()))
                },
            )
            .is_ok()
        };
        let oks = [
            run(&|c| insert(c, 1)),
            run(&failing),
            run(&|c| insert(c, 3)),
        ];
        tx.unwrap().commit().unwrap();
        let kept = conn
            .prepare("SELECT x FROM t ORDER BY x")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        (oks, kept)
    }

    #[test]
    fn a_failing_request_is_undone_alone_and_the_transaction_commits_the_rest() {
        // Its first insert succeeds, its second breaks the constraint: both are undone.
        let (oks, kept) = three_requests(Undo::Savepoint, |c| {
            insert(c, 2)?;
            insert(c, 1)
        });
        assert_eq!((oks, kept), ([true, false, true], vec![1, 3]));
    }

    /// A request that writes once runs without a savepoint: its statement, failing half-way
    /// through its rows, is undone by SQLite alone, and the rest of the transaction stays.
    #[test]
    fn a_failing_single_statement_request_is_undone_alone_without_a_savepoint() {
        // 5 and 6 go in before 1 breaks the constraint: the statement takes them back.
        let (oks, kept) = three_requests(Undo::Statement, |c| {
            c.execute_batch("INSERT INTO t (x) VALUES (5), (6), (1)")
        });
        assert_eq!((oks, kept), ([true, false, true], vec![1, 3]));
    }
}
