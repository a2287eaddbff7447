//! Real Juju clients against lockstep's API, unchanged: python-jujuclient 0.54.0 and
//! python-libjuju (PyPI `juju`) 3.6.1.3, installed into a throwaway virtualenv under the
//! target directory with their dependencies pinned by `tests/interop/constraints.txt`.
//!
//! - jujuclient logs in and reads status while the agent is limited; a call outside the
//!   allow-list is refused with `upgrade in progress` and jujuclient retries it (about once
//!   a second) until the test turns the agent Ready, then it succeeds.
//! - libjuju connects, reads status into its typed objects, and sees error code
//!   `upgrade in progress` (it does not retry).

mod api_support;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use api_support::*;
use lockstep_core::Phase;
use serde_json::Value;

const CLIENTS: [&str; 2] = ["jujuclient==0.54.0", "juju==3.6.1.3"];

/// Creates the virtualenv once per test process (tests share it); later runs reuse it.
fn python() -> PathBuf {
    static VENV: Mutex<Option<PathBuf>> = Mutex::new(None);
    let mut venv = VENV.lock().expect("not poisoned");
    if let Some(python) = &*venv {
        return python.clone();
    }
    let directory = Path::new(env!("CARGO_TARGET_TMPDIR")).join("interop-venv");
    let python = directory.join("bin/python");
    let marker = directory.join("installed.txt");
    let wanted = CLIENTS.join(" ");
    if std::fs::read_to_string(&marker).ok().as_deref() != Some(wanted.as_str()) {
        let _ = std::fs::remove_dir_all(&directory);
        run(Command::new("python3").args(["-m", "venv"]).arg(&directory));
        let constraints =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/constraints.txt");
        run(Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-c",
            ])
            .arg(&constraints)
            .args(CLIENTS));
        std::fs::write(&marker, &wanted).expect("write the venv marker");
    }
    *venv = Some(python.clone());
    python
}

fn run(command: &mut Command) {
    let output = command
        .output()
        .unwrap_or_else(|error| panic!("{command:?}: {error}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A client process, killed by its id if the test ends before it does.
struct Client(Child);

impl Drop for Client {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

impl Client {
    fn start(script: &str, fixture: &Fixture) -> Client {
        let ca =
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("interop-ca-{}.pem", fixture.port));
        std::fs::write(&ca, &fixture.ca_pem).expect("write the CA");
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/interop")
            .join(script);
        let child = Command::new(python())
            .arg(script)
            .arg(fixture.port.to_string())
            .arg(&ca)
            .arg(MODEL_UUID)
            .arg(PASSWORD)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the client");
        Client(child)
    }

    fn running(&mut self) -> bool {
        matches!(self.0.try_wait(), Ok(None))
    }

    /// Waits for the client to exit (at most `bound`) and returns its JSON line.
    async fn finish(mut self, bound: Duration) -> Value {
        let deadline = Instant::now() + bound;
        while self.running() {
            assert!(
                Instant::now() < deadline,
                "the client did not finish within {bound:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let status = self.0.wait().expect("reaped");
        let (mut stdout, mut stderr) = (String::new(), String::new());
        self.0
            .stdout
            .take()
            .expect("piped")
            .read_to_string(&mut stdout)
            .unwrap();
        self.0
            .stderr
            .take()
            .expect("piped")
            .read_to_string(&mut stderr)
            .unwrap();
        assert!(
            status.success(),
            "client failed ({status}):\n{stdout}\n{stderr}"
        );
        serde_json::from_str(stdout.trim())
            .unwrap_or_else(|error| panic!("{error}: {stdout:?}\n{stderr}"))
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn jujuclient_retries_upgrade_in_progress_until_the_agent_is_ready() {
    tokio::task::spawn_blocking(python).await.unwrap();
    let fixture = start(Phase::RunningSteps).await;
    let mut client = Client::start("jujuclient_check.py", &fixture);
    // Wait until jujuclient has been turned away three times, then open the API.
    let deadline = Instant::now() + Duration::from_secs(60);
    while fixture.api.gate_rejections() < 3 {
        assert!(
            client.running(),
            "jujuclient exited while the agent was limited"
        );
        assert!(Instant::now() < deadline, "jujuclient never retried");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    fixture.gate.send(view(Phase::Ready)).unwrap();
    let seen = client.finish(Duration::from_secs(60)).await;
    assert_eq!(seen["redirect"], Value::Null, "{seen}");
    assert_eq!(seen["status_model"], "controller");
    assert_eq!(seen["agent_version"], "2.9.43");
    let sends = seen["model_get_sends"].as_u64().unwrap();
    assert!(
        sends >= 4,
        "three refusals and a success, got {sends} sends"
    );
    assert_eq!(
        sends,
        fixture.api.gate_rejections() + 1,
        "every refusal was retried"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn libjuju_connects_reads_status_and_sees_the_upgrade_error_code() {
    tokio::task::spawn_blocking(python).await.unwrap();
    let fixture = start(Phase::CheckingAgentVersion).await;
    let client = Client::start("libjuju_check.py", &fixture);
    let seen = client.finish(Duration::from_secs(60)).await;
    assert_eq!(seen["status_model"], "controller", "{seen}");
    assert_eq!(seen["error_code"], "upgrade in progress");
    assert_eq!(fixture.api.gate_rejections(), 1);
}
