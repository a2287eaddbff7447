//! Agent-binary catalogues from simplestreams metadata, verified downloads, and a mirror
//! generator: the stream-lookup adapter of lockstep.
//!
//! Simplestreams metadata comes from a mirror and is untrusted. This crate reads it
//! exactly as Juju writes it, refuses what cannot be verified while keeping the rest usable,
//! guards against rolled-back, frozen and mixed-up metadata the way a TUF client does, and
//! installs a binary only after its size and sha256 matched. It reads no clock: `now` is a
//! parameter everywhere.
//!
//! # Layout
//!
//! - [`metadata`]: parsing `streams/v1/index2.json`, the legacy `index.json`, products files
//!   (`com.ubuntu.juju:<stream>:agents`, older `...:tools` with series-keyed product ids)
//!   and `mirrors.json`; per-item verification and the conflict rule.
//! - [`source`]: the synchronous [`Source`] trait, the directory source for `file://`
//!   mirrors, the size cap every fetch carries, and the path check that keeps fetches
//!   inside the mirror.
//! - [`fetch`]: the async [`AsyncSource`] trait the (tokio-based) agent drives, and
//!   [`look_up_async`]; its module doc says why both a sync and an async trait exist.
//! - [`http`]: [`HttpSource`], `http://` and `https://` mirrors with `reqwest` and rustls
//!   (ring): a configured trust store, a size cap, a deadline and a minimum throughput on
//!   every fetch, bounded retries with seeded jitter, and `Range` resume.
//! - [`lookup`]: [`look_up`]: index, products, guards, catalogue; the high-water mark
//!   advances only when everything passed.
//! - [`signature`]: OpenPGP clear-signed `.sjson` metadata, verified with rPGP against a
//!   [`Keyring`]; unsigned metadata only with `allow_unsigned`; [`SigningKey`] for the
//!   generator.
//! - [`state`]: the persisted [`HighWaterMark`](lockstep_core::policy::HighWaterMark)
//!   file, written atomically.
//! - [`download`](mod@download): [`download()`]: stream into a temporary file while hashing and counting,
//!   rename only when size and digest match.
//! - [`generate`]: [`generate_agent_binaries`], Juju's `juju metadata
//!   generate-agent-binaries` (its module doc shows the mirror layout).
//! - [`time`]: the RFC 1123 `updated` times and `YYYYMMDD` version keys.
//! - [`error`]: every error names the file, the field and the offending value.
//!
//! **Architecture Invariant:** this crate decides nothing about which version to run; it
//! hands a [`Catalogue`](lockstep_core::policy::Catalogue) to the core's
//! [`select`](lockstep_core::policy::select). **Architecture Invariant:** nothing is
//! written to a destination or to the high-water mark unless every check passed.

pub mod download;
pub mod error;
pub mod fetch;
pub mod generate;
pub mod http;
pub mod lookup;
pub mod metadata;
pub mod signature;
pub mod source;
pub mod state;
pub mod time;

pub use download::{DownloadProgress, download};
pub use error::{
    DownloadError, GenerateError, LookupError, MetadataError, RedirectRule, SourceError, StateError,
};
pub use fetch::{AsyncSource, look_up_async};
pub use generate::{GenerateOptions, Generated, generate_agent_binaries, sign_generated_metadata};
pub use http::{BasicAuth, HttpConfig, HttpSource, RetryPolicy};
pub use lookup::{Lookup, LookupConfig, look_up};
pub use signature::{Keyring, SigningKey};
pub use source::{DirectorySource, Source};
pub use state::HighWaterMarkFile;
