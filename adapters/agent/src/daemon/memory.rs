//! The daemon's use of the C allocator.
//!
//! A login's password check (argon2) allocates 19 MiB and frees it at once. glibc serves an
//! allocation that large with `mmap`, but after the first such free it raises its mmap
//! threshold (up to 32 MiB) and serves the next ones from its heaps, one per thread, which
//! keep what was freed: fifty machine agents logging in and being provisioned left a
//! worker at 626 MB resident (`cargo bench -p lockstep-agent --bench fleet`, BENCHMARKS.md).
//! Fixing the threshold keeps every allocation from 1 MiB up mapped and unmapped on its
//! own, so the memory goes back to the system when the check ends (64 MB in the same run).

/// Allocations from this size up are mapped on their own and returned on free.
pub const MMAP_THRESHOLD_BYTES: usize = 1 << 20;

/// Fixes glibc's mmap threshold at [`MMAP_THRESHOLD_BYTES`] (which also stops it from
/// moving). Call once, at the start of the process, before other threads run. Elsewhere
/// than glibc it does nothing.
pub fn return_large_allocations() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets an allocator parameter; it is called before the process
        // starts other threads, and its arguments are a valid parameter and value.
        #[allow(unsafe_code)]
        let set = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES as i32) };
        if set != 1 {
            tracing::warn!(target: "lockstep::agent", "mallopt(M_MMAP_THRESHOLD) refused: freed login buffers may stay resident");
        }
    }
}
