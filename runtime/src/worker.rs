//! One host worker thread per device, bound to the CPUs nearest the device, running the
//! device's host-side work in order; and per-node `rayon` pools whose threads are bound to
//! a device's CPUs, for the CPU copies of staging.
//!
//! A job that panics does not end its worker (the device's later work still needs it):
//! [`DeviceWorker::run`] hands the panic back to the waiting caller, where it resumes; a
//! job given to [`DeviceWorker::submit`] must report its own failures (`nowait` tasks catch
//! their panics), and a panic that escapes one anyway is dropped.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{bounded, unbounded, Sender};

use crate::topology::Topology;

type Job = Box<dyn FnOnce() + Send>;

/// The worker is gone: it panicked, or the device is shutting down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WorkerGone;

/// A thread bound to a device's CPUs that runs jobs in submission order.
pub(crate) struct DeviceWorker {
    queue: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    binding: Result<Vec<usize>, String>,
}

impl std::fmt::Debug for DeviceWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceWorker").field("binding", &self.binding).finish_non_exhaustive()
    }
}

impl DeviceWorker {
    /// Starts a worker named `name`, bound to `cpus` of `topology` (best effort: the
    /// binding read back, or why it failed, is kept for the report).
    pub(crate) fn spawn(name: String, topology: Arc<Topology>, cpus: Vec<usize>) -> std::io::Result<Self> {
        let (tx, rx) = unbounded::<Job>();
        let (bound_tx, bound_rx) = bounded(1);
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            let _ = bound_tx.send(topology.bind_current_thread(&cpus).map_err(|e| e.to_string()));
            for job in rx {
                // The job's owner learns of a panic (see the module documentation).
                let _ = catch_unwind(AssertUnwindSafe(job));
            }
        })?;
        let binding = bound_rx.recv().unwrap_or_else(|_| Err("worker ended before binding".into()));
        Ok(Self { queue: Some(tx), thread: Some(thread), binding })
    }

    /// Runs `f` on the worker after every job submitted before it, and returns its result;
    /// a panic of `f` resumes in the caller (the worker goes on).
    pub(crate) fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, WorkerGone> {
        let (tx, rx) = bounded(1);
        self.queue
            .as_ref()
            .ok_or(WorkerGone)?
            .send(Box::new(move || {
                // The caller waits on `rx`, so the receiver is alive.
                let _ = tx.send(catch_unwind(AssertUnwindSafe(f)));
            }))
            .map_err(|_| WorkerGone)?;
        match rx.recv() {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(panic)) => resume_unwind(panic),
            Err(_) => Err(WorkerGone),
        }
    }

    /// Queues `job` after every job submitted before it, without waiting.
    pub(crate) fn submit(&self, job: Box<dyn FnOnce() + Send>) -> Result<(), WorkerGone> {
        self.queue.as_ref().ok_or(WorkerGone)?.send(job).map_err(|_| WorkerGone)
    }

    /// The CPUs the worker is bound to, as read back after binding (empty when the
    /// topology is not this machine's), or why binding failed.
    pub(crate) fn binding(&self) -> Result<&[usize], &str> {
        self.binding.as_deref().map_err(String::as_str)
    }
}

impl Drop for DeviceWorker {
    fn drop(&mut self) {
        self.queue = None; // the worker drains its queue and ends
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The three lane threads of a device (`nowait` tasks run on them): copy-in, compute and
/// copy-out, in that order.
pub(crate) struct Lanes([DeviceWorker; 3]);

impl Lanes {
    /// The copy-in, compute and copy-out lanes, in that order.
    pub(crate) fn new(lanes: [DeviceWorker; 3]) -> Self {
        Self(lanes)
    }

    /// Lane `index` (0 copy-in, 1 compute, 2 copy-out).
    pub(crate) fn worker(&self, index: usize) -> &DeviceWorker {
        &self.0[index]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_jobs_in_order_and_reports_its_binding() {
        let topo = Arc::new(Topology::system());
        let cpus = topo.whole_machine("test").cpus;
        let w = DeviceWorker::spawn("test-worker".into(), topo, cpus.clone()).unwrap();
        let log = Arc::new(parking_lot::Mutex::new(Vec::new()));
        for i in 0..100 {
            let l = Arc::clone(&log);
            w.run(move || l.lock().push(i)).unwrap();
        }
        assert_eq!(*log.lock(), (0..100).collect::<Vec<_>>());
        let name = w.run(|| std::thread::current().name().map(String::from)).unwrap();
        assert_eq!(name.as_deref(), Some("test-worker"));
        if let Ok(b) = w.binding() {
            assert!(b.iter().all(|c| cpus.contains(c)), "bound to {b:?}, asked {cpus:?}");
        }
    }

    #[test]
    fn a_panicking_job_resumes_in_its_caller_and_the_worker_goes_on() {
        let topo = Arc::new(Topology::system());
        let w = DeviceWorker::spawn("test-worker".into(), topo, Vec::new()).unwrap();
        let caught = catch_unwind(AssertUnwindSafe(|| w.run(|| panic!("job panicked"))));
        assert_eq!(crate::error::panic_message(&*caught.unwrap_err()), "job panicked");
        // A submitted job has no caller to resume in; its panic must not end the worker.
        w.submit(Box::new(|| panic!("submitted job panicked"))).unwrap();
        assert_eq!(w.run(|| 7), Ok(7));
    }
}
