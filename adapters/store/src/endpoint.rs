//! Which etcd endpoints may be spoken to in plain http: loopback ones only, unless the
//! operator accepted the risk.
//!
//! Whoever can write the controllers' store can change the model's config,
//! `agent-metadata-url` included. Plain http to a host that is not this machine lets anyone
//! on the network between read and change it, so an endpoint is refused when it is plain
//! (`http://`, or no scheme without TLS) and its host is not a loopback address
//! (`127.0.0.0/8`, `::1`, `::ffff:127.x.y.z`) or `localhost`. Names are never resolved:
//! a name that happens to resolve to loopback is refused like any other. This is the one
//! implementation of the rule; the etcd engine ([`crate::EtcdConfig::insecure`]) and the
//! agent (`--etcd-insecure`) both ask it. It is compiled without the `etcd` feature, so an
//! agent built without etcd still names a refused endpoint the same way.

use std::net::IpAddr;

/// The host of an endpoint `scheme://host:port[/path]` or `host:port` (`[v6]:port` gives
/// `v6`); `None` when there is none to read.
pub fn endpoint_host(endpoint: &str) -> Option<&str> {
    let rest = endpoint
        .split_once("://")
        .map_or(endpoint, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or(rest);
    let host = if let Some(bracketed) = authority.strip_prefix('[') {
        bracketed.split_once(']').map(|(host, _)| host)?
    } else {
        authority
            .rsplit_once(':')
            .map_or(authority, |(host, _)| host)
    };
    (!host.is_empty()).then_some(host)
}

/// Is `host` this machine by its very spelling: a loopback address, or `localhost`?
pub fn is_loopback_host(host: &str) -> bool {
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(address)) => address.is_loopback(),
        Ok(IpAddr::V6(address)) => {
            address.is_loopback() || address.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
        Err(_) => false,
    }
}

/// Is `endpoint` spoken to in plain http? `http://`, or no scheme when `tls` is off.
pub fn is_plain(endpoint: &str, tls: bool) -> bool {
    match endpoint.split_once("://") {
        Some((scheme, _)) => scheme.eq_ignore_ascii_case("http"),
        None => !tls,
    }
}

/// The first endpoint that would be spoken to in plain http with a host that is not
/// loopback (see the module's rule), if any.
pub fn plain_off_loopback<'a>(
    endpoints: impl IntoIterator<Item = &'a str>,
    tls: bool,
) -> Option<&'a str> {
    endpoints.into_iter().find(|endpoint| {
        is_plain(endpoint, tls) && !endpoint_host(endpoint).is_some_and(is_loopback_host)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_read_from_every_spelling() {
        assert_eq!(endpoint_host("http://127.0.0.1:2379"), Some("127.0.0.1"));
        assert_eq!(endpoint_host("127.0.0.1:2379"), Some("127.0.0.1"));
        assert_eq!(endpoint_host("http://[::1]:2379/"), Some("::1"));
        assert_eq!(
            endpoint_host("https://etcd.example:2379/x"),
            Some("etcd.example")
        );
        assert_eq!(endpoint_host("localhost"), Some("localhost"));
        assert_eq!(endpoint_host("http://:2379"), None);
        assert_eq!(endpoint_host("http://[::1"), None);
    }

    #[test]
    fn only_loopback_addresses_and_localhost_are_loopback() {
        for host in [
            "127.0.0.1",
            "127.255.0.9",
            "::1",
            "::ffff:127.0.0.1",
            "LocalHost",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "192.0.2.1",
            "10.0.0.1",
            "0.0.0.0",
            "::",
            "2001:db8::1",
            "::ffff:192.0.2.1",
            // Never resolved: a name is not loopback, whatever it resolves to.
            "localhost.example",
            "127.1",
            "",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn a_plain_endpoint_off_loopback_is_found_and_tls_or_loopback_ones_are_not() {
        let loopback = [
            "http://127.0.0.1:2379",
            "localhost:2379",
            "http://[::1]:2379",
        ];
        assert_eq!(plain_off_loopback(loopback, false), None);
        assert_eq!(
            plain_off_loopback(["127.0.0.1:2379", "http://192.0.2.1:2379"], false),
            Some("http://192.0.2.1:2379")
        );
        // No scheme: plain without TLS, TLS with it.
        assert_eq!(
            plain_off_loopback(["192.0.2.1:2379"], false),
            Some("192.0.2.1:2379")
        );
        assert_eq!(plain_off_loopback(["192.0.2.1:2379"], true), None);
        assert_eq!(plain_off_loopback(["https://192.0.2.1:2379"], false), None);
        // An explicit http:// is plain even when TLS is configured.
        assert_eq!(
            plain_off_loopback(["HTTP://192.0.2.1:2379"], true),
            Some("HTTP://192.0.2.1:2379")
        );
        // A host that cannot be read is not loopback.
        assert_eq!(
            plain_off_loopback(["http://:2379"], false),
            Some("http://:2379")
        );
    }
}
