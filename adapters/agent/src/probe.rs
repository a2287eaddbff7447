//! HTTP GETs of the controller's probes (`/readyz`, `/metrics`) over its TLS port, trusting
//! only the controller's CA.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::bootstrap::ControllerFile;

/// `GET path` → (status code, body). One request per connection (`Connection: close`).
pub async fn get(controller: &ControllerFile, path: &str) -> Result<(u16, String), String> {
    let config = lockstep_transport::tls::client_config(
        &controller.ca_cert,
        &[&rustls::version::TLS13, &rustls::version::TLS12],
    )
    .map_err(|e| e.to_string())?;
    let address = &controller.api_endpoints[0];
    let connector = tokio_rustls::TlsConnector::from(Arc::clone(&config));
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect(address)
            .await
            .map_err(|e| format!("cannot connect to {address}: {e}"))?;
        let name =
            rustls::pki_types::ServerName::try_from("juju-apiserver").map_err(|e| e.to_string())?;
        let mut tls = connector
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS with {address}: {e}"))?;
        tls.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: juju-apiserver\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .map_err(|e| e.to_string())?;
        let mut response = Vec::new();
        // A peer that closes without TLS close_notify still sent the whole response.
        let _ = tls.read_to_end(&mut response).await;
        Ok::<_, String>(response)
    };
    let response = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .map_err(|_| format!("GET {path} from {address} timed out"))??;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("GET {path}: no HTTP response"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("GET {path}: bad status line"))?;
    Ok((code, body.to_owned()))
}

/// The sum of every sample of `metric` in `/metrics`.
pub async fn metric_sum(controller: &ControllerFile, metric: &str) -> Result<u64, String> {
    let (_, body) = get(controller, "/metrics").await?;
    Ok(body
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| {
            line.strip_prefix(metric)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}
