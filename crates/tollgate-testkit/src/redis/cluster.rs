//! A private Redis Cluster of `redis-server` processes.

use std::path::PathBuf;
use std::process::Command;

use crate::tls::TlsFiles;

use super::server::{RedisServer, ServerTls};
use super::{binary, fresh_dir, tls_cli_args};

/// A private Redis Cluster made with `redis-cli --cluster create`: primaries alone, or each with one replica.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// The certificates' directory of a TLS cluster (removed with the cluster).
    cert_dir: Option<PathBuf>,
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        self.nodes.clear();
        if let Some(dir) = &self.cert_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The nodes' `cluster-node-timeout`: a primary unreachable for this long is failed over to its replica.
pub const CLUSTER_NODE_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(2_000);
const NODE_TIMEOUT_MS: &str = "2000";

impl RedisCluster {
    /// `masters` cluster-enabled servers (at least 3), joined and with every slot assigned.
    ///
    /// # Panics
    /// When the servers do not start or the cluster does not form within 20 s.
    #[must_use]
    pub fn start(masters: usize) -> Self {
        Self::start_inner(masters, 0, None)
    }

    /// `masters` primaries (at least 3), each with one replica (`--cluster-replicas 1`): a primary that fails is
    /// replaced by its replica after the node timeout ([`CLUSTER_NODE_TIMEOUT`]).
    ///
    /// # Panics
    /// When the servers do not start or the cluster does not form within 20 s.
    #[must_use]
    pub fn start_with_replicas(masters: usize) -> Self {
        let cluster = Self::start_inner(masters, 1, None);
        // A replica that has not synced yet would not be promoted: wait until every one has.
        for node in &cluster.nodes {
            node.wait_until("a replica in sync", || {
                let info = node.cli(&["INFO", "replication"]);
                info.contains("role:master") || info.contains("master_link_status:up")
            });
        }
        cluster
    }

    /// A Cluster whose nodes speak TLS only (clients and the cluster bus), with one CA and one certificate.
    ///
    /// # Panics
    /// When the servers do not start or the cluster does not form within 20 s.
    #[must_use]
    pub fn start_tls(masters: usize) -> Self {
        let dir = fresh_dir("cluster-certs");
        let files = TlsFiles::generate(&dir, &TlsFiles::LOCAL_NAMES, false);
        let mut cluster = Self::start_inner(
            masters,
            0,
            Some(ServerTls {
                files,
                auth_clients: false,
            }),
        );
        cluster.cert_dir = Some(dir);
        cluster
    }

    fn start_inner(masters: usize, replicas: usize, tls: Option<ServerTls>) -> Self {
        assert!(
            masters >= 3,
            "redis-cli --cluster create needs at least 3 primaries"
        );
        let nodes: Vec<RedisServer> = (0..masters * (1 + replicas))
            .map(|_| {
                RedisServer::start_inner(
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        NODE_TIMEOUT_MS,
                    ],
                    tls.clone(),
                )
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let tool_args = tls
            .as_ref()
            .map(|t| tls_cli_args(&t.files))
            .unwrap_or_default();
        let out = Command::new(binary("redis-cli"))
            .args(&tool_args)
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| panic!("redis-cli --cluster create failed to run: {e}"));
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Self {
            nodes,
            cert_dir: None,
        };
        cluster.wait_settled();
        cluster
    }

    /// Waits until every node reports `cluster_state:ok` and agrees that every slot is served.
    ///
    /// # Panics
    /// After 20 s without agreement.
    pub fn wait_settled(&self) {
        let live: Vec<&RedisServer> = self.nodes.iter().filter(|n| n.pid().is_some()).collect();
        for node in &live {
            node.wait_until("cluster_state:ok", || {
                let info = node.cli(&["CLUSTER", "INFO"]);
                info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
            });
        }
        let sign = |n: &RedisServer| {
            let mut lines: Vec<String> = n
                .cli(&["CLUSTER", "NODES"])
                .lines()
                .map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    format!(
                        "{} {}",
                        f.first().unwrap_or(&""),
                        f.get(8..).map(|s| s.join(" ")).unwrap_or_default()
                    )
                })
                .collect();
            lines.sort();
            lines
        };
        let first = live[0];
        first.wait_until("agreement on the slot map", || {
            live.iter().all(|n| sign(n) == sign(first))
        });
    }

    /// Seed URLs of every node.
    #[must_use]
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The `i`-th node.
    #[must_use]
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    /// The `i`-th node, mutably (to kill or restart it).
    #[must_use]
    pub fn node_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.nodes[i]
    }

    /// Index of the node serving `slot`.
    ///
    /// # Panics
    /// When no node claims it.
    #[must_use]
    pub fn owner_of_slot(&self, slot: u16) -> usize {
        let id = self.slot_owner_id(slot);
        self.nodes
            .iter()
            .position(|n| n.pid().is_some() && n.cli(&["CLUSTER", "MYID"]) == id)
            .unwrap_or_else(|| panic!("no node serves slot {slot}"))
    }

    fn slot_owner_id(&self, slot: u16) -> String {
        for line in self.live_node().cli(&["CLUSTER", "NODES"]).lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.get(2).is_some_and(|flags| flags.contains("fail")) {
                continue;
            }
            for range in f.iter().skip(8) {
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                if let (Ok(lo), Ok(hi)) = (lo.parse::<u16>(), hi.parse::<u16>())
                    && (lo..=hi).contains(&slot)
                {
                    return f[0].to_owned();
                }
            }
        }
        panic!("no node serves slot {slot}");
    }

    /// A node that is running (the first), to ask about the cluster.
    fn live_node(&self) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.pid().is_some())
            .expect("a node of the cluster is running")
    }

    /// Index of the replica of node `primary`, if it has one that is running.
    #[must_use]
    pub fn replica_of(&self, primary: usize) -> Option<usize> {
        let id = self.nodes[primary].cli(&["CLUSTER", "MYID"]);
        self.nodes.iter().position(|n| {
            n.pid().is_some() && {
                let info = n.cli(&["CLUSTER", "NODES"]);
                info.lines().any(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    f.get(2)
                        .is_some_and(|flags| flags.contains("myself") && flags.contains("slave"))
                        && f.get(3) == Some(&id.as_str())
                })
            }
        })
    }

    /// `CLUSTER FAILOVER` on `replica`: it and its primary swap roles with no write lost (the primary stops
    /// taking writes until the replica has them all); waits until the replica says it is the primary.
    ///
    /// # Panics
    /// When the node refuses, or is not the primary within 20 s.
    pub fn failover(&self, replica: usize) {
        let node = &self.nodes[replica];
        assert_eq!(node.cli(&["CLUSTER", "FAILOVER"]), "OK", "CLUSTER FAILOVER");
        node.wait_until("the role of primary after CLUSTER FAILOVER", || {
            node.cli(&["ROLE"]).starts_with("master")
        });
    }

    /// Moves one slot with its keys to node `to`, step by step as `redis-cli --cluster reshard` does (`IMPORTING`
    /// on the target, `MIGRATING` on the source, `MIGRATE` of its keys in batches of `batch`, then the slot's new
    /// owner announced to every primary): while it runs, a key already moved answers `ASK` from the source, and
    /// once it is done every key of the slot answers `MOVED` there.
    ///
    /// # Panics
    /// When a step is refused.
    pub fn move_slot(&self, slot: u16, to: usize, batch: usize) {
        let from = self.owner_of_slot(slot);
        if from == to {
            return;
        }
        let (source, target) = (&self.nodes[from], &self.nodes[to]);
        let from_id = source.cli(&["CLUSTER", "MYID"]);
        let to_id = target.cli(&["CLUSTER", "MYID"]);
        let slot = slot.to_string();
        let ok = |reply: String, what: &str| assert_eq!(reply, "OK", "{what}");
        ok(
            target.cli(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id]),
            "SETSLOT IMPORTING",
        );
        ok(
            source.cli(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id]),
            "SETSLOT MIGRATING",
        );
        let port = target.port().to_string();
        loop {
            let keys = source.cli(&["CLUSTER", "GETKEYSINSLOT", &slot, &batch.to_string()]);
            let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(keys);
            let reply = source.cli(&args);
            assert!(reply == "OK" || reply == "NOKEY", "MIGRATE: {reply}");
        }
        for node in self.nodes.iter().filter(|n| n.pid().is_some()) {
            if node.cli(&["ROLE"]).starts_with("master") {
                ok(
                    node.cli(&["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]),
                    "SETSLOT NODE",
                );
            }
        }
    }

    /// Moves `count` slots (with their keys) from node `from` to node `to` with `redis-cli --cluster reshard`, and
    /// waits for the cluster to settle: clients holding the old slot map now get `MOVED`.
    ///
    /// # Panics
    /// When the reshard fails.
    pub fn reshard(&self, from: usize, to: usize, count: usize) {
        let from_id = self.nodes[from].cli(&["CLUSTER", "MYID"]);
        let to_id = self.nodes[to].cli(&["CLUSTER", "MYID"]);
        let tool_args = self.nodes[0]
            .tls
            .as_ref()
            .map(|t| tls_cli_args(&t.files))
            .unwrap_or_default();
        let out = Command::new(binary("redis-cli"))
            .args(&tool_args)
            .args([
                "--cluster",
                "reshard",
                &format!("127.0.0.1:{}", self.nodes[0].port()),
            ])
            .args(["--cluster-from", &from_id, "--cluster-to", &to_id])
            .args(["--cluster-slots", &count.to_string(), "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| panic!("redis-cli --cluster reshard failed to run: {e}"));
        assert!(
            out.status.success(),
            "redis-cli --cluster reshard failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        self.wait_settled();
    }
}
