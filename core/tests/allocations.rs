//! A Ready agent's steady state allocates nothing: every API call reads the gate, and a
//! long-lived agent sees a trickle of timers, stale completions and watch events for
//! months. This file counts heap allocations with a wrapping global allocator and asserts
//! exactly zero across a steady mix of Ready inputs.
//!
//! Each test binary has its own global allocator, so this one counts only here.

// A `#[global_allocator]` must implement the `unsafe` trait `GlobalAlloc`; there is no safe
// way to count allocations. The workspace denies unsafe code everywhere else; here it is
// four one-line forwards to `std::alloc::System`, in a test binary only.
#![allow(unsafe_code)]

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use lockstep_core::lifecycle::{
    ControllerId, ControllerSet, Input, Lifecycle, Output, RecordView, RecordWrite, Request,
    RequestId, StepOutcome, UpgradeInfo, UpgradeStatus,
};
use lockstep_core::{Millis, Phase, Timestamp};
use support::*;

/// Allocations (and reallocations) made on a thread while it counts.
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    // Only the measuring thread counts: the test harness runs tests (and prints their
    // results) on other threads at the same time. A `const` thread-local without a
    // destructor is a plain TLS slot: reading it never allocates.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

struct CountingAllocator;

impl CountingAllocator {
    fn note(&self) {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; the
// counting touches only an atomic and a `const` thread-local, neither of which allocates.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.note();
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract; passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.note();
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        self.note();
        // SAFETY: `ptr` and `layout` came from this allocator, which is `System`'s.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` and `layout` came from this allocator, which is `System`'s.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// One measurement at a time: the counter is shared, and tests run on parallel threads.
static MEASURING: Mutex<()> = Mutex::new(());

/// Allocations `work` makes on this thread.
fn allocations_in<T>(work: impl FnOnce() -> T) -> (usize, T) {
    let _one_at_a_time = MEASURING
        .lock()
        .unwrap_or_else(|poison| poison.into_inner());
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    COUNTING.with(|counting| counting.set(true));
    let result = work();
    COUNTING.with(|counting| counting.set(false));
    (ALLOCATIONS.load(Ordering::Relaxed) - before, result)
}

/// Inputs in the steady mix.
const STEADY_INPUTS: u64 = 10_000;

/// One controller driven through its 2.9.42 → 2.9.43 upgrade to Ready by the world, then
/// taken out of it (with the world's clock).
fn ready_controller() -> (Lifecycle, Timestamp) {
    let mut world = world(controllers_upgrading(1, V42, V43, registry()));
    let taken = world.run_in_order(10_000);
    assert!(taken < 10_000, "the world did not settle");
    world.check().expect("no invariant broken");
    let now = world.now;
    let process = world.hosts[0].process.take().expect("running");
    assert_eq!(process.phase(), Phase::Ready);
    (process, now)
}

#[test]
fn the_counter_counts() {
    let (count, vector) = allocations_in(|| {
        let mut vector: Vec<u64> = Vec::with_capacity(4);
        vector.extend(0..100);
        std::hint::black_box(vector)
    });
    assert!(count >= 2, "one allocation and a growth, counted {count}");
    assert_eq!(vector.len(), 100);
    // An allocation inside the lifecycle is seen too: a new lifecycle allocates its
    // output queue.
    let (config, registry) = (controller(0, V43), registry());
    let (count, process) =
        allocations_in(|| Lifecycle::new(config, registry, None).expect("valid"));
    assert!(
        count > 0,
        "Lifecycle::new allocates its queue, counted {count}"
    );
    assert_eq!(process.phase(), Phase::Bootstrapping);
}

#[test]
fn ready_steady_state_allocates_nothing() {
    let (mut process, start) = ready_controller();
    let running = process.config().running.number;
    let stale = RequestId(999_999);
    let record = UpgradeInfo {
        previous_version: V42,
        target_version: V43,
        status: UpgradeStatus::Complete,
        controllers_ready: ControllerSet::first(1),
        controllers_done: ControllerSet::EMPTY.with(ControllerId(0)),
    };
    let archived = RecordView {
        current: None,
        last_archived: Some(record),
        revision: lockstep_core::lifecycle::Revision(7),
    };
    // Every input built here is allocation-free to build (no `String`, no catalogue).
    let input = |index: u64| match index % 9 {
        0 => Input::Done { id: stale },
        1 => Input::StepFinished {
            id: stale,
            outcome: StepOutcome::Applied,
        },
        2 => Input::RecordChanged(archived),
        3 => Input::AgentVersionChanged(running),
        4 => Input::RecordWritten {
            id: stale,
            write: RecordWrite::Fenced,
        },
        5 => Input::LeaseAnswered {
            id: stale,
            lease: None,
        },
        6 => Input::Staged {
            id: stale,
            result: Ok(()),
        },
        7 => Input::StepFinished {
            id: RequestId(index),
            outcome: StepOutcome::AlreadyApplied,
        },
        _ => Input::Done {
            id: RequestId(index),
        },
    };

    // The 6-hourly catalogue check runs every `CHECK_EVERY` inputs: its answer carries a
    // catalogue, cloned here beforehand, since building that input allocates (the driver's
    // business, not the core's).
    const CHECK_EVERY: u64 = 1_000;
    let mut answers: Vec<_> = (0..STEADY_INPUTS / CHECK_EVERY)
        .map(|_| catalogue(&[V42, V43, V44]))
        .collect();
    let mut now = start;

    let (count, (outputs, checks)) = allocations_in(|| {
        let (mut outputs, mut checks) = (0u64, 0u64);
        for index in 0..STEADY_INPUTS {
            let due = process.poll_timeout().expect("the periodic check is armed");
            if index % CHECK_EVERY == CHECK_EVERY - 1 {
                now = due; // time jumps to the check
            } else {
                now = now + Millis(1);
                assert!(now < due, "nothing is due");
            }
            process.handle_timeout(now);
            while let Some(output) = process.poll_output() {
                let Output::Request {
                    id,
                    request: Request::LookupCatalogue { .. },
                } = output
                else {
                    panic!("the check asks the catalogue, and only that")
                };
                let catalogue = answers.pop().expect("one answer per check");
                process.handle(
                    now,
                    Input::CatalogueFound {
                        id,
                        result: Ok(catalogue),
                    },
                );
                checks += 1;
            }
            process.handle(now, input(index));
            while let Some(output) = process.poll_output() {
                std::hint::black_box(output);
                outputs += 1;
            }
            std::hint::black_box(process.poll_timeout());
            std::hint::black_box(process.phase());
            std::hint::black_box(process.gate());
            std::hint::black_box(process.awaiting());
        }
        (outputs, checks)
    });
    assert_eq!(checks, STEADY_INPUTS / CHECK_EVERY, "every check ran");
    assert_eq!(outputs, 0, "steady-state inputs produce no output");
    assert_eq!(process.phase(), Phase::Ready);
    assert_eq!(
        count, 0,
        "{count} allocations over {STEADY_INPUTS} steady Ready inputs"
    );
}
