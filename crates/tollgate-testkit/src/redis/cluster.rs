//! A private Redis Cluster of `redis-server` processes.

use std::path::PathBuf;
use std::process::Command;

use crate::tls::TlsFiles;

use super::server::{RedisServer, ServerTls};
use super::{binary, fresh_dir, tls_cli_args};

/// A private Redis Cluster of primaries without replicas, made with `redis-cli --cluster create`.
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

impl RedisCluster {
    /// `masters` cluster-enabled servers (at least 3), joined and with every slot assigned.
    ///
    /// # Panics
    /// When the servers do not start or the cluster does not form within 20 s.
    #[must_use]
    pub fn start(masters: usize) -> Self {
        Self::start_inner(masters, None)
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
            Some(ServerTls {
                files,
                auth_clients: false,
            }),
        );
        cluster.cert_dir = Some(dir);
        cluster
    }

    fn start_inner(masters: usize, tls: Option<ServerTls>) -> Self {
        assert!(
            masters >= 3,
            "redis-cli --cluster create needs at least 3 primaries"
        );
        let nodes: Vec<RedisServer> = (0..masters)
            .map(|_| {
                RedisServer::start_inner(
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "2000",
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
            .args(["--cluster-replicas", "0", "--cluster-yes"])
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
        for node in &self.nodes {
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
        let first = &self.nodes[0];
        first.wait_until("agreement on the slot map", || {
            self.nodes.iter().all(|n| sign(n) == sign(first))
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
            .position(|n| n.cli(&["CLUSTER", "MYID"]) == id)
            .unwrap_or_else(|| panic!("no node serves slot {slot}"))
    }

    fn slot_owner_id(&self, slot: u16) -> String {
        for line in self.nodes[0].cli(&["CLUSTER", "NODES"]).lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
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
