//! The controller's TLS material: a CA generated at bootstrap and a server certificate it
//! signs, served with TLS 1.2 and 1.3 (python-jujuclient pins 1.2). Clients check the
//! chain against the CA the user was handed; neither Juju client checks the host name, but
//! the certificate names `localhost`, `juju-apiserver` and the addresses given anyway.
//!
//! One crypto provider for the whole workspace: ring.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The CA and the server's certificate and key, as PEM (what the agent keeps on disk).
#[derive(Clone)]
pub struct Credentials {
    pub ca_pem: String,
    pub certificate_pem: String,
    pub key_pem: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("ca_pem", &format_args!("{} bytes", self.ca_pem.len()))
            .field("key_pem", &"<secret>")
            .finish_non_exhaustive()
    }
}

/// TLS material that cannot be made or read.
#[derive(Debug)]
pub struct TlsError(pub String);

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TlsError {}

fn tls_error(what: &str) -> impl Fn(rcgen::Error) -> TlsError + '_ {
    move |error| TlsError(format!("{what}: {error}"))
}

impl Credentials {
    /// A new CA named after the controller, and a server certificate it signs for
    /// `localhost`, `juju-apiserver` and `addresses`.
    pub fn generate(controller_name: &str, addresses: &[IpAddr]) -> Result<Credentials, TlsError> {
        let ca_key = KeyPair::generate().map_err(tls_error("generating the CA key"))?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())
            .map_err(tls_error("the CA's parameters"))?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let mut name = DistinguishedName::new();
        name.push(DnType::OrganizationName, "lockstep");
        name.push(
            DnType::CommonName,
            format!("lockstep CA for controller {controller_name}"),
        );
        ca_params.distinguished_name = name;
        let ca_certificate = ca_params
            .self_signed(&ca_key)
            .map_err(tls_error("signing the CA"))?;
        let issuer = Issuer::new(ca_params, ca_key);

        let server_key = KeyPair::generate().map_err(tls_error("generating the server key"))?;
        let mut server_params =
            CertificateParams::new(vec!["localhost".to_owned(), "juju-apiserver".to_owned()])
                .map_err(tls_error("the server's parameters"))?;
        server_params
            .subject_alt_names
            .extend(addresses.iter().map(|address| SanType::IpAddress(*address)));
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, "juju-apiserver");
        server_params.distinguished_name = name;
        let server_certificate = server_params
            .signed_by(&server_key, &issuer)
            .map_err(tls_error("signing the server certificate"))?;
        Ok(Credentials {
            ca_pem: ca_certificate.pem(),
            certificate_pem: server_certificate.pem(),
            key_pem: server_key.serialize_pem(),
        })
    }

    /// The server's configuration: TLS 1.2 and 1.3, the certificate chain to the CA.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let chain = vec![
            parse_certificate(&self.certificate_pem, "server certificate")?,
            parse_certificate(&self.ca_pem, "CA certificate")?,
        ];
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())
            .map_err(|error| TlsError(format!("server key is not PEM: {error}")))?;
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|error| TlsError(format!("TLS versions: {error}")))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|error| TlsError(format!("server certificate and key do not match: {error}")))?;
        Ok(Arc::new(config))
    }
}

/// A client configuration that trusts `ca_pem` only, with the given protocol versions
/// (the Rust client, and tests that play python-jujuclient's TLS 1.2).
pub fn client_config(
    ca_pem: &str,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(parse_certificate(ca_pem, "CA certificate")?)
        .map_err(|error| TlsError(format!("CA certificate not usable as a root: {error}")))?;
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(versions)
    .map_err(|error| TlsError(format!("TLS versions: {error}")))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(config))
}

fn parse_certificate(pem: &str, what: &str) -> Result<CertificateDer<'static>, TlsError> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .map_err(|error| TlsError(format!("{what} is not PEM: {error}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_material_makes_a_server_and_refuses_a_mismatched_key() {
        let credentials = Credentials::generate("test", &["127.0.0.1".parse().unwrap()]).unwrap();
        assert!(
            credentials
                .ca_pem
                .starts_with("-----BEGIN CERTIFICATE-----")
        );
        credentials.server_config().unwrap();
        client_config(&credentials.ca_pem, &[&rustls::version::TLS12]).unwrap();
        let other = Credentials::generate("other", &[]).unwrap();
        let mixed = Credentials {
            key_pem: other.key_pem,
            ..credentials
        };
        let error = mixed.server_config().unwrap_err().to_string();
        assert!(error.contains("do not match"), "{error}");
        assert!(!format!("{mixed:?}").contains("PRIVATE KEY"));
    }
}
