//! `lockstepd`'s flags for the API's limits ([`ApiLimits`]): one flag per limit, each
//! with an environment variable of the same name (`--max-connections`,
//! `LOCKSTEPD_MAX_CONNECTIONS`), defaults from [`ApiLimits::default`]. The launcher passes
//! them on to the worker ([`ApiLimitFlags::to_args`]). `spec/wire.md` lists them.

use std::time::Duration;

use lockstep_transport::limits::ApiLimits;

/// The flags; unset ones keep [`ApiLimits::default`]'s value.
#[derive(clap::Args, Clone, Debug, Default, PartialEq, Eq)]
pub struct ApiLimitFlags {
    /// Connections open at once, logged in or not [default: 4096].
    #[arg(long, env = "LOCKSTEPD_MAX_CONNECTIONS", global = true)]
    pub max_connections: Option<usize>,
    /// Connections not logged in yet, from all sources [default: 512].
    #[arg(long, env = "LOCKSTEPD_MAX_PENDING_CONNECTIONS", global = true)]
    pub max_pending_connections: Option<usize>,
    /// Connections not logged in yet from one source address [default: 32].
    #[arg(
        long,
        env = "LOCKSTEPD_MAX_PENDING_CONNECTIONS_PER_SOURCE",
        global = true
    )]
    pub max_pending_connections_per_source: Option<usize>,
    /// Seconds a TLS handshake may take [default: 10].
    #[arg(long, env = "LOCKSTEPD_TLS_HANDSHAKE_TIMEOUT_SEC", global = true)]
    pub tls_handshake_timeout_sec: Option<u64>,
    /// Seconds from accepting a connection to its login [default: 30].
    #[arg(long, env = "LOCKSTEPD_LOGIN_TIMEOUT_SEC", global = true)]
    pub login_timeout_sec: Option<u64>,
    /// Bytes a connection may send before it logs in [default: 65536].
    #[arg(long, env = "LOCKSTEPD_MAX_PRE_LOGIN_BYTES", global = true)]
    pub max_pre_login_bytes: Option<usize>,
    /// Password checks at once, on threads of their own [default: the number of cores].
    #[arg(long, env = "LOCKSTEPD_LOGIN_CONCURRENCY", global = true)]
    pub login_concurrency: Option<usize>,
    /// Password checks waiting per source address [default: 16].
    #[arg(long, env = "LOCKSTEPD_MAX_QUEUED_LOGINS_PER_SOURCE", global = true)]
    pub max_queued_logins_per_source: Option<usize>,
    /// Failed logins per source address, or per user, before throttling [default: 5].
    #[arg(long, env = "LOCKSTEPD_LOGIN_FAILURES_BEFORE_THROTTLE", global = true)]
    pub login_failures_before_throttle: Option<u32>,
    /// Longest wait, in seconds, a throttled login is told [default: 60].
    #[arg(long, env = "LOCKSTEPD_LOGIN_THROTTLE_MAX_SEC", global = true)]
    pub login_throttle_max_sec: Option<u64>,
    /// Unwritten reply bytes one connection may hold [default: 4194304].
    #[arg(long, env = "LOCKSTEPD_MAX_REPLY_BYTES_PER_CONNECTION", global = true)]
    pub max_reply_bytes_per_connection: Option<usize>,
    /// Unwritten reply bytes all connections together may hold [default: 67108864].
    #[arg(long, env = "LOCKSTEPD_MAX_REPLY_BYTES", global = true)]
    pub max_reply_bytes: Option<usize>,
    /// Seconds a reply may take to be written to a client's socket [default: 30].
    #[arg(long, env = "LOCKSTEPD_WRITE_TIMEOUT_SEC", global = true)]
    pub write_timeout_sec: Option<u64>,
    /// AllWatchers one connection may hold [default: 16].
    #[arg(long, env = "LOCKSTEPD_MAX_WATCHERS_PER_CONNECTION", global = true)]
    pub max_watchers_per_connection: Option<usize>,
    /// AllWatchers all connections together may hold [default: 1024].
    #[arg(long, env = "LOCKSTEPD_MAX_WATCHERS", global = true)]
    pub max_watchers: Option<usize>,
}

impl ApiLimitFlags {
    /// The limits: each flag given, else its default.
    pub fn limits(&self) -> ApiLimits {
        let default = ApiLimits::default();
        let seconds =
            |flag: Option<u64>, default: Duration| flag.map_or(default, Duration::from_secs);
        ApiLimits {
            connections_max: self.max_connections.unwrap_or(default.connections_max),
            pending_connections_max: self
                .max_pending_connections
                .unwrap_or(default.pending_connections_max),
            pending_connections_per_source_max: self
                .max_pending_connections_per_source
                .unwrap_or(default.pending_connections_per_source_max),
            tls_handshake_timeout: seconds(
                self.tls_handshake_timeout_sec,
                default.tls_handshake_timeout,
            ),
            login_timeout: seconds(self.login_timeout_sec, default.login_timeout),
            pre_login_bytes_max: self
                .max_pre_login_bytes
                .unwrap_or(default.pre_login_bytes_max),
            login_concurrency: self
                .login_concurrency
                .unwrap_or(default.login_concurrency)
                .max(1),
            queued_logins_per_source_max: self
                .max_queued_logins_per_source
                .unwrap_or(default.queued_logins_per_source_max),
            login_failures_before_throttle: self
                .login_failures_before_throttle
                .unwrap_or(default.login_failures_before_throttle),
            login_throttle_max: seconds(self.login_throttle_max_sec, default.login_throttle_max),
            reply_bytes_per_connection_max: self
                .max_reply_bytes_per_connection
                .unwrap_or(default.reply_bytes_per_connection_max),
            reply_bytes_max: self.max_reply_bytes.unwrap_or(default.reply_bytes_max),
            write_timeout: seconds(self.write_timeout_sec, default.write_timeout),
            watchers_per_connection_max: self
                .max_watchers_per_connection
                .unwrap_or(default.watchers_per_connection_max),
            watchers_max: self.max_watchers.unwrap_or(default.watchers_max),
        }
    }

    /// The flags given, as arguments for the worker.
    pub fn to_args(&self) -> Vec<String> {
        let flags: [(&str, Option<u64>); 15] = [
            ("--max-connections", self.max_connections.map(as_u64)),
            (
                "--max-pending-connections",
                self.max_pending_connections.map(as_u64),
            ),
            (
                "--max-pending-connections-per-source",
                self.max_pending_connections_per_source.map(as_u64),
            ),
            (
                "--tls-handshake-timeout-sec",
                self.tls_handshake_timeout_sec,
            ),
            ("--login-timeout-sec", self.login_timeout_sec),
            (
                "--max-pre-login-bytes",
                self.max_pre_login_bytes.map(as_u64),
            ),
            ("--login-concurrency", self.login_concurrency.map(as_u64)),
            (
                "--max-queued-logins-per-source",
                self.max_queued_logins_per_source.map(as_u64),
            ),
            (
                "--login-failures-before-throttle",
                self.login_failures_before_throttle.map(u64::from),
            ),
            ("--login-throttle-max-sec", self.login_throttle_max_sec),
            (
                "--max-reply-bytes-per-connection",
                self.max_reply_bytes_per_connection.map(as_u64),
            ),
            ("--max-reply-bytes", self.max_reply_bytes.map(as_u64)),
            ("--write-timeout-sec", self.write_timeout_sec),
            (
                "--max-watchers-per-connection",
                self.max_watchers_per_connection.map(as_u64),
            ),
            ("--max-watchers", self.max_watchers.map(as_u64)),
        ];
        flags
            .into_iter()
            .filter_map(|(flag, value)| value.map(|value| [flag.to_owned(), value.to_string()]))
            .flatten()
            .collect()
    }
}

fn as_u64(value: usize) -> u64 {
    value as u64
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(clap::Parser, Debug)]
    struct Command {
        #[command(flatten)]
        limits: ApiLimitFlags,
    }

    #[test]
    fn no_flag_keeps_every_default() {
        let command = Command::try_parse_from(["lockstepd"]).unwrap();
        assert_eq!(command.limits.limits(), ApiLimits::default());
        assert!(command.limits.to_args().is_empty());
    }

    #[test]
    fn flags_set_their_limit_and_pass_to_the_worker_unchanged() {
        let given = [
            "lockstepd",
            "--max-connections",
            "10",
            "--max-pending-connections",
            "9",
            "--max-pending-connections-per-source",
            "8",
            "--tls-handshake-timeout-sec",
            "7",
            "--login-timeout-sec",
            "6",
            "--max-pre-login-bytes",
            "5000",
            "--login-concurrency",
            "4",
            "--max-queued-logins-per-source",
            "3",
            "--login-failures-before-throttle",
            "2",
            "--login-throttle-max-sec",
            "11",
            "--max-reply-bytes-per-connection",
            "12",
            "--max-reply-bytes",
            "13",
            "--write-timeout-sec",
            "14",
            "--max-watchers-per-connection",
            "15",
            "--max-watchers",
            "16",
        ];
        let command = Command::try_parse_from(given).unwrap();
        let limits = command.limits.limits();
        assert_eq!(
            limits,
            ApiLimits {
                connections_max: 10,
                pending_connections_max: 9,
                pending_connections_per_source_max: 8,
                tls_handshake_timeout: Duration::from_secs(7),
                login_timeout: Duration::from_secs(6),
                pre_login_bytes_max: 5000,
                login_concurrency: 4,
                queued_logins_per_source_max: 3,
                login_failures_before_throttle: 2,
                login_throttle_max: Duration::from_secs(11),
                reply_bytes_per_connection_max: 12,
                reply_bytes_max: 13,
                write_timeout: Duration::from_secs(14),
                watchers_per_connection_max: 15,
                watchers_max: 16,
            }
        );
        assert_eq!(command.limits.to_args(), given[1..]);
    }
}
