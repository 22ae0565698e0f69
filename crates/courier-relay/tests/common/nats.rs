//! A NATS cluster on loopback for the cluster mode's tests (`docs/cluster.md`): 1 or 3
//! `nats-server` processes with JetStream, their stores in a temp dir, routes between them on
//! ephemeral ports. Waits are polls with a deadline; every server is SIGKILLed on drop.
//!
//! The binary is `COURIER_NATS_SERVER` when set, else where `node scripts/install-nats.mjs`
//! installs it.

use std::fs::File;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A cluster has elected its JetStream meta leader, or a restarted server has caught up, within
/// this.
pub const CLUSTER_DEADLINE: Duration = Duration::from_secs(30);

/// Between two readiness probes.
const POLL: Duration = Duration::from_millis(50);

pub fn nats_server_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("COURIER_NATS_SERVER") {
        return PathBuf::from(path);
    }
    let home = std::env::var_os("HOME").expect("HOME is set");
    let path = Path::new(&home).join(".cache/courier-tools/nats/bin/nats-server");
    assert!(
        path.exists(),
        "no nats-server at {}: run `node scripts/install-nats.mjs` (or set COURIER_NATS_SERVER)",
        path.display()
    );
    path
}

/// A port free on 127.0.0.1 now. The listener is closed before the server binds the port, which
/// another process could take meanwhile; the server then fails to start and the readiness wait
/// says so.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("an ephemeral port")
        .port()
}

struct Server {
    name: String,
    client: u16,
    monitor: u16,
    config: PathBuf,
    log: PathBuf,
    process: Option<Child>,
}

impl Server {
    fn spawn(&mut self) {
        assert!(self.process.is_none(), "{} is already running", self.name);
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("the server's log file");
        let child = Command::new(nats_server_binary())
            .arg("-c")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .spawn()
            .expect("nats-server starts");
        self.process = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.process.take() {
            // SIGKILL: no shutdown, no flush beyond what JetStream already synced.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub struct NatsCluster {
    dir: tempfile::TempDir,
    servers: Vec<Server>,
    /// Held while the cluster lives: one cluster per test process at a time, so elections and
    /// JetStream requests are not starved of the machine's cores by other tests' clusters.
    turn: Option<tokio::sync::MutexGuard<'static, ()>>,
}

static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl NatsCluster {
    /// Starts `size` servers (1, or 3 for a cluster with routes between all of them) and waits
    /// until JetStream answers on each.
    pub async fn start(size: usize) -> Self {
        assert!(size == 1 || size == 3, "a cluster of 1 or 3 servers");
        let mut turn = Some(TURN.lock().await);
        // A port found free can be taken by another process before the server binds it: that
        // server exits at once, and the cluster starts again on other ports.
        for _ in 0..3 {
            let (dir, servers) = Self::configure(size);
            let mut cluster = Self { dir, servers, turn };
            for server in &mut cluster.servers {
                server.spawn();
            }
            match cluster.poll_healthy().await {
                Ok(()) => return cluster,
                Err(exited) => {
                    eprintln!("{exited}");
                    turn = cluster.turn.take();
                }
            }
        }
        panic!("the NATS servers did not start in three attempts");
    }

    fn configure(size: usize) -> (tempfile::TempDir, Vec<Server>) {
        let dir = tempfile::tempdir().expect("a temp dir");
        let routes: Vec<u16> = (0..size).map(|_| free_port()).collect();
        let servers = (0..size)
            .map(|i| {
                let name = format!("n{i}");
                let client = free_port();
                let monitor = free_port();
                let store = dir.path().join(&name);
                let cluster = if size > 1 {
                    let urls: Vec<String> = routes
                        .iter()
                        .map(|port| format!("\"nats-route://127.0.0.1:{port}\""))
                        .collect();
                    format!(
                        "cluster {{ name: courier-test, listen: \"127.0.0.1:{}\", routes: [{}] }}",
                        routes[i],
                        urls.join(", ")
                    )
                } else {
                    String::new()
                };
                let config = dir.path().join(format!("{name}.conf"));
                std::fs::write(
                    &config,
                    format!(
                        "server_name: {name}\n\
                         listen: \"127.0.0.1:{client}\"\n\
                         http: \"127.0.0.1:{monitor}\"\n\
                         jetstream {{ store_dir: {store:?}, max_memory_store: 64MB, max_file_store: 1GB }}\n\
                         {cluster}\n"
                    ),
                )
                .expect("write the server config");
                Server {
                    log: dir.path().join(format!("{name}.log")),
                    name,
                    client,
                    monitor,
                    config,
                    process: None,
                }
            })
            .collect();
        (dir, servers)
    }

    /// Client URLs of every server, running or not (a client given all of them fails over).
    pub fn urls(&self) -> Vec<String> {
        self.servers
            .iter()
            .map(|s| format!("nats://127.0.0.1:{}", s.client))
            .collect()
    }

    pub fn url(&self, server: usize) -> String {
        format!("nats://127.0.0.1:{}", self.servers[server].client)
    }

    pub fn len(&self) -> usize {
        self.servers.len()
    }

    /// SIGKILLs one server.
    pub fn kill(&mut self, server: usize) {
        self.servers[server].kill();
    }

    /// The index of the server leading the relay's journal stream (the default deployment's):
    /// the server whose loss costs an election mid-stream.
    pub async fn journal_leader(&self) -> usize {
        let client = async_nats::connect(self.urls()).await.unwrap();
        let mut stream = async_nats::jetstream::new(client)
            .get_stream("courier-journal")
            .await
            .unwrap();
        let info = stream.info().await.unwrap();
        let leader = info.cluster.as_ref().and_then(|c| c.leader.clone());
        let leader = leader.expect("a replicated stream has a leader");
        // The servers are named n0, n1, n2.
        leader[1..].parse().unwrap()
    }

    /// The default deployment's journal frames and accounts, read now.
    pub async fn deployment_figures(&self) -> (u64, u64) {
        let client = async_nats::connect(self.urls()).await.unwrap();
        let js = async_nats::jetstream::new(client);
        let mut journal = js.get_stream("courier-journal").await.unwrap();
        let frames = journal.info().await.unwrap().state.messages;
        let accounts = js.get_key_value("courier-accounts").await.unwrap();
        (frames, accounts.status().await.unwrap().values())
    }

    /// SIGKILLs every server.
    pub fn kill_all(&mut self) {
        for server in &mut self.servers {
            server.kill();
        }
    }

    /// Starts every killed server again and waits until all are healthy.
    pub async fn restart_all(&mut self) {
        for server in self.servers.iter_mut().filter(|s| s.process.is_none()) {
            server.spawn();
        }
        self.wait_healthy().await;
    }

    /// Cuts one server off from its peers and clients while keeping its state (SIGSTOP): what a
    /// network partition of that server does, seen from everyone else. It answers nothing, and
    /// its routes and client connections time out, until [`NatsCluster::heal`].
    pub fn partition(&mut self, server: usize) {
        self.signal(server, "-STOP");
    }

    /// Ends [`NatsCluster::partition`] (SIGCONT): the server rejoins with what it held when cut
    /// off, as after a partition heals.
    pub fn heal(&mut self, server: usize) {
        self.signal(server, "-CONT");
    }

    fn signal(&mut self, server: usize, signal: &str) {
        let pid = self.servers[server]
            .process
            .as_ref()
            .expect("the server is running")
            .id();
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {signal} {pid}");
    }

    /// Starts a killed server again, on its ports and its store, and waits until every running
    /// server reports healthy (the restarted one caught up with the cluster).
    pub async fn restart(&mut self, server: usize) {
        self.servers[server].spawn();
        self.wait_healthy().await;
    }

    /// Waits until `/healthz` answers 200 on every running server: JetStream enabled, a meta
    /// leader known, and the server's streams current. Panics with the servers' logs past
    /// [`CLUSTER_DEADLINE`].
    pub async fn wait_healthy(&mut self) {
        if let Err(exited) = self.poll_healthy().await {
            panic!("{exited}");
        }
    }

    /// [`NatsCluster::wait_healthy`], answering a server that exited with its log.
    async fn poll_healthy(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + CLUSTER_DEADLINE;
        loop {
            for server in &mut self.servers {
                if let Some(child) = server.process.as_mut() {
                    if let Ok(Some(status)) = child.try_wait() {
                        server.process = None;
                        return Err(format!(
                            "{} exited ({status}):\n{}",
                            server.name,
                            std::fs::read_to_string(&server.log).unwrap_or_default()
                        ));
                    }
                }
            }
            let mut healthy = true;
            for server in self.servers.iter().filter(|s| s.process.is_some()) {
                let addr = SocketAddr::from(([127, 0, 0, 1], server.monitor));
                healthy &= healthz(addr).await == Some(200);
            }
            if healthy {
                return Ok(());
            }
            assert!(
                Instant::now() < deadline,
                "the NATS servers were not healthy within {CLUSTER_DEADLINE:?}:\n{}",
                self.logs()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Every server's log, for a failure message.
    pub fn logs(&self) -> String {
        self.servers
            .iter()
            .map(|s| {
                format!(
                    "--- {} ---\n{}",
                    s.name,
                    std::fs::read_to_string(&s.log).unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for server in &mut self.servers {
            server.kill();
        }
    }
}

/// The status of `GET /healthz` on a monitoring port, or `None` while nothing answers there.
async fn healthz(addr: SocketAddr) -> Option<u16> {
    let probe = async {
        let mut tcp = TcpStream::connect(addr).await.ok()?;
        let request = format!("GET /healthz HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        tcp.write_all(request.as_bytes()).await.ok()?;
        let mut response = Vec::new();
        tcp.read_to_end(&mut response).await.ok()?;
        let response = String::from_utf8(response).ok()?;
        response.split_whitespace().nth(1)?.parse().ok()
    };
    tokio::time::timeout(Duration::from_secs(2), probe)
        .await
        .ok()
        .flatten()
}
