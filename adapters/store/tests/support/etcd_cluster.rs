//! Real etcd for tests: a single member or a cluster on 127.0.0.1, on ports chosen free at
//! run time, with a temporary data dir; every process started here is killed by its pid
//! (SIGKILL: a SIGTERM of a 3-member cluster takes seconds) when the cluster is dropped, a panicking test
//! included. Shared by the engine suite (`src/suite.rs`, through `#[path]`) and
//! `tests/etcd.rs`.
//!
//! [`EtcdCluster::start_tls`] starts one over TLS: a CA made with rcgen for the run, one
//! server certificate (127.0.0.1 and localhost) every member serves to clients and peers,
//! client certificates required on both (`--client-cert-auth`, `--peer-client-cert-auth`),
//! and one client certificate for the tests ([`EtcdCluster::tls`]).
//!
//! [`EtcdCluster::enable_auth`] turns etcd's user authentication on (with `etcdctl`): a
//! `root` user, and users whose role may read and write one prefix.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a cluster may take to answer `endpoint health` (a busy 2-core machine).
const HEALTHY_WITHIN: Duration = Duration::from_secs(60);

/// Members started by this test process, each killed by pid on drop.
#[derive(Debug)]
pub struct EtcdCluster {
    dir: tempfile::TempDir,
    members: Vec<Member>,
    tls: Option<TlsFiles>,
}

/// A TLS cluster's files for its clients (PEM, in the cluster's dir): the CA that signed
/// the members' certificate, and the client certificate and key the members accept.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Debug)]
pub struct Member {
    pub name: String,
    pub client_url: String,
    pub peer_url: String,
    child: Option<Child>,
}

impl Member {
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

/// A port nobody listens on right now (the OS's choice).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// Is `etcd` installed? Tests that need it fail with this hint otherwise.
pub fn require_etcd() {
    let found = Command::new("etcd")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    assert!(
        found,
        "etcd is not installed: run .ci/install-etcd (etcd-server, etcd-client, protobuf)"
    );
}

/// Writes into `dir` a CA (`ca.pem`), a server certificate for 127.0.0.1 and localhost,
/// good for serving and for dialling peers (`server.pem`, `server-key.pem`), and a client
/// certificate (`client.pem`, `client-key.pem`), all made with rcgen.
pub fn write_certificates(dir: &Path) -> Result<TlsFiles, String> {
    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
        IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };
    let failed = |what: &'static str| move |error: rcgen::Error| format!("{what}: {error}");
    let ca_key = KeyPair::generate().map_err(failed("generating the CA key"))?;
    let mut ca_params =
        CertificateParams::new(Vec::<String>::new()).map_err(failed("the CA's parameters"))?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, "lockstep etcd test CA");
    ca_params.distinguished_name = name;
    let ca = ca_params
        .self_signed(&ca_key)
        .map_err(failed("signing the CA"))?;
    let issuer = Issuer::new(ca_params, ca_key);

    let signed = |common_name: &str,
                  names: Vec<String>,
                  usages: Vec<ExtendedKeyUsagePurpose>|
     -> Result<(String, String), String> {
        let key = KeyPair::generate().map_err(failed("generating a key"))?;
        let mut params = CertificateParams::new(names).map_err(failed("a certificate's names"))?;
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, common_name);
        params.distinguished_name = name;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = usages;
        let certificate = params
            .signed_by(&key, &issuer)
            .map_err(failed("signing a certificate"))?;
        Ok((certificate.pem(), key.serialize_pem()))
    };
    // Peers dial each other with the same certificate: it is a client's too.
    let (server, server_key) = signed(
        "etcd",
        vec!["127.0.0.1".to_owned(), "localhost".to_owned()],
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
    )?;
    let (client, client_key) = signed(
        "lockstep",
        Vec::new(),
        vec![ExtendedKeyUsagePurpose::ClientAuth],
    )?;
    let write = |file: &str, pem: &str| -> Result<PathBuf, String> {
        let path = dir.join(file);
        std::fs::write(&path, pem).map_err(|error| format!("write {}: {error}", path.display()))?;
        Ok(path)
    };
    let ca = write("ca.pem", &ca.pem())?;
    write("server.pem", &server)?;
    write("server-key.pem", &server_key)?;
    Ok(TlsFiles {
        ca,
        cert: write("client.pem", &client)?,
        key: write("client-key.pem", &client_key)?,
    })
}

impl EtcdCluster {
    /// Starts `size` members with `extra` flags each, and waits until the cluster is
    /// healthy. Ports collide rarely (chosen free, then bound by etcd): then it starts over.
    pub fn start(size: usize, extra: &[&str]) -> EtcdCluster {
        require_etcd();
        let mut last = String::new();
        for _ in 0..3 {
            match EtcdCluster::try_start(size, extra, false) {
                Ok(cluster) => return cluster,
                Err(error) => last = error,
            }
        }
        panic!("etcd did not start: {last}");
    }

    /// [`EtcdCluster::start`] over TLS: `https://` client and peer URLs, one server
    /// certificate for every member, client certificates required from clients and peers;
    /// [`EtcdCluster::tls`] gives the CA and a client certificate the members accept.
    pub fn start_tls(size: usize, extra: &[&str]) -> EtcdCluster {
        require_etcd();
        let mut last = String::new();
        for _ in 0..3 {
            match EtcdCluster::try_start(size, extra, true) {
                Ok(cluster) => return cluster,
                Err(error) => last = error,
            }
        }
        panic!("etcd did not start over TLS: {last}");
    }

    fn try_start(size: usize, extra: &[&str], tls: bool) -> Result<EtcdCluster, String> {
        let dir = tempfile::tempdir().map_err(|error| error.to_string())?;
        let files = if tls {
            Some(write_certificates(dir.path())?)
        } else {
            None
        };
        let scheme = if tls { "https" } else { "http" };
        let mut tls_flags: Vec<String> = Vec::new();
        if let Some(files) = &files {
            let ca = files.ca.display().to_string();
            let cert = dir.path().join("server.pem").display().to_string();
            let key = dir.path().join("server-key.pem").display().to_string();
            tls_flags = vec![
                format!("--cert-file={cert}"),
                format!("--key-file={key}"),
                format!("--trusted-ca-file={ca}"),
                "--client-cert-auth".to_owned(),
                format!("--peer-cert-file={cert}"),
                format!("--peer-key-file={key}"),
                format!("--peer-trusted-ca-file={ca}"),
                "--peer-client-cert-auth".to_owned(),
            ];
        }
        let token = format!(
            "lockstep-test-{}-{}",
            std::process::id(),
            dir.path().display()
        );
        let mut members: Vec<Member> = (0..size)
            .map(|index| Member {
                name: format!("m{index}"),
                client_url: format!("{scheme}://127.0.0.1:{}", free_port()),
                peer_url: format!("{scheme}://127.0.0.1:{}", free_port()),
                child: None,
            })
            .collect();
        let initial: Vec<String> = members
            .iter()
            .map(|member| format!("{}={}", member.name, member.peer_url))
            .collect();
        let initial = initial.join(",");
        for member in &mut members {
            let data = dir.path().join(&member.name);
            let log = std::fs::File::create(dir.path().join(format!("{}.log", member.name)))
                .map_err(|error| error.to_string())?;
            let child = Command::new("etcd")
                .args([
                    "--name",
                    &member.name,
                    "--data-dir",
                    &data.display().to_string(),
                    "--listen-client-urls",
                    &member.client_url,
                    "--advertise-client-urls",
                    &member.client_url,
                    "--listen-peer-urls",
                    &member.peer_url,
                    "--initial-advertise-peer-urls",
                    &member.peer_url,
                    "--initial-cluster",
                    &initial,
                    "--initial-cluster-state",
                    "new",
                    "--initial-cluster-token",
                    &token,
                    "--logger=zap",
                    "--log-outputs=stderr",
                    "--auto-compaction-mode=revision",
                    "--auto-compaction-retention=10000",
                ])
                .args(&tls_flags)
                .args(extra)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .map_err(|error| format!("spawn etcd: {error}"))?;
            member.child = Some(child);
        }
        let mut cluster = EtcdCluster {
            dir,
            members,
            tls: files,
        };
        let deadline = Instant::now() + HEALTHY_WITHIN;
        loop {
            if cluster.healthy() {
                return Ok(cluster);
            }
            if let Some(exited) = cluster.exited() {
                return Err(format!(
                    "member {exited} exited: {}",
                    cluster.log_tail(&cluster.members[exited].name)
                ));
            }
            if Instant::now() > deadline {
                return Err(format!("not healthy within {HEALTHY_WITHIN:?}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // `cluster` is dropped on every error path: its members are killed.
    }

    /// The client URLs of the members still running.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .filter(|member| member.child.is_some())
            .map(|member| member.client_url.clone())
            .collect()
    }

    /// Every member's client URL, killed ones included.
    pub fn all_endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|member| member.client_url.clone())
            .collect()
    }

    pub fn members(&self) -> &[Member] {
        &self.members
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA and client certificate of a cluster from [`EtcdCluster::start_tls`].
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    /// `etcdctl` for the running members, with the client certificate when over TLS.
    fn etcdctl(&self) -> Command {
        let mut command = Command::new("etcdctl");
        command
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoints().join(",")));
        if let Some(files) = &self.tls {
            command.arg(format!("--cacert={}", files.ca.display()));
            command.arg(format!("--cert={}", files.cert.display()));
            command.arg(format!("--key={}", files.key.display()));
        }
        command
    }

    /// Turns on etcd's user authentication: adds `root` with `root_password` and, for each
    /// `(user, password, prefix)`, a role `<user>` with readwrite on keys starting with
    /// `prefix` and the user holding it; then `auth enable`. Every client must then log
    /// in (`endpoint health` without a user fails from here on).
    pub fn enable_auth(&self, root_password: &str, users: &[(&str, &str, &str)]) {
        let run = |args: &[&str]| {
            let output = self
                .etcdctl()
                .arg("--command-timeout=10s")
                .args(args)
                .output()
                .expect("etcdctl runs");
            assert!(
                output.status.success(),
                "etcdctl {}: {}{}",
                args.first().copied().unwrap_or_default(),
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        };
        run(&["user", "add", "root", "--new-user-password", root_password]);
        for (user, password, prefix) in users {
            run(&["role", "add", user]);
            run(&[
                "role",
                "grant-permission",
                user,
                "--prefix=true",
                "readwrite",
                prefix,
            ]);
            run(&["user", "add", user, "--new-user-password", password]);
            run(&["user", "grant-role", user, user]);
        }
        run(&["auth", "enable"]);
    }

    /// `etcdctl endpoint health` over the running members.
    pub fn healthy(&self) -> bool {
        let endpoints = self.endpoints();
        if endpoints.is_empty() {
            return false;
        }
        self.etcdctl()
            .args(["--command-timeout=2s", "endpoint", "health"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    }

    /// The first member whose process exited on its own.
    fn exited(&mut self) -> Option<usize> {
        self.members.iter_mut().position(|member| {
            member
                .child
                .as_mut()
                .is_some_and(|child| !matches!(child.try_wait(), Ok(None)))
        })
    }

    /// The index of the raft leader among the running members (`etcdctl endpoint status`).
    pub fn leader(&self) -> Option<usize> {
        let output = self
            .etcdctl()
            .args(["--command-timeout=2s", "endpoint", "status", "-w", "json"])
            .stderr(Stdio::null())
            .output()
            .ok()?;
        let statuses: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
        let statuses = statuses.as_array()?;
        let leader = statuses
            .iter()
            .find_map(|status| status["Status"]["leader"].as_u64())?;
        let endpoint = statuses.iter().find_map(|status| {
            (status["Status"]["header"]["member_id"].as_u64() == Some(leader))
                .then(|| status["Endpoint"].as_str().map(str::to_owned))
                .flatten()
        })?;
        self.members
            .iter()
            .position(|member| member.client_url == endpoint)
    }

    /// SIGKILLs member `index` (by its pid) and reaps it.
    pub fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.members[index].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The last lines of a member's log, for failure messages.
    pub fn log_tail(&self, name: &str) -> String {
        let path: PathBuf = self.dir.path().join(format!("{name}.log"));
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join("\n")
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for index in 0..self.members.len() {
            self.kill(index);
        }
    }
}
