//! Threads that serve connections, each running a single-threaded tokio runtime: a
//! connection placed on one is read, relayed and written on that thread for its whole life.
//!
//! Why: on tokio's multi-threaded runtime a task woken by its socket is often run by the
//! other worker thread, which must first be woken itself (a futex), and the thread that
//! polled the socket then sleeps again. Behind the front door every call wakes the launcher
//! twice (the client's frame, the worker's reply); on its shared runtime the launcher made
//! 0.79 futex calls and 1.30 context switches per relayed call, on a thread of its own none
//! and 0.76 (BENCHMARKS.md, "The front door's connection threads"). A connection that
//! stays on one thread is woken by its socket and nothing else.
//! Connections are spread over the threads by their number of live tasks, so a busy thread
//! gets the next connection last.

use std::future::Future;
use std::io;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// A thread running a single-threaded runtime, until [`ConnectionThreads`] is dropped.
struct Thread {
    handle: Handle,
    /// Dropped with the pool: the thread's runtime then stops, dropping its tasks.
    _stop: oneshot::Sender<()>,
}

/// `count` threads, each with its own single-threaded runtime (I/O and timers enabled),
/// that connections are spawned on ([`ConnectionThreads::spawn`]). Dropping the pool stops
/// every thread, which drops the tasks still running on it.
pub struct ConnectionThreads {
    threads: Vec<Thread>,
}

impl std::fmt::Debug for ConnectionThreads {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ConnectionThreads")
            .field("threads", &self.threads.len())
            .finish()
    }
}

impl ConnectionThreads {
    /// Starts `count` threads (at least one) named `<name>-<n>` (Linux keeps 15 bytes of a
    /// thread's name: keep `name` short enough for the number to show).
    pub fn start(name: &str, count: usize) -> io::Result<ConnectionThreads> {
        let mut threads = Vec::with_capacity(count.max(1));
        for number in 0..count.max(1) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let handle = runtime.handle().clone();
            let (stop, stopped) = oneshot::channel::<()>();
            std::thread::Builder::new()
                .name(format!("{name}-{number}"))
                .spawn(move || {
                    // Either the pool is dropped (`Err`) or, never, a value is sent.
                    let _ = runtime.block_on(stopped);
                    // The runtime is dropped here, on its own thread, with its tasks.
                })?;
            threads.push(Thread {
                handle,
                _stop: stop,
            });
        }
        Ok(ConnectionThreads { threads })
    }

    /// The default number of threads: half the CPUs this process may run on
    /// (`available_parallelism`), rounded up. Behind the front door the launcher does about
    /// half of a call's work (TLS, the websocket, the relay) and the worker the rest; on a
    /// 2-CPU machine two threads were measured no faster than one (BENCHMARKS.md, "The
    /// front door's connection threads"). Larger machines are not measured yet.
    pub fn default_count() -> usize {
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        cpus.div_ceil(2)
    }

    /// How many threads there are.
    pub fn len(&self) -> usize {
        self.threads.len()
    }

    /// Never: [`ConnectionThreads::start`] starts at least one.
    pub fn is_empty(&self) -> bool {
        self.threads.is_empty()
    }

    /// The runtime of the thread with the fewest live tasks (the first of those tied).
    pub fn least_busy(&self) -> &Handle {
        &self
            .threads
            .iter()
            .min_by_key(|thread| thread.handle.metrics().num_alive_tasks())
            .expect("at least one thread")
            .handle
    }

    /// Spawns `task` on the least busy thread ([`ConnectionThreads::least_busy`]), tracked
    /// by `set`: dropping or aborting the set aborts it, as for a task spawned on the
    /// caller's runtime. A socket the task uses must be registered there, from inside the
    /// task (`from_std`), not with the caller's runtime.
    pub fn spawn<F>(&self, set: &mut tokio::task::JoinSet<()>, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        set.spawn_on(task, self.least_busy());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_connection_task_runs_on_a_pool_thread_and_is_aborted_with_its_set() {
        let threads = ConnectionThreads::start("test-connections", 2).unwrap();
        assert_eq!(threads.len(), 2);
        let mut set = tokio::task::JoinSet::new();
        let (name_sender, name) = oneshot::channel();
        let (dropped_sender, dropped) = oneshot::channel::<()>();
        threads.spawn(&mut set, async move {
            name_sender
                .send(std::thread::current().name().map(str::to_owned))
                .unwrap();
            // Held until the task is dropped.
            let _dropped = dropped_sender;
            std::future::pending::<()>().await;
        });
        let name = name.await.unwrap().unwrap();
        assert!(name.starts_with("test-connections-"), "{name}");
        drop(set);
        // The sender inside the aborted task is dropped: the receiver sees the end.
        let ended = tokio::time::timeout(std::time::Duration::from_secs(10), dropped).await;
        assert!(
            matches!(ended, Ok(Err(_))),
            "the task outlived its set: {ended:?}"
        );
    }

    #[tokio::test]
    async fn the_next_task_goes_to_the_thread_with_fewer_live_tasks() {
        let threads = ConnectionThreads::start("test-spread", 2).unwrap();
        let mut set = tokio::task::JoinSet::new();
        let mut names = Vec::new();
        for _ in 0..4 {
            let (sender, name) = oneshot::channel();
            threads.spawn(&mut set, async move {
                sender
                    .send(std::thread::current().name().map(str::to_owned))
                    .unwrap();
                std::future::pending::<()>().await;
            });
            names.push(name.await.unwrap().unwrap());
        }
        names.sort();
        assert_eq!(
            names,
            [
                "test-spread-0",
                "test-spread-0",
                "test-spread-1",
                "test-spread-1"
            ]
        );
    }

    #[test]
    fn dropping_the_pool_stops_its_threads_and_their_tasks() {
        let threads = ConnectionThreads::start("test-stop", 1).unwrap();
        let (dropped_sender, dropped) = std::sync::mpsc::channel::<()>();
        threads.least_busy().spawn(async move {
            let _dropped = dropped_sender;
            std::future::pending::<()>().await;
        });
        drop(threads);
        // The task (and the sender it holds) is dropped with its runtime.
        assert_eq!(
            dropped.recv_timeout(std::time::Duration::from_secs(10)),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected)
        );
    }
}
