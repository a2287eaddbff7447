//! Time from Ready to a waiting client's first successful call: lockstep's client (waiting
//! by `Upgrade.WatchProgress`) side by side with python-jujuclient's algorithm (resend the
//! same call every 1.0 s while it says `upgrade in progress`), in the same run, against the
//! same server.
//!
//! Run: `cargo bench -p lockstep-transport --bench ready`. Each trial limits the gate,
//! starts both waiters, opens the gate after a delay that varies from trial to trial (so
//! the 1 s loop is caught at every point of its period), and records, for each, the time
//! from the gate opening to its first successful `ModelConfig.ModelSet` (a write: reads are
//! served in every phase, writes only from Ready). Each waiter must have been refused
//! before the gate opened and must have its write answered after: any other reply stops
//! the bench. `LOCKSTEP_BENCH_QUICK=1` runs one trial (same code paths,
//! same checks): CI runs it so that a broken bench fails.
#![allow(clippy::print_stdout, reason = "a benchmark's report is its output")]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use lockstep_core::Phase;
use lockstep_core::client::RetryPolicy;
use lockstep_transport::client::{Client, ClientConfig};
use lockstep_transport::tls::{Credentials, client_config};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

const TRIALS: u64 = 20;

/// How much work a run does: the full run, or `LOCKSTEP_BENCH_QUICK=1`'s (anything but `0`)
/// one trial, for CI.
#[derive(Clone, Copy, Debug)]
struct Size {
    quick: bool,
    trials: u64,
}

impl Size {
    fn from_env() -> Size {
        let quick = std::env::var_os("LOCKSTEP_BENCH_QUICK").is_some_and(|value| value != "0");
        Size {
            quick,
            trials: if quick { 1 } else { TRIALS },
        }
    }
}

/// The write the waiters make: a model config key, as `juju model-config` sets one.
fn model_set_params() -> Value {
    json!({"config": {"logging-config": "<root>=INFO"}})
}

/// `ModelSet`'s reply: answered (an empty result), not refused.
fn assert_model_set(response: &Value) {
    assert!(
        response.get("error").is_none() && response.get("error-code").is_none(),
        "{response}"
    );
}

/// python-jujuclient's loop (`_rpc_retry_if_upgrading`): the same frame every 1.0 s.
async fn jujuclient_style(
    port: u16,
    ca: String,
    ready_at: Arc<tokio::sync::OnceCell<Instant>>,
) -> Duration {
    let connector =
        tokio_rustls::TlsConnector::from(client_config(&ca, &[&rustls::version::TLS12]).unwrap());
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let stream = connector
        .connect(
            rustls::pki_types::ServerName::try_from("localhost").unwrap(),
            tcp,
        )
        .await
        .unwrap();
    let (mut socket, _) =
        tokio_tungstenite::client_async(format!("wss://localhost:{port}/api"), stream)
            .await
            .unwrap();
    let mut exchange = async |frame: Value| -> Value {
        socket
            .send(Message::Text(frame.to_string().into()))
            .await
            .unwrap();
        loop {
            if let Message::Text(text) = socket.next().await.unwrap().unwrap() {
                return serde_json::from_str(&text).unwrap();
            }
        }
    };
    let logged_in = exchange(
        json!({"request-id": 1, "type": "Admin", "version": 3, "request": "Login",
                    "params": {"auth-tag": "user-admin", "credentials": "bench"}}),
    )
    .await;
    assert!(logged_in.get("error").is_none(), "{logged_in}");
    let frame = json!({"request-id": 2, "type": "ModelConfig", "version": 3, "request": "ModelSet", "params": model_set_params()});
    let mut refusals = 0;
    loop {
        let reply = exchange(frame.clone()).await;
        match reply.get("error") {
            None => {
                let elapsed = ready_at.get().expect("answered only after Ready").elapsed();
                assert!(refusals > 0, "never refused: it did not wait for Ready");
                assert_model_set(&reply);
                return elapsed;
            }
            Some(error) => {
                assert!(
                    error
                        .as_str()
                        .unwrap_or_default()
                        .contains("upgrade in progress"),
                    "refused for another reason than the upgrade: {reply}"
                );
                refusals += 1;
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn lockstep_client(
    port: u16,
    ca: String,
    ready_at: Arc<tokio::sync::OnceCell<Instant>>,
) -> Duration {
    let client = Client::new(ClientConfig {
        address: format!("127.0.0.1:{port}"),
        fallback_addresses: Vec::new(),
        ca_pem: ca,
        model_uuid: None,
        user: "admin".into(),
        password: "bench".into(),
        retry: RetryPolicy::default(),
        client_id: "bench".into(),
    });
    let phases = client.wait_ready(Duration::from_secs(60)).await.unwrap();
    let response = client
        .call(
            "ModelConfig",
            3,
            "ModelSet",
            model_set_params(),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    let elapsed = ready_at.get().expect("answered only after Ready").elapsed();
    // It waited through the limited phase: a client that saw only Ready measured nothing.
    assert_eq!(phases, [Phase::RunningSteps, Phase::Ready], "phases seen");
    assert_model_set(&response);
    elapsed
}

fn median(values: &mut [Duration]) -> Duration {
    values.sort();
    values[values.len() / 2]
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let size = Size::from_env();
    let credentials = Credentials::generate("bench", &[]).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (gate, gate_view) = watch::channel(common::view(Phase::RunningSteps));
    let api = common::api(gate_view);
    let server = tokio::spawn(api.serve(listener, credentials.server_config().unwrap()));

    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for trial in 0..size.trials {
        gate.send(common::view(Phase::RunningSteps)).unwrap();
        let ready_at = Arc::new(tokio::sync::OnceCell::new());
        let lockstep = tokio::spawn(lockstep_client(
            port,
            credentials.ca_pem.clone(),
            Arc::clone(&ready_at),
        ));
        let jujuclient = tokio::spawn(jujuclient_style(
            port,
            credentials.ca_pem.clone(),
            Arc::clone(&ready_at),
        ));
        // Open the gate at a point that moves through the 1 s retry period.
        tokio::time::sleep(Duration::from_millis(500 + trial * 1000 / size.trials)).await;
        ready_at.set(Instant::now()).unwrap();
        gate.send(common::view(Phase::Ready)).unwrap();
        ours.push(lockstep.await.unwrap());
        theirs.push(jujuclient.await.unwrap());
    }
    server.abort();
    let (ours, theirs) = (median(&mut ours), median(&mut theirs));
    println!(
        "time from Ready to the first successful call, median of {} trials{}:",
        size.trials,
        if size.quick {
            " (quick: LOCKSTEP_BENCH_QUICK)"
        } else {
            ""
        }
    );
    println!(
        "  lockstep client (Upgrade.WatchProgress)   {:>9.2} ms",
        ours.as_secs_f64() * 1e3
    );
    println!(
        "  jujuclient's loop (retry every 1.0 s)     {:>9.2} ms",
        theirs.as_secs_f64() * 1e3
    );
    println!(
        "  ratio jujuclient / lockstep               {:>9.1}x",
        theirs.as_secs_f64() / ours.as_secs_f64()
    );
}
