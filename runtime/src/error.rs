//! The one error type of the runtime.
//!
//! Every failure is a value. Messages name the device, the host range and what was
//! expected, so that a failed construct can be understood from its message alone.

use std::fmt;

/// Still reachable here, where it was before it moved to `range.rs` (`offload::HostRange`
/// is the usual path).
pub use crate::range::HostRange;

/// Which kind of `OMP_TARGET_OFFLOAD` policy or configuration value was wrong.
pub type EnvVar = &'static str;

/// Every way a runtime call can fail.
///
/// `Debug` shows the same message as `Display`, so that a program whose `main` returns
/// `Result<(), offload::Error>` ends with a readable line (`Error: ` and the message)
/// rather than a struct dump:
///
/// ```
/// fn run() -> Result<(), offload::Error> {
///     let rt = offload::Runtime::builder().host_devices(1).build()?;
///     rt.device(7)?;
///     Ok(())
/// }
/// let e = run().unwrap_err();
/// // What a `main` returning this error prints after "Error: ":
/// assert_eq!(format!("{e:?}"), e.to_string());
/// assert!(e.to_string().contains("device 7"), "{e}");
/// ```
#[derive(Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An environment variable or builder setting holds a value the runtime does not accept.
    #[error("{var}={value:?} is not valid: expected {expected}")]
    InvalidSetting {
        /// The variable or setting name.
        var: EnvVar,
        /// The value found.
        value: String,
        /// What would have been accepted.
        expected: &'static str,
    },

    /// A builder value or a field of a configuration struct (`StagingConfig`, `PoolConfig`)
    /// is outside the range the runtime can work with.
    #[error("{field} = {value} is not valid: expected {expected}")]
    InvalidConfig {
        /// The builder method or `Struct::field`.
        field: &'static str,
        /// The value given.
        value: String,
        /// The accepted range.
        expected: &'static str,
    },

    /// `OMP_TARGET_OFFLOAD=mandatory` and no device can be used.
    #[error("OMP_TARGET_OFFLOAD=mandatory but no offload device is available ({reason})")]
    OffloadMandatory {
        /// Why there are no devices (what each backend reported).
        reason: String,
    },

    /// A device number outside `0..=initial_device`.
    #[error(
        "device {device} does not exist: {available} devices (0..{available}), initial device {available}"
    )]
    NoSuchDevice {
        /// The number asked for.
        device: i64,
        /// How many offload devices there are.
        available: usize,
    },

    /// A `present` map, or an `update`/launch argument, named a range not mapped on the device.
    #[error("device {device}: {} is not present (required by {what})", named(*range, name.as_deref()))]
    NotPresent {
        /// Device number.
        device: usize,
        /// The range asked for.
        range: HostRange,
        /// The construct or clause that required presence.
        what: &'static str,
        /// The range as the program named it (`y[0:4]`), when its map was named
        /// ([`crate::MapItem::named`]).
        name: Option<String>,
    },

    /// A request partly overlaps, or extends past, a range already mapped ("explicit extension").
    #[error("device {device}: {requested} extends the mapped {existing}; a map must lie inside one mapped range or outside all of them")]
    Extension {
        /// Device number.
        device: usize,
        /// The range asked for.
        requested: HostRange,
        /// The entry it overlaps.
        existing: HostRange,
    },

    /// `disassociate_ptr` on a range that `associate_ptr` did not make.
    #[error("device {device}: host {host:#x} is not mapped by associate_ptr ({found})")]
    NotAssociated {
        /// Device number.
        device: usize,
        /// The host address passed.
        host: usize,
        /// What the table holds there instead.
        found: &'static str,
    },

    /// `disassociate_ptr` while a region's `hold` map still holds the entry.
    #[error("device {device}: cannot disassociate {range}: a `hold` map of a region holds it (hold count {count})")]
    StillHeld {
        /// Device number.
        device: usize,
        /// The associated range.
        range: HostRange,
        /// Its hold count.
        count: u64,
    },

    /// `associate_ptr` over a range that is already mapped.
    #[error("device {device}: cannot associate {range}: already mapped as {existing}")]
    AlreadyMapped {
        /// Device number.
        device: usize,
        /// The range asked for.
        range: HostRange,
        /// The entry that is there.
        existing: HostRange,
    },

    /// A device allocation failed for lack of memory.
    #[error("device {device}: out of memory allocating {requested} bytes ({free} bytes free of {total})")]
    OutOfMemory {
        /// Device number.
        device: usize,
        /// Bytes asked for.
        requested: usize,
        /// Bytes free on the device when it failed.
        free: usize,
        /// Device memory in all.
        total: usize,
    },

    /// A pointer argument that must not be null was null, or a size that must not be zero was zero.
    #[error("{routine}: {what}")]
    InvalidArgument {
        /// The routine called.
        routine: &'static str,
        /// What was wrong.
        what: String,
    },

    /// Arithmetic on sizes, offsets, strides or counts a caller passed overflowed.
    #[error("{routine}: {what} overflows")]
    Overflow {
        /// The routine called.
        routine: &'static str,
        /// The computation, with its values.
        what: String,
    },

    /// A device range that does not lie inside one live allocation of its device (as the
    /// device's memory pool records them: `target_alloc` blocks and mapped entries, each
    /// of the size asked for). Refused before anything is read or written.
    #[error(
        "device {device}: {routine}: device {addr:#x}..+{bytes} bytes is not inside one live allocation ({found})"
    )]
    OutsideAllocation {
        /// Device number.
        device: usize,
        /// The routine called.
        routine: &'static str,
        /// First device byte of the range.
        addr: u64,
        /// Length of the range in bytes.
        bytes: usize,
        /// The block found there, or that none is.
        found: String,
    },

    /// A device pointer that the device did not allocate (or already freed).
    #[error("device {device}: {addr:#x} is not an allocation of this device ({routine})")]
    UnknownDevicePointer {
        /// Device number.
        device: usize,
        /// The pointer passed.
        addr: u64,
        /// The routine called.
        routine: &'static str,
    },

    /// The kernel has no implementation for the device's backend.
    #[error("device {device}: kernel `{kernel}` has no {backend} implementation")]
    NoKernelImpl {
        /// Device number.
        device: usize,
        /// Kernel name.
        kernel: &'static str,
        /// The backend that lacks it.
        backend: &'static str,
    },

    /// A kernel argument did not have the type or number the kernel expects.
    #[error("kernel `{kernel}`: argument {index}: {what}")]
    KernelArgument {
        /// Kernel name.
        kernel: &'static str,
        /// Zero-based argument position.
        index: usize,
        /// What was expected and what came.
        what: String,
    },

    /// Work that a construct queued failed after the construct had returned (a kernel
    /// that faulted or reported failure, a copy the driver could not make). It is
    /// reported once, by the next synchronising call on the device (a copy back to the
    /// host, a reduction's value, [`Runtime::synchronize`](crate::Runtime::synchronize),
    /// ...), and names the construct that queued the work and where the program called it.
    #[error("device {device}: {construct} at {at} failed after it returned: {source}")]
    Queued {
        /// Device number.
        device: usize,
        /// The construct, with its kernel when it launched one.
        construct: String,
        /// The program's `file:line` that called it.
        at: String,
        /// What failed.
        #[source]
        source: Box<Error>,
    },

    /// A device operation of a construct failed while the construct ran (an allocation, a
    /// copy, a launch the driver refused): names the construct and where the program
    /// called it, with the device's failure as its source. What the construct changed is
    /// undone as docs/SEMANTICS.md's R9 says. Validation errors (a range not present, ...)
    /// are returned as they are: they name what was wrong already.
    #[error("device {device}: {construct} at {at} failed: {source}")]
    Construct {
        /// Device number.
        device: usize,
        /// The construct, with its kernel when it launches one.
        construct: String,
        /// The program's `file:line` that called it.
        at: String,
        /// What failed.
        #[source]
        source: Box<Error>,
    },

    /// A construct refused because work that an earlier construct queued on the device
    /// failed, and no synchronising call has reported it yet.
    #[error(
        "device {device}: not run: {construct} at {at} failed after it returned and is not reported yet \
         (a synchronising call such as `Runtime::synchronize` reports it)"
    )]
    EarlierFailure {
        /// Device number.
        device: usize,
        /// The construct whose queued work failed.
        construct: String,
        /// The program's `file:line` that called it.
        at: String,
    },

    /// A kernel reported failure (host kernels) or faulted (GPU kernels).
    #[error("device {device}: kernel `{kernel}` failed: {message}")]
    KernelFailed {
        /// Device number.
        device: usize,
        /// Kernel name.
        kernel: &'static str,
        /// What it reported.
        message: String,
    },

    /// Code run for the caller on another thread (a `nowait` task, a pipeline stage, a
    /// solver's device thread) panicked; what it had begun was ended as on an error.
    #[error("device {device}: {what} panicked: {message}")]
    Panicked {
        /// Device number.
        device: usize,
        /// What panicked.
        what: &'static str,
        /// The panic's message.
        message: String,
    },

    /// Moving a halo region between the parts of a split grid failed: names the part that
    /// sent or received it (and its rank, across ranks), its device and the region, with
    /// the failure as its source.
    #[error("{}part {part} (device {device}): {region} failed: {source}", rank.map_or(String::new(), |r| format!("rank {r}, ")))]
    Exchange {
        /// The part's rank, across ranks.
        rank: Option<usize>,
        /// The part that sent or received the region.
        part: usize,
        /// Its device.
        device: usize,
        /// The region: sent or received, its kind, its points in grid coordinates, the
        /// other part.
        region: String,
        /// What failed.
        #[source]
        source: Box<Error>,
    },

    /// An MPI call failed or could not be made (feature `mpi`).
    #[error("MPI rank {rank}: {call}: {message}")]
    Mpi {
        /// This process's rank in the world communicator (0 before MPI started).
        rank: usize,
        /// The MPI function or the step of the runtime's.
        call: &'static str,
        /// What went wrong.
        message: String,
    },

    /// A driver call failed.
    #[error("device {device}: {call} failed: {message}")]
    Driver {
        /// Device number.
        device: usize,
        /// The driver function.
        call: &'static str,
        /// The driver's description of the error.
        message: String,
    },

    /// An asynchronous task did not run because a task it depends on failed.
    #[error("not run: a task it depends on failed ({cause})")]
    Dependency {
        /// The dependency's error.
        cause: String,
    },

    /// A pipeline batch failed; the pipeline stopped.
    #[error("batch {batch} failed: {source}")]
    Batch {
        /// The batch's index.
        batch: usize,
        /// What went wrong.
        #[source]
        source: Box<Error>,
    },

    /// A stage of a [`crate::pipeline::StagePipeline`] failed.
    #[error("stage {stage} (device {device}) failed: {source}")]
    Stage {
        /// The stage's index.
        stage: usize,
        /// Its device.
        device: usize,
        /// What went wrong.
        #[source]
        source: Box<Error>,
    },

    /// A request to a pipeline's server ([`crate::pipeline::Pipeline::serve`]) came after
    /// its intake closed, so it was not run.
    #[error("the pipeline's server has closed: {what}")]
    ServerClosed {
        /// What was refused or dropped.
        what: &'static str,
    },

    /// A weights file that cannot be read, or a tensor in it that is missing or not what
    /// the model declares ([`crate::weights::Weights`]).
    #[error("{path}: {what}")]
    Weights {
        /// The file.
        path: String,
        /// What is wrong, naming the tensor where one is at fault.
        what: String,
    },

    /// A tensor whose shape is not what a routine expects ([`crate::tensor`]).
    #[error("{routine}: tensor `{tensor}` {what}")]
    Shape {
        /// The routine or op that refused it.
        routine: &'static str,
        /// The tensor's name.
        tensor: String,
        /// Its shape and what was expected.
        what: String,
    },

    /// A device's worker is gone (it panicked or the runtime is shutting down).
    #[error("device {device}: its work queue is closed ({why})")]
    QueueClosed {
        /// Device number.
        device: usize,
        /// What happened.
        why: &'static str,
    },
}

impl Error {
    /// The failure beneath the construct that reports it: the source of an
    /// [`Error::Construct`], [`Error::Queued`] or [`Error::Batch`] (repeatedly), else the
    /// error itself.
    ///
    /// ```
    /// use offload::Error;
    /// let oom = Error::OutOfMemory { device: 0, requested: 64, free: 0, total: 0 };
    /// let e = Error::Construct {
    ///     device: 0,
    ///     construct: "target enter data".into(),
    ///     at: "main.rs:7".into(),
    ///     source: Box::new(oom.clone()),
    /// };
    /// assert!(e.to_string().starts_with("device 0: target enter data at main.rs:7 failed: "));
    /// assert!(matches!(e.cause(), Error::OutOfMemory { requested: 64, .. }));
    /// assert!(matches!(oom.cause(), Error::OutOfMemory { .. }));
    /// ```
    pub fn cause(&self) -> &Error {
        match self {
            Error::Construct { source, .. }
            | Error::Queued { source, .. }
            | Error::Batch { source, .. }
            | Error::Stage { source, .. } => source.cause(),
            e => e,
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Result with the runtime's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `range` as a message gives it: by the program's name for it when there is one
/// (`y[0:4] at host 0x..0x.. (16 bytes)`), else by its bytes.
fn named(range: HostRange, name: Option<&str>) -> String {
    match name {
        Some(n) => format!("{n} at {range}"),
        None => range.to_string(),
    }
}

/// The message of a panic's payload (`panic!` gives a `&str` or a `String`).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_device_range_and_expectation() {
        let e = Error::NotPresent {
            device: 1,
            range: HostRange::new(0x1000, 4),
            what: "map(present)",
            name: None,
        };
        assert_eq!(
            e.to_string(),
            "device 1: host 0x1000..0x1004 (4 bytes) is not present (required by map(present))"
        );
        let e = Error::NotPresent {
            device: 1,
            range: HostRange::new(0x1000, 4),
            what: "map(present)",
            name: Some("y[0:1]".into()),
        };
        assert_eq!(
            e.to_string(),
            "device 1: y[0:1] at host 0x1000..0x1004 (4 bytes) is not present (required by map(present))"
        );
        let e = Error::Extension {
            device: 0,
            requested: HostRange::new(0x1004, 8),
            existing: HostRange::new(0x1000, 8),
        };
        let s = e.to_string();
        assert!(s.contains("0x1004..0x100c") && s.contains("0x1000..0x1008"), "{s}");
    }

    #[test]
    fn panic_messages_are_read_from_str_and_string_payloads() {
        let text = std::panic::catch_unwind(|| panic!("plain")).unwrap_err();
        let formatted = std::panic::catch_unwind(|| panic!("formatted {}", 7)).unwrap_err();
        let other = std::panic::catch_unwind(|| std::panic::panic_any(7u8)).unwrap_err();
        assert_eq!(panic_message(&*text), "plain");
        assert_eq!(panic_message(&*formatted), "formatted 7");
        assert_eq!(panic_message(&*other), "a panic without a message");
    }
}
