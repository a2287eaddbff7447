//! A connection's TLS records kept where another process can take them back: the journal
//! that lets the launcher hand a client's socket to the worker and, when the worker dies
//! (`kill -9` included), carry the connection on from exactly where the worker left it.
//!
//! The journal is a memory file (`memfd`) both processes map. The process holding the
//! connection ([`JournaledStream`]) reads the socket's bytes straight into the journal's
//! read ring and copies what it seals into the write ring, from which it writes: keeping
//! the journal costs no system call, only a copy of each record out of or into a ring
//! (`benches/records.rs` measures it). What it has *taken* of its reads (absorbed: the
//! application will not need them again) and what it *publishes* of its writes change
//! together, at one store ([`JournaledStream::poll_flush`]'s commit): a commit slot is
//! filled, then the journal's generation flips to it. Bytes are written to the socket only
//! once committed.
//!
//! Whoever takes the connection back ([`recover`]), after the holder is dead, needs only the
//! journal and the socket: the socket's own counters (`TCP_INFO`'s bytes received and bytes
//! acknowledged, with `SIOCINQ` and `SIOCOUTQ`) say exactly how many bytes the dead process
//! consumed and wrote. What it consumed since the last commit is in the read ring; what it
//! committed and did not write is in the write ring. So the connection carries on with
//! nothing lost and nothing twice: the client's bytes not absorbed are read again, the
//! committed bytes not written are written, and bytes sealed but not committed were never
//! written.
//!
//! Only the holder touches the journal while it lives; the launcher writes it before the
//! lease and reads it after the holder's death, never at the same time.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::records::{
    CIPHERTEXT_BYTES_MAX, DirectionState, HEADER_BYTES, Opened, RecordError, Secret, Session,
    SessionState, Suite,
};

const MAGIC: [u8; 8] = *b"LSJRNL01";
const HEADER_AT: usize = 0;
const GENERATION_AT: usize = 8;
const SLOTS_AT: usize = 64;
/// The most application state a commit carries: room for two of the largest frames the
/// API takes, and a quarter of a MiB besides. The memory file is sparse: a connection's
/// pages are only those its commits wrote.
pub const APP_BYTES_MAX: usize = 2 * crate::wire::FRAME_SIZE_BYTES_MAX + (256 << 10);
/// A commit slot: the two directions, the application's state, padded.
const SLOT_BYTES: usize = 1024 + APP_BYTES_MAX;
const SECRET_BYTES_MAX: usize = 64;
/// Pages of the memory file no longer needed (ring bytes consumed, a slot's state past its
/// end) are given back once this many have gathered: a connection's resident journal is
/// what it holds now, not the most it ever held.
const RELEASE_BYTES: u64 = 64 << 10;

/// The journal's shape, and what the lease says of where the streams start.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Shape {
    /// The read ring's bytes: at least two of the largest records, and enough for the
    /// largest message the application absorbs whole.
    pub read_ring: usize,
    /// The write ring's bytes.
    pub write_ring: usize,
}

impl Shape {
    /// An API connection's rings: the read ring holds the largest message the API takes
    /// (a websocket message is absorbed whole) with room for its records' framing and the
    /// next record; the write ring, sealed records until the socket takes them.
    pub const API: Shape = Shape {
        read_ring: crate::wire::FRAME_SIZE_BYTES_MAX + (128 << 10),
        write_ring: 128 << 10,
    };

    fn read_at(self) -> usize {
        SLOTS_AT + 2 * SLOT_BYTES
    }

    fn write_at(self) -> usize {
        self.read_at() + self.read_ring
    }

    fn len(self) -> usize {
        self.write_at() + self.write_ring
    }

    fn check(self) -> io::Result<()> {
        let least = 2 * (HEADER_BYTES + CIPHERTEXT_BYTES_MAX);
        if self.read_ring < least || self.write_ring < least {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "journal rings of {} and {} bytes: each needs at least {least}",
                    self.read_ring, self.write_ring
                ),
            ));
        }
        Ok(())
    }
}

/// A commit: where each direction stands, and the application's state with it.
#[derive(Clone, PartialEq, Eq, Debug)]
struct Commit {
    /// Read stream offset of the first record not wholly absorbed, its plaintext bytes
    /// absorbed already, and the read direction's state before that record.
    read_at: u64,
    read_skip: u64,
    read: DirectionState,
    /// Write stream bytes published, and the write direction's state after them.
    written_at: u64,
    write: DirectionState,
    /// The application's state, as read back ([`Journal::last_commit`]); a commit is
    /// written with the holder's own ([`Journal::commit`]).
    app: Vec<u8>,
}

/// The shared mapping of a journal's memory file.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory; `Journal` gives access through `&mut self` for
// writes, and the protocol (module docs) keeps the two processes from touching it at once.
#[allow(unsafe_code)]
unsafe impl Send for Mapping {}
#[allow(unsafe_code)]
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `len` are the mapping made in `Journal::map`, unmapped once.
        #[allow(unsafe_code)]
        unsafe {
            let _ = rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// A connection's journal, mapped.
pub struct Journal {
    file: OwnedFd,
    map: Mapping,
    shape: Shape,
    suite: Suite,
    /// The most application state each slot may hold pages for: what this process wrote,
    /// or, for a journal another process wrote, anything up to the bound.
    slot_app_held: [usize; 2],
}

impl fmt::Debug for Journal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Journal")
            .field("shape", &self.shape)
            .field("generation", &self.generation())
            .finish_non_exhaustive()
    }
}

impl Journal {
    /// A new journal of `shape`, for a session of `suite`, in a memory file of its own.
    pub fn create(shape: Shape, suite: Suite) -> io::Result<Journal> {
        shape.check()?;
        let file = rustix::fs::memfd_create("lockstep-journal", rustix::fs::MemfdFlags::CLOEXEC)?;
        rustix::fs::ftruncate(&file, shape.len() as u64)?;
        let mut journal = Journal::map(file, shape, suite)?;
        journal.slot_app_held = [0; 2];
        journal.write_bytes(HEADER_AT, &MAGIC);
        Ok(journal)
    }

    /// Maps a journal's memory file, received from the process that made it.
    pub fn open(file: OwnedFd, shape: Shape, suite: Suite) -> io::Result<Journal> {
        shape.check()?;
        let size = rustix::fs::fstat(&file)?.st_size;
        if u64::try_from(size).ok() != Some(shape.len() as u64) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "a journal file of {size} bytes where {shape:?} needs {}",
                    shape.len()
                ),
            ));
        }
        let journal = Journal::map(file, shape, suite)?;
        let mut magic = [0u8; 8];
        journal.read_bytes(HEADER_AT, &mut magic);
        if magic != MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("not a journal: it starts {magic:?}"),
            ));
        }
        Ok(journal)
    }

    fn map(file: OwnedFd, shape: Shape, suite: Suite) -> io::Result<Journal> {
        // SAFETY: a fresh shared mapping of the whole file, which stays open as long as the
        // mapping; the mapping is unmapped only by `Mapping::drop`.
        #[allow(unsafe_code)]
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                shape.len(),
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                &file,
                0,
            )?
        };
        let ptr =
            NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        Ok(Journal {
            file,
            map: Mapping {
                ptr,
                len: shape.len(),
            },
            shape,
            suite,
            slot_app_held: [APP_BYTES_MAX; 2],
        })
    }

    /// Forgets every commit, so that the journal can carry a new lease: until the new
    /// holder's first commit (its first act), [`recover`] gives back that lease as it was.
    /// The launcher's, between two leases of one journal.
    pub fn reset(&mut self) {
        self.generation_cell().store(0, Ordering::Release);
    }

    /// The memory file, to send to the process that will hold the connection.
    pub fn file(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// The shape.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    fn write_bytes(&mut self, at: usize, bytes: &[u8]) {
        assert!(
            at + bytes.len() <= self.map.len,
            "a write inside the journal"
        );
        // SAFETY: in bounds (asserted); `&mut self` is the only writer in this process and
        // the protocol keeps the other process out while this one holds the journal.
        #[allow(unsafe_code)]
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.map.ptr.as_ptr().add(at),
                bytes.len(),
            );
        }
    }

    fn read_bytes(&self, at: usize, out: &mut [u8]) {
        assert!(at + out.len() <= self.map.len, "a read inside the journal");
        // SAFETY: in bounds (asserted); see `write_bytes`.
        #[allow(unsafe_code)]
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.map.ptr.as_ptr().add(at),
                out.as_mut_ptr(),
                out.len(),
            );
        }
    }

    fn generation_cell(&self) -> &AtomicU64 {
        // SAFETY: in bounds and 8-byte aligned (a page-aligned mapping, offset 8); only
        // ever accessed atomically.
        #[allow(unsafe_code)]
        unsafe {
            AtomicU64::from_ptr(self.map.ptr.as_ptr().add(GENERATION_AT).cast::<u64>())
        }
    }

    fn generation(&self) -> u64 {
        self.generation_cell().load(Ordering::Acquire)
    }

    /// A ring's bytes from stream offset `from` (`len` of them), into `out`.
    fn ring_read(&self, ring_at: usize, ring_len: usize, from: u64, out: &mut [u8]) {
        let mut done = 0;
        while done < out.len() {
            let at = ((from + done as u64) % ring_len as u64) as usize;
            let n = (out.len() - done).min(ring_len - at);
            self.read_bytes(ring_at + at, &mut out[done..done + n]);
            done += n;
        }
    }

    fn ring_write(&mut self, ring_at: usize, ring_len: usize, from: u64, bytes: &[u8]) {
        let mut done = 0;
        while done < bytes.len() {
            let at = ((from + done as u64) % ring_len as u64) as usize;
            let n = (bytes.len() - done).min(ring_len - at);
            self.write_bytes(ring_at + at, &bytes[done..done + n]);
            done += n;
        }
    }

    /// Gives the pages of a ring's stream bytes `from..to` back to the system: the caller
    /// knows no one needs them (a later write finds zeros there, as a fresh file has).
    fn ring_release(&self, ring_at: usize, ring_len: usize, from: u64, to: u64) {
        debug_assert!(
            to - from <= ring_len as u64,
            "a release within one ring's turn"
        );
        let mut done = from;
        while done < to {
            let at = (done % ring_len as u64) as usize;
            let n = ((to - done) as usize).min(ring_len - at);
            self.release(ring_at + at, n);
            done += n as u64;
        }
    }

    /// Punches `len` bytes at `at` out of the memory file (a partial page is zeroed, a whole
    /// one freed). Should the system refuse, the pages stay resident: the journal's
    /// contents are the same either way.
    fn release(&self, at: usize, len: usize) {
        let _ = rustix::fs::fallocate(
            &self.file,
            rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
            at as u64,
            len as u64,
        );
    }

    /// The ring's free span from stream offset `from`, as a slice of the mapping.
    fn ring_span_mut(
        &mut self,
        ring_at: usize,
        ring_len: usize,
        from: u64,
        len: usize,
    ) -> &mut [u8] {
        let at = (from % ring_len as u64) as usize;
        let len = len.min(ring_len - at);
        // SAFETY: in bounds (within the ring); `&mut self` keeps it exclusive in this
        // process, and the protocol keeps the other out.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts_mut(self.map.ptr.as_ptr().add(ring_at + at), len)
        }
    }

    fn encode_direction(out: &mut Vec<u8>, direction: &DirectionState) {
        out.extend_from_slice(&direction.seq.to_le_bytes());
        let secret = direction.secret.as_bytes();
        out.push(secret.len() as u8);
        let mut padded = [0u8; SECRET_BYTES_MAX];
        padded[..secret.len()].copy_from_slice(secret);
        out.extend_from_slice(&padded);
    }

    fn decode_direction(bytes: &[u8]) -> io::Result<DirectionState> {
        let seq = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
        let len = usize::from(bytes[8]);
        if len > SECRET_BYTES_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a journal secret of {len} bytes"),
            ));
        }
        Ok(DirectionState {
            seq,
            secret: Secret::from_bytes(&bytes[9..9 + len]),
        })
    }

    const DIRECTION_BYTES: usize = 8 + 1 + SECRET_BYTES_MAX;

    /// Writes `commit` into the slot not in use, then flips the generation to it: until the
    /// flip the previous commit stands, after it this one, whenever the writer dies.
    fn commit(&mut self, commit: &Commit, app: &[u8]) {
        assert!(
            app.len() <= APP_BYTES_MAX,
            "application state within the journal's bound"
        );
        let next = self.generation() + 1;
        let mut head = Vec::with_capacity(28 + 2 * Self::DIRECTION_BYTES);
        head.extend_from_slice(&commit.read_at.to_le_bytes());
        head.extend_from_slice(&commit.read_skip.to_le_bytes());
        head.extend_from_slice(&commit.written_at.to_le_bytes());
        head.extend_from_slice(&(app.len() as u32).to_le_bytes());
        Self::encode_direction(&mut head, &commit.read);
        Self::encode_direction(&mut head, &commit.write);
        let slot = (next % 2) as usize;
        let at = SLOTS_AT + slot * SLOT_BYTES;
        self.write_bytes(at, &head);
        self.write_bytes(at + head.len(), app);
        let held = self.slot_app_held[slot];
        if held >= app.len() + RELEASE_BYTES as usize {
            self.release(at + head.len() + app.len(), held - app.len());
            self.slot_app_held[slot] = app.len();
        } else {
            self.slot_app_held[slot] = held.max(app.len());
        }
        self.generation_cell().store(next, Ordering::Release);
    }

    /// The commit standing, if any.
    fn last_commit(&self) -> io::Result<Option<Commit>> {
        let generation = self.generation();
        if generation == 0 {
            return Ok(None);
        }
        let at = SLOTS_AT + (generation % 2) as usize * SLOT_BYTES;
        let mut head = [0u8; 28 + 2 * Self::DIRECTION_BYTES];
        self.read_bytes(at, &mut head);
        let word = |i: usize| u64::from_le_bytes(head[i..i + 8].try_into().expect("8 bytes"));
        let app_len = u32::from_le_bytes(head[24..28].try_into().expect("4 bytes")) as usize;
        if app_len > APP_BYTES_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a journal commit with {app_len} bytes of application state"),
            ));
        }
        let mut app = vec![0u8; app_len];
        self.read_bytes(at + head.len(), &mut app);
        Ok(Some(Commit {
            read_at: word(0),
            read_skip: word(8),
            written_at: word(16),
            read: Self::decode_direction(&head[28..28 + Self::DIRECTION_BYTES])?,
            write: Self::decode_direction(&head[28 + Self::DIRECTION_BYTES..])?,
            app,
        }))
    }
}

/// What a socket's own counters say the process holding it consumed and wrote: bytes read
/// out of its receive queue, and bytes handed to its send queue.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct SocketCounters {
    /// Bytes the holders of the socket have read from it.
    pub consumed: u64,
    /// Bytes they have written to it.
    pub written: u64,
}

/// Reads a TCP socket's counters: `TCP_INFO`'s bytes received less those still queued
/// (`SIOCINQ`) and less the peer's `FIN` if it came (the kernel counts it as a byte), and
/// bytes acknowledged plus those still queued (`SIOCOUTQ`).
///
/// Bytes keep arriving and being acknowledged while they are read, and the counts come from
/// three calls: they are read between two `TCP_INFO`s and taken only when neither of its
/// counts moved between them (no process reads or writes the socket meanwhile, so what
/// arrives changes both a count and its queue, and a difference of the two stays).
pub fn socket_counters(socket: BorrowedFd<'_>) -> io::Result<SocketCounters> {
    const ATTEMPTS: usize = 1000;
    for _ in 0..ATTEMPTS {
        let before = tcp_info(socket)?;
        let inq = queued(socket, libc::FIONREAD)?;
        let outq = queued(socket, libc::TIOCOUTQ)?;
        let after = tcp_info(socket)?;
        if before.tcpi_bytes_received != after.tcpi_bytes_received
            || before.tcpi_bytes_acked != after.tcpi_bytes_acked
            || before.tcpi_state != after.tcpi_state
        {
            continue;
        }
        // The states in which the peer's FIN has arrived (include/net/tcp_states.h):
        // TIME_WAIT, CLOSE_WAIT, LAST_ACK, CLOSING.
        let fin = matches!(after.tcpi_state, 6 | 8 | 9 | 11);
        let consumed = after
            .tcpi_bytes_received
            .checked_sub(inq + u64::from(fin))
            .ok_or_else(|| {
                io::Error::other(format!(
                    "a socket that received {} bytes and holds {inq} unread",
                    after.tcpi_bytes_received
                ))
            })?;
        return Ok(SocketCounters {
            consumed,
            written: after.tcpi_bytes_acked + outq,
        });
    }
    Err(io::Error::other(format!(
        "the socket's counters moved on every one of {ATTEMPTS} readings"
    )))
}

fn tcp_info(socket: BorrowedFd<'_>) -> io::Result<libc::tcp_info> {
    // SAFETY: `tcp_info` is a C struct of integers, for which all zeros is a value.
    #[allow(unsafe_code)]
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: writes at most `len` bytes into `info`, which it is.
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            std::ptr::addr_of_mut!(info).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(info)
}

/// A socket queue's bytes: `FIONREAD` (`SIOCINQ`) or `TIOCOUTQ` (`SIOCOUTQ`).
fn queued(socket: BorrowedFd<'_>, request: libc::Ioctl) -> io::Result<u64> {
    let mut bytes: libc::c_int = 0;
    // SAFETY: both requests write one `int` into `bytes`.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::ioctl(socket.as_raw_fd(), request, &mut bytes) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    u64::try_from(bytes).map_err(|_| io::Error::other(format!("a socket queue of {bytes} bytes")))
}

/// What the process taking a connection is given with its socket and its journal.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Lease {
    /// The journal's shape.
    pub shape: Shape,
    /// The session as it stands at the lease.
    pub session: SessionState,
    /// The socket's counters at the lease: stream offsets count from these.
    pub counters: SocketCounters,
    /// Ciphertext already read from the socket and not yet opened, the read stream's first
    /// bytes.
    pub read_ahead: Vec<u8>,
    /// Plaintext bytes of the first record already taken before the lease.
    pub skip: u64,
    /// The application's state at the lease (its first commit's).
    pub app: Vec<u8>,
}

/// A connection taken back from a journal: where its dead holder left it.
#[derive(Debug)]
pub struct Recovered {
    /// The session: its reads at the first record not wholly absorbed, its writes after
    /// the last byte committed.
    pub session: SessionState,
    /// The ciphertext the holder consumed from that record on: the read stream's next
    /// bytes, before the socket's.
    pub read_ahead: Vec<u8>,
    /// Plaintext bytes of that first record absorbed already.
    pub skip: u64,
    /// The application's committed state.
    pub app: Vec<u8>,
    /// Ciphertext committed and not written to the socket: to be written before anything
    /// else.
    pub unwritten: Vec<u8>,
}

/// Takes a connection back from its journal after its holder's death.
pub fn recover(journal: &Journal, lease: &Lease, socket: BorrowedFd<'_>) -> io::Result<Recovered> {
    let now = socket_counters(socket)?;
    let invalid = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    let consumed = now
        .consumed
        .checked_sub(lease.counters.consumed)
        .ok_or_else(|| {
            invalid(format!(
                "the socket consumed fewer bytes than at the lease: {now:?} against {:?}",
                lease.counters
            ))
        })?;
    let written = now
        .written
        .checked_sub(lease.counters.written)
        .ok_or_else(|| {
            invalid(format!(
                "the socket wrote fewer bytes than at the lease: {now:?} against {:?}",
                lease.counters
            ))
        })?;
    // The read stream: the read-ahead, then what the holder consumed.
    let read_end = lease.read_ahead.len() as u64 + consumed;
    let Some(commit) = journal.last_commit()? else {
        // No holder took the lease (its first act is to commit it): the connection is
        // where the lease left it, and the socket must say so.
        if consumed != 0 || written != 0 {
            return Err(invalid(format!(
                "a journal with no commit, and a socket that moved since the lease: {now:?} against {:?}",
                lease.counters
            )));
        }
        return Ok(Recovered {
            session: lease.session.clone(),
            read_ahead: lease.read_ahead.clone(),
            skip: lease.skip,
            app: lease.app.clone(),
            unwritten: Vec::new(),
        });
    };
    if read_end < commit.read_at || read_end - commit.read_at > journal.shape.read_ring as u64 {
        return Err(invalid(format!(
            "the holder consumed {read_end} bytes, outside the read ring from the commit's {}",
            commit.read_at
        )));
    }
    if written > commit.written_at || commit.written_at - written > journal.shape.write_ring as u64
    {
        return Err(invalid(format!(
            "the socket took {written} bytes, outside the write ring to the commit's {}",
            commit.written_at
        )));
    }
    let mut read_ahead = vec![0u8; (read_end - commit.read_at) as usize];
    journal.ring_read(
        journal.shape.read_at(),
        journal.shape.read_ring,
        commit.read_at,
        &mut read_ahead,
    );
    let mut unwritten = vec![0u8; (commit.written_at - written) as usize];
    journal.ring_read(
        journal.shape.write_at(),
        journal.shape.write_ring,
        written,
        &mut unwritten,
    );
    Ok(Recovered {
        session: SessionState {
            suite: journal.suite,
            rx: commit.read,
            tx: commit.write,
        },
        read_ahead,
        skip: commit.read_skip,
        app: commit.app,
        unwritten,
    })
}
/// A record opened and not wholly absorbed: where it starts in the read stream, its
/// plaintext's length, and the read direction's state before it.
#[derive(Debug)]
struct Opening {
    at: u64,
    plain: u64,
    before: DirectionState,
}

/// A session over a socket whose reads and writes are kept in a [`Journal`].
///
/// Reads hand on plaintext; [`JournaledStream::absorb`] says how much of it the
/// application has taken for good. Writes are sealed into the write ring; a flush commits
/// (what was absorbed, what was sealed, [`JournaledStream::set_app`]'s state) and then
/// writes. Nothing is written to the socket uncommitted.
pub struct JournaledStream<S> {
    io: S,
    journal: Journal,
    session: Session,
    /// Read stream offsets: bytes read into the ring, the next record to open, and the
    /// committed start of what recovery needs (the ring keeps it from being overwritten).
    read_end: u64,
    open_at: u64,
    committed_read_at: u64,
    /// Where each ring's pages were last given back to ([`RELEASE_BYTES`]).
    released_read: u64,
    released_written: u64,
    /// Records opened and not wholly absorbed, and the plaintext absorbed of the first.
    opened: std::collections::VecDeque<Opening>,
    absorbed_first: u64,
    /// Plaintext handed on and not absorbed.
    unabsorbed: u64,
    /// Plaintext of the lease's first record that was absorbed before it: not handed on.
    discard: u64,
    /// Plaintext opened and not handed on yet.
    plain: Vec<u8>,
    plain_at: usize,
    record: Vec<u8>,
    read_closed: bool,
    /// Write stream offsets: sealed, committed, written.
    sealed_end: u64,
    committed_end: u64,
    written_end: u64,
    seal_buf: Vec<u8>,
    app: Vec<u8>,
    dirty: bool,
    failed: Option<RecordError>,
}

impl<S> fmt::Debug for JournaledStream<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JournaledStream")
            .field("journal", &self.journal)
            .field("read_end", &self.read_end)
            .field("sealed_end", &self.sealed_end)
            .field("written_end", &self.written_end)
            .finish_non_exhaustive()
    }
}

impl<S> JournaledStream<S> {
    /// Takes the connection `lease` describes, on its socket and its journal (whose
    /// previous contents are not read: the lease says all).
    pub fn new(io: S, mut journal: Journal, lease: &Lease) -> io::Result<JournaledStream<S>> {
        let session = Session::new(&lease.session)?;
        if lease.read_ahead.len() > journal.shape.read_ring {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} bytes of read-ahead for a read ring of {}",
                    lease.read_ahead.len(),
                    journal.shape.read_ring
                ),
            ));
        }
        let shape = journal.shape;
        journal.ring_write(shape.read_at(), shape.read_ring, 0, &lease.read_ahead);
        let mut stream = JournaledStream {
            io,
            journal,
            session,
            read_end: lease.read_ahead.len() as u64,
            open_at: 0,
            committed_read_at: 0,
            released_read: 0,
            released_written: 0,
            opened: std::collections::VecDeque::new(),
            absorbed_first: lease.skip,
            unabsorbed: 0,
            discard: lease.skip,
            plain: Vec::new(),
            plain_at: 0,
            record: vec![0; HEADER_BYTES + CIPHERTEXT_BYTES_MAX],
            read_closed: false,
            sealed_end: 0,
            committed_end: 0,
            written_end: 0,
            seal_buf: Vec::new(),
            app: lease.app.clone(),
            dirty: true,
            failed: None,
        };
        // Generations count on from the journal's; the lease is the first commit.
        stream.commit();
        Ok(stream)
    }

    /// The application has taken `n` more bytes of the plaintext handed on for good: a
    /// connection taken back after the next commit does not read them again.
    pub fn absorb(&mut self, n: u64) {
        assert!(
            n <= self.unabsorbed,
            "absorbing {n} bytes of the {} handed on",
            self.unabsorbed
        );
        self.unabsorbed -= n;
        self.absorbed_first += n;
        self.pop_absorbed();
        self.dirty = true;
    }

    fn pop_absorbed(&mut self) {
        while let Some(first) = self.opened.front() {
            if self.absorbed_first < first.plain {
                break;
            }
            self.absorbed_first -= first.plain;
            self.opened.pop_front();
        }
    }

    /// The application's state, committed with the next flush.
    pub fn set_app(&mut self, app: &[u8]) -> io::Result<()> {
        if app.len() > APP_BYTES_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} bytes of application state, more than the journal's {APP_BYTES_MAX}",
                    app.len()
                ),
            ));
        }
        self.app.clear();
        self.app.extend_from_slice(app);
        self.dirty = true;
        Ok(())
    }

    /// Commits what is absorbed and sealed, and the application's state.
    fn commit(&mut self) {
        let (read_at, read_skip, read) = match self.opened.front() {
            Some(first) => (first.at, self.absorbed_first, first.before.clone()),
            None => (self.open_at, self.absorbed_first, self.session.state().rx),
        };
        let commit = Commit {
            read_at,
            read_skip,
            read,
            written_at: self.sealed_end,
            write: self.session.state().tx,
            app: Vec::new(),
        };
        self.journal.commit(&commit, &self.app);
        self.committed_read_at = read_at;
        self.committed_end = self.sealed_end;
        self.dirty = false;
        // Recovery starts at the commit's read offset: the ring's bytes before it are spent
        // (those a turn of the ring ago hold newer input now).
        if read_at >= self.released_read + RELEASE_BYTES {
            let ring = self.journal.shape.read_ring;
            let from = self
                .released_read
                .max(self.read_end.saturating_sub(ring as u64));
            if from < read_at {
                let ring_at = self.journal.shape.read_at();
                self.journal.ring_release(ring_at, ring, from, read_at);
            }
            self.released_read = read_at;
        }
    }

    /// Seals `plain`, or a record `seal` makes, into the write ring.
    fn sealed(&mut self) -> io::Result<()> {
        let shape = self.journal.shape;
        let len = self.seal_buf.len() as u64;
        if self.sealed_end + len - self.written_end > shape.write_ring as u64 {
            return Err(io::Error::other("the write ring is full"));
        }
        let bytes = std::mem::take(&mut self.seal_buf);
        self.journal
            .ring_write(shape.write_at(), shape.write_ring, self.sealed_end, &bytes);
        self.sealed_end += len;
        self.seal_buf = bytes;
        self.seal_buf.clear();
        self.dirty = true;
        Ok(())
    }

    fn failed(&self) -> Option<io::Error> {
        self.failed.clone().map(io::Error::from)
    }
}

impl<S: AsyncWrite + Unpin> JournaledStream<S> {
    /// Commits if anything changed, then writes what is committed until the socket takes
    /// no more.
    fn poll_commit_and_write(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.dirty {
            self.commit();
        }
        let shape = self.journal.shape;
        while self.written_end < self.committed_end {
            let at = (self.written_end % shape.write_ring as u64) as usize;
            let len = ((self.committed_end - self.written_end) as usize).min(shape.write_ring - at);
            let span = self.journal.ring_span(shape.write_at() + at, len);
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, span))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written_end += n as u64;
        }
        // What the socket took is never written again (recovery counts from the socket).
        if self.written_end >= self.released_written + RELEASE_BYTES {
            let ring = shape.write_ring;
            let from = self
                .released_written
                .max(self.sealed_end.saturating_sub(ring as u64));
            if from < self.written_end {
                let ring_at = shape.write_at();
                self.journal
                    .ring_release(ring_at, ring, from, self.written_end);
            }
            self.released_written = self.written_end;
        }
        Poll::Ready(Ok(()))
    }
}

impl Journal {
    fn ring_span(&self, at: usize, len: usize) -> &[u8] {
        assert!(at + len <= self.map.len, "a span inside the journal");
        // SAFETY: in bounds (asserted); the bytes are not written while borrowed (`&self`).
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(self.map.ptr.as_ptr().add(at), len)
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for JournaledStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let shape = this.journal.shape;
        loop {
            if this.plain_at < this.plain.len() {
                let n = buf.remaining().min(this.plain.len() - this.plain_at);
                buf.put_slice(&this.plain[this.plain_at..this.plain_at + n]);
                this.plain_at += n;
                this.unabsorbed += n as u64;
                return Poll::Ready(Ok(()));
            }
            if let Some(error) = this.failed() {
                return Poll::Ready(Err(error));
            }
            if this.read_closed {
                return Poll::Ready(Ok(()));
            }
            // Open the next record if it is all in the ring.
            let have = (this.read_end - this.open_at) as usize;
            if have >= HEADER_BYTES {
                this.journal.ring_read(
                    shape.read_at(),
                    shape.read_ring,
                    this.open_at,
                    &mut this.record[..HEADER_BYTES],
                );
                let len = match this.session.whole_record(&this.record[..HEADER_BYTES]) {
                    Ok(_) => {
                        HEADER_BYTES
                            + usize::from(u16::from_be_bytes([this.record[3], this.record[4]]))
                    }
                    Err(error) => {
                        this.failed = Some(error.clone());
                        return Poll::Ready(Err(error.into()));
                    }
                };
                if have >= len {
                    this.journal.ring_read(
                        shape.read_at(),
                        shape.read_ring,
                        this.open_at,
                        &mut this.record[..len],
                    );
                    let before = this.session.state().rx;
                    let at = this.open_at;
                    this.seal_buf.clear();
                    let mut answer = std::mem::take(&mut this.seal_buf);
                    let opened = this.session.open(&mut this.record[..len], &mut answer);
                    this.seal_buf = answer;
                    let (plain, closed) = match opened {
                        Ok(Some((_, Opened::Data(range)))) => (range, false),
                        Ok(Some((_, Opened::CloseNotify))) => (0..0, true),
                        Ok(Some((_, Opened::KeyUpdate))) => (0..0, false),
                        Ok(None) => unreachable!("a whole record"),
                        Err(error) => {
                            this.failed = Some(error.clone());
                            return Poll::Ready(Err(error.into()));
                        }
                    };
                    if !this.seal_buf.is_empty() {
                        // This side's key update, answering the peer's: committed and
                        // written with the next flush, tried now.
                        this.sealed()?;
                        if let Poll::Ready(Err(e)) = this.poll_commit_and_write(cx) {
                            return Poll::Ready(Err(e));
                        }
                    }
                    this.open_at += len as u64;
                    // What was taken before the lease is in the first record opened.
                    let discard = (plain.len() as u64).min(std::mem::take(&mut this.discard));
                    this.plain.clear();
                    this.plain_at = 0;
                    this.plain
                        .extend_from_slice(&this.record[plain.start + discard as usize..plain.end]);
                    this.opened.push_back(Opening {
                        at,
                        plain: plain.len() as u64,
                        before,
                    });
                    this.pop_absorbed();
                    this.read_closed = closed;
                    continue;
                }
            }
            // Read more into the ring, never over what recovery may need.
            let mut free = shape.read_ring as u64 - (this.read_end - this.committed_read_at);
            if free == 0 && this.dirty {
                this.commit();
                free = shape.read_ring as u64 - (this.read_end - this.committed_read_at);
            }
            if free == 0 {
                let error = io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "the journal's read ring ({} bytes) is full of input the application has not absorbed",
                        shape.read_ring
                    ),
                );
                return Poll::Ready(Err(error));
            }
            let span = this.journal.ring_span_mut(
                shape.read_at(),
                shape.read_ring,
                this.read_end,
                free as usize,
            );
            let mut read = ReadBuf::new(span);
            ready!(Pin::new(&mut this.io).poll_read(cx, &mut read))?;
            let n = read.filled().len();
            if n == 0 {
                if this.read_end > this.open_at {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the peer's socket ended inside a TLS record",
                    )));
                }
                this.read_closed = true;
                return Poll::Ready(Ok(()));
            }
            this.read_end += n as u64;
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for JournaledStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(error) = this.failed() {
            return Poll::Ready(Err(error));
        }
        // Room for the records of this write, else what is committed goes out first.
        let n = buf.len().min(4 * crate::records::PLAINTEXT_BYTES_MAX);
        let room = this.journal.shape.write_ring as u64 - (this.sealed_end - this.written_end);
        if room < (n + 4 * 512) as u64 {
            ready!(this.poll_commit_and_write(cx))?;
        }
        this.session.seal(&buf[..n], &mut this.seal_buf)?;
        this.sealed()?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_commit_and_write(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.failed.is_none() && !this.session.is_closed() {
            this.session.seal_close_notify(&mut this.seal_buf)?;
            this.sealed()?;
        }
        ready!(this.poll_commit_and_write(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}
