//! The charms endpoint, `POST /model/<uuid>/charms?series=<series>`: a local charm uploaded
//! as python-libjuju's `Model.deploy(<directory>)` and python-jujuclient's
//! `add_local_charm` send it (Juju's `apiserver/charms.go`): a zip archive, `Content-Type:
//! application/zip`, HTTP Basic authentication as a user (`user-admin:<password>`).
//!
//! lockstep runs no charms: it reads the archive's metadata and config options
//! ([`Charm::from_archive`]), records them in the shared state under the charm's URL, and
//! keeps no archive. The reply is Juju's: 200 with header `Juju-Curl` and body
//! `{"charm-url": "local:jammy/mycharm-0"}`; errors are JSON `{"error": {"message",
//! "code"}}`.

use std::net::IpAddr;

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use lockstep_core::gate::{self, Login};
use serde_json::json;

use crate::admission::Ticket;
use crate::api::Api;
use crate::auth::{self, ModelAccess};
pub use crate::charm::UPLOADS_IN_FLIGHT_MAX;
use crate::charm::{ARCHIVE_SIZE_BYTES_MAX, Charm};
use crate::tools_endpoint::http_error;

/// The longest `series` query value taken as a series; anything else (`None`, which
/// python-libjuju sends for a charm without one) is ignored.
pub const SERIES_SIZE_BYTES_MAX: usize = 32;

/// `POST /model/<uuid>/charms`, from a client at `source` on the connection of `ticket`
/// (`None` when the router is served without the API's accept loop).
pub async fn post(
    api: &Api,
    source: IpAddr,
    ticket: Option<&Ticket>,
    uuid: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: Body,
) -> Response {
    if uuid != api.config.model_uuid {
        return http_error(
            StatusCode::NOT_FOUND,
            "not found",
            format!("unknown model {uuid:?}"),
        );
    }
    let user = match auth::http_login(api, source, ticket, headers, &[Login::User]).await {
        Ok((_, tag)) => tag.strip_prefix("user-").unwrap_or_default().to_owned(),
        Err(refused) => return refused,
    };
    if let Err(refused) = gate::admit(&api.view(), Login::User, "Charms", "AddCharm") {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(
                json!({"error": {"message": refused.message, "code": refused.code,
                                        "info": refused.detail}}),
            ),
        )
            .into_response();
    }
    if auth::model_access(&user) < ModelAccess::Write {
        return http_error(
            StatusCode::FORBIDDEN,
            "unauthorized access",
            "permission denied: uploading a charm needs write access to the model",
        );
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    if content_type != "application/zip" {
        return http_error(
            StatusCode::BAD_REQUEST,
            "bad request",
            format!("expected Content-Type: application/zip, got: {content_type}"),
        );
    }
    let mut series = None;
    for (key, value) in query
        .unwrap_or_default()
        .split('&')
        .filter_map(|pair| pair.split_once('='))
    {
        match key {
            "schema" if value != "local" => {
                return http_error(
                    StatusCode::BAD_REQUEST,
                    "bad request",
                    format!("unsupported schema {value:?}: lockstep records local charms only"),
                );
            }
            "series" if valid_series(value) => series = Some(value.to_owned()),
            _ => {}
        }
    }
    let Ok(_permit) = api.uploads.acquire().await else {
        return http_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "",
            "the server is stopping",
        );
    };
    let bytes = match axum::body::to_bytes(body, ARCHIVE_SIZE_BYTES_MAX).await {
        Ok(bytes) => bytes,
        Err(error) => {
            return http_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "bad request",
                format!(
                    "cannot read the charm archive (at most {ARCHIVE_SIZE_BYTES_MAX} bytes): {error}"
                ),
            );
        }
    };
    let charm = match tokio::task::spawn_blocking(move || Charm::from_archive(&bytes)).await {
        Ok(Ok(charm)) => charm,
        Ok(Err(error)) => {
            return http_error(StatusCode::BAD_REQUEST, "bad request", error.to_string());
        }
        Err(error) => {
            return http_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "",
                format!("internal error: {error}"),
            );
        }
    };
    match api.state.add_charm(&charm, series.as_deref()).await {
        Ok(url) => {
            tracing::info!(target: "lockstep::api", charm = %url, size_bytes = charm.size_bytes, "charm recorded");
            (
                StatusCode::OK,
                [("Juju-Curl", url.clone())],
                axum::Json(json!({"charm-url": url})),
            )
                .into_response()
        }
        Err(error) => {
            let status = if error.code == "not found" {
                StatusCode::NOT_FOUND
            } else {
                StatusCode::INTERNAL_SERVER_ERROR
            };
            http_error(status, &error.code, error.message)
        }
    }
}

/// A series name as Juju spells them (`jammy`, `focal`, `kubernetes`); `None` is not one.
pub fn valid_series(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= SERIES_SIZE_BYTES_MAX
        && value != "None"
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}
