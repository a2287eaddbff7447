//! The tools endpoint of a real controller, started by `lockstep bootstrap` from a mirror:
//! nobody without credentials downloads (or makes the controller fetch) an agent binary;
//! the admin downloads the one the controller runs, byte for byte the mirror's tarball.

mod common;

use std::path::Path;

use common::{Controller, Mirror, Published, own};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `GET path` on the controller over TLS (its CA), with an `Authorization` header when
/// given; the status and the body.
async fn get(controller: &Controller, path: &str, authorization: Option<String>) -> (u16, Vec<u8>) {
    let file = controller.controller_file();
    let config = lockstep_transport::tls::client_config(
        &file.ca_cert,
        &[&rustls::version::TLS13, &rustls::version::TLS12],
    )
    .expect("a TLS client configuration");
    let tcp = tokio::net::TcpStream::connect(&file.api_endpoints[0])
        .await
        .expect("the controller listens");
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut stream = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .expect("a TLS connection");
    let authorization =
        authorization.map_or_else(String::new, |value| format!("Authorization: {value}\r\n"));
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\n{authorization}Connection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    // A server may close a TLS connection without close_notify once it has answered.
    let _ = stream.read_to_end(&mut answer).await;
    let split = answer
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .expect("a complete head");
    let status = String::from_utf8_lossy(&answer[9..12]).parse().unwrap();
    (status, answer[split + 4..].to_vec())
}

fn basic(tag: &str, password: &str) -> String {
    use base64::Engine;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{tag}:{password}"))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_binaries_are_served_only_to_a_login_and_as_the_mirror_published_them() {
    let mirror = Mirror::new(&[(own(), Published::Lockstepd)]);
    let controller = Controller::bootstrap(
        &[
            "--metadata-source",
            &mirror.source(),
            "--metadata-key",
            &mirror.key(),
        ],
        &[],
    );
    controller.assert_bootstrapped();
    let file = controller.controller_file();
    let binary = lockstep_agent::datadir::host_binary(own());
    let path = format!("/model/{}/tools/{binary}", file.model_uuid);
    let cache = controller.data().tools_cache_dir();

    for (who, authorization) in [
        ("nobody", None),
        ("a wrong password", Some(basic("user-admin", "wrong"))),
        (
            "a machine that does not exist",
            Some(basic("machine-7", &file.password)),
        ),
    ] {
        let (status, body) = get(&controller, &path, authorization).await;
        assert_eq!(status, 401, "{who}: {}", String::from_utf8_lossy(&body));
    }
    assert!(
        !cache.join(format!("{binary}.tgz")).exists(),
        "a refused download fetched the binary"
    );

    let (status, body) = get(
        &controller,
        &path,
        Some(basic("user-admin", &file.password)),
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let published = std::fs::read(tarball_in(mirror.path(), &binary.to_string()))
        .expect("the mirror's tarball");
    assert!(
        body == published,
        "the download differs from the mirror's tarball"
    );
}

/// The mirror's tarball of `binary` (`tools/<stream>/juju-<binary>.tgz`).
fn tarball_in(mirror: &Path, binary: &str) -> std::path::PathBuf {
    let name = format!("juju-{binary}.tgz");
    walk(mirror)
        .into_iter()
        .find(|path| path.file_name().is_some_and(|file| file == name.as_str()))
        .unwrap_or_else(|| panic!("no {name} in {}", mirror.display()))
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(walk(&path));
        } else {
            found.push(path);
        }
    }
    found
}
