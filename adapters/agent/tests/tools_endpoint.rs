//! The tools endpoint of a real controller, started by `lockstep bootstrap` from a mirror:
//! nobody without credentials downloads (or makes the controller fetch) an agent binary;
//! the admin downloads a published one, byte for byte the mirror's tarball.

use crate::common;

use std::path::Path;

use common::{Controller, basic, next};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_binaries_are_served_only_to_a_login_and_as_the_mirror_published_them() {
    // N+1 is published, not installed: the controller has not fetched it for itself.
    let (mirror, controller) = Controller::from_signed_mirror();
    let file = controller.controller_file();
    let binary = lockstep_agent::datadir::host_binary(next());
    let path = format!("/model/{}/tools/{binary}", file.model_uuid);
    let cache = controller.data().tools_cache_dir();

    refused_without_a_login(&controller, &path, &file.password).await;
    assert!(
        !cache.join(format!("juju-{binary}.tgz")).exists(),
        "a refused download fetched the binary"
    );

    let (status, body) = controller
        .https_get(&path, Some(basic("user-admin", &file.password)))
        .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let published = std::fs::read(tarball_in(mirror.path(), &binary.to_string()))
        .expect("the mirror's tarball");
    assert!(
        body == published,
        "the download differs from the mirror's tarball"
    );
}

/// `path` answers 401 to nobody, to a wrong password and to a machine that does not exist
/// (`password`: the admin's, right for the admin only).
async fn refused_without_a_login(controller: &Controller, path: &str, password: &str) {
    for (who, authorization) in [
        ("nobody", None),
        ("a wrong password", Some(basic("user-admin", "wrong"))),
        (
            "a machine that does not exist",
            Some(basic("machine-7", password)),
        ),
    ] {
        let (status, body) = controller.https_get(path, authorization).await;
        assert_eq!(status, 401, "{who}: {}", String::from_utf8_lossy(&body));
    }
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

/// The link probe (`GET /model/<uuid>/link-probe`, what a machine agent that never
/// downloaded a binary times to learn its link's rate) needs a login as the tools do,
/// answers 404 for another model, and is `LINK_PROBE_BYTES` zero bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_link_probe_is_served_only_to_a_login_and_is_a_mebibyte_of_zeros() {
    let (_mirror, controller) = Controller::from_signed_mirror();
    let file = controller.controller_file();
    let path = format!("/model/{}/link-probe", file.model_uuid);
    refused_without_a_login(&controller, &path, &file.password).await;
    let admin = || Some(basic("user-admin", &file.password));
    let other = "/model/00000000-0000-4000-8000-000000000000/link-probe";
    let (status, body) = controller.https_get(other, admin()).await;
    assert_eq!(status, 404, "{}", String::from_utf8_lossy(&body));

    let (status, body) = controller.https_get(&path, admin()).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(
        body.len() as u64,
        lockstep_core::upgrader::LINK_PROBE_BYTES,
        "the probe's size"
    );
    assert!(body.iter().all(|byte| *byte == 0), "the probe is zeros");
}
