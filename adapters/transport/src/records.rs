//! A TLS session carried on after rustls's handshake, so that it can move between
//! processes.
//!
//! rustls keeps a connection's record layer (its keys and sequence numbers) inside the
//! process that made the handshake, and cannot take it back once it is out. Kernel TLS is
//! how other programs move an established session (into the kernel, and with the socket to
//! another process); the project's machines' kernels offer no `tls` upper-layer protocol.
//! So this module does what the kernel would:
//!
//! - rustls makes the handshake ([`accept`]) and gives up the session: its keys (TLS 1.3's
//!   traffic secrets, TLS 1.2's keys) and sequence numbers, as [`SessionState`], plain data
//!   another process can be sent;
//! - [`Session`] seals and opens the records from there on, on ring's AEADs (the ones
//!   rustls uses): RFC 8446 §5.2-5.3 for TLS 1.3, key updates included (§4.6.3, §7.2), and
//!   RFC 5288 / RFC 7905 for TLS 1.2's AES-GCM and ChaCha20-Poly1305 (the only TLS 1.2
//!   suites rustls offers);
//! - [`RecordStream`] is that session over a socket, as `AsyncRead` and `AsyncWrite`.
//!
//! The handshake reads the client one whole record at a time and stops at the record that
//! ends it, so nothing the client sent after its `Finished` is left in rustls's buffers:
//! the session's first read is the first byte of the client's first application record.

use std::fmt;
use std::io;
use std::ops::Range;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use ring::aead::{self, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::hkdf;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use zeroize::Zeroize;

/// The largest plaintext a record carries (2^14).
pub const PLAINTEXT_BYTES_MAX: usize = 1 << 14;

/// The largest body a TLS 1.3 record may have (RFC 8446 §5.2: 2^14 + 256).
pub const TLS13_CIPHERTEXT_BYTES_MAX: usize = PLAINTEXT_BYTES_MAX + 256;

/// The largest body a TLS 1.2 record may have (RFC 5246 §6.2.3: 2^14 + 2048), and so the
/// largest a handshake record may have.
pub const CIPHERTEXT_BYTES_MAX: usize = PLAINTEXT_BYTES_MAX + 2048;

/// A record's header: type, legacy version, length.
pub const HEADER_BYTES: usize = 5;

const TAG_BYTES: usize = 16;
const TLS12_EXPLICIT_NONCE_BYTES: usize = 8;

const CONTENT_ALERT: u8 = 21;
const CONTENT_HANDSHAKE: u8 = 22;
const CONTENT_APPLICATION_DATA: u8 = 23;
const LEGACY_VERSION: u16 = 0x0303;
const HANDSHAKE_KEY_UPDATE: u8 = 24;
const ALERT_WARNING: u8 = 1;
const ALERT_FATAL: u8 = 2;
const ALERT_CLOSE_NOTIFY: u8 = 0;
const ALERT_UNEXPECTED_MESSAGE: u8 = 10;
const ALERT_BAD_RECORD_MAC: u8 = 20;
const ALERT_RECORD_OVERFLOW: u8 = 22;
const ALERT_DECODE_ERROR: u8 = 50;

/// The most records in a row a peer may send that carry no application data (empty ones,
/// key updates): rustls's and BoringSSL's bound, so that a peer cannot keep this side
/// opening records that move nothing on.
pub const IDLE_RECORDS_MAX: u32 = 32;

/// The most ciphertext [`RecordStream`] keeps unwritten before a write waits for the
/// socket: four full records.
const WRITE_BUFFER_BYTES_MAX: usize = 4 * (HEADER_BYTES + TLS13_CIPHERTEXT_BYTES_MAX);

/// A cipher suite a session can be carried on in: its protocol version, AEAD and hash.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Suite {
    /// TLS_AES_128_GCM_SHA256.
    Tls13Aes128GcmSha256,
    /// TLS_AES_256_GCM_SHA384.
    Tls13Aes256GcmSha384,
    /// TLS_CHACHA20_POLY1305_SHA256.
    Tls13Chacha20Poly1305Sha256,
    /// TLS 1.2's ECDHE suites with AES-128-GCM (RFC 5288).
    Tls12Aes128Gcm,
    /// TLS 1.2's ECDHE suites with AES-256-GCM.
    Tls12Aes256Gcm,
    /// TLS 1.2's ECDHE suites with ChaCha20-Poly1305 (RFC 7905).
    Tls12Chacha20Poly1305,
}

impl Suite {
    fn from_rustls(suite: rustls::CipherSuite) -> Option<Suite> {
        use rustls::CipherSuite as C;
        Some(match suite {
            C::TLS13_AES_128_GCM_SHA256 => Suite::Tls13Aes128GcmSha256,
            C::TLS13_AES_256_GCM_SHA384 => Suite::Tls13Aes256GcmSha384,
            C::TLS13_CHACHA20_POLY1305_SHA256 => Suite::Tls13Chacha20Poly1305Sha256,
            C::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
            | C::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => Suite::Tls12Aes128Gcm,
            C::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384
            | C::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 => Suite::Tls12Aes256Gcm,
            C::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
            | C::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256 => Suite::Tls12Chacha20Poly1305,
            _ => return None,
        })
    }

    fn tls13(self) -> bool {
        matches!(
            self,
            Suite::Tls13Aes128GcmSha256
                | Suite::Tls13Aes256GcmSha384
                | Suite::Tls13Chacha20Poly1305Sha256
        )
    }

    /// TLS 1.2's AES-GCM carries the nonce's last 8 bytes in each record.
    fn explicit_nonce(self) -> bool {
        matches!(self, Suite::Tls12Aes128Gcm | Suite::Tls12Aes256Gcm)
    }

    fn aead(self) -> &'static aead::Algorithm {
        match self {
            Suite::Tls13Aes128GcmSha256 | Suite::Tls12Aes128Gcm => &aead::AES_128_GCM,
            Suite::Tls13Aes256GcmSha384 | Suite::Tls12Aes256Gcm => &aead::AES_256_GCM,
            Suite::Tls13Chacha20Poly1305Sha256 | Suite::Tls12Chacha20Poly1305 => {
                &aead::CHACHA20_POLY1305
            }
        }
    }

    fn hkdf(self) -> hkdf::Algorithm {
        match self {
            Suite::Tls13Aes256GcmSha384 => hkdf::HKDF_SHA384,
            _ => hkdf::HKDF_SHA256,
        }
    }

    /// The length of a direction's secret in [`DirectionState`]: TLS 1.3's traffic secret
    /// (the hash's length), or TLS 1.2's key and IV.
    fn secret_len(self) -> usize {
        match self {
            Suite::Tls13Aes256GcmSha384 => 48,
            Suite::Tls13Aes128GcmSha256 | Suite::Tls13Chacha20Poly1305Sha256 => 32,
            _ => self.aead().key_len() + NONCE_LEN,
        }
    }

    fn ciphertext_max(self) -> usize {
        if self.tls13() {
            TLS13_CIPHERTEXT_BYTES_MAX
        } else {
            CIPHERTEXT_BYTES_MAX
        }
    }

    /// The records one TLS 1.3 key may seal before it is replaced: RFC 8446 §5.5 allows
    /// AES-GCM 2^24.5 and ChaCha20-Poly1305 more than 2^64. TLS 1.2 has no key update.
    fn records_per_key_max(self) -> u64 {
        match self {
            Suite::Tls13Aes128GcmSha256 | Suite::Tls13Aes256GcmSha384 => 1 << 23,
            _ => u64::MAX,
        }
    }
}

/// Key material, wiped when dropped. Its `Debug` does not show it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(Vec<u8>);

impl Drop for Secret {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl Secret {
    /// The key material.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Key material from bytes.
    pub(crate) fn from_bytes(bytes: &[u8]) -> Secret {
        Secret(bytes.to_vec())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

/// One direction of a session: its key material and the sequence number of its next record.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct DirectionState {
    /// The sequence number of the next record this direction seals or opens.
    pub seq: u64,
    /// TLS 1.3: the direction's current application traffic secret. TLS 1.2: its key, then
    /// its 12-byte IV (for AES-GCM the 4-byte salt, then the explicit nonce's start).
    pub secret: Secret,
}

/// All a session is once its handshake is done: what another process needs to carry it on.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct SessionState {
    /// The negotiated suite.
    pub suite: Suite,
    /// What this side reads: the peer's records.
    pub rx: DirectionState,
    /// What this side writes.
    pub tx: DirectionState,
}

impl SessionState {
    /// The same session seen from the other end: its reads are this side's writes.
    pub fn peer(&self) -> SessionState {
        SessionState {
            suite: self.suite,
            rx: self.tx.clone(),
            tx: self.rx.clone(),
        }
    }
}

/// Why a session could not be taken from rustls, or a record was refused.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    /// The suite is not one this module carries.
    #[error("the cipher suite {0} is not one lockstep carries on after the handshake")]
    Suite(String),
    /// rustls did not log the traffic secrets, or they do not match its keys.
    #[error("the session's traffic secrets: {0}")]
    Secrets(String),
    /// rustls refused to give up the session.
    #[error("rustls gave up no session: {0}")]
    Extract(String),
    /// A record's header is not one this session may receive.
    #[error("a record of type {typ} and version {version:#06x}, which this session does not take")]
    Header {
        /// The record's type.
        typ: u8,
        /// Its legacy version.
        version: u16,
    },
    /// A record longer than TLS allows.
    #[error("a record of {len} bytes, more than the {max} TLS allows")]
    Overflow {
        /// The record's length.
        len: usize,
        /// The most allowed.
        max: usize,
    },
    /// A record that does not open with the session's key.
    #[error("a record (sequence number {0}) that does not decrypt")]
    BadRecord(u64),
    /// A TLS 1.3 record whose plaintext is padding only.
    #[error("a record (sequence number {0}) with no content type")]
    NoContentType(u64),
    /// A handshake message after the handshake that is not a whole TLS 1.3 `key_update`
    /// (TLS 1.2's renegotiation is refused, as rustls refuses it).
    #[error("a post-handshake message of type {typ} and {len} bytes; only key_update is taken")]
    Handshake {
        /// The handshake message's type.
        typ: u8,
        /// The record's handshake bytes.
        len: usize,
    },
    /// A `key_update` whose request byte is neither 0 nor 1.
    #[error("a key_update with request {0}, neither 0 nor 1")]
    KeyUpdateRequest(u8),
    /// An alert other than `close_notify`, or a malformed one.
    #[error("the peer sent alert {description} (level {level})")]
    Alert {
        /// The alert's level.
        level: u8,
        /// Its description.
        description: u8,
    },
    /// A record of a content type not sent encrypted.
    #[error("a record of inner content type {0}")]
    ContentType(u8),
    /// The session's sequence numbers ran out.
    #[error("the session's sequence numbers are exhausted")]
    Exhausted,
    /// Too many records in a row with no application data.
    #[error("{} records in a row with no application data (empty, or key updates)", IDLE_RECORDS_MAX + 1)]
    Idle,
    /// A write after this side said `close_notify`.
    #[error("a write after close_notify")]
    Closed,
}

impl RecordError {
    /// The alert this side sends the peer before closing, if the error is the peer's.
    fn alert(&self) -> Option<u8> {
        match self {
            RecordError::Header { .. }
            | RecordError::ContentType(_)
            | RecordError::Handshake { .. }
            | RecordError::Idle => Some(ALERT_UNEXPECTED_MESSAGE),
            RecordError::Overflow { .. } => Some(ALERT_RECORD_OVERFLOW),
            RecordError::BadRecord(_) => Some(ALERT_BAD_RECORD_MAC),
            RecordError::NoContentType(_) | RecordError::KeyUpdateRequest(_) => {
                Some(ALERT_DECODE_ERROR)
            }
            _ => None,
        }
    }
}

impl From<RecordError> for io::Error {
    fn from(error: RecordError) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, error)
    }
}

/// `HKDF-Expand-Label(secret, label, "", len)` (RFC 8446 §7.1).
fn expand_label(suite: Suite, secret: &[u8], label: &[u8], len: usize) -> Vec<u8> {
    struct Len(usize);
    impl hkdf::KeyType for Len {
        fn len(&self) -> usize {
            self.0
        }
    }
    let length = (len as u16).to_be_bytes();
    let label_len = [(b"tls13 ".len() + label.len()) as u8];
    let context_len = [0u8];
    let info: [&[u8]; 5] = [&length, &label_len, b"tls13 ", label, &context_len];
    let prk = hkdf::Prk::new_less_safe(suite.hkdf(), secret);
    let mut out = vec![0u8; len];
    prk.expand(&info, Len(len))
        .and_then(|okm| okm.fill(&mut out))
        .expect("HKDF-Expand of at most 255 hash lengths");
    out
}

/// One direction's keys in use.
struct Direction {
    suite: Suite,
    secret: Secret,
    key: LessSafeKey,
    iv: [u8; NONCE_LEN],
    seq: u64,
}

impl Direction {
    fn new(suite: Suite, state: &DirectionState) -> Result<Direction, RecordError> {
        if state.secret.0.len() != suite.secret_len() {
            return Err(RecordError::Secrets(format!(
                "a secret of {} bytes for {suite:?}, which needs {}",
                state.secret.0.len(),
                suite.secret_len()
            )));
        }
        let (key, iv) = Direction::keys(suite, &state.secret.0);
        Ok(Direction {
            suite,
            secret: state.secret.clone(),
            key,
            iv,
            seq: state.seq,
        })
    }

    /// The key and IV of a direction's secret: derived from TLS 1.3's traffic secret (RFC
    /// 8446 §7.3), TLS 1.2's as they are.
    fn keys(suite: Suite, secret: &[u8]) -> (LessSafeKey, [u8; NONCE_LEN]) {
        let key_len = suite.aead().key_len();
        let (mut key_bytes, iv_bytes) = if suite.tls13() {
            (
                expand_label(suite, secret, b"key", key_len),
                expand_label(suite, secret, b"iv", NONCE_LEN),
            )
        } else {
            (secret[..key_len].to_vec(), secret[key_len..].to_vec())
        };
        let key = LessSafeKey::new(
            UnboundKey::new(suite.aead(), &key_bytes).expect("a key of the AEAD's length"),
        );
        key_bytes.zeroize();
        let mut iv = [0u8; NONCE_LEN];
        iv.copy_from_slice(&iv_bytes);
        (key, iv)
    }

    /// Moves to the next TLS 1.3 traffic secret (RFC 8446 §7.2), its sequence from 0.
    fn update(&mut self) {
        let next = Secret(expand_label(
            self.suite,
            &self.secret.0,
            b"traffic upd",
            self.suite.secret_len(),
        ));
        let (key, iv) = Direction::keys(self.suite, &next.0);
        self.secret = next;
        self.key = key;
        self.iv = iv;
        self.seq = 0;
    }

    /// The next record's sequence number and its nonce (the IV xor the sequence number),
    /// the sequence moved on.
    fn next(&mut self) -> Result<(u64, [u8; NONCE_LEN]), RecordError> {
        if self.seq == u64::MAX {
            return Err(RecordError::Exhausted);
        }
        let seq = self.seq;
        let mut nonce = self.iv;
        for (n, s) in nonce[NONCE_LEN - 8..].iter_mut().zip(seq.to_be_bytes()) {
            *n ^= s;
        }
        self.seq += 1;
        Ok((seq, nonce))
    }

    fn state(&self) -> DirectionState {
        DirectionState {
            seq: self.seq,
            secret: self.secret.clone(),
        }
    }
}

/// TLS 1.2's additional data: the sequence number, then the plaintext's header.
fn tls12_aad(seq: u64, typ: u8, plain_len: usize) -> Aad<[u8; 13]> {
    let mut aad = [0u8; 13];
    aad[..8].copy_from_slice(&seq.to_be_bytes());
    aad[8] = typ;
    aad[9..11].copy_from_slice(&LEGACY_VERSION.to_be_bytes());
    aad[11..].copy_from_slice(&(plain_len as u16).to_be_bytes());
    Aad::from(aad)
}

/// What one record brought.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Opened {
    /// Application data, at this range of the buffer given to [`Session::open`].
    Data(Range<usize>),
    /// The peer's `close_notify`: it writes no more.
    CloseNotify,
    /// A TLS 1.3 `key_update`: this side's reads now use the peer's next key; if the peer
    /// asked, [`Session::open`] has already sealed this side's own `key_update`.
    KeyUpdate,
}

/// A session's record layer: seals what this side writes, opens what it reads.
pub struct Session {
    suite: Suite,
    rx: Direction,
    tx: Direction,
    closed: bool,
    /// Records opened in a row that carried no application data.
    idle: u32,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("suite", &self.suite)
            .field("rx_seq", &self.rx.seq)
            .field("tx_seq", &self.tx.seq)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Carries on the session `state` describes.
    pub fn new(state: &SessionState) -> Result<Session, RecordError> {
        Ok(Session {
            suite: state.suite,
            rx: Direction::new(state.suite, &state.rx)?,
            tx: Direction::new(state.suite, &state.tx)?,
            closed: false,
            idle: 0,
        })
    }

    /// What another process needs to carry the session on from here.
    pub fn state(&self) -> SessionState {
        SessionState {
            suite: self.suite,
            rx: self.rx.state(),
            tx: self.tx.state(),
        }
    }

    /// Whether this side has said `close_notify`.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Seals `plain` as application data, in records of at most
    /// [`PLAINTEXT_BYTES_MAX`], appended to `out`.
    pub fn seal(&mut self, plain: &[u8], out: &mut Vec<u8>) -> Result<(), RecordError> {
        if self.closed {
            return Err(RecordError::Closed);
        }
        for chunk in plain.chunks(PLAINTEXT_BYTES_MAX) {
            self.seal_record(CONTENT_APPLICATION_DATA, chunk, out)?;
        }
        Ok(())
    }

    /// Seals a `close_notify` alert into `out`; nothing may be sealed after it.
    pub fn seal_close_notify(&mut self, out: &mut Vec<u8>) -> Result<(), RecordError> {
        if self.closed {
            return Ok(());
        }
        self.seal_record(CONTENT_ALERT, &[ALERT_WARNING, ALERT_CLOSE_NOTIFY], out)?;
        self.closed = true;
        Ok(())
    }

    /// Seals a fatal alert for `error`, if it is one the peer should hear of.
    fn seal_alert_for(&mut self, error: &RecordError, out: &mut Vec<u8>) {
        if let Some(description) = error.alert()
            && !self.closed
            && self
                .seal_record(CONTENT_ALERT, &[ALERT_FATAL, description], out)
                .is_ok()
        {
            self.closed = true;
        }
    }

    /// Seals this side's TLS 1.3 `key_update` and moves its writes to the next key.
    fn seal_key_update(&mut self, requested: bool, out: &mut Vec<u8>) -> Result<(), RecordError> {
        let message = [HANDSHAKE_KEY_UPDATE, 0, 0, 1, u8::from(requested)];
        self.seal_record(CONTENT_HANDSHAKE, &message, out)?;
        self.tx.update();
        Ok(())
    }

    fn seal_record(&mut self, typ: u8, plain: &[u8], out: &mut Vec<u8>) -> Result<(), RecordError> {
        debug_assert!(plain.len() <= PLAINTEXT_BYTES_MAX);
        // A TLS 1.3 key that sealed as many records as its suite allows is replaced first.
        if typ != CONTENT_HANDSHAKE && self.tx.seq >= self.suite.records_per_key_max() {
            self.seal_key_update(false, out)?;
        }
        let (seq, nonce) = self.tx.next()?;
        let start = out.len();
        let (outer, explicit, body_len) = if self.suite.tls13() {
            (CONTENT_APPLICATION_DATA, 0, plain.len() + 1 + TAG_BYTES)
        } else if self.suite.explicit_nonce() {
            let explicit = TLS12_EXPLICIT_NONCE_BYTES;
            (typ, explicit, explicit + plain.len() + TAG_BYTES)
        } else {
            (typ, 0, plain.len() + TAG_BYTES)
        };
        out.push(outer);
        out.extend_from_slice(&LEGACY_VERSION.to_be_bytes());
        out.extend_from_slice(&(body_len as u16).to_be_bytes());
        out.extend_from_slice(&nonce[NONCE_LEN - explicit..]);
        out.extend_from_slice(plain);
        let tag = if self.suite.tls13() {
            out.push(typ);
            let mut header = [0u8; HEADER_BYTES];
            header.copy_from_slice(&out[start..start + HEADER_BYTES]);
            self.tx.key.seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(header),
                &mut out[start + HEADER_BYTES..],
            )
        } else {
            self.tx.key.seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                tls12_aad(seq, typ, plain.len()),
                &mut out[start + HEADER_BYTES + explicit..],
            )
        }
        .expect("a record within the AEAD's bounds");
        out.extend_from_slice(tag.as_ref());
        Ok(())
    }

    /// The length of the first record in `buf` if all of it is there, after checking its
    /// header.
    pub fn whole_record(&self, buf: &[u8]) -> Result<Option<usize>, RecordError> {
        if buf.len() < HEADER_BYTES {
            return Ok(None);
        }
        let typ = buf[0];
        let version = u16::from_be_bytes([buf[1], buf[2]]);
        let typ_taken = if self.suite.tls13() {
            typ == CONTENT_APPLICATION_DATA
        } else {
            matches!(
                typ,
                CONTENT_ALERT | CONTENT_HANDSHAKE | CONTENT_APPLICATION_DATA
            )
        };
        if !typ_taken || version != LEGACY_VERSION {
            return Err(RecordError::Header { typ, version });
        }
        let len = usize::from(u16::from_be_bytes([buf[3], buf[4]]));
        if len > self.suite.ciphertext_max() {
            return Err(RecordError::Overflow {
                len,
                max: self.suite.ciphertext_max(),
            });
        }
        if buf.len() < HEADER_BYTES + len {
            return Ok(None);
        }
        Ok(Some(HEADER_BYTES + len))
    }

    /// Opens the first record of `buf` in place. `Ok(None)`: the record is not all there
    /// yet. Otherwise the record's length and what it brought; a `key_update` the peer
    /// asked to be answered is answered into `out`.
    pub fn open(
        &mut self,
        buf: &mut [u8],
        out: &mut Vec<u8>,
    ) -> Result<Option<(usize, Opened)>, RecordError> {
        let Some(len) = self.whole_record(buf)? else {
            return Ok(None);
        };
        let (seq, mut nonce) = self.rx.next()?;
        let (typ, content) = if self.suite.tls13() {
            let mut header = [0u8; HEADER_BYTES];
            header.copy_from_slice(&buf[..HEADER_BYTES]);
            let inner_len = self
                .rx
                .key
                .open_in_place(
                    Nonce::assume_unique_for_key(nonce),
                    Aad::from(header),
                    &mut buf[HEADER_BYTES..len],
                )
                .map_err(|_| RecordError::BadRecord(seq))?
                .len();
            // The inner plaintext: content, then its type, then zeros.
            let inner = &buf[HEADER_BYTES..HEADER_BYTES + inner_len];
            let Some(type_at) = inner.iter().rposition(|&b| b != 0) else {
                return Err(RecordError::NoContentType(seq));
            };
            (inner[type_at], HEADER_BYTES..HEADER_BYTES + type_at)
        } else {
            let explicit = if self.suite.explicit_nonce() {
                TLS12_EXPLICIT_NONCE_BYTES
            } else {
                0
            };
            let body = HEADER_BYTES + explicit;
            if len < body + TAG_BYTES {
                return Err(RecordError::BadRecord(seq));
            }
            nonce[NONCE_LEN - explicit..].copy_from_slice(&buf[HEADER_BYTES..body]);
            let plain_len = len - body - TAG_BYTES;
            let typ = buf[0];
            self.rx
                .key
                .open_in_place(
                    Nonce::assume_unique_for_key(nonce),
                    tls12_aad(seq, typ, plain_len),
                    &mut buf[body..len],
                )
                .map_err(|_| RecordError::BadRecord(seq))?;
            (typ, body..body + plain_len)
        };
        if typ == CONTENT_APPLICATION_DATA && !content.is_empty() {
            self.idle = 0;
        } else {
            self.idle += 1;
            if self.idle > IDLE_RECORDS_MAX {
                return Err(RecordError::Idle);
            }
        }
        match typ {
            CONTENT_APPLICATION_DATA => Ok(Some((len, Opened::Data(content)))),
            CONTENT_ALERT => match buf[content] {
                [_, ALERT_CLOSE_NOTIFY] => Ok(Some((len, Opened::CloseNotify))),
                [level, description] => Err(RecordError::Alert { level, description }),
                _ => Err(RecordError::Alert {
                    level: 0,
                    description: ALERT_DECODE_ERROR,
                }),
            },
            CONTENT_HANDSHAKE => match buf[content] {
                [HANDSHAKE_KEY_UPDATE, 0, 0, 1, request] if self.suite.tls13() => {
                    let requested = match request {
                        0 => false,
                        1 => true,
                        other => return Err(RecordError::KeyUpdateRequest(other)),
                    };
                    self.rx.update();
                    if requested && !self.closed {
                        self.seal_key_update(false, out)?;
                    }
                    Ok(Some((len, Opened::KeyUpdate)))
                }
                ref other => Err(RecordError::Handshake {
                    typ: other.first().copied().unwrap_or(0),
                    len: other.len(),
                }),
            },
            other => Err(RecordError::ContentType(other)),
        }
    }
}

/// A key log that keeps one connection's TLS 1.3 application traffic secrets, for
/// [`accept`].
#[derive(Default)]
struct TrafficSecrets(Mutex<(Option<Secret>, Option<Secret>)>);

impl fmt::Debug for TrafficSecrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TrafficSecrets")
    }
}

impl rustls::KeyLog for TrafficSecrets {
    fn log(&self, label: &str, _client_random: &[u8], secret: &[u8]) {
        let mut secrets = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match label {
            "CLIENT_TRAFFIC_SECRET_0" => secrets.0 = Some(Secret(secret.to_vec())),
            "SERVER_TRAFFIC_SECRET_0" => secrets.1 = Some(Secret(secret.to_vec())),
            _ => {}
        }
    }

    fn will_log(&self, label: &str) -> bool {
        matches!(label, "CLIENT_TRAFFIC_SECRET_0" | "SERVER_TRAFFIC_SECRET_0")
    }
}

/// Writes what rustls has to send.
async fn write_tls<S: AsyncWrite + Unpin>(
    connection: &mut rustls::ServerConnection,
    io: &mut S,
    out: &mut Vec<u8>,
) -> io::Result<()> {
    while connection.wants_write() {
        out.clear();
        connection.write_tls(out)?;
        io.write_all(out).await?;
    }
    Ok(())
}

/// Makes the server side of a TLS handshake on `io` with rustls (`config`, with its
/// secrets kept for this one connection and their extraction allowed), then takes the
/// session from rustls. The handshake reads one whole record at a time and stops after the
/// record that completes it.
pub async fn accept<S>(config: &rustls::ServerConfig, mut io: S) -> io::Result<(S, SessionState)>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    // A key log cannot tell connections apart: one per connection, in a copy of `config`.
    let secrets = Arc::new(TrafficSecrets::default());
    let mut config = config.clone();
    config.key_log = secrets.clone();
    config.enable_secret_extraction = true;
    let mut connection = rustls::ServerConnection::new(Arc::new(config))
        .map_err(|e| io::Error::other(e.to_string()))?;
    let mut record = vec![0u8; HEADER_BYTES];
    let mut out = Vec::new();
    loop {
        write_tls(&mut connection, &mut io, &mut out).await?;
        if !connection.is_handshaking() {
            break;
        }
        record.resize(HEADER_BYTES, 0);
        io.read_exact(&mut record).await?;
        // Not a TLS record at all (plain HTTP to the TLS port, say): refused at once, not
        // waited for to the length its first bytes would spell.
        if !(20..=23).contains(&record[0]) || record[1] != 3 {
            return Err(RecordError::Header {
                typ: record[0],
                version: u16::from_be_bytes([record[1], record[2]]),
            }
            .into());
        }
        let len = usize::from(u16::from_be_bytes([record[3], record[4]]));
        if len > CIPHERTEXT_BYTES_MAX {
            return Err(RecordError::Overflow {
                len,
                max: CIPHERTEXT_BYTES_MAX,
            }
            .into());
        }
        record.resize(HEADER_BYTES + len, 0);
        io.read_exact(&mut record[HEADER_BYTES..]).await?;
        let mut rest = &record[..];
        while !rest.is_empty() {
            connection.read_tls(&mut rest)?;
        }
        if let Err(error) = connection.process_new_packets() {
            // The alert rustls has for it, then the error.
            let _ = write_tls(&mut connection, &mut io, &mut out).await;
            return Err(io::Error::new(io::ErrorKind::InvalidData, error));
        }
    }
    io.flush().await?;
    let state = take(connection, &secrets)?;
    Ok((io, state))
}

fn take(
    mut connection: rustls::ServerConnection,
    secrets: &TrafficSecrets,
) -> Result<SessionState, RecordError> {
    let negotiated = connection
        .negotiated_cipher_suite()
        .ok_or_else(|| RecordError::Extract("no cipher suite negotiated".into()))?;
    let suite = Suite::from_rustls(negotiated.suite())
        .ok_or_else(|| RecordError::Suite(format!("{:?}", negotiated.suite())))?;
    // Plaintext rustls had read would be lost with it: the handshake stops at its last
    // record, so there is none.
    let mut probe = [0u8; 1];
    match io::Read::read(&mut connection.reader(), &mut probe) {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
        other => {
            return Err(RecordError::Extract(format!(
                "rustls holds application data already: {other:?}"
            )));
        }
    }
    let logged = {
        let mut logged = secrets.0.lock().unwrap_or_else(|e| e.into_inner());
        (logged.0.take(), logged.1.take())
    };
    let extracted = connection
        .dangerous_extract_secrets()
        .map_err(|e| RecordError::Extract(e.to_string()))?;
    let key_and_iv = |keys: &rustls::ConnectionTrafficSecrets| match keys {
        rustls::ConnectionTrafficSecrets::Aes128Gcm { key, iv }
        | rustls::ConnectionTrafficSecrets::Aes256Gcm { key, iv }
        | rustls::ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
            Ok([key.as_ref(), iv.as_ref()].concat())
        }
        _ => Err(RecordError::Suite(format!("{:?}", negotiated.suite()))),
    };
    let rx_keys = key_and_iv(&extracted.rx.1)?;
    let tx_keys = key_and_iv(&extracted.tx.1)?;
    let (rx_secret, tx_secret) = if suite.tls13() {
        let (Some(rx), Some(tx)) = logged else {
            return Err(RecordError::Secrets(
                "rustls logged no application traffic secrets".into(),
            ));
        };
        // The logged secrets must be the ones rustls's keys came from.
        for (name, secret, keys) in [("read", &rx, &rx_keys), ("write", &tx, &tx_keys)] {
            let derived = [
                expand_label(suite, &secret.0, b"key", suite.aead().key_len()),
                expand_label(suite, &secret.0, b"iv", NONCE_LEN),
            ]
            .concat();
            if &derived != keys {
                return Err(RecordError::Secrets(format!(
                    "the logged {name} secret is not the one rustls's {name} key came from"
                )));
            }
        }
        (rx, tx)
    } else {
        (Secret(rx_keys), Secret(tx_keys))
    };
    Ok(SessionState {
        suite,
        rx: DirectionState {
            seq: extracted.rx.0,
            secret: rx_secret,
        },
        tx: DirectionState {
            seq: extracted.tx.0,
            secret: tx_secret,
        },
    })
}

/// A session carried on over a socket: reads open the peer's records, writes are sealed
/// into records. Ciphertext written is buffered up to four records; a write waits for the
/// socket beyond that.
pub struct RecordStream<S> {
    io: S,
    session: Session,
    /// Ciphertext read, `read_buf[..read_filled]`; `plain` is the opened record's content
    /// not yet read, `record_len` that record's length.
    read_buf: Vec<u8>,
    read_filled: usize,
    plain: Range<usize>,
    record_len: usize,
    /// The peer said `close_notify`, or its socket ended.
    read_closed: bool,
    /// Ciphertext sealed, `write_buf[written..]` not yet written.
    write_buf: Vec<u8>,
    written: usize,
    /// A record error, reported to every read and write after it.
    failed: Option<RecordError>,
    /// Ciphertext read from the socket before this stream (a handover's read-ahead),
    /// `ahead[ahead_at..]` not yet moved into `read_buf`: read before the socket.
    ahead: Vec<u8>,
    ahead_at: usize,
    /// Plaintext bytes of the first record opened that were taken before the handover.
    discard: u64,
}

/// A session at a handover: what the next holder of the connection needs with its socket.
#[derive(Debug)]
pub struct Handover<S> {
    /// The socket.
    pub io: S,
    /// The session, its reads at the first record of `read_ahead`.
    pub session: SessionState,
    /// Ciphertext read from the socket and not opened: the read stream's next bytes.
    pub read_ahead: Vec<u8>,
    /// Plaintext bytes of the first record of `read_ahead` already taken.
    pub skip: u64,
}

impl<S> fmt::Debug for RecordStream<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordStream")
            .field("session", &self.session)
            .field("unwritten", &(self.write_buf.len() - self.written))
            .finish_non_exhaustive()
    }
}

impl<S> RecordStream<S> {
    /// Carries on `session` over `io`, whose next byte is the start of a record.
    pub fn new(io: S, session: Session) -> RecordStream<S> {
        RecordStream {
            io,
            session,
            read_buf: vec![0; HEADER_BYTES + CIPHERTEXT_BYTES_MAX],
            read_filled: 0,
            plain: 0..0,
            record_len: 0,
            read_closed: false,
            write_buf: Vec::with_capacity(HEADER_BYTES + TLS13_CIPHERTEXT_BYTES_MAX),
            written: 0,
            failed: None,
            ahead: Vec::new(),
            ahead_at: 0,
            discard: 0,
        }
    }

    /// Carries on a session handed over with ciphertext already read from `io`
    /// (`read_ahead`, read before the socket) of which the first record's first `skip`
    /// plaintext bytes were taken.
    pub fn resume(io: S, session: Session, read_ahead: Vec<u8>, skip: u64) -> RecordStream<S> {
        let mut stream = RecordStream::new(io, session);
        stream.ahead = read_ahead;
        stream.discard = skip;
        stream
    }

    /// The socket.
    pub fn get_ref(&self) -> &S {
        &self.io
    }

    /// The session's state now: what another process needs to carry it on once this
    /// stream is [`RecordStream::is_quiet`].
    pub fn session_state(&self) -> SessionState {
        self.session.state()
    }

    /// Nothing read and not yet handed on, nothing sealed and not yet written.
    pub fn is_quiet(&self) -> bool {
        self.plain.is_empty()
            && self.read_filled == self.record_len
            && self.ahead_at == self.ahead.len()
            && self.written == self.write_buf.len()
    }

    /// The socket and the session for the connection's next holder, once no opened
    /// plaintext waits to be read and everything sealed is written (ciphertext read and not
    /// opened goes with it); the stream back if not.
    pub fn into_handover(mut self) -> Result<Handover<S>, Box<RecordStream<S>>> {
        if !self.plain.is_empty() || self.written != self.write_buf.len() || self.failed.is_some() {
            return Err(Box::new(self));
        }
        let mut read_ahead = self.read_buf[self.record_len..self.read_filled].to_vec();
        read_ahead.extend_from_slice(&self.ahead[self.ahead_at..]);
        let session = self.session.state();
        self.read_buf = Vec::new();
        Ok(Handover {
            io: self.io,
            session,
            read_ahead,
            skip: self.discard,
        })
    }

    fn fail(&mut self, error: RecordError) -> io::Error {
        let mut alert = Vec::new();
        self.session.seal_alert_for(&error, &mut alert);
        self.write_buf.extend_from_slice(&alert);
        self.failed = Some(error.clone());
        error.into()
    }

    fn failed(&self) -> Option<io::Error> {
        self.failed.clone().map(io::Error::from)
    }
}

impl<S: AsyncWrite + Unpin> RecordStream<S> {
    /// Writes what is sealed and unwritten until the socket takes no more.
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.write_buf.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.write_buf[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.write_buf.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RecordStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.plain.is_empty() {
                let n = buf.remaining().min(this.plain.len());
                buf.put_slice(&this.read_buf[this.plain.start..this.plain.start + n]);
                this.plain.start += n;
                return Poll::Ready(Ok(()));
            }
            if let Some(error) = this.failed() {
                return Poll::Ready(Err(error));
            }
            if this.read_closed {
                return Poll::Ready(Ok(()));
            }
            // The record handed on leaves the buffer.
            if this.record_len > 0 {
                this.read_buf
                    .copy_within(this.record_len..this.read_filled, 0);
                this.read_filled -= this.record_len;
                this.record_len = 0;
            }
            let mut answer = Vec::new();
            match this
                .session
                .open(&mut this.read_buf[..this.read_filled], &mut answer)
            {
                Ok(Some((len, opened))) => {
                    this.record_len = len;
                    // What was taken before a handover is in the first record opened.
                    let discard = std::mem::take(&mut this.discard);
                    match opened {
                        Opened::Data(range) => {
                            let discard = (discard as usize).min(range.len());
                            this.plain = range.start + discard..range.end;
                        }
                        Opened::CloseNotify => this.read_closed = true,
                        Opened::KeyUpdate if !answer.is_empty() => {
                            this.write_buf.extend_from_slice(&answer);
                            // Sent now if the socket takes it, else with the next write.
                            if let Poll::Ready(Err(e)) = this.poll_write_out(cx) {
                                return Poll::Ready(Err(e));
                            }
                        }
                        Opened::KeyUpdate => {}
                    }
                    continue;
                }
                Ok(None) => {}
                Err(error) => {
                    let error = this.fail(error);
                    let _ = this.poll_write_out(cx);
                    return Poll::Ready(Err(error));
                }
            }
            if this.ahead_at < this.ahead.len() {
                let n =
                    (this.ahead.len() - this.ahead_at).min(this.read_buf.len() - this.read_filled);
                this.read_buf[this.read_filled..this.read_filled + n]
                    .copy_from_slice(&this.ahead[this.ahead_at..this.ahead_at + n]);
                this.ahead_at += n;
                this.read_filled += n;
                if this.ahead_at == this.ahead.len() {
                    this.ahead = Vec::new();
                    this.ahead_at = 0;
                }
                continue;
            }
            let mut read = ReadBuf::new(&mut this.read_buf[this.read_filled..]);
            ready!(Pin::new(&mut this.io).poll_read(cx, &mut read))?;
            let n = read.filled().len();
            if n == 0 {
                if this.read_filled > 0 {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the peer's socket ended inside a TLS record",
                    )));
                }
                // No close_notify: the socket's end is the stream's.
                this.read_closed = true;
                return Poll::Ready(Ok(()));
            }
            this.read_filled += n;
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RecordStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(error) = this.failed() {
            return Poll::Ready(Err(error));
        }
        if this.write_buf.len() - this.written >= WRITE_BUFFER_BYTES_MAX {
            ready!(this.poll_write_out(cx))?;
        }
        let n = buf.len().min(WRITE_BUFFER_BYTES_MAX / 2);
        this.session.seal(&buf[..n], &mut this.write_buf)?;
        // Written now if the socket takes it; what it does not take waits for the next
        // write or flush, the waker registered.
        if let Poll::Ready(Err(e)) = this.poll_write_out(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_write_out(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.failed.is_none() {
            this.session.seal_close_notify(&mut this.write_buf)?;
        }
        ready!(this.poll_write_out(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::{Credentials, client_config};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    type Client = tokio_rustls::client::TlsStream<TcpStream>;

    /// A server and a rustls client of `versions` and `suites` (all if empty), connected
    /// over loopback TCP, the server's handshake made by [`accept`].
    async fn pair(
        versions: &[&'static rustls::SupportedProtocolVersion],
        suites: &[rustls::SupportedCipherSuite],
    ) -> ((TcpStream, SessionState), Client) {
        let credentials = Credentials::generate("records", &[]).unwrap();
        let server_config = credentials.server_config().unwrap();
        let mut provider = rustls::crypto::ring::default_provider();
        if !suites.is_empty() {
            provider.cipher_suites = suites.to_vec();
        }
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(
                rustls::pki_types::pem::PemObject::from_pem_slice(credentials.ca_pem.as_bytes())
                    .unwrap(),
            )
            .unwrap();
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            accept(&server_config, socket).await.unwrap()
        });
        let socket = TcpStream::connect(address).await.unwrap();
        let client = tokio_rustls::TlsConnector::from(Arc::new(client))
            .connect("localhost".try_into().unwrap(), socket)
            .await
            .unwrap();
        (server.await.unwrap(), client)
    }

    fn records((socket, state): (TcpStream, SessionState)) -> RecordStream<TcpStream> {
        RecordStream::new(socket, Session::new(&state).unwrap())
    }

    /// `n` bytes that differ from one position to the next.
    fn bytes(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    async fn exchange<A, B>(a: &mut A, b: &mut B, n: usize, seed: u8)
    where
        A: AsyncRead + AsyncWrite + Unpin + Send,
        B: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let sent = bytes(n, seed);
        let mut got = vec![0u8; n];
        let (written, read) = tokio::join!(
            async {
                a.write_all(&sent).await.unwrap();
                a.flush().await.unwrap();
            },
            b.read_exact(&mut got)
        );
        let _: () = written;
        read.unwrap();
        assert!(got == sent, "{n} bytes arrived changed");
    }

    #[tokio::test]
    async fn a_session_taken_from_rustls_carries_data_both_ways_in_every_suite_it_offers() {
        use rustls::crypto::ring::cipher_suite as s;
        for (version, suite) in [
            (&rustls::version::TLS13, s::TLS13_AES_128_GCM_SHA256),
            (&rustls::version::TLS13, s::TLS13_AES_256_GCM_SHA384),
            (&rustls::version::TLS13, s::TLS13_CHACHA20_POLY1305_SHA256),
            (
                &rustls::version::TLS12,
                s::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
            ),
            (
                &rustls::version::TLS12,
                s::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
            ),
            (
                &rustls::version::TLS12,
                s::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
            ),
        ] {
            let (accepted, mut client) = pair(&[version], &[suite]).await;
            assert_eq!(Suite::from_rustls(suite.suite()), Some(accepted.1.suite));
            let mut server = records(accepted);
            for (n, seed) in [(1, 1), (200, 2), (PLAINTEXT_BYTES_MAX + 1, 3), (300_000, 4)] {
                exchange(&mut client, &mut server, n, seed).await;
                exchange(&mut server, &mut client, n, seed).await;
            }
        }
    }

    #[tokio::test]
    async fn a_session_moved_to_a_new_stream_mid_conversation_carries_on() {
        let (accepted, mut client) = pair(&[&rustls::version::TLS13], &[]).await;
        let mut server = records(accepted);
        exchange(&mut client, &mut server, 1000, 1).await;
        exchange(&mut server, &mut client, 1000, 2).await;
        assert!(server.is_quiet());
        // What another process would be given: the socket and the state, as JSON.
        let state = serde_json::to_string(&server.session_state()).unwrap();
        let RecordStream { io, .. } = server;
        let state: SessionState = serde_json::from_str(&state).unwrap();
        let mut moved = RecordStream::new(io, Session::new(&state).unwrap());
        exchange(&mut client, &mut moved, 5000, 3).await;
        exchange(&mut moved, &mut client, 5000, 4).await;
    }

    #[tokio::test]
    async fn key_updates_either_side_asks_for_are_followed_and_answered() {
        let (accepted, mut client) = pair(&[&rustls::version::TLS13], &[]).await;
        let mut server = records(accepted);
        exchange(&mut client, &mut server, 100, 1).await;
        let before = server.session_state();
        // rustls's refresh asks the peer to update too.
        client.get_mut().1.refresh_traffic_keys().unwrap();
        exchange(&mut client, &mut server, 100, 2).await;
        exchange(&mut server, &mut client, 100, 3).await;
        let after = server.session_state();
        assert_ne!(
            before.rx.secret, after.rx.secret,
            "the server's reads did not move"
        );
        assert_ne!(
            before.tx.secret, after.tx.secret,
            "the server did not answer the update"
        );
        // This side's own update, which the client follows.
        let mut update = Vec::new();
        server.session.seal_key_update(true, &mut update).unwrap();
        server.write_buf.extend_from_slice(&update);
        exchange(&mut server, &mut client, 100, 4).await;
        exchange(&mut client, &mut server, 100, 5).await;
        assert_ne!(
            after.rx.secret,
            server.session_state().rx.secret,
            "the client did not answer"
        );
    }

    #[tokio::test]
    async fn close_notify_ends_the_stream_each_way() {
        let (accepted, mut client) = pair(&[&rustls::version::TLS13], &[]).await;
        let mut server = records(accepted);
        client.shutdown().await.unwrap();
        let mut rest = Vec::new();
        assert_eq!(server.read_to_end(&mut rest).await.unwrap(), 0);
        server.shutdown().await.unwrap();
        assert_eq!(
            client.read_to_end(&mut rest).await.unwrap(),
            0,
            "no clean close_notify"
        );
        assert!(
            matches!(server.write(b"late").await, Err(e) if e.to_string().contains("close_notify"))
        );
    }

    #[tokio::test]
    async fn a_tampered_record_is_refused_and_the_peer_told_bad_record_mac() {
        let ((socket, state), client) = pair(&[&rustls::version::TLS13], &[]).await;
        // A man in the middle flips a bit of the client's record on its way.
        let mut peer_view = Session::new(&state.peer()).unwrap();
        let mut record = Vec::new();
        peer_view.seal(b"deploy", &mut record).unwrap();
        record[HEADER_BYTES + 2] ^= 1;
        let (client_socket, _) = client.into_inner();
        let mut client_socket = client_socket;
        client_socket.write_all(&record).await.unwrap();
        let mut server = RecordStream::new(socket, Session::new(&state).unwrap());
        let mut buf = [0u8; 16];
        let error = server.read(&mut buf).await.unwrap_err();
        assert_eq!(
            error.to_string(),
            "a record (sequence number 0) that does not decrypt"
        );
        // The alert the server sent, opened as the client would: the last record on the
        // socket, after the session tickets the client had not read.
        drop(server);
        let mut sent = Vec::new();
        client_socket.read_to_end(&mut sent).await.unwrap();
        let mut last = 0;
        while let Some(len) = peer_view.whole_record(&sent[last..]).unwrap() {
            if last + len == sent.len() {
                break;
            }
            last += len;
        }
        let opened = peer_view.open(&mut sent[last..], &mut Vec::new());
        assert_eq!(
            opened.unwrap_err(),
            RecordError::Alert {
                level: ALERT_FATAL,
                description: ALERT_BAD_RECORD_MAC
            }
        );
    }

    #[tokio::test]
    async fn records_that_are_not_tls13_application_records_are_refused_naming_the_value() {
        let ((_, state), _client) = pair(&[&rustls::version::TLS13], &[]).await;
        let mut session = Session::new(&state).unwrap();
        let mut handshake = [22u8, 3, 3, 0, 1, 0];
        assert_eq!(
            session
                .open(&mut handshake, &mut Vec::new())
                .unwrap_err()
                .to_string(),
            "a record of type 22 and version 0x0303, which this session does not take"
        );
        let mut long = vec![23u8, 3, 3, 0x48, 0x01];
        long.resize(HEADER_BYTES + 0x4801, 0);
        assert_eq!(
            session.open(&mut long, &mut Vec::new()).unwrap_err(),
            RecordError::Overflow {
                len: 0x4801,
                max: TLS13_CIPHERTEXT_BYTES_MAX
            }
        );
        // Half a record is waited for, not refused.
        let mut peer = Session::new(&state.peer()).unwrap();
        let mut record = Vec::new();
        peer.seal(b"status", &mut record).unwrap();
        let half = record.len() / 2;
        assert_eq!(
            session.open(&mut record[..half], &mut Vec::new()).unwrap(),
            None
        );
        let (len, opened) = session.open(&mut record, &mut Vec::new()).unwrap().unwrap();
        assert_eq!(len, record.len());
        let Opened::Data(range) = opened else {
            panic!("{opened:?}");
        };
        assert_eq!(&record[range], b"status");
        // A post-handshake message other than key_update.
        let mut ticket = Vec::new();
        peer.seal_record(CONTENT_HANDSHAKE, &[4, 0, 0, 0], &mut ticket)
            .unwrap();
        assert_eq!(
            session.open(&mut ticket, &mut Vec::new()).unwrap_err(),
            RecordError::Handshake { typ: 4, len: 4 }
        );
    }

    #[tokio::test]
    async fn a_peer_sending_records_that_carry_nothing_is_cut_off_after_32() {
        let ((_, state), _client) = pair(&[&rustls::version::TLS13], &[]).await;
        for with_data_between in [false, true] {
            let mut session = Session::new(&state).unwrap();
            let mut peer = Session::new(&state.peer()).unwrap();
            let mut outcome = Ok(None);
            for n in 0..100 {
                let mut record = Vec::new();
                if with_data_between && n % 30 == 29 {
                    peer.seal(b"x", &mut record).unwrap();
                } else if n % 2 == 0 {
                    peer.seal_record(CONTENT_APPLICATION_DATA, &[], &mut record)
                        .unwrap();
                } else {
                    peer.seal_key_update(false, &mut record).unwrap();
                }
                outcome = session.open(&mut record, &mut Vec::new());
                if outcome.is_err() {
                    assert_eq!(n, 32, "cut off at the 33rd");
                    break;
                }
            }
            assert_eq!(outcome.is_err(), !with_data_between, "{outcome:?}");
        }
    }

    #[tokio::test]
    async fn plain_http_to_the_tls_port_is_refused_at_once() {
        let credentials = Credentials::generate("records", &[]).unwrap();
        let server_config = credentials.server_config().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let mut client = TcpStream::connect(address).await.unwrap();
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let (socket, _) = listener.accept().await.unwrap();
        let refused = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            accept(&server_config, socket),
        )
        .await
        .expect("refused without waiting for more bytes");
        assert_eq!(
            refused.unwrap_err().to_string(),
            "a record of type 71 and version 0x4554, which this session does not take"
        );
    }

    #[tokio::test]
    async fn a_tls12_renegotiation_is_refused_naming_it() {
        let ((_, state), _client) = pair(&[&rustls::version::TLS12], &[]).await;
        let mut session = Session::new(&state).unwrap();
        let mut peer = Session::new(&state.peer()).unwrap();
        let mut hello = Vec::new();
        peer.seal_record(CONTENT_HANDSHAKE, &[1, 0, 0, 2, 3, 3], &mut hello)
            .unwrap();
        assert_eq!(
            session.open(&mut hello, &mut Vec::new()).unwrap_err(),
            RecordError::Handshake { typ: 1, len: 6 }
        );
    }

    #[tokio::test]
    async fn the_handshake_reads_no_byte_past_its_last_record() {
        // The client's first request goes in the same write as its Finished (rustls sends
        // plaintext written during the handshake with it): that record must reach the
        // session, not stay in rustls's buffers.
        let credentials = Credentials::generate("records", &[]).unwrap();
        let server_config = credentials.server_config().unwrap();
        let client_config = client_config(&credentials.ca_pem, &[&rustls::version::TLS13]).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let client = std::thread::spawn(move || {
            let mut socket = std::net::TcpStream::connect(address).unwrap();
            let mut connection =
                rustls::ClientConnection::new(client_config, "localhost".try_into().unwrap())
                    .unwrap();
            io::Write::write_all(&mut connection.writer(), b"GET /api HTTP/1.1\r\n\r\n").unwrap();
            while connection.is_handshaking() || connection.wants_write() {
                connection.complete_io(&mut socket).unwrap();
            }
            socket
        });
        let (socket, _) = listener.accept().await.unwrap();
        let mut server = records(accept(&server_config, socket).await.unwrap());
        let mut got = [0u8; 21];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"GET /api HTTP/1.1\r\n\r\n");
        drop(client.join().unwrap());
    }
}
